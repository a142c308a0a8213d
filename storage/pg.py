"""psycopg 3 driven natively from trio: a connection class (its pool is ``storage/pool.py``).

Theory of operation
-------------------
psycopg does all protocol work in generators that yield "wait for the socket
to become readable/writable" requests and are resumed with the readiness
state (``psycopg.generators``). ``AsyncConnection`` consumes them with asyncio
(``psycopg.waiting.wait_async``) and serialises callers with an
``asyncio.Lock``. ``TrioConnection`` keeps every piece of psycopg's logic and
swaps only the waiting: ``trio.lowlevel.wait_readable``/``wait_writable`` on
the connection's file descriptor, a ``trio.Lock``, trio-side name resolution
and connect/cancel loops. No asyncio event loop is ever needed.

Cancellation: a trio cancel while a statement runs must not leave the
connection half-way through the protocol. ``TrioConnection.wait`` therefore
sends a server-side cancel request and drains the interrupted generator
(shielded, bounded by ``CANCEL_TIMEOUT``); if that fails the connection is
closed, never handed back half-read. A connection whose transaction was
aborted by a cancel stays in the INERROR state until rolled back (the pool
does that on release).

psycopg private names used here (hence the ``>=3.3,<3.4`` pin; keep every such
touch in this module): ``psycopg.errors._WaitTimeout``,
``psycopg._conninfo_attempts.conninfo_attempts``,
``psycopg._conninfo_utils.gssapi_requested``,
``psycopg._capabilities.capabilities``, ``psycopg.abc.PQGen``/``PQGenConn``,
and the connection internals ``_connect_gen``, ``_cancel_gen``,
``_should_cancel``, ``_get_connection_params``, ``_autocommit``,
``_adapters`` and the ``lock`` attribute's type; for ``run_prepared``,
``psycopg._transformer.Transformer`` and ``psycopg.generators.execute``.
"""

from __future__ import annotations

import ipaddress
import math
import re
import select
import warnings
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import msgspec
import psycopg
import structlog
import trio
from psycopg import errors as e
from psycopg import pq
from psycopg._capabilities import capabilities
from psycopg._conninfo_attempts import conninfo_attempts
from psycopg._conninfo_utils import gssapi_requested
from psycopg._transformer import Transformer
from psycopg.abc import AdaptContext, ConnDict, ConnParam, PQGen, PQGenConn
from psycopg.abc import Transformer as AbcTransformer
from psycopg.adapt import AdaptersMap
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo
from psycopg.cursor_async import AsyncCursor
from psycopg.generators import execute as execute_gen
from psycopg.pq.abc import PGconn, PGresult
from psycopg.rows import AsyncRowFactory
from psycopg.types.json import set_json_loads
from psycopg.waiting import Ready, Wait

__all__ = [
    "CANCEL_TIMEOUT",
    "Prepared",
    "TrioConnection",
    "connect",
    "dsn_for_database",
    "ready_now",
]

log = structlog.get_logger(__name__)

RV = TypeVar("RV")

# How long a cancelled statement may take to be cancelled server-side and
# drained before the connection is given up and closed.
CANCEL_TIMEOUT = 5.0

_IDLE = pq.TransactionStatus.IDLE
_ACTIVE = pq.TransactionStatus.ACTIVE
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
# invalid_sql_statement_name: the server forgot a statement (DEALLOCATE ALL,
# DISCARD ALL run by someone else on this connection).
_NO_SUCH_STATEMENT = "26000"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A statement converted once at import: ``$n`` placeholders, fixed
    parameter types (OIDs), a server-side name. ``TrioConnection.run_prepared``
    prepares it on first use per connection and then only binds text
    parameters the caller already encoded: no query conversion, no adapter
    lookup, no cursor per call."""

    name: bytes
    sql: bytes
    types: tuple[int, ...]

    @classmethod
    def from_named(
        cls, name: str, sql: str, types: dict[str, int]
    ) -> tuple[Prepared, tuple[str, ...]]:
        """Convert ``%(name)s`` placeholders and ``%%`` escapes, as psycopg
        does; returns the statement and the parameter names in ``$n`` order (a
        repeated name is one parameter)."""
        order: list[str] = []

        def convert(match: re.Match[str]) -> str:
            key = match.group(1)
            if key is None:
                if match.group(0) != "%%":
                    raise ValueError(f"{name}: stray % in statement")
                return "%"
            if key not in order:
                order.append(key)
            return f"${order.index(key) + 1}"

        converted = re.sub(r"%\((\w+)\)s|%%|%", convert, sql)
        oids = tuple(types[key] for key in order)
        return cls(name.encode(), converted.encode(), oids), tuple(order)


# A text[] parameter's items, quoted as PostgreSQL's array input reads them.
_ARRAY_ITEM_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"'})


def text_param(value: object) -> bytes | None:
    """A parameter of a :class:`Prepared` statement in PostgreSQL's text format."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, timedelta):
        return f"{value.total_seconds()} seconds".encode()
    if isinstance(value, list | tuple | frozenset):
        quoted = ('"' + str(item).translate(_ARRAY_ITEM_ESCAPES) + '"' for item in value)
        return ("{" + ",".join(quoted) + "}").encode()
    return str(value).encode()


