"""reconnect-storm: N sessions drop and reconnect with ``hello.resume`` at once.

Phase 1: N reader sessions (over a few human members) join one scope and see
a few warm-up messages. Phase 2: every session drops; the sender posts
``gap`` messages. Phase 3: all N reconnect at the same moment with
``resume = {scope: last seen seq}``; the bench records, per session, the
time from the storm's start to ``resumed`` and checks that the replayed
``message`` events are exactly the missed seqs (no gap, no duplicate).
"""

from __future__ import annotations

import time
from typing import Any

import trio

from bench.client import open_session
from bench.stats import Latency
from bench.workloads.common import Env, WorkloadResult, create_channel, open_sessions

WARMUP = 3


class _Tracker:
    """The seqs of ``scope`` one session saw, and when it saw ``resumed``."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.seqs: list[int] = []
        self.resumed_at: int | None = None
        self.resumed: dict[str, Any] = {}
        self.resumed_event = trio.Event()
        self.want_seq = 0
        self.caught_up = trio.Event()

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def want(self, seq: int) -> None:
        """Set ``caught_up`` once a message with ``seq`` or later arrived."""
        self.want_seq = seq
        if self.last_seq >= seq:
            self.caught_up.set()

    def on_event(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "message" and frame.get("scopeId") == self.scope:
            self.seqs.append(int(frame["message"]["seq"]))
            if self.want_seq and self.last_seq >= self.want_seq:
                self.caught_up.set()
        elif kind == "resumed":
            self.resumed_at = time.perf_counter_ns()
            self.resumed = frame.get("scopes", {}).get(self.scope, {})
            self.resumed_event.set()


async def run(env: Env, *, sessions: int, gap: int) -> WorkloadResult:
    ws = await env.workspace("bench-reconnect")
    [sender] = await env.members(ws, "human", "bench-rc-sender", 1)
    members = await env.members(ws, "human", "bench-rc-reader", min(sessions, env.members_cap))
    tokens = [members[i % len(members)].token for i in range(sessions)]
    cpu = env.cpu_window()
    lat = Latency("time_to_resumed")
    async with open_session(env.url(ws), sender.token, kind="browser") as snd:
        scope = await create_channel(snd, f"bench-reconnect-{env.seed}")
        first = [_Tracker(scope) for _ in range(sessions)]
        env.progress.phase("sessions", sessions)
        handlers = [t.on_event for t in first]
        async with open_sessions(
            env.url(ws), tokens, kind="browser", progress=env.progress, handlers=handlers
        ) as ss:
            for m in {s.member_id: s for s in ss}.values():
                await m.request("join", scopeId=scope)
            latest = 0
            for i in range(WARMUP):
                r = await snd.request("send", target=f"scope:{scope}", content=f"warm {i}",
                                      clientMessageId=f"rc-w-{env.seed}-{i}")  # fmt: skip
                latest = int(r["acceptedSeq"])
            with trio.move_on_after(env.timeout_s):
                for t in first:
                    t.want(latest)
                    await t.caught_up.wait()
        env.progress.close()
        # Every session is now closed: post the messages they will miss.
        for i in range(gap):
            r = await snd.request("send", target=f"scope:{scope}", content=f"missed {i}",
                                  clientMessageId=f"rc-g-{env.seed}-{i}")  # fmt: skip
            latest = int(r["acceptedSeq"])
        seen = [t.last_seq for t in first]
        second = [_Tracker(scope) for _ in range(sessions)]
        failures: list[str] = []
        go = trio.Event()
        done = trio.Event()
        storm_start = 0
        all_resumed_ns = 0
        env.progress.phase("reconnect", sessions)
        resumed_count = 0
        all_back = trio.Event()

        def settled() -> None:
            if resumed_count + len(failures) >= sessions:
                all_back.set()

        async def reconnect(i: int) -> None:
            nonlocal resumed_count
            await go.wait()
            tr = second[i]
            try:
                async with open_session(
                    env.url(ws), tokens[i], kind="browser", resume={scope: seen[i]},
                    on_event=tr.on_event, connect_timeout=env.timeout_s,
                ):  # fmt: skip
                    await tr.resumed_event.wait()
                    resumed_count += 1
                    env.progress.update(resumed_count)
                    settled()
                    await done.wait()
            except Exception as e:  # one failed session is a result, not a crash
                failures.append(f"{type(e).__name__}: {e}"[:200])
                settled()

        cpu.start()
        with trio.move_on_after(env.timeout_s):
            async with trio.open_nursery() as nursery:
                for i in range(sessions):
                    nursery.start_soon(reconnect, i)
                await trio.sleep(0.1)
                storm_start = time.perf_counter_ns()
                go.set()
                await all_back.wait()
                all_resumed_ns = time.perf_counter_ns() - storm_start
                done.set()
        cpu.stop()
    env.progress.close()
    gaps = dups = 0
    for i, tr in enumerate(second):
        if tr.resumed_at is not None:
            lat.record_ns(tr.resumed_at - storm_start)
        expected = list(range(seen[i] + 1, min(latest, seen[i] + 200) + 1))
        got = [q for q in tr.seqs if q > seen[i]]
        dups += len(got) - len(set(got))
        gaps += len(set(expected) - set(got))
    results = {
        "sessions": sessions,
        "missed_per_session": gap,
        "resumed": sum(1 for t in second if t.resumed_at is not None),
        "failed": len(failures),
        "failures": failures[:5],
        "time_to_all_resumed_ms": round(all_resumed_ns / 1e6, 3) if resumed_count else None,
        "gaps": gaps,
        "duplicates": dups,
        "ok": gaps == 0 and dups == 0 and not failures,
        "time_to_resumed": lat.summary(),
    }
    return WorkloadResult(results, cpu, [lat])
