"""reactions: readers watch a channel while members add and remove reactions.

R reactor members and N reader sessions (spread over a few human members)
share one channel holding M messages. Reactor ``i`` toggles one emoji on the
messages in turn — add, then remove — sequentially, as its own WebSocket
session: request → ``reply`` is the reaction latency, request → the
``reaction`` event at a reader session the delivery latency. The reader
sessions run in ``--reader-processes`` processes of their own
(``bench.reaction_readers``; ``0``: in this process), so a reactor's round
trip does not wait behind the readers' parsing; every process reads the same
monotonic clock.

The raw baseline runs in the same run: the statements of ``storage.reactions``
(``REACT_ADD`` / ``REACT_REMOVE``, through its own ``react`` function, the one
the node's Applier calls) straight against the node's database, one
autocommit connection per reactor, for the same (member, message, emoji)
sequences, and with ``--relay-floor`` the bare relay too. The phases take
turns in ``ROUNDS`` rounds, the order rotated each round (raw, node, floor;
then node, floor, raw; …) so that every phase holds every place equally
often, and each round's node p50 over its raw and floor p50s is reported with
its spread over the rounds (median, min, max) beside the pooled figures.
Each op sequence ends with a remove, so every phase starts from messages
without reactions. Every phase is bounded by its count and by time.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import trio

from bench.baseline import NoDatabase, open_database
from bench.client import RequestError, Session
from bench.reaction_readers import Key, ReaderProcesses, reaction_key
from bench.relayfloor import (
    EMOJI,
    Reactors,
    RelayFloor,
    connect_reactors,
    open_relay_floor,
    run_ops,
)
from bench.stats import Latency, ratio_spread, rotated
from bench.workloads.common import (
    CpuWindow,
    Env,
    WorkloadResult,
    create_channel,
    join_each_member,
    open_sessions,
)

# Every phase takes every place in the order equally often (a Latin square
# over the rounds): a machine whose speed drifts favours none of them.
ROUNDS = 6
PHASES = ("raw", "node", "floor")
PINGS = 200
DRAIN_S = 5.0
CONTENT_PAD = "x" * 100

Op = tuple[str, str]  # (message id, "add" | "remove")


def op_sequence(worker: int, message_ids: Sequence[str], count: int) -> list[Op]:
    """``count`` ops (rounded up to whole add/remove pairs), starting at a
    message of its own so concurrent reactors spread over the messages."""
    ops: list[Op] = []
    for k in range((count + 1) // 2):
        message_id = message_ids[(worker + k) % len(message_ids)]
        ops += [(message_id, "add"), (message_id, "remove")]
    return ops


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class Deliveries:
    """Reader sessions in the reactors' process (``--reader-processes 0``):
    request-sent times by reaction, delivery latency on arrival."""

    def __init__(self) -> None:
        self.sent_ns: dict[Key, int] = {}
        self.latency = Latency("reaction_delivery")
        self.count = 0
        self.cpu_s = 0.0  # counted with the reactors' process
        self._want = 0
        self._reached = trio.Event()

    def sent(self, key: Key, ns: int) -> None:
        self.sent_ns[key] = ns

    def withdraw(self, key: Key) -> None:
        self.sent_ns.pop(key, None)

    async def arrived(self) -> int:
        return self.count

    async def wait_for(self, count: int, timeout_s: float) -> int:
        """Deliveries in all, once ``count`` arrived or ``timeout_s`` passed."""
        if self.count < count:
            self._want, self._reached = count, trio.Event()
            with trio.move_on_after(timeout_s):
                await self._reached.wait()
        return self.count

    async def finish(self) -> int:
        return self.count

    def on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("type") != "reaction":
            return
        key = reaction_key(frame)
        start = self.sent_ns.get(key)
        if start is not None:
            self.latency.record_ns(time.perf_counter_ns() - start)
            self.count += 1
            if self.count >= self._want:
                self._reached.set()


class RawReactions:
    """``storage.reactions.react`` on the node's database, one connection per reactor."""

    def __init__(self, reactors: Reactors) -> None:
        self.reactors = reactors
        self.latency = Latency("raw_reaction_statement")
        self.outcomes: Counter[str] = Counter()

    async def run_phase(self, ops: list[list[Op]], duration_s: float, latency: Latency) -> int:
        """The op sequences through the statements, timed into ``latency`` and
        into ``self.latency``."""

        async def one(i: int, message_id: str, op: str) -> None:
            outcome = await self.reactors.react(i, message_id, op)
            # A fenced-out or unreadable outcome wrote nothing: it would make
            # the baseline cheaper than the node's statement.
            if not (outcome.fenced and outcome.found and outcome.readable):
                self.outcomes["not_applied"] += 1
            else:
                self.outcomes["changed" if outcome.changed else "unchanged"] += 1

        done = await run_ops(ops, duration_s, latency, one)
        self.latency.hist.add(latency.hist)
        return done


