"""contention: A agents send to one scope at once, each with freshness.

Each agent declares the ``freshness`` capability and sends with the frontier
it has seen; a ``held`` reply moves its frontier to ``needsRefreshUntilSeq``
(as a daemon would after refreshing) and it tries again. Afterwards the
scope's history is paged with ``afterSeq`` to verify seqs are exactly
``1..latestSeq`` (gap-free, unique) and that every ``sent`` message is there
once.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import trio

from bench.client import Session
from bench.stats import Latency
from bench.workloads.common import Env, WorkloadResult, create_channel, open_sessions


async def run(env: Env, *, agents: int, messages: int, duration_s: float) -> WorkloadResult:
    ws = await env.workspace("bench-contention")
    members = await env.members(ws, "agent", "bench-ct-agent", agents)
    lat = Latency("contention_send")
    states: Counter[str] = Counter()
    accepted: list[int] = []
    cpu = env.cpu_window()
    async with open_sessions(
        env.url(ws), [m.token for m in members], kind="daemon", capabilities=["freshness"]
    ) as sess:
        scope = await create_channel(sess[0], f"bench-contention-{env.seed}")
        for s in sess[1:]:
            await s.request("join", scopeId=scope)
        env.progress.phase("contention", agents * messages)
        cpu.start()
        t0 = time.monotonic()
        deadline = t0 + duration_s

        async def agent(i: int, s: Session) -> None:
            target_key, seen, sent = scope, 0, 0
            for attempt in range(messages * 20):
                if sent >= messages or time.monotonic() > deadline:
                    return
                start = time.perf_counter_ns()
                result = await s.request(
                    "send",
                    target=f"scope:{scope}",
                    content=f"contention agent {i} message {sent}",
                    clientMessageId=f"ct-{env.seed}-{i}-{sent}-{attempt}",
                    freshness={"targetKey": target_key, "seenUpToSeq": seen},
                )
                lat.record_ns(time.perf_counter_ns() - start)
                state = str(result.get("state"))
                states[state] += 1
                target_key = str(result.get("targetKey", target_key))
                if state == "sent":
                    accepted.append(int(result["acceptedSeq"]))
                    seen = int(result["acceptedSeq"])
                    sent += 1
                elif state == "partial_held":
                    accepted.extend(int(a["acceptedSeq"]) for a in result.get("accepted", []))
                    seen = int(result.get("needsRefreshUntilSeq") or seen)
                    sent += 1
                else:
                    seen = int(
                        result.get("needsRefreshUntilSeq") or result.get("latestSeq") or seen
                    )
                env.progress.update(len(accepted))

        with trio.move_on_after(duration_s + env.timeout_s):
            async with trio.open_nursery() as nursery:
                for i, s in enumerate(sess):
                    nursery.start_soon(agent, i, s)
        elapsed = time.monotonic() - t0
        cpu.stop()
        env.progress.close()
        verify = await verify_history(sess[0], scope, accepted)
    attempts = sum(states.values())
    results = {
        "agents": agents,
        "attempts": attempts,
        "elapsed_s": round(elapsed, 3),
        "states": dict(states),
        "sent_ratio": round(states["sent"] / attempts, 4) if attempts else 0.0,
        "held_ratio": round(states["held"] / attempts, 4) if attempts else 0.0,
        "verify": verify,
        "latency": lat.summary(),
    }
    return WorkloadResult(results, cpu, [lat])


async def verify_history(s: Session, scope: str, accepted: list[int]) -> dict[str, Any]:
    """Page the whole scope oldest-first; check seqs are 1..latest, gap-free and unique."""
    seqs: list[int] = []
    after = 0
    latest = 0
    for _ in range(100_000):
        page = await s.request("history", target=f"scope:{scope}", afterSeq=after, limit=200)
        latest = int(page.get("latestSeq", latest))
        msgs = page.get("messages", [])
        seqs.extend(int(m["seq"]) for m in msgs)
        after = max([after, int(page.get("coversThroughSeq") or 0), *(int(m["seq"]) for m in msgs)])
        if not page.get("hasMore") or not msgs:
            break
    unique = len(set(seqs)) == len(seqs)
    gap_free = sorted(set(seqs)) == list(range(1, latest + 1))
    accepted_ok = len(set(accepted)) == len(accepted) and set(accepted) <= set(seqs)
    return {
        "latest_seq": latest,
        "messages": len(seqs),
        "unique": unique,
        "gap_free": gap_free,
        "accepted_unique_and_present": accepted_ok,
        "ok": unique and gap_free and accepted_ok,
    }
