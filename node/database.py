"""Where the node's PostgreSQL comes from: a URL, or the embedded server."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import psycopg
import structlog
import trio

from storage import schema
from storage.embedded import EmbeddedPostgres
from storage.pg import TrioConnection

log = structlog.get_logger(__name__)

DATABASE_URL_ENV = "DATABASE_URL"


def database_url_from_env() -> str | None:
    """The database named by ``DATABASE_URL``; None (embedded) when unset or empty."""
    return os.environ.get(DATABASE_URL_ENV) or None


@asynccontextmanager
async def open_database(data_dir: Path, database_url: str | None) -> AsyncIterator[str]:
    """A DSN with the schema applied; an embedded server lives for the block if needed."""
    embedded: EmbeddedPostgres | None = None
    if database_url:
        dsn = database_url
    else:
        await trio.to_thread.run_sync(partial(data_dir.mkdir, parents=True, exist_ok=True))
        embedded = EmbeddedPostgres(data_dir)
        dsn = await trio.to_thread.run_sync(embedded.start)
    try:
        applied = await trio.to_thread.run_sync(migrate, dsn)
        if applied:
            log.info("schema_migrated", versions=applied)
        yield dsn
    finally:
        if embedded is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(embedded.stop)


def migrate(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return schema.migrate(conn)


def verify(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return schema.verify(conn)


async def autocommit(conn: TrioConnection) -> None:
    await conn.set_autocommit(True)
