"""Baseline (a): the raw database send transaction, no node.

One statement per transaction (autocommit), the shape of the Applier's send:
bump the scope's ``latest_seq`` and insert the message with that seq. When the
node exposes ``storage.applier.RAW_SEND_BASELINE_SQL`` and
``storage.applier.prepare_baseline(conn) -> params`` those are used; until
then an equivalent CTE runs against a private scratch schema
(``bench_baseline``) that never touches the node's tables.

The driver is the node's own (``storage.pg.connect``: psycopg on trio). If
that module is not importable, psycopg's asyncio connection runs the same
measurement on a worker thread and the result says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.stats import Latency

SCRATCH_SETUP = (
    "CREATE SCHEMA IF NOT EXISTS bench_baseline",
    "CREATE TABLE IF NOT EXISTS bench_baseline.scopes ("
    " id bigint PRIMARY KEY, latest_seq bigint NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS bench_baseline.messages ("
    " scope_id bigint NOT NULL, seq bigint NOT NULL, content text NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope_id, seq))",
    "TRUNCATE bench_baseline.messages",
    "UPDATE bench_baseline.scopes SET latest_seq = 0",
)
SCRATCH_SCOPES = (
    "INSERT INTO bench_baseline.scopes (id) SELECT g FROM generate_series(1, %s) AS g"
    " ON CONFLICT (id) DO NOTHING"
)
SCRATCH_SEND = (
    "WITH s AS (UPDATE bench_baseline.scopes SET latest_seq = latest_seq + 1"
    " WHERE id = %s RETURNING id, latest_seq)"
    " INSERT INTO bench_baseline.messages (scope_id, seq, content)"
    " SELECT id, latest_seq, %s FROM s RETURNING seq"
)
CONTENT = "baseline send " + "x" * 180
# The scratch tables live in a database of their own so the node's schema
# (checked by ``scopenode db verify``) never sees them.
SCRATCH_DB = "scopenode_bench"


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


# Positional for the scratch statement, by name for the node's.
Params = tuple[Any, ...] | dict[str, Any]
Execute = Callable[[str, Params], Awaitable[Any]]


def _node_statement() -> tuple[str, Any] | None:
    """``(RAW_SEND_BASELINE_SQL, prepare_baseline)`` if the node exposes them."""
    try:
        applier = importlib.import_module("storage.applier")
    except ImportError:
        return None
    sql = getattr(applier, "RAW_SEND_BASELINE_SQL", None)
    prepare = getattr(applier, "prepare_baseline", None)
    if not isinstance(sql, str) or prepare is None:
        return None
    return sql, prepare


def _settle_statement() -> tuple[str, Callable[[Params], tuple[Any, ...]]] | None:
    """How to mark the baseline's outbox rows delivered, if the node says."""
    try:
        applier = importlib.import_module("storage.applier")
    except ImportError:
        return None
    sql = getattr(applier, "BASELINE_SETTLE_SQL", None)
    params = getattr(applier, "baseline_settle_params", None)
    if not isinstance(sql, str) or params is None:
        return None
    return sql, params