_POLL_MASKS = {
    Wait.R: select.POLLIN,
    Wait.W: select.POLLOUT,
    Wait.RW: select.POLLIN | select.POLLOUT,
}


# --- waiting on the socket --------------------------------------------------


def ready_now(fileno: int, state: Wait) -> int:
    """Readiness of ``fileno`` for ``state`` right now, without blocking."""
    poller = select.poll()
    poller.register(fileno, _POLL_MASKS[state])
    ready = 0
    for _, events in poller.poll(0):
        if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
            # Let libpq find out what went wrong by trying the operation.
            return int(state)
        if events & select.POLLIN:
            ready |= Ready.R
        if events & select.POLLOUT:
            ready |= Ready.W
    return ready


async def _wait_either(fileno: int) -> int:
    """Wait until ``fileno`` is readable or writable; return which.

    Rare path: libpq asks for both only when the socket buffer is full while
    sending (large statements, pipeline mode), so a small nursery is fine.
    """
    ready = 0
    failure: Exception | None = None

    async def watch(waiter: Callable[[int], Awaitable[None]], flag: int) -> None:
        nonlocal ready, failure
        try:
            await waiter(fileno)
        except (OSError, trio.ClosedResourceError) as exc:
            failure = exc
        else:
            ready |= flag
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, trio.lowlevel.wait_readable, Ready.R)
            nursery.start_soon(watch, trio.lowlevel.wait_writable, Ready.W)
    except BaseExceptionGroup as group:
        # An outer cancellation reaches both watchers; surface it as the
        # plain Cancelled every caller expects, not as a group.
        cancelled, others = group.split(trio.Cancelled)
        if others is None and cancelled is not None:
            raise _first_leaf(cancelled) from None
        raise
    if not ready and failure is not None:
        raise failure
    return ready


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _wait_ready(fileno: int, state: Wait, deadline: float) -> int:
    """Wait until ``fileno`` is ready for ``state``; 0 if ``deadline`` passed."""
    # A socket asked for writing is nearly always writable, and a poll is
    # much cheaper than a trip through the scheduler. With a deadline
    # (notifies(timeout=0)) this also makes "poll at least once" true.
    if (state & Wait.W or deadline != math.inf) and (ready := ready_now(fileno, state)):
        await trio.lowlevel.checkpoint_if_cancelled()
        return ready
    if deadline == math.inf:
        # Every statement waits here: a cancel scope per wait was a measurable
        # share of a send's CPU, and without a deadline it has nothing to do.
        return await _wait_state(fileno, state)
    with trio.move_on_at(deadline):
        return await _wait_state(fileno, state)
    return 0


async def _wait_state(fileno: int, state: Wait) -> int:
    if state == Wait.R:
        await trio.lowlevel.wait_readable(fileno)
        return Ready.R
    if state == Wait.W:
        await trio.lowlevel.wait_writable(fileno)
        return Ready.W
    if state == Wait.RW:
        return await _wait_either(fileno)
    raise e.InternalError(f"bad poll status: {state}")


