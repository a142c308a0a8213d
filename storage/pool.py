"""A small trio pool of TrioConnections (``storage/pg.py``).

Connections are opened lazily and handed out for a block
(``async with pool.connection()``) or kept by a long-lived owner
(:meth:`Pool.keep`, a commit lane or the cluster relay). Whatever comes back
is rolled back to IDLE or closed, never handed out half-way through a
transaction; idle connections are checked without a round trip before reuse.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import psycopg
import structlog
import trio
from psycopg import pq
from psycopg.waiting import Wait

from storage.errors import DatabaseUnavailable, translate
from storage.pg import TrioConnection, connect, ready_now

log = structlog.get_logger(__name__)

# How long the pool may spend rolling back a returned connection.
RESET_TIMEOUT = 5.0

_IDLE = pq.TransactionStatus.IDLE
_INTRANS = pq.TransactionStatus.INTRANS
_INERROR = pq.TransactionStatus.INERROR
_CONN_OK = pq.ConnStatus.OK


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a Pool: ``size`` is the configured maximum; ``in_use``
    counts connections handed out (or being opened for a caller); ``waiting``
    counts callers blocked for a free slot."""

    size: int
    idle: int
    in_use: int
    waiting: int


class Pool:
    """A small trio pool of TrioConnections.

    Connections are opened lazily (autocommit off) up to ``size``.
    ``connection()`` waits for a free one for at most ``acquire_timeout``
    seconds (opening included), then raises ``DatabaseUnavailable``; a
    connection that cannot be opened also raises ``DatabaseUnavailable``.
    ``configure`` runs on every new connection before first use (a
    transaction it leaves open is committed).

    On return a connection goes back to the pool only if it is healthy and
    idle: an open or failed transaction is rolled back (shielded, bounded by
    ``RESET_TIMEOUT``), anything else (closed, broken, a statement still
    running) is closed and replaced on demand. Idle connections are checked
    without a round trip before reuse, so connections the server dropped
    while idle are replaced rather than handed out.
    """

    def __init__(
        self,
        dsn: str,
        *,
        size: int = 8,
        acquire_timeout: float = 10.0,
        configure: Callable[[TrioConnection], Awaitable[None]] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("pool size must be at least 1")
        self._dsn = dsn
        self._size = size
        self._acquire_timeout = acquire_timeout
        self._configure = configure
        self._slots = trio.Semaphore(size)
        self._idle: deque[TrioConnection] = deque()
        self._waiting = 0
        self._closed = False

    def connection(self) -> AbstractAsyncContextManager[TrioConnection]:
        """``async with pool.connection() as conn``: borrow a connection."""
        return self._borrow()

    @asynccontextmanager
    async def _borrow(self) -> AsyncIterator[TrioConnection]:
        conn = await self._acquire()
        try:
            yield conn
        finally:
            await self._release(conn)

    async def keep(self) -> TrioConnection:
        """Borrow a connection for a long-lived owner (a commit lane), which
        uses it statement after statement and returns it with :meth:`give_back`
        once it is no longer :func:`reusable`. It counts against ``size``."""
        return await self._acquire()

    async def give_back(self, conn: TrioConnection) -> None:
        """Return a connection taken with :meth:`keep` (rolled back or closed)."""
        await self._release(conn)

    async def aclose(self) -> None:
        """Close idle connections now and borrowed ones when they come back;
        later ``connection()`` calls raise ``DatabaseUnavailable``."""
        self._closed = True
        while self._idle:
            await self._idle.pop().close()

    def statistics(self) -> PoolStatistics:
        """A snapshot of the pool's occupancy."""
        return PoolStatistics(
            size=self._size,
            idle=len(self._idle),
            in_use=self._size - self._slots.value,
            waiting=self._waiting,
        )

    async def _acquire(self) -> TrioConnection:
        if self._closed:
            raise DatabaseUnavailable("the connection pool is closed")
        if self._idle and not self._waiting and self._slot_now():
            # A free slot and an idle connection: nothing to wait for, so no
            # deadline and no pass of the scheduler (the statement that follows
            # waits on its socket). Nobody waiting: no queue-jumping.
            return await self._check_out()
        with trio.move_on_after(self._acquire_timeout):
            self._waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
            return await self._check_out()
        raise DatabaseUnavailable(
            f"no database connection available within {self._acquire_timeout}s"
        )

    def _slot_now(self) -> bool:
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return False
        return True

    async def _check_out(self) -> TrioConnection:
        """A connection for the slot just taken; the slot is freed if none comes."""
        try:
            return await self._idle_or_new()
        except BaseException:
            self._slots.release()
            raise

    async def _idle_or_new(self) -> TrioConnection:
        while self._idle:
            conn = self._idle.pop()  # most recently used: warm statement cache
            if _looks_healthy(conn):
                return conn
            log.info("pg.connection_discarded", reason="dropped while idle")
            await conn.close()
        return await self._open()

    async def _open(self) -> TrioConnection:
        try:
            conn = await connect(self._dsn)
        except psycopg.Error as exc:
            raise DatabaseUnavailable(str(translate(exc))) from exc
        try:
            if self._configure is not None:
                await self._configure(conn)
                if conn.pgconn.transaction_status == _INTRANS:
                    await conn.commit()
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _release(self, conn: TrioConnection) -> None:
        try:
            if not self._closed and await _reset(conn):
                self._idle.append(conn)
            else:
                await conn.close()
        finally:
            self._slots.release()


def reusable(conn: TrioConnection) -> bool:
    """Whether a kept connection can run its owner's next statement as it is."""
    return _looks_healthy(conn)


def worth_keeping(conn: TrioConnection) -> bool:
    """Whether a connection that just answered may be kept for later, judged
    from its state alone: :func:`reusable` looks at the socket again before
    the next statement, so a poll here too would only repeat it."""
    pgconn = conn.pgconn
    return not conn.closed and pgconn.status == _CONN_OK and pgconn.transaction_status == _IDLE


def _looks_healthy(conn: TrioConnection) -> bool:
    """Whether an idle connection still looks usable, without a round trip.

    An idle connection has nothing to read unless the server sent a
    notification or parameter change, or said goodbye and closed: read what
    is there and look at the resulting state.
    """
    if not worth_keeping(conn):
        return False
    pgconn = conn.pgconn
    try:
        # A terminated backend first sends its FATAL message, then EOF: keep
        # reading while there is something to read (bounded: a live server
        # does not talk to an idle client for long).
        for _ in range(8):
            if not ready_now(pgconn.socket, Wait.R):
                break
            pgconn.consume_input()
    except (psycopg.Error, OSError):
        return False
    return pgconn.status == _CONN_OK


async def _reset(conn: TrioConnection) -> bool:
    """Bring a returned connection back to IDLE; False if it must be closed."""
    if conn.closed:
        log.info("pg.connection_discarded", reason="closed or broken")
        return False
    status = conn.pgconn.transaction_status
    if status == _IDLE:
        return True
    if status not in (_INTRANS, _INERROR):
        log.info("pg.connection_discarded", reason="unknown state")
        return False
    # Shielded: a caller that was cancelled still owes the pool a rollback.
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + RESET_TIMEOUT
        try:
            await conn.rollback()
        except psycopg.Error:
            log.info("pg.connection_discarded", reason="rollback failed")
            return False
    if scope.cancelled_caught or conn.closed or conn.pgconn.transaction_status != _IDLE:
        log.info("pg.connection_discarded", reason="rollback timed out")
        return False
    return True


@asynccontextmanager
async def open_pool(
    dsn: str,
    *,
    size: int = 8,
    acquire_timeout: float = 10.0,
    configure: Callable[[TrioConnection], Awaitable[None]] | None = None,
) -> AsyncIterator[Pool]:
    """A Pool for the duration of the block, closed (shielded) on exit."""
    pool = Pool(dsn, size=size, acquire_timeout=acquire_timeout, configure=configure)
    try:
        yield pool
    finally:
        with trio.CancelScope(shield=True):
            await pool.aclose()