async def _open_raw(
    stack: AsyncExitStack, dsn: str, scope_id: str, member_ids: list[str]
) -> RawReactions:
    reactors = await connect_reactors(dsn, scope_id, member_ids)
    stack.push_async_callback(reactors.close)
    return RawReactions(reactors)


async def run(
    env: Env,
    *,
    readers: int,
    reactors: int,
    messages: int,
    reactions: int,
    duration_s: float,
    database_url: str | None,
    baseline: bool = True,
    relay_floor: str | None = None,
) -> WorkloadResult:
    ws = await env.workspace("bench-reactions")
    reactor_members = await env.members(ws, "human", "bench-rx-reactor", reactors)
    reader_members = await env.members(
        ws, "human", "bench-rx-reader", max(1, min(readers, env.members_cap))
    )
    reader_tokens = [reader_members[i % len(reader_members)].token for i in range(readers)]
    reply_lat = Latency("reaction_reply")
    ping_lat = Latency("ping_round_trip")
    errors: Counter[str] = Counter()
    changed: Counter[str] = Counter()
    cpu: CpuWindow = env.cpu_window()
    per_round = max(2, reactions // (reactors * ROUNDS))
    phase_s = duration_s / ROUNDS
    rounds: list[dict[str, Any]] = []
    raw: RawReactions | None = None
    raw_skipped: str | None = None if baseline else "--no-baseline"
    node_elapsed = 0.0
    node_ops = 0
    cpu_node = 0.0
    cpu_gen = 0.0
    url = env.url(ws)
    async with AsyncExitStack() as stack:
        env.progress.phase("sessions", reactors + readers)
        rx = await stack.enter_async_context(
            open_sessions(url, [m.token for m in reactor_members], kind="browser")
        )
        scope = await create_channel(rx[0], f"bench-reactions-{env.seed}")
        for s in rx[1:]:
            await s.request("join", scopeId=scope)
        deliveries: Deliveries | ReaderProcesses
        if env.reader_processes > 0 and readers > 0:
            processes = ReaderProcesses(url, reader_tokens, scope, env.reader_processes)
            stack.callback(processes.close)
            await processes.ready()
            deliveries = processes
        else:
            deliveries = Deliveries()
            handlers = [deliveries.on_event] * readers
            rd = await stack.enter_async_context(
                open_sessions(
                    url, reader_tokens, kind="browser", progress=env.progress, handlers=handlers
                )
            )
            await join_each_member(rd, scope)
        env.progress.close()
        message_ids = []
        for i in range(messages):
            result = await rx[0].request(
                "send",
                target=f"scope:{scope}",
                content=f"react to me {i} {CONTENT_PAD}",
                clientMessageId=f"rx-{env.seed}-{i}",
            )
            message_ids.append(str(result["messageId"]))
        ops = [op_sequence(i, message_ids, per_round) for i in range(reactors)]
        if baseline:
            try:
                dsn = await stack.enter_async_context(
                    open_database(database_url, env.node.data_dir)
                )
                raw = await _open_raw(stack, dsn, scope, [s.member_id for s in rx])
            except NoDatabase as e:
                raw_skipped = str(e)
        floor: RelayFloor | None = None
        if relay_floor and raw is not None:
            floor = await open_relay_floor(
                stack,
                dsn,
                scope,
                [s.member_id for s in rx],
                readers,
                env.reader_processes,
                relay_floor,
            )
        # Joins and sends emit events to every reader: let them drain first.
        await trio.sleep(0.5)

        async def reactor(
            i: int, s: Session, deadline: float, counts: list[int], latency: Latency
        ) -> None:
            for message_id, op in ops[i]:
                key = (message_id, s.member_id, EMOJI, op)
                deliveries.sent(key, start := time.perf_counter_ns())
                try:
                    result = await s.request("react", messageId=message_id, emoji=EMOJI, op=op)
                except RequestError as e:
                    deliveries.withdraw(key)  # nothing changed: no event comes
                    errors[e.code] += 1
                    if not e.retryable:
                        return
                    continue
                latency.record_ns(time.perf_counter_ns() - start)
                counts[i] += 1
                changed[str(bool(result.get("changed")))] += 1
                if op == "remove" and time.monotonic() > deadline:
                    return

        async def ops_phase(
            runner: RawReactions | RelayFloor, label: str, key: str, count_key: str, r: int
        ) -> dict[str, Any]:
            """One round of the op sequences through the raw statement or the relay."""
            env.progress.phase(f"{label} {r + 1}/{ROUNDS}", 1)
            latency = Latency(f"{key}_round")
            p0 = time.monotonic()
            done = await runner.run_phase(ops, phase_s, latency)
            elapsed = time.monotonic() - p0
            env.progress.close()
            return {
                count_key: done,
                f"{key}_per_s": round(done / elapsed, 1) if elapsed else 0.0,
                f"{key}_p50_ms": latency.percentile_ms(50),
            }

        async def raw_phase(r: int, entry: dict[str, Any]) -> None:
            assert raw is not None
            entry.update(await ops_phase(raw, "raw statement", "raw", "raw_statements", r))

        async def node_phase(r: int, entry: dict[str, Any]) -> None:
            nonlocal node_elapsed, node_ops, cpu_node, cpu_gen
            env.progress.phase(f"reactions {r + 1}/{ROUNDS}", reactors * len(ops[0]))
            counts = [0] * reactors
            latency = Latency("node_round")
            expected_before = await deliveries.arrived()
            window = env.cpu_window()
            window.start()
            t0 = time.monotonic()
            deadline = t0 + phase_s
            with trio.move_on_after(phase_s + env.timeout_s):
                async with trio.open_nursery() as nursery:
                    for i, s in enumerate(rx):
                        nursery.start_soon(reactor, i, s, deadline, counts, latency)
            elapsed = time.monotonic() - t0
            window.stop()
            env.progress.close()
            reply_lat.hist.add(latency.hist)
            node_elapsed += elapsed
            node_ops += sum(counts)
            cpu_node += window.node_cpu_s or 0.0
            cpu_gen += window.generator_cpu_s
            # Every change reaches every reader session; wait for the tail.
            want = expected_before + sum(counts) * readers
            arrived = await deliveries.wait_for(want, DRAIN_S)
            entry.update(
                reactions=sum(counts),
                reactions_per_s=round(sum(counts) / elapsed, 1) if elapsed else 0.0,
                node_p50_ms=latency.percentile_ms(50),
                deliveries=arrived - expected_before,
                expected_deliveries=sum(counts) * readers,
            )
            # The bare round trip through the node, on a quiet channel: what
            # any request pays before its own work (no task, actor or database).
            for _ in range(PINGS):
                start = time.perf_counter_ns()
                await rx[0].ping()
                ping_lat.record_ns(time.perf_counter_ns() - start)

        async def floor_phase(r: int, entry: dict[str, Any]) -> None:
            assert floor is not None
            entry.update(
                await ops_phase(floor, "relay floor", "relay_floor", "relay_floor_reactions", r)
            )

        phases = {"raw": raw_phase, "node": node_phase, "floor": floor_phase}
        present = [name for name in PHASES if name == "node" or (raw if name == "raw" else floor)]
        for r in range(ROUNDS):
            order = rotated(present, r)
            entry: dict[str, Any] = {"round": r + 1, "order": order, "load_avg_1m": [_load()]}
            for name in order:
                await phases[name](r, entry)
            entry["load_avg_1m"].append(_load())
            rounds.append(entry)
        delivered = await deliveries.finish()
        floor_events = await floor.close() if floor is not None else 0
    cpu.generator_cpu_s = round(cpu_gen, 3)
    cpu.node_cpu_s = round(cpu_node, 3) if env.node.pid else None
    expected = sum(e["expected_deliveries"] for e in rounds)
    results: dict[str, Any] = {
        "readers": readers,
        "reactors": reactors,
        "messages": messages,
        "emoji": EMOJI,
        "reactions": node_ops,
        "elapsed_s": round(node_elapsed, 3),
        "reactions_per_s": round(node_ops / node_elapsed, 1) if node_elapsed else 0.0,
        "changed": dict(changed),
        "errors": dict(errors),
        "reply_latency": reply_lat.summary(),
        "delivery_latency": deliveries.latency.summary(),
        "ping_round_trip": ping_lat.summary(),
        "deliveries": delivered,
        "expected_deliveries": expected,
        "complete": delivered == expected and not errors,
        # Reader sessions in processes of their own (0: in the reactors' process).
        "reader_processes": env.reader_processes if isinstance(deliveries, ReaderProcesses) else 0,
        "reader_processes_cpu_s": round(deliveries.cpu_s, 3),
        "node_cpu_ms_per_reaction": (
            round(1000 * cpu_node / node_ops, 3) if env.node.pid and node_ops else None
        ),
        "rounds": rounds,
        "rounds_node_over_raw_p50": ratio_spread(rounds, "node_p50_ms", "raw_p50_ms"),
        "rounds_node_over_floor_p50": ratio_spread(rounds, "node_p50_ms", "relay_floor_p50_ms"),
    }
    latencies = [reply_lat, deliveries.latency, ping_lat]
    if raw is not None:
        results["raw_statement"] = {
            "statement": "storage.reactions.REACT_ADD / REACT_REMOVE (storage.reactions.react)",
            "concurrency": reactors,
            "outcomes": dict(raw.outcomes),
            "ok": raw.outcomes.get("not_applied", 0) == 0,
            **raw.latency.summary(),
        }
        latencies.append(raw.latency)
    else:
        results["raw_statement"] = {"skipped": raw_skipped}
    if floor is not None:
        results["relay_floor"] = {
            "events": relay_floor,
            "changed": floor.changed,
            "deliveries": floor_events,
            "expected_deliveries": floor.changed * readers,
            **floor.latency.summary(),
        }
        latencies.append(floor.latency)
    return WorkloadResult(results, cpu, latencies)
