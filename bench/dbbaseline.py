"""Baseline (a): the raw database send transaction, no node.

One autocommitted statement per transaction: the Applier's single-send writes
(``storage.send_baseline.RAW_SEND_BASELINE_SQL``: the fence, the message and its
realtime outbox row) on a workspace, member and scope of the worker's own,
committed through ``storage.send_baseline.run_baseline``: on the node's connection
type (psycopg on trio), through the prepared-statement call the node's own
sends take, with the parameters encoded once as the node encodes a send's. A
later speed-up of that path speeds the baseline up with it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import trio

from bench.stats import Latency
from storage import pg, send_baseline


@dataclass(frozen=True)
class DbPlan:
    sequential: int = 2000
    concurrency: tuple[int, ...] = (32,)
    duration_s: float = 5.0
    max_per_worker: int = 100_000
    # Workers per scope in the concurrent phase: 1 gives each its own scope;
    # 2 makes pairs share one, as the throughput workload's senders do when it
    # runs two senders per scope (they then wait on each other's row lock).
    per_scope: int = 1


@dataclass(frozen=True)
class _Worker:
    """One connection and the statement parameters of the scope it sends to."""

    conn: pg.TrioConnection
    params: dict[str, Any]
    values: list[bytes | None]

    @classmethod
    async def on_new_scope(cls, conn: pg.TrioConnection) -> _Worker:
        return cls.on(conn, await send_baseline.prepare_baseline(conn))

    @classmethod
    def on(cls, conn: pg.TrioConnection, params: dict[str, Any]) -> _Worker:
        return cls(conn, params, send_baseline.baseline_statement_values(params))

    async def send(self) -> None:
        await send_baseline.run_baseline(self.conn, self.values)

    async def settle(self) -> None:
        """Leave no pending outbox rows behind for the node's worker to replay
        while a later phase is measured (outside every timed window)."""
        await self.conn.execute(
            send_baseline.BASELINE_SETTLE_SQL, send_baseline.baseline_settle_params(self.params)
        )


class _Measure:
    def __init__(self, dsn: str, plan: DbPlan) -> None:
        self.dsn = dsn
        self.plan = plan

    async def _connect(self) -> pg.TrioConnection:
        return await pg.connect(self.dsn, autocommit=True)

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        conn = await self._connect()
        try:
            worker = await _Worker.on_new_scope(conn)
            seq = Latency("raw_tx_sequential")
            deadline = time.monotonic() + plan.duration_s
            t0 = time.perf_counter()
            n = 0
            for _ in range(plan.sequential):
                s = time.perf_counter_ns()
                await worker.send()
                seq.record_ns(time.perf_counter_ns() - s)
                n += 1
                if time.monotonic() > deadline:
                    break
            seq_elapsed = time.perf_counter() - t0
            await worker.settle()
        finally:
            await conn.close()
        out: dict[str, Any] = {
            "statement": "storage.send_baseline.RAW_SEND_BASELINE_SQL",
            "call": "storage.send_baseline.run_baseline",
            "driver": "storage.pg (psycopg on trio)",
            "sequential": {
                **seq.summary(),
                "tx_per_s": round(n / seq_elapsed, 1) if seq_elapsed else 0.0,
            },
            "concurrent": {},
        }
        for c in plan.concurrency:
            out["concurrent"][str(c)] = await self._concurrent(c)
        return out

    async def _concurrent(self, c: int) -> dict[str, Any]:
        lat = Latency(f"raw_tx_c{c}")
        conns = [await self._connect() for _ in range(c)]
        try:
            return await self._timed(c, conns, lat)
        finally:
            for conn in conns:
                await conn.close()

    async def _timed(self, c: int, conns: list[pg.TrioConnection], lat: Latency) -> dict[str, Any]:
        # Each scope is created before the clock starts; workers i and j share
        # one when i // per_scope == j // per_scope.
        per_scope = max(1, self.plan.per_scope)
        scoped = [
            await send_baseline.prepare_baseline(conn) for conn in conns[: -(-c // per_scope)]
        ]
        workers = [_Worker.on(conn, scoped[i // per_scope]) for i, conn in enumerate(conns)]
        counts = [0] * c
        start = time.monotonic()
        deadline = start + self.plan.duration_s
        stop = [0.0] * c

        async def run(i: int) -> None:
            worker = workers[i]
            for _ in range(self.plan.max_per_worker):
                s = time.perf_counter_ns()
                await worker.send()
                lat.record_ns(time.perf_counter_ns() - s)
                counts[i] += 1
                if time.monotonic() > deadline:
                    break
            stop[i] = time.monotonic()

        async with trio.open_nursery() as nursery:
            for i in range(c):
                nursery.start_soon(run, i)
        for worker in workers[::per_scope]:
            await worker.settle()
        elapsed = max(stop) - start if any(stop) else time.monotonic() - start
        total = sum(counts)
        return {
            "concurrency": c,
            "workers_per_scope": per_scope,
            "transactions": total,
            "elapsed_s": round(elapsed, 3),
            "tx_per_s": round(total / elapsed, 1) if elapsed else 0.0,
            **lat.summary(),
        }


def _checkpoint(dsn: str) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        # A role without the right to checkpoint measures without it.
        contextlib.suppress(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("CHECKPOINT")


async def checkpoint(dsn: str) -> None:
    """Flush the database server's dirty pages now (needs a superuser).

    Both phases of a comparison then start right after a checkpoint, paying
    the same full-page writes, instead of whichever one a timed or WAL-size
    checkpoint happens to land in.
    """
    await trio.to_thread.run_sync(_checkpoint, dsn)


async def measure_db(dsn: str, plan: DbPlan) -> dict[str, Any]:
    """Run baseline (a) against ``dsn``; returns sequential and concurrent figures."""
    return await _Measure(dsn, plan).run()
