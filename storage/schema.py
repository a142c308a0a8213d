"""The one schema definition: bootstrap, migrations and verify all come from it.

Migrations are versioned SQL files shipped in this package and recorded in
``schema_migrations``. A fresh bootstrap is "apply every migration in order",
so bootstrap and migrations cannot diverge. ``verify`` builds a scratch copy
of the definition in a throw-away schema inside one rolled-back transaction
and compares the live catalog with it, so verify cannot diverge either.

These functions take a synchronous psycopg connection: they run from the CLI
and, at node start, in a worker thread.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from importlib import resources

import psycopg

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "initial", "schema_v1.sql"),
    (2, "default_channels", "schema_v2_default_channels.sql"),
    (3, "reactions", "schema_v3_reactions.sql"),
    (4, "edits", "schema_v4_edits.sql"),
    (5, "attachments", "schema_v5_attachments.sql"),
    (6, "sources", "schema_v6_sources.sql"),
    (7, "search", "schema_v7_search.sql"),
    (8, "search_scale", "schema_v8_search_scale.sql"),
    (9, "cjk_bigrams", "schema_v9_cjk_bigrams.sql"),
    (10, "cjk_partial", "schema_v10_cjk_partial.sql"),
    (11, "drop_author_index", "schema_v11_drop_author_index.sql"),
    (12, "steady_under_writes", "schema_v12_steady_under_writes.sql"),
    (13, "symbols", "schema_v13_symbols.sql"),
    (14, "growing_lookups", "schema_v14_growing_lookups.sql"),
    (15, "invites", "schema_v15_invites.sql"),
    (16, "avatar_color", "schema_v16_avatar_color.sql"),
    (17, "tasks", "schema_v17_tasks.sql"),
    (18, "services", "schema_v18_services.sql"),
    (19, "workflows", "schema_v19_workflows.sql"),
    (20, "schedules", "schema_v20_schedules.sql"),
    (21, "service_notification_cards", "schema_v21_service_notification_cards.sql"),
    (22, "rewind", "schema_v22_rewind.sql"),
)
_LOCK_KEY = 0x5C0_9E_0DE  # advisory lock serialising concurrent migrators
_BOOKKEEPING = "schema_migrations"

CREATE_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class SchemaError(Exception):
    """The database schema cannot be brought to, or does not match, the definition."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """The definition, read once per process: a node checks it at every start."""
    files = resources.files("storage")
    return tuple(
        Migration(version, name, files.joinpath(filename).read_text(encoding="utf-8"))
        for version, name, filename in MIGRATIONS
    )


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    """Apply the migrations the database lacks; return the versions applied."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(CREATE_BOOKKEEPING)
        rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
        done = {int(str(version)): str(checksum) for version, checksum in rows}
        for migration in migrations():
            if migration.version in done:
                if done[migration.version] != migration.checksum:
                    raise SchemaError(
                        f"migration {migration.version} ({migration.name}) was changed "
                        "after it was applied"
                    )
                continue
            conn.execute(migration.sql.encode())
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            applied.append(migration.version)
    return applied


def verify(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """Differences between the live ``public`` schema and the definition; empty when equal."""
    scratch = f"scopenode_verify_{os.getpid()}"
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL search_path = public")
        live = _snapshot(conn, "public")
        conn.execute(f"CREATE SCHEMA {scratch}".encode())
        conn.execute(f"SET LOCAL search_path = {scratch}, public".encode())
        for migration in migrations():
            conn.execute(migration.sql.encode())
        wanted = _snapshot(conn, scratch)
    drift = [f"missing: {item}" for item in sorted(wanted - live)]
    drift += [f"unexpected: {item}" for item in sorted(live - wanted)]
    return drift


_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
"""
_CONSTRAINTS = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s
"""
# An index is compared by its uniqueness and what follows USING in its
# definition (method, keys, operator classes, INCLUDE, predicate): the part
# before names the table with its schema, which differs between the live
# schema and the scratch one by design.
_INDEXES = """
SELECT c.relname, i.relname, x.indisunique, substr(d.def, strpos(d.def, ' USING '))
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
CROSS JOIN LATERAL pg_get_indexdef(i.oid) AS d(def)
JOIN pg_class c ON c.oid = x.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s
"""


def _snapshot(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> set[str]:
    items: set[str] = set()
    for table, column, type_, notnull, default, identity in conn.execute(_COLUMNS, (schema,)):
        if table == _BOOKKEEPING:
            continue
        null = "NOT NULL" if notnull else "NULL"
        items.add(f"column {table}.{column} {type_} {null} default={default!s} {identity!s}")
    for table, name, definition in conn.execute(_CONSTRAINTS, (schema,)):
        if table != _BOOKKEEPING:
            items.add(f"constraint {table}.{name} {definition}")
    for table, name, unique, definition in conn.execute(_INDEXES, (schema,)):
        if table != _BOOKKEEPING:
            items.add(f"index {table}.{name} unique={unique}{definition}")
    return items