async def _settle(execute: Execute, params: Params) -> None:
    """Leave no pending outbox rows behind for the node's worker to replay
    while a later phase is measured (outside every timed window)."""
    settle = _settle_statement()
    if settle is not None:
        sql, of = settle
        await execute(sql, of(params))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _Measure:
    """The driver-independent measurement; ``connect`` yields ``(execute, close)``."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[tuple[Execute, Callable[[], Awaitable[None]], Any]]],
        plan: DbPlan,
        gather: Callable[[list[Callable[[], Awaitable[None]]]], Awaitable[None]],
    ) -> None:
        self.connect = connect
        self.plan = plan
        self.gather = gather
        self.node = _node_statement()

    async def _params(self, conn: Any, scope: int) -> tuple[str, Params]:
        if self.node is not None:
            sql, prepare = self.node
            params: Params = await _maybe_await(prepare(conn))
            return sql, params
        return SCRATCH_SEND, (scope, CONTENT)

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        execute, close, raw = await self.connect()
        try:
            if self.node is None:
                for stmt in SCRATCH_SETUP:
                    await execute(stmt, ())
                await execute(SCRATCH_SCOPES, (max((*plan.concurrency, 1)) + 1,))
            sql, params = await self._params(raw, 1)
            seq = Latency("raw_tx_sequential")
            deadline = time.monotonic() + plan.duration_s
            t0 = time.perf_counter()
            n = 0
            for _ in range(plan.sequential):
                s = time.perf_counter_ns()
                await execute(sql, params)
                seq.record_ns(time.perf_counter_ns() - s)
                n += 1
                if time.monotonic() > deadline:
                    break
            seq_elapsed = time.perf_counter() - t0
            if self.node is not None:
                await _settle(execute, params)
        finally:
            await close()
        out: dict[str, Any] = {
            "statement": "storage.applier.RAW_SEND_BASELINE_SQL" if self.node else "scratch CTE",
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
        conns = [await self.connect() for _ in range(c)]
        # Each scope is created before the clock starts; workers i and j share
        # one when i // per_scope == j // per_scope.
        per_scope = max(1, self.plan.per_scope)
        scoped = [
            await self._params(raw, i + 2)
            for i, (_e, _c, raw) in enumerate(conns[: -(-c // per_scope)])
        ]
        prepared = [scoped[i // per_scope] for i in range(c)]
        counts = [0] * c
        start = time.monotonic()
        deadline = start + self.plan.duration_s
        stop = [0.0] * c

        def worker(i: int) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                execute = conns[i][0]
                sql, params = prepared[i]
                for _ in range(self.plan.max_per_worker):
                    s = time.perf_counter_ns()
                    await execute(sql, params)
                    lat.record_ns(time.perf_counter_ns() - s)
                    counts[i] += 1
                    if time.monotonic() > deadline:
                        break
                stop[i] = time.monotonic()

            return run

        try:
            await self.gather([worker(i) for i in range(c)])
            if self.node is not None:
                for (execute, _c, _r), (_sql, params) in zip(conns, scoped, strict=False):
                    await _settle(execute, params)
        finally:
            for _e, close, _r in conns:
                await close()
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


async def _trio_gather(fns: list[Callable[[], Awaitable[None]]]) -> None:
    async with trio.open_nursery() as nursery:
        for fn in fns:
            nursery.start_soon(fn)


async def _asyncio_gather(fns: list[Callable[[], Awaitable[None]]]) -> None:
    await asyncio.gather(*(fn() for fn in fns))


def scratch_dsn(dsn: str) -> str:
    """``dsn`` pointed at the scratch database, created if missing (blocking)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (SCRATCH_DB,))
        if found.fetchone() is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(f'CREATE DATABASE "{SCRATCH_DB}"')
    params = conninfo_to_dict(dsn)
    params["dbname"] = SCRATCH_DB
    return make_conninfo("", **params)


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
    if _node_statement() is None:
        dsn = await trio.to_thread.run_sync(scratch_dsn, dsn)
    try:
        pg = importlib.import_module("storage.pg")
    except ImportError:
        pg = None
    if pg is not None and hasattr(pg, "connect"):

        async def connect_trio() -> tuple[Execute, Callable[[], Awaitable[None]], Any]:
            conn = await pg.connect(dsn, autocommit=True)

            async def execute(sql: str, params: Params) -> Any:
                return await conn.execute(sql, params)

            async def close() -> None:
                await _maybe_await(conn.close())

            return execute, close, conn

        result = await _Measure(connect_trio, plan, _trio_gather).run()
        result["driver"] = "storage.pg (psycopg on trio)"
        return result

    def in_thread() -> dict[str, Any]:
        return asyncio.run(_measure_asyncio(dsn, plan))

    result = await trio.to_thread.run_sync(in_thread)
    result["driver"] = "psycopg AsyncConnection on asyncio (storage.pg not available)"
    return result


async def _measure_asyncio(dsn: str, plan: DbPlan) -> dict[str, Any]:
    async def connect() -> tuple[Execute, Callable[[], Awaitable[None]], Any]:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)

        async def execute(sql: str, params: Params) -> Any:
            return await conn.execute(sql, params)

        return execute, conn.close, conn

    return await _Measure(connect, plan, _asyncio_gather).run()
