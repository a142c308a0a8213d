"""Typed storage errors: the only database exceptions that leave ``storage/``.

psycopg exceptions are translated here at the layer boundary (STYLE.md
principle 5) so that callers outside ``storage/`` never import psycopg. Every
error carries a stable ``code`` (safe to log and to put in metrics or client
error frames) and ``retryable``: whether running the same transaction again
may succeed without any change by the caller.

Translation is by SQLSTATE where the server gave one, and by exception class
for client-side failures (refused connection, lost socket), which have none.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

__all__ = [
    "ConstraintViolation",
    "DatabaseUnavailable",
    "EmbeddedPostgresError",
    "QueryCanceled",
    "SerializationFailure",
    "StorageError",
    "UniqueViolation",
    "map_errors",
    "translate",
]


class StorageError(Exception):
    """A storage failure; the base of every error raised by ``storage/``.

    ``code`` is stable and low-cardinality; ``retryable`` says whether the
    same operation may succeed if simply tried again.
    """

    code: str = "storage_error"
    retryable: bool = False

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class DatabaseUnavailable(StorageError):
    """The database cannot be reached: refused, lost, terminated, shutting
    down, too many connections, or no pooled connection became free in time.
    The dependency's fault; retry later."""

    code = "unavailable"
    retryable = True


class UniqueViolation(StorageError):
    """A unique or primary-key constraint rejected the write (``constraint``
    names it when the server reported it). The caller's conflict."""

    code = "conflict"
    retryable = False

    def __init__(
        self, message: str, *, sqlstate: str | None = None, constraint: str | None = None
    ) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.constraint = constraint


class ConstraintViolation(StorageError):
    """A foreign-key, check, not-null or exclusion constraint rejected the
    write (``constraint`` names it when known). Usually a bug or a race with a
    delete; not retryable as is."""

    code = "constraint_violation"
    retryable = False

    def __init__(
        self, message: str, *, sqlstate: str | None = None, constraint: str | None = None
    ) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.constraint = constraint


class SerializationFailure(StorageError):
    """The transaction lost a serialization race or a deadlock and was rolled
    back by the server; run the whole transaction again."""

    code = "serialization_failure"
    retryable = True


class QueryCanceled(StorageError):
    """The statement was cancelled (statement_timeout or a cancel request)."""

    code = "canceled"
    retryable = True


class EmbeddedPostgresError(StorageError):
    """The embedded PostgreSQL server could not be located, created, started
    or stopped. The message says what the operator can do about it."""

    code = "embedded_postgres"
    retryable = False


# Server-side SQLSTATEs meaning "the server went away or will not serve us".
_UNAVAILABLE_SQLSTATES = frozenset(
    {
        "57P01",  # admin_shutdown (also pg_terminate_backend)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up / shutting down)
        "57P04",  # database_dropped
        "53300",  # too_many_connections
    }
)
_SERIALIZATION_SQLSTATES = frozenset({"40001", "40P01"})  # serialization, deadlock
_CONSTRAINT_SQLSTATES = frozenset({"23503", "23514", "23502", "23P01"})


def translate(exc: psycopg.Error) -> StorageError:
    """Return the StorageError that stands for ``exc`` (not raised, not chained)."""
    sqlstate = exc.sqlstate
    message = _message(exc)
    constraint = exc.diag.constraint_name if sqlstate else None
    if sqlstate == "23505":
        return UniqueViolation(message, sqlstate=sqlstate, constraint=constraint)
    if sqlstate in _CONSTRAINT_SQLSTATES:
        return ConstraintViolation(message, sqlstate=sqlstate, constraint=constraint)
    if sqlstate in _SERIALIZATION_SQLSTATES:
        return SerializationFailure(message, sqlstate=sqlstate)
    if sqlstate == "57014":
        return QueryCanceled(message, sqlstate=sqlstate)
    if _is_unavailable(exc):
        return DatabaseUnavailable(message, sqlstate=sqlstate)
    return StorageError(message, sqlstate=sqlstate)


@contextmanager
def map_errors() -> Iterator[None]:
    """Re-raise psycopg errors raised in the block as StorageError subclasses.

    A plain (sync) context manager so it also wraps ``await`` expressions in
    async code. Only ``psycopg.Error`` is caught: cancellation and every other
    exception pass through untouched.
    """
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc


def _is_unavailable(exc: psycopg.Error) -> bool:
    sqlstate = exc.sqlstate
    if sqlstate is not None:
        return sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES
    # Client-side failures carry no SQLSTATE: connection refused, socket lost,
    # "the connection is closed", connect timeout. All are OperationalError.
    return isinstance(exc, pg_errors.OperationalError)


def _message(exc: psycopg.Error) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
