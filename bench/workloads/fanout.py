"""fanout: one sender, N reader sessions in one scope.

Readers are raw sockets in reader processes (:mod:`bench.readers`): each
sends ``hello`` and ``join`` right after the upgrade, then only counts
``@bt:`` markers in ``message`` events (the node may coalesce several events
per frame). The sender's content carries the send time, so delivery latency
is send issued → event received. Sessions are spread over a few human
members; every session of a member receives the event.
"""

from __future__ import annotations

import time

import msgspec
import trio

from bench.client import open_session
from bench.fanout_baseline import FanoutPlan, summarize
from bench.readers import ReaderPlan, ReaderPool, ReaderSummary, ReaderTarget
from bench.stats import Latency
from bench.workloads.common import CpuWindow, Env, WorkloadResult, create_channel
from bench.wsframes import mark
from protocol.wsframes import client_frame

CONTENT_PAD = "x" * 100
SETTLE_S = 1.0


def reader_targets(
    env: Env, workspace_id: str, tokens: list[str], scope_id: str | None
) -> list[ReaderTarget]:
    """Raw reader connections: ``hello`` (+ ``join`` of ``scope_id``) as setup frames."""
    host, port = env.host_port
    path = f"/v1/ws?workspace={workspace_id}"
    out = []
    for token in tokens:
        hello = {
            "type": "hello",
            "token": token,
            "client": {"kind": "browser", "name": "scopenode-bench-reader", "version": "1"},
        }
        frames = client_frame(msgspec.json.encode(hello))
        if scope_id is None:
            out.append(ReaderTarget(host, port, path, frames, done_type="welcome"))
        else:
            join = {"type": "join", "id": "bench-join", "scopeId": scope_id}
            frames += client_frame(msgspec.json.encode(join))
            out.append(ReaderTarget(host, port, path, frames, done_id="bench-join"))
    return out


async def run(
    env: Env, *, readers: int, messages: int, rate: float, sample_every: int, window: int = 1
) -> WorkloadResult:
    ws = await env.workspace("bench-fanout")
    [sender] = await env.members(ws, "human", "bench-fan-sender", 1)
    members = await env.members(ws, "human", "bench-fan-reader", min(readers, env.members_cap))
    send_lat = Latency("fanout_send_reply")
    cpu: CpuWindow = env.cpu_window()
    plan = FanoutPlan(clients=readers, messages=messages, sample_every=sample_every)
    async with open_session(env.url(ws), sender.token, kind="browser") as s:
        scope = await create_channel(s, f"bench-fanout-{env.seed}")
        tokens = [members[i % len(members)].token for i in range(readers)]
        pool = ReaderPool(
            reader_targets(env, ws, tokens, scope),
            ReaderPlan(
                expected_events=messages,
                sample_every=sample_every,
                setup_timeout_s=env.timeout_s,
                timeout_s=env.timeout_s,
            ),
            processes=env.reader_processes,
        )
        pool.start()
        try:
            env.progress.phase("readers", readers)
            ready = await trio.to_thread.run_sync(pool.wait_ready, env.timeout_s + 30)
            env.progress.close()
            # Joins emit membership events to every reader: let them drain first.
            await trio.sleep(SETTLE_S)
            env.progress.phase("fanout", readers * messages)
            cpu.start()
            t_first = time.monotonic_ns()
            t0 = trio.current_time()
            interval = 1.0 / rate if rate > 0 else 0.0
            # Up to `window` sends in flight, like the baselines' burst: the
            # node can then commit and fan out several messages per write.
            in_flight = trio.Semaphore(max(window, 1))

            async def send_one(i: int) -> None:
                try:
                    t = time.monotonic_ns()
                    start = time.perf_counter_ns()
                    await s.request(
                        "send",
                        target=f"scope:{scope}",
                        content=f"{mark(t)} {CONTENT_PAD}",
                        clientMessageId=f"fan-{env.seed}-{i}",
                    )
                    send_lat.record_ns(time.perf_counter_ns() - start)
                    env.progress.update(pool.progress_events)
                finally:
                    in_flight.release()

            async with trio.open_nursery() as senders:
                for i in range(messages):
                    await in_flight.acquire()
                    senders.start_soon(send_one, i)
                    if interval:
                        await trio.sleep_until(t0 + (i + 1) * interval)
            final = await _wait_result(env, pool)
        finally:
            pool.stop()
            await trio.to_thread.run_sync(pool.close)
    env.progress.close()
    cpu.stop(final.cpu_s - ready.cpu_s)
    results = summarize(plan, final, t_first)
    results["send_reply_latency"] = send_lat.summary()
    results["rate"] = rate
    results["window"] = window
    final.latency.name = "fanout_delivery"
    return WorkloadResult(results, cpu, [final.latency, send_lat])


async def _wait_result(env: Env, pool: ReaderPool) -> ReaderSummary:
    async with trio.open_nursery() as nursery:

        async def show() -> None:
            while True:
                env.progress.update(pool.progress_events)
                await trio.sleep(0.1)

        nursery.start_soon(show)
        result = await trio.to_thread.run_sync(pool.wait_result, env.timeout_s + 30)
        nursery.cancel_scope.cancel()
    return result
