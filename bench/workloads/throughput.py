"""throughput: S concurrent senders over R scopes for T seconds.

Sender ``i`` writes to scope ``i % R`` as a browser session (no freshness),
sequentially: the next send leaves when the previous reply arrived, or, with
``pace_ms``, after a pause drawn from an exponential distribution of that
mean (senders that type rather than fire: a lighter, irregular load). Sessions
are spread over a few human members (provisioning is slow through the CLI);
each sender is its own WebSocket session.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import trio

from bench.client import RequestError, Session
from bench.stats import Latency
from bench.workloads.cluster import node_gauges
from bench.workloads.common import Env, WorkloadResult, create_channel, open_sessions

CONTENT_PAD = "x" * 120


async def run(
    env: Env,
    *,
    senders: int,
    scopes: int,
    duration_s: float,
    max_sends: int,
    pace_ms: float = 0.0,
) -> WorkloadResult:
    ws = await env.workspace("bench-throughput")
    members = await env.members(ws, "human", "bench-tp-human", min(senders, env.members_cap))
    tokens = [members[i % len(members)].token for i in range(senders)]
    lat = Latency("throughput_send")
    states: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    counts = [0] * senders
    cpu = env.cpu_window()
    env.progress.phase("sessions", senders)
    async with open_sessions(env.url(ws), tokens, kind="browser", progress=env.progress) as sess:
        env.progress.close()
        scope_ids = [
            await create_channel(sess[0], f"bench-tp-{env.seed}-{j}") for j in range(scopes)
        ]
        joined: set[tuple[str, str]] = set()
        for i, s in enumerate(sess):
            key = (s.member_id, scope_ids[i % scopes])
            if key not in joined:
                await s.request("join", scopeId=key[1])
                joined.add(key)
        # The creator joined every channel by creating it; leave the ones it does
        # not send to, so each send reaches only its scope's own senders.
        creator = sess[0].member_id
        for scope_id in scope_ids:
            if (creator, scope_id) not in joined:
                await sess[0].request("leave", scopeId=scope_id)
        per_sender = max(1, max_sends // senders)
        env.progress.phase("throughput", per_sender * senders)
        statements_before = await _statements(env)
        cpu.start()
        t0 = time.monotonic()
        deadline = t0 + duration_s

        async def sender(i: int, s: Session) -> None:
            target = f"scope:{scope_ids[i % scopes]}"
            pauses = random.Random(f"{env.seed}-{i}")
            for k in range(per_sender):
                if pace_ms > 0:
                    await trio.sleep(pauses.expovariate(1000.0 / pace_ms))
                start = time.perf_counter_ns()
                try:
                    # No per-request timeout: the phase's own deadline bounds it.
                    result = await s.request(
                        "send",
                        None,
                        target=target,
                        content=f"tp {i} {k} {CONTENT_PAD}",
                        clientMessageId=f"tp-{env.seed}-{i}-{k}",
                    )
                except RequestError as e:
                    errors[e.code] += 1
                    if not e.retryable:
                        return
                    continue
                lat.record_ns(time.perf_counter_ns() - start)
                states[str(result.get("state"))] += 1
                counts[i] += 1
                if time.monotonic() > deadline:
                    return

        async with trio.open_nursery() as outer:
            outer.start_soon(_show, env, counts)
            with trio.move_on_after(duration_s + env.timeout_s):
                async with trio.open_nursery() as nursery:
                    for i, s in enumerate(sess):
                        nursery.start_soon(sender, i, s)
            elapsed = time.monotonic() - t0
            outer.cancel_scope.cancel()
        cpu.stop()
        statements_after = await _statements(env)
    env.progress.close()
    total = sum(counts)
    results = {
        "senders": senders,
        "scopes": scopes,
        "sends": total,
        "elapsed_s": round(elapsed, 3),
        "sends_per_s": round(total / elapsed, 1) if elapsed else 0.0,
        "pace_ms": pace_ms,
        "states": dict(states),
        "errors": dict(errors),
        "latency": lat.summary(),
        # The node's group-commit statements over the run (None: no committer).
        "statements": (
            statements_after - statements_before
            if statements_after is not None and statements_before is not None
            else None
        ),
    }
    return WorkloadResult(results, cpu, [lat])


async def _statements(env: Env) -> int | None:
    value = (await node_gauges(env.host_port[1])).get("group_commit_statements")
    return None if value is None else int(value)


async def _show(env: Env, counts: list[int]) -> None:
    while True:
        env.progress.update(sum(counts))
        await trio.sleep(0.1)