async def _wait_gen(gen: PQGen[RV], fileno: int, timeout: float | None = None) -> RV:
    """Run a psycopg generator on a fixed fd (trio version of ``wait_async``).

    Raise ``psycopg.errors._WaitTimeout`` if ``timeout`` seconds pass first.
    """
    # Nothing has been sent yet: the cheapest moment to honour a cancel.
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        state = next(gen)
    except StopIteration as ex:
        await trio.lowlevel.cancel_shielded_checkpoint()
        return cast(RV, ex.value)
    deadline = math.inf if timeout is None else trio.current_time() + timeout
    try:
        while True:
            ready = await _wait_ready(fileno, state, deadline)
            if not ready:
                raise e._WaitTimeout("wait timeout expired")
            state = gen.send(Ready(ready))
    except StopIteration as ex:
        return cast(RV, ex.value)
    except (OSError, trio.ClosedResourceError) as ex:
        raise e.OperationalError("connection socket closed") from ex


async def _wait_conn_gen(gen: PQGenConn[RV], timeout: float | None = None) -> RV:
    """Run a psycopg connection generator, whose fd may change (connect, cancel)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        fileno, state = next(gen)
    except StopIteration as ex:
        await trio.lowlevel.cancel_shielded_checkpoint()
        return cast(RV, ex.value)
    deadline = math.inf if timeout is None else trio.current_time() + timeout
    try:
        while True:
            ready = await _wait_ready(fileno, state, deadline)
            if not ready:
                raise e._WaitTimeout("wait timeout expired")
            fileno, state = gen.send(Ready(ready))
    except StopIteration as ex:
        return cast(RV, ex.value)
    except (OSError, trio.ClosedResourceError) as ex:
        raise e.OperationalError("connection socket closed") from ex


# --- the connection ---------------------------------------------------------


class _Adapters:
    """psycopg's adapters, with ``json``/``jsonb`` read by msgspec: every
    message row carries a ``metadata`` document, and the standard library's
    parser was a visible share of reading a page of them."""

    connection = None  # an adaptation context of no connection

    def __init__(self) -> None:
        self.adapters = AdaptersMap(psycopg.adapters)
        set_json_loads(msgspec.json.decode, self)


_ADAPTERS = _Adapters()


class TrioConnection(psycopg.AsyncConnection[Any]):
    """A psycopg ``AsyncConnection`` that runs on trio instead of asyncio.

    Everything ``AsyncConnection`` offers works: ``execute``, ``cursor()``,
    ``transaction()``, ``pipeline()``, ``notifies()``, ``copy``, ``close``.
    Concurrent tasks using one connection are serialised by a ``trio.Lock``.
    Iterate ``notifies()`` inside ``contextlib.aclosing`` (or with
    ``stop_after``/``timeout``) so the lock is released by the task that took it.

    A trio cancellation during a statement cancels it server-side and leaves
    the connection either usable (possibly in a failed transaction, to be
    rolled back) or closed.
    """

    def __init__(self, pgconn: PGconn, row_factory: AsyncRowFactory[Any] | None = None):
        if row_factory is None:
            super().__init__(pgconn)
        else:
            super().__init__(pgconn, row_factory)
        # The base class uses an asyncio.Lock; every user only does
        # `async with self.lock`, which trio.Lock supports.
        self.lock = trio.Lock()  # type: ignore[assignment]
        # Names of the Prepared statements this session has prepared.
        self._prepared_here: set[bytes] = set()
        self._loader: AbcTransformer | None = None

    @classmethod
    async def connect(
        cls,
        conninfo: str = "",
        *,
        autocommit: bool = False,
        prepare_threshold: int | None = 5,
        context: AdaptContext | None = None,
        row_factory: AsyncRowFactory[Any] | None = None,
        cursor_factory: type[AsyncCursor[Any]] | None = None,
        **kwargs: ConnParam,
    ) -> TrioConnection:
        """Connect like ``AsyncConnection.connect`` (same arguments), on trio.

        Each host/address is tried in turn within libpq's ``connect_timeout``
        (psycopg's default when unset); unix-socket hosts (``host=/dir``) work.
        """
        params = await cls._get_connection_params(conninfo, **kwargs)
        timeout = timeout_from_conninfo(params)
        attempts = await _connection_attempts(params)
        conn: TrioConnection | None = None
        failures: list[tuple[e.Error, str]] = []
        for attempt in attempts:
            where = f"host: {attempt.get('host')!r}, port: {attempt.get('port')!r}"
            try:
                gen = cls._connect_gen(make_conninfo("", **attempt))
                conn = await _wait_conn_gen(gen, timeout=timeout)
            except e._WaitTimeout:
                failures.append((e.ConnectionTimeout("connection timeout expired"), where))
            except e.Error as ex:
                failures.append((ex, where))
            else:
                break
        if conn is None:
            raise _connect_failure(failures)

        _warn_unrequested_gssapi(conn, params)
        conn._autocommit = bool(autocommit)
        if row_factory:
            conn.row_factory = row_factory
        if cursor_factory:
            conn.cursor_factory = cursor_factory
        conn._adapters = AdaptersMap(context.adapters if context else _ADAPTERS.adapters)
        conn.prepare_threshold = prepare_threshold
        return conn

    async def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        """Consume ``gen`` on this connection's socket (``interval`` is unused:
        trio wakes us on readiness, no periodic polling is needed)."""
        try:
            return await _wait_gen(gen, self.pgconn.socket, timeout)
        except BaseException as exc:
            # Cancelled (or KeyboardInterrupt) mid-statement: the server is
            # still running it and the reply is still coming. Exceptions
            # (errors) leave the protocol in a consistent state by themselves.
            if not isinstance(exc, Exception) and self._statement_in_flight():
                await self._abort_statement(gen)
            raise

    async def run_prepared(
        self, stmt: Prepared, params: Sequence[bytes | None]
    ) -> list[tuple[Any, ...]]:
        """Run ``stmt`` with text-format ``params``; return its rows, decoded.

        The hot path of a send: one ``send_query_prepared`` and one wait, the
        connection's lock held throughout. Needs autocommit or an open
        transaction (it never issues BEGIN itself). A statement the server
        forgot is prepared again and retried once when no transaction is open.
        """
        async with self.lock:
            pgconn = self.pgconn
            if not self._autocommit and pgconn.transaction_status == _IDLE:
                raise e.ProgrammingError("run_prepared needs autocommit or a transaction")
            for attempt in (0, 1):
                if stmt.name not in self._prepared_here:
                    pgconn.send_prepare(stmt.name, stmt.sql, param_types=stmt.types)
                    self._check(await self.wait(execute_gen(pgconn)), _COMMAND_OK)
                    self._prepared_here.add(stmt.name)
                pgconn.send_query_prepared(stmt.name, params)
                results = await self.wait(execute_gen(pgconn))
                res = results[-1]
                if (
                    attempt == 0
                    and res.status == _FATAL_ERROR
                    and res.error_field(pq.DiagnosticField.SQLSTATE) == _NO_SUCH_STATEMENT.encode()
                ):
                    self._prepared_here.discard(stmt.name)
                    if pgconn.transaction_status == _IDLE:
                        continue
                self._check(results, _TUPLES_OK)
                loader = self._loader
                if loader is None:
                    loader = self._loader = Transformer(self)
                loader.set_pgresult(res)
                return loader.load_rows(0, res.ntuples, tuple)
        raise AssertionError("unreachable")

    def start_prepared(self, stmt: Prepared, params: Sequence[bytes | None]) -> bool:
        """Send ``stmt`` now, from synchronous code, without reading its result.

        For a connection one task owns (the relay's publisher): the statement
        leaves at once instead of when that task is next scheduled. It is sent
        only when the connection is idle, in autocommit and has ``stmt``
        prepared; otherwise nothing is sent and the answer is False. After
        True, nothing else may use the connection before :meth:`finish_started`.
        """
        if (
            self.closed
            or self.lock.locked()
            or not self._autocommit
            or stmt.name not in self._prepared_here
            or self.pgconn.transaction_status != _IDLE
        ):
            return False
        try:
            self.pgconn.send_query_prepared(stmt.name, params)
        except e.Error:
            return False
        with suppress(e.Error):
            # Non-blocking: whatever does not fit now goes in finish_started,
            # which also reports a broken connection.
            self.pgconn.flush()
        return True

    async def finish_started(self) -> None:
        """Read to the end the result of the statement :meth:`start_prepared` sent."""
        async with self.lock:
            self._check(await self.wait(execute_gen(self.pgconn)), _TUPLES_OK)

    def _check(self, results: list[PGresult], expected: pq.ExecStatus) -> None:
        for res in results:
            if res.status == _FATAL_ERROR:
                raise e.error_from_result(res, encoding=self.pgconn._encoding)
            if res.status != expected:
                raise e.InternalError(f"unexpected result status {res.status}")

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        """Ask the server to cancel the running statement (non-blocking on trio).

        Raise ``psycopg.errors.CancellationTimeout`` if the request is not
        delivered within ``timeout`` seconds.
        """
        if not self._should_cancel():
            return
        if capabilities.has_cancel_safe():
            try:
                await _wait_conn_gen(self._cancel_gen(), timeout=timeout or None)
            except e._WaitTimeout:
                raise e.CancellationTimeout("cancellation timeout expired") from None
        else:
            # libpq < 17 only has the blocking cancel: keep it off the loop.
            await trio.to_thread.run_sync(self.cancel)

    async def close(self) -> None:
        """Close the connection; tasks blocked on its socket get an error."""
        if self.closed:
            return
        self._forget_socket()
        await super().close()

    def _statement_in_flight(self) -> bool:
        return not self.closed and self.pgconn.transaction_status == _ACTIVE

    async def _abort_statement(self, gen: PQGen[Any]) -> None:
        """Cancel the statement server-side and read its reply to the end, so
        the connection is back in step; close the connection if that fails."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + CANCEL_TIMEOUT
            try:
                await self.cancel_safe(timeout=CANCEL_TIMEOUT)
                await _wait_gen(gen, self.pgconn.socket)
            except e.Error:
                pass  # normally QueryCanceled: the reply we expected
            except Exception as exc:
                log.warning("pg.cancel_failed", error=type(exc).__name__)
        if scope.cancelled_caught or self._statement_in_flight():
            log.warning("pg.connection_abandoned", reason="statement not cancelled in time")
            self._abandon()

    def _abandon(self) -> None:
        """Close without talking to the server (its state is unknown)."""
        if self.closed:
            return
        self._forget_socket()
        self.pgconn.finish()

    def _forget_socket(self) -> None:
        # The fd is about to be closed: wake any task blocked on it, or it
        # would wait forever (epoll silently drops closed fds).
        try:
            fileno = self.pgconn.socket
        except e.OperationalError:
            return
        trio.lowlevel.notify_closing(fileno)


async def _connection_attempts(params: ConnDict) -> list[ConnDict]:
    """psycopg's split of ``params`` into attempts (one per host/address).

    The sync version resolves host names with a blocking getaddrinfo(), so
    it runs in a worker thread; psycopg's async version would need asyncio.
    """
    hosts = str(params.get("host") or "")
    if all(_needs_no_lookup(host) for host in hosts.split(",")):
        return conninfo_attempts(params)
    return await trio.to_thread.run_sync(conninfo_attempts, params, abandon_on_cancel=True)


def _needs_no_lookup(host: str) -> bool:
    host = host.strip()
    return not host or host.startswith("/") or host[1:2] == ":" or _is_ip(host)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _connect_failure(failures: list[tuple[e.Error, str]]) -> e.Error:
    last = failures[-1][0]
    if len(failures) == 1:
        return last.with_traceback(None)
    lines = [str(last), "Multiple connection attempts failed. All failures were:"]
    lines.extend(f"- {where}: {error}" for error, where in failures)
    return type(last)("\n".join(lines), pgconn=last.pgconn)


def _warn_unrequested_gssapi(conn: TrioConnection, params: ConnDict) -> None:
    # Same warning as AsyncConnection.connect, for parity.
    used = capabilities.has_used_gssapi() and conn.pgconn.used_gssapi
    if used and not gssapi_requested(params):
        warnings.warn(
            "the connection was obtained using the GSSAPI relying on the"
            " 'gssencmode=prefer' libpq default; set 'gssencmode' explicitly",
            RuntimeWarning,
            stacklevel=3,
        )


async def connect(
    dsn: str, *, autocommit: bool = False, row_factory: AsyncRowFactory[Any] | None = None
) -> TrioConnection:
    """Open one TrioConnection (psycopg errors propagate untranslated).

    ``prepare_threshold`` keeps psycopg's default so hot statements get
    prepared server-side.
    """
    return await TrioConnection.connect(dsn, autocommit=autocommit, row_factory=row_factory)


def dsn_for_database(base_dsn: str, dbname: str) -> str:
    """``base_dsn`` (URL or key=value) pointed at ``dbname``, as key=value."""
    params = conninfo_to_dict(base_dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)
