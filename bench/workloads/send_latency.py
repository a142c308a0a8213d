"""send-latency: one agent session sends K messages sequentially to one scope.

Every send carries ``freshness`` with the frontier the agent has seen (its
own last accepted seq), so the node takes the agent path. Latency is
request sent → ``reply`` received.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import trio

from bench.client import open_session
from bench.stats import Latency
from bench.workloads.common import Env, WorkloadResult, create_channel

CONTENT_PAD = "x" * 120


async def run(env: Env, *, messages: int, duration_s: float) -> WorkloadResult:
    ws = await env.workspace("bench-latency")
    [agent] = await env.members(ws, "agent", "bench-lat-agent", 1)
    lat = Latency("send_latency")
    states: Counter[str] = Counter()
    cpu = env.cpu_window()
    async with open_session(env.url(ws), agent.token, capabilities=["freshness"]) as s:
        scope = await create_channel(s, f"bench-latency-{env.seed}")
        target_key, seen = scope, 0
        env.progress.phase("send-latency", messages)
        cpu.start()
        t0 = time.monotonic()
        deadline = t0 + duration_s
        sent = 0
        # One bound for the whole loop, none per request: a cancel scope per
        # send would be timed with it.
        with trio.fail_after(duration_s + env.timeout_s):
            for i in range(messages):
                fields: dict[str, Any] = {
                    "target": f"scope:{scope}",
                    "content": f"latency {i} {CONTENT_PAD}",
                    "clientMessageId": f"lat-{env.seed}-{i}",
                    "freshness": {"targetKey": target_key, "seenUpToSeq": seen},
                }
                start = time.perf_counter_ns()
                result = await s.request("send", None, **fields)
                lat.record_ns(time.perf_counter_ns() - start)
                state = str(result.get("state"))
                states[state] += 1
                target_key = str(result.get("targetKey", target_key))
                if state in ("sent", "already_sent"):
                    seen = int(result["acceptedSeq"])
                else:
                    seen = int(
                        result.get("needsRefreshUntilSeq") or result.get("latestSeq") or seen
                    )
                sent += 1
                env.progress.update(sent)
                if time.monotonic() > deadline:
                    break
        elapsed = time.monotonic() - t0
        cpu.stop()
    env.progress.close()
    results = {
        "sends": sent,
        "elapsed_s": round(elapsed, 3),
        "sends_per_s": round(sent / elapsed, 1) if elapsed else 0.0,
        "states": dict(states),
        "latency": lat.summary(),
    }
    return WorkloadResult(results, cpu, [lat])
