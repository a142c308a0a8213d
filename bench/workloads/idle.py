"""idle: N idle sessions; the node's RSS per session.

Sessions are raw reader sockets (``hello`` only, kept alive with WebSocket
pings) spread over reader processes. RSS comes from ``/proc/<pid>/status``
``VmRSS`` of the node process, so it needs the node's pid: the bench started
the node, or ``--node-pid`` was given.
"""

from __future__ import annotations

import trio

from bench.readers import ReaderPlan, ReaderPool
from bench.stats import proc_rss_kib
from bench.workloads.common import Env, WorkloadResult
from bench.workloads.fanout import reader_targets

TARGET_KIB_PER_SESSION = 16.0
SETTLE_S = 2.0


async def run(env: Env, *, sessions: int) -> WorkloadResult:
    ws = await env.workspace("bench-idle")
    members = await env.members(ws, "human", "bench-idle-human", min(sessions, env.members_cap))
    tokens = [members[i % len(members)].token for i in range(sessions)]
    cpu = env.cpu_window()
    pid = env.node.pid
    await trio.sleep(SETTLE_S)
    rss_before = proc_rss_kib(pid) if pid else None
    procs = max(env.reader_processes, sessions // 2500 + 1)
    pool = ReaderPool(
        reader_targets(env, ws, tokens, None),
        ReaderPlan(expected_events=0, setup_timeout_s=env.timeout_s, timeout_s=env.timeout_s),
        processes=procs,
    )
    cpu.start()
    pool.start()
    try:
        env.progress.phase("idle sessions", sessions)
        ready = await trio.to_thread.run_sync(pool.wait_ready, env.timeout_s + 60)
        env.progress.update(ready.connections, force=True)
        env.progress.close()
        await trio.sleep(SETTLE_S)
        rss_after = proc_rss_kib(pid) if pid else None
    finally:
        pool.stop()
        final = await trio.to_thread.run_sync(pool.wait_result, 60.0)
        await trio.to_thread.run_sync(pool.close)
    cpu.stop(final.cpu_s)
    per_session = None
    if rss_before is not None and rss_after is not None and ready.connections:
        per_session = round((rss_after - rss_before) / ready.connections, 2)
    results = {
        "sessions": sessions,
        "connected": ready.connections,
        "failed": ready.failed,
        "errors": ready.errors[:5],
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "kib_per_session": per_session,
        "target_kib_per_session": TARGET_KIB_PER_SESSION,
        "note": None
        if pid
        else "node pid unknown: pass --node-pid or let the bench start the node",
    }
    return WorkloadResult(results, cpu, [])
