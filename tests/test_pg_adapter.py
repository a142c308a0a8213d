"""The trio-native psycopg adapter and pool against a real PostgreSQL.

The robustness contract: queries, transactions, error translation,
cancellation, a killed backend, concurrent use of one connection,
LISTEN/NOTIFY and pool exhaustion all behave, and the pool keeps working.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import psycopg
import pytest
import trio
import trio.testing
from psycopg import errors as pg_errors
from psycopg import pq

from storage.errors import (
    ConstraintViolation,
    DatabaseUnavailable,
    QueryCanceled,
    SerializationFailure,
    StorageError,
    UniqueViolation,
    map_errors,
    translate,
)
from storage.pg import TrioConnection, connect
from storage.pool import Pool, open_pool

IDLE = pq.TransactionStatus.IDLE


@pytest.fixture
async def conn(empty_database_url: str) -> AsyncIterator[TrioConnection]:
    connection = await connect(empty_database_url, autocommit=True)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def pool(empty_database_url: str) -> AsyncIterator[Pool]:
    async with open_pool(empty_database_url, size=2, acquire_timeout=5.0) as pool:
        yield pool


async def fetch_value(conn: TrioConnection, query: str) -> object:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def test_basic_query_with_parameters(conn: TrioConnection) -> None:
    cur = await conn.execute("SELECT %s::int + 1, %s::text", (41, "ok"))
    assert await cur.fetchall() == [(42, "ok")]


async def test_cursor_and_pipeline_mode(conn: TrioConnection) -> None:
    async with conn.cursor() as cur:
        await cur.execute("SELECT generate_series(1, 3)")
        assert [row[0] for row in await cur.fetchall()] == [1, 2, 3]
    async with conn.pipeline():
        first = await conn.execute("SELECT 1")
        second = await conn.execute("SELECT 2")
    assert await first.fetchone() == (1,)
    assert await second.fetchone() == (2,)


async def test_large_statement_that_fills_the_socket_buffer(conn: TrioConnection) -> None:
    # Far more than a socket buffer: libpq must wait for writability while
    # staying ready to read (the RW wait).
    payload = "x" * (16 * 1024 * 1024)
    cur = await conn.execute("SELECT length(%s)", (payload,))
    assert await cur.fetchone() == (len(payload),)


async def test_transaction_commits_and_rolls_back(conn: TrioConnection) -> None:
    await conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
    async with conn.transaction():
        await conn.execute("INSERT INTO items VALUES (1)")

    async def insert_then_fail() -> None:
        async with conn.transaction():
            await conn.execute("INSERT INTO items VALUES (2)")
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        await insert_then_fail()
    assert await fetch_value(conn, "SELECT array_agg(id) FROM items") == [1]


async def test_unique_violation_is_translated_and_connection_stays_usable(pool: Pool) -> None:
    async with pool.connection() as conn:
        async with conn.transaction():
            await conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
            await conn.execute("INSERT INTO items VALUES (1)")
        with pytest.raises(UniqueViolation) as caught, map_errors():
            async with conn.transaction():
                await conn.execute("INSERT INTO items VALUES (1)")
        assert caught.value.code == "conflict"
        assert caught.value.constraint == "items_pkey"
        assert not caught.value.retryable
        assert isinstance(caught.value.__cause__, pg_errors.UniqueViolation)
        assert conn.info.transaction_status == IDLE
        assert await fetch_value(conn, "SELECT count(*) FROM items") == 1


async def test_cancel_mid_query_returns_quickly_and_leaves_connection_usable(
    conn: TrioConnection,
) -> None:
    started = time.monotonic()
    with trio.move_on_after(0.2) as scope:
        await conn.execute("SELECT pg_sleep(10)")
    assert scope.cancelled_caught
    assert time.monotonic() - started < 3.0
    assert not conn.closed
    assert await fetch_value(conn, "SELECT 1") == 1


async def test_cancel_inside_transaction_then_pool_keeps_working(pool: Pool) -> None:
    started = time.monotonic()
    with trio.move_on_after(0.2):
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_sleep(10)")
    assert time.monotonic() - started < 3.0
    with trio.move_on_after(0.2):
        async with pool.connection() as conn:
            await conn.execute("SELECT pg_sleep(10)")  # implicit transaction
    async with pool.connection() as conn:
        assert conn.info.transaction_status == IDLE
        assert await fetch_value(conn, "SELECT 1") == 1
    stats = pool.statistics()
    assert (stats.in_use, stats.waiting) == (0, 0)


async def test_terminated_backend_raises_unavailable_and_pool_replaces_it(
    pool: Pool, conn: TrioConnection
) -> None:
    async with pool.connection() as victim:
        victim_pid = victim.info.backend_pid
        await conn.execute("SELECT pg_terminate_backend(%s, 5000)", (victim_pid,))
        with pytest.raises(DatabaseUnavailable) as caught, map_errors():
            await victim.execute("SELECT 1")
        assert caught.value.code == "unavailable"
        assert caught.value.retryable
    async with pool.connection() as replacement:
        assert replacement.info.backend_pid != victim_pid
        assert await fetch_value(replacement, "SELECT 1") == 1


async def test_connection_dropped_while_idle_is_not_handed_out(
    empty_database_url: str, conn: TrioConnection
) -> None:
    async with open_pool(empty_database_url, size=1) as pool:
        async with pool.connection() as first:
            first_pid = first.info.backend_pid
        await conn.execute("SELECT pg_terminate_backend(%s, 5000)", (first_pid,))
        async with pool.connection() as second:
            assert second.info.backend_pid != first_pid
            assert await fetch_value(second, "SELECT 1") == 1


async def test_concurrent_tasks_on_one_connection_are_serialised(conn: TrioConnection) -> None:
    results: list[int] = []

    async def query(value: int) -> None:
        cur = await conn.execute("SELECT %s::int, pg_sleep(0.002)", (value,))
        row = await cur.fetchone()
        assert row is not None
        results.append(row[0])

    async with trio.open_nursery() as nursery:
        for value in range(20):
            nursery.start_soon(query, value)
    assert sorted(results) == list(range(20))


async def test_listen_notify_delivers_a_notification(conn: TrioConnection, pool: Pool) -> None:
    await conn.execute("LISTEN scopenode_test")
    received: list[psycopg.Notify] = []

    async def receive_one() -> None:
        async with aclosing(conn.notifies(timeout=10.0, stop_after=1)) as notifies:
            received.extend([notify async for notify in notifies])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_one)
        async with pool.connection() as sender, sender.transaction():
            await sender.execute("SELECT pg_notify('scopenode_test', 'hello')")
    assert [(n.channel, n.payload) for n in received] == [("scopenode_test", "hello")]


async def test_pool_acquire_timeout_raises_unavailable(empty_database_url: str) -> None:
    async with open_pool(empty_database_url, size=1, acquire_timeout=0.2) as pool:
        async with pool.connection():
            with pytest.raises(DatabaseUnavailable):
                async with pool.connection():
                    pass  # pragma: no cover - never acquired
            assert pool.statistics().in_use == 1
        stats = pool.statistics()
        assert (stats.size, stats.idle, stats.in_use, stats.waiting) == (1, 1, 0, 0)


async def test_pool_hands_an_idle_connection_over_without_a_scheduler_pass(
    empty_database_url: str,
) -> None:
    """A free slot and an idle connection: the borrow neither waits nor yields.
    Borrowers that must wait are served in arrival order."""
    async with open_pool(empty_database_url, size=1, acquire_timeout=5.0) as pool:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
        borrow = pool.connection()
        with trio.testing.assert_no_checkpoints():
            again = await borrow.__aenter__()
        try:
            assert again is conn
        finally:
            await borrow.__aexit__(None, None, None)
        order: list[str] = []

        async def borrower(name: str) -> None:
            async with pool.connection():
                order.append(name)

        async with trio.open_nursery() as nursery, pool.connection():
            for name in ("first", "second", "third"):
                nursery.start_soon(borrower, name)
                await trio.testing.wait_all_tasks_blocked()
            assert pool.statistics().waiting == 3
        assert order == ["first", "second", "third"]


async def test_pool_with_unreachable_server_raises_unavailable(tmp_path: object) -> None:
    dsn = f"host={tmp_path} port=1 user=nobody dbname=nothing"
    async with open_pool(dsn, size=1, acquire_timeout=5.0) as pool:
        with pytest.raises(DatabaseUnavailable):
            async with pool.connection():
                pass  # pragma: no cover - never connected
        assert pool.statistics().in_use == 0


@pytest.mark.parametrize(
    ("error", "expected", "code", "retryable"),
    [
        (pg_errors.UniqueViolation("dup"), UniqueViolation, "conflict", False),
        (pg_errors.ForeignKeyViolation("fk"), ConstraintViolation, "constraint_violation", False),
        (
            pg_errors.SerializationFailure("race"),
            SerializationFailure,
            "serialization_failure",
            True,
        ),
        (
            pg_errors.DeadlockDetected("deadlock"),
            SerializationFailure,
            "serialization_failure",
            True,
        ),
        (pg_errors.QueryCanceled("timeout"), QueryCanceled, "canceled", True),
        (pg_errors.AdminShutdown("terminated"), DatabaseUnavailable, "unavailable", True),
        (pg_errors.TooManyConnections("full"), DatabaseUnavailable, "unavailable", True),
        (psycopg.OperationalError("connection refused"), DatabaseUnavailable, "unavailable", True),
        (pg_errors.UndefinedTable("no table"), StorageError, "storage_error", False),
    ],
)
def test_translate_maps_psycopg_errors(
    error: psycopg.Error, expected: type[StorageError], code: str, retryable: bool
) -> None:
    translated = translate(error)
    assert type(translated) is expected
    assert (translated.code, translated.retryable) == (code, retryable)


async def test_a_started_statement_runs_before_its_result_is_read(conn: TrioConnection) -> None:
    """start_prepared sends from synchronous code; finish_started reads the
    result, and the connection is usable again after it."""
    from storage.pg import Prepared

    stmt = Prepared(b"t_started_v1", b"SELECT pg_notify($1, $2)", (0, 0))
    listener = await connect(conn.info.dsn, autocommit=True)
    try:
        await listener.execute("LISTEN t_started")
        # Not yet prepared on this connection: nothing is sent.
        assert not conn.start_prepared(stmt, (b"t_started", b"early"))
        await conn.run_prepared(stmt, (b"t_started", b"prepared"))
        assert conn.start_prepared(stmt, (b"t_started", b"early"))
        # Busy until its result is read: a second start is refused.
        assert not conn.start_prepared(stmt, (b"t_started", b"twice"))
        await conn.finish_started()
        async with aclosing(listener.notifies(timeout=2.0, stop_after=2)) as notifies:
            payloads = [notify.payload async for notify in notifies]
        assert payloads == ["prepared", "early"]
        assert await conn.run_prepared(stmt, (b"t_started", b"after")) == [("",)]
    finally:
        await listener.close()
