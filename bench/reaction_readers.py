"""Reader sessions of the reactions workload in processes of their own.

A reader in the reactors' process parses every ``reaction`` event between
the reactors' replies, so a reactor's measured round trip held the readers'
work too; browsers watching a channel run elsewhere. Each reader process
opens its sessions with the bench's lean client, joins the channel once per
member and records every ``reaction`` event it receives with the arrival
time (``time.perf_counter_ns``: ``CLOCK_MONOTONIC``, one clock for every
process of the machine). The parent keeps each reaction's request times in
order; a session receives the events of one reaction key in the order they
were sent, so its k-th event of a key answers the k-th request of that key.

Control on the pipe (parent → child): ``"count"`` (answered with the events
received so far), ``"stop"`` (answered with every arrival and the child's
CPU seconds, then the child exits). Child → parent first: ``("ready", error)``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import defaultdict
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import trio

from bench.stats import Latency, own_cpu_s
from bench.workloads.common import join_each_member, open_sessions

Key = tuple[str, str, str, str]  # message id, member id, emoji, op
SETUP_TIMEOUT_S = 60.0


def reaction_key(frame: dict[str, Any]) -> Key:
    return (
        str(frame.get("messageId")),
        str(frame.get("memberId")),
        str(frame.get("emoji")),
        str(frame.get("op")),
    )


def _child(url: str, tokens: list[str], scope_id: str, ctl: Connection) -> None:
    trio.run(_child_main, url, tokens, scope_id, ctl)


async def _child_main(url: str, tokens: list[str], scope_id: str, ctl: Connection) -> None:
    arrivals: list[tuple[int, Key, int]] = []

    def handler(session: int) -> Any:
        def on_event(frame: dict[str, Any]) -> None:
            if frame.get("type") == "reaction":
                arrivals.append((session, reaction_key(frame), time.perf_counter_ns()))

        return on_event

    handlers = [handler(i) for i in range(len(tokens))]
    try:
        async with open_sessions(url, tokens, kind="browser", handlers=handlers) as sessions:
            await join_each_member(sessions, scope_id)
            ctl.send(("ready", None))
            while await trio.to_thread.run_sync(ctl.recv) == "count":
                ctl.send(("count", len(arrivals)))
            ctl.send(("result", arrivals, own_cpu_s()))
    except Exception as e:  # reported, the parent fails the run
        ctl.send(("ready", repr(e)))


class ReaderProcesses:
    """The reader side of the reactions workload, in ``processes`` processes."""

    def __init__(self, url: str, tokens: Sequence[str], scope_id: str, processes: int) -> None:
        self.latency = Latency("reaction_delivery")
        self.cpu_s = 0.0
        self._sent: defaultdict[Key, list[int]] = defaultdict(list)
        self._pipes: list[Connection] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        ctx = multiprocessing.get_context("spawn")
        parts = [list(tokens[i::processes]) for i in range(processes)]
        for part in (p for p in parts if p):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(url, part, scope_id, child), daemon=True)
            proc.start()
            self._pipes.append(parent)
            self._procs.append(proc)

    async def ready(self) -> None:
        for pipe in self._pipes:
            kind, error = await self._ask(pipe, None)
            if kind != "ready" or error is not None:
                raise RuntimeError(f"reader process failed to start: {error}")

    def sent(self, key: Key, ns: int) -> None:
        self._sent[key].append(ns)

    def withdraw(self, key: Key) -> None:
        """The last request of ``key`` changed nothing: no event answers it."""
        if self._sent.get(key):
            self._sent[key].pop()

    async def arrived(self) -> int:
        total = 0
        for pipe in self._pipes:
            _, count = await self._ask(pipe, "count")
            total += int(count)
        return total

    async def wait_for(self, count: int, timeout_s: float) -> int:
        """Events received in all, once ``count`` arrived or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            arrived = await self.arrived()
            if arrived >= count or time.monotonic() > deadline:
                return arrived
            await trio.sleep(0.02)

    async def finish(self) -> int:
        """Stop the processes; record every delivery's latency; return how many."""
        delivered = 0
        for pipe in self._pipes:
            _, arrivals, cpu_s = await self._ask(pipe, "stop")
            self.cpu_s += float(cpu_s)
            delivered += self._match(arrivals)
        for proc in self._procs:
            await trio.to_thread.run_sync(proc.join, 5.0)
        return delivered

    def close(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()

    def _match(self, arrivals: list[tuple[int, Key, int]]) -> int:
        seen: defaultdict[tuple[int, Key], int] = defaultdict(int)
        matched = 0
        for session, key, ns in arrivals:
            k = seen[session, key]
            seen[session, key] = k + 1
            sent = self._sent.get(key)
            if sent is not None and k < len(sent):
                self.latency.record_ns(ns - sent[k])
                matched += 1
        return matched

    async def _ask(self, pipe: Connection, command: str | None) -> Any:
        if command is not None:
            pipe.send(command)
        with trio.fail_after(SETUP_TIMEOUT_S):
            ready = await trio.to_thread.run_sync(pipe.poll, SETUP_TIMEOUT_S)
        if not ready:
            raise RuntimeError("reader process did not answer")
        return pipe.recv()
