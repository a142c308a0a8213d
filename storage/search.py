"""Search: the query over the projection, its readiness, and its rebuild.

docs/design.md#search. ``scope_message_search_docs`` holds one document per
live message (written by the send statement, updated by edits, removed by
deletes); migration 7 indexes it twice, a ``simple`` tsvector for words and
trigrams for substrings. A query is one statement: candidates from the indexes,
then the readable predicate of ``storage/visibility.py``, evaluated per row
with the viewer's rights in that row's scope, so a hit is exactly a message
``history`` would show the viewer.

Readiness lives in ``scope_message_search_state`` (scope key ``*``): a
workspace without a row is ready (every send projects its message), an import
that writes messages beside the send path marks it ``building``
(:func:`mark_building`) and :func:`rebuild` makes it ready again. A rebuild of
a ready workspace never touches its row and never deletes the document of a
live message: it only adds what is missing and rewrites what differs, so
searches running meanwhile see at least what they saw before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from actors.search_query import ParsedQuery, Term, TermKind
from storage.errors import map_errors
from storage.messages import MESSAGE_COLUMNS, ReadableMessage, message_from_row
from storage.pg import TrioConnection
from storage.visibility import READABLE_JOIN

Sort = Literal["recent", "relevance"]
MAX_LIMIT = 50
REBUILD_BATCH = 5000

READY = "read_ready"
BUILDING = "building"


class BadCursor(ValueError):
    """The cursor was not issued for this query."""


# ------------------------------------------------------------------ the query

# The predicate's per-scope parameters become columns of the viewer's candidate
# scopes, computed once per scope as scopes.viewer_for does (not once per row:
# the planner would plan that lookup again at every place the predicate uses it).
_RIGHTS = """
rights AS MATERIALIZED (
    SELECT
        sc.id AS scope_id,
        NOT %(viewer_private)s AND EXISTS (
            SELECT 1 FROM scope_memberships x
            WHERE x.scope_id = sc.id AND x.member_id = %(viewer_id)s
              AND x.visibility = 'public' AND x.effective_to_seq IS NULL
        ) AS viewer_public,
        sc.type = 'thread' AS in_thread,
        CASE WHEN sc.parent_scope_id IS NULL THEN ARRAY[sc.id]
             ELSE ARRAY[sc.id, sc.parent_scope_id] END AS grant_scopes
    FROM scopes sc
    WHERE sc.id IN (SELECT scope_id FROM scopes_in)
)"""
_PER_ROW = {
    "%(viewer_public)s": "sv.viewer_public",
    "%(in_thread)s": "sv.in_thread",
    "%(grant_scopes)s": "sv.grant_scopes",
}


def _readable_per_row() -> str:
    text = READABLE_JOIN
    for placeholder, column in _PER_ROW.items():
        assert placeholder in text, placeholder
        text = text.replace(placeholder, column)
    return text


READABLE_PER_ROW = _readable_per_row()

# Scopes where the viewer could read anything at all: a superset the index scan
# is narrowed to; the predicate decides each row. Private agents keep every
# interval (closed ones too) and the scopes their explicit context opens.
_SCOPES_IN = """
scopes_in AS (
    SELECT vm.scope_id FROM scope_memberships vm
    WHERE vm.member_id = %(viewer_id)s
      AND (vm.visibility = 'private' OR vm.effective_to_seq IS NULL)
    UNION
    SELECT t.id FROM scope_memberships pm
    JOIN scopes t ON t.parent_scope_id = pm.scope_id AND t.type = 'thread'
    WHERE NOT %(viewer_private)s AND pm.member_id = %(viewer_id)s
      AND pm.visibility = 'public' AND pm.effective_to_seq IS NULL
    UNION
    SELECT cx.source_scope_id FROM scope_message_sources cx
    WHERE %(viewer_private)s AND cx.context_member_id = %(viewer_id)s
)"""


# A workspace being built yields no hits, so a page with hits needs no separate
# readiness round trip; only an empty one asks (is_ready()).
_BUILDING = """
SELECT 1 FROM scope_message_search_state st
WHERE st.workspace_id = %(workspace_id)s AND st.scope_key = '*' AND NOT st.read_ready"""


@dataclass(frozen=True, slots=True)
class Filters:
    workspace_id: str
    scope_id: str | None = None
    author_id: str | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    readable: ReadableMessage
    rank: float


@dataclass(frozen=True, slots=True)
class Results:
    hits: list[Hit]
    next_cursor: str | None


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _tsquery(words: list[str]) -> str:
    # Word terms are letters only, so quoting cannot be escaped out of.
    return " & ".join(f"'{w}':*" for w in words)


def _term_condition(t: Term, name: str, params: dict[str, object]) -> str:
    if t.kind is TermKind.WORD:
        params[name] = _tsquery([t.text])
        return f"d.body_tsv @@ to_tsquery('simple', %({name})s)"
    params[name] = _like(t.text)
    return f"d.body ILIKE %({name})s"


def build_query(
    parsed: ParsedQuery,
    filters: Filters,
    viewer_params: dict[str, object],
    *,
    sort: Sort,
    limit: int,
    after: tuple[Any, ...] | None,
    raw: bool = False,
) -> tuple[str, dict[str, object]]:
    """The search statement and its parameters. ``raw`` leaves out the viewer
    (the bench's baseline: the same index work without the predicate)."""
    params: dict[str, object] = {"workspace_id": filters.workspace_id, "limit": limit + 1}
    params.update(viewer_params)
    where = ["d.workspace_id = %(workspace_id)s"]
    for i, t in enumerate(parsed.terms):
        where.append(_term_condition(t, f"t{i}", params))
    for i, t in enumerate(parsed.excluded):
        where.append(f"NOT ({_term_condition(t, f'x{i}', params)})")
    if filters.scope_id is not None:
        params["scope_id"] = filters.scope_id
        where.append("d.scope_id = %(scope_id)s")
    if filters.author_id is not None:
        params["author_id"] = filters.author_id
        where.append("d.author_member_id = %(author_id)s")
    if parsed.from_handles:
        params["handles"] = list(parsed.from_handles)
        where.append(
            "d.author_member_id IN (SELECT h.id FROM members h"
            " WHERE h.workspace_id = %(workspace_id)s AND h.handle = ANY(%(handles)s))"
        )
    if parsed.in_channels:
        params["channels"] = list(parsed.in_channels)
        where.append(
            "d.scope_id IN (SELECT cs.id FROM scope_channel_profiles cp"
            " JOIN scopes cs ON cs.id = cp.scope_id OR cs.parent_scope_id = cp.scope_id"
            " WHERE cp.workspace_id = %(workspace_id)s AND cp.slug = ANY(%(channels)s))"
        )
    words = [t.text for t in parsed.terms if t.kind is TermKind.WORD]
    if sort == "relevance" and words:
        params["rank_query"] = " | ".join(f"'{w}':*" for w in words)
        rank = "ts_rank(d.body_tsv, to_tsquery('simple', %(rank_query)s))"
    else:
        rank = "0::real"
    if sort == "relevance":
        order = f"{rank} DESC, d.created_at DESC, d.message_id DESC"
        key = f"({rank}, d.created_at, d.message_id)"
    else:
        order = "d.created_at DESC, d.message_id DESC"
        key = "(d.created_at, d.message_id)"
    if after is not None:
        params["after"] = after
        if sort == "relevance":
            where.append(f"{key} < (%(after_rank)s::real, %(after_at)s, %(after_id)s)")
            params.update(after_rank=after[0], after_at=after[1], after_id=after[2])
        else:
            where.append(f"{key} < (%(after_at)s, %(after_id)s)")
            params.update(after_at=after[0], after_id=after[1])
        del params["after"]
    if raw:
        statement = f"""
SELECT d.message_id, {rank}, d.created_at
FROM scope_message_search_docs d
WHERE {" AND ".join(where)}
ORDER BY {order}
LIMIT %(limit)s"""
        return statement, params
    statement = f"""
WITH {_SCOPES_IN},
{_RIGHTS}
SELECT {MESSAGE_COLUMNS}, {rank}
FROM scope_message_search_docs d
JOIN rights sv ON sv.scope_id = d.scope_id
JOIN scope_messages m ON m.id = d.message_id
JOIN members mem ON mem.id = m.author_member_id
{READABLE_PER_ROW}
WHERE {" AND ".join(where)}
  AND m.deleted_at IS NULL AND v.reason IS NOT NULL
  AND NOT EXISTS ({_BUILDING})
ORDER BY {order}
LIMIT %(limit)s"""
    return statement, params


def _fingerprint(query: str, filters: Filters, sort: Sort) -> str:
    basis = json.dumps([query, filters.scope_id, filters.author_id, sort])
    return hashlib.sha256(basis.encode()).hexdigest()[:12]


def encode_cursor(fingerprint: str, sort: Sort, last: Hit) -> str:
    message = last.readable.message
    key: list[object] = [message.created_at.isoformat(), message.id]
    if sort == "relevance":
        key.insert(0, last.rank)
    raw = json.dumps({"f": fingerprint, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, fingerprint: str, sort: Sort) -> tuple[Any, ...]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        body = json.loads(raw)
        key = body["k"]
        if body["f"] != fingerprint or len(key) != (3 if sort == "relevance" else 2):
            raise BadCursor("the cursor belongs to another query")
        at = datetime.fromisoformat(str(key[-2]))
        if at.tzinfo is None or not isinstance(key[-1], str):
            raise BadCursor("not a cursor")
        if sort == "relevance":
            return (float(key[0]), at, key[-1])
        return (at, key[-1])
    except BadCursor:
        raise
    except (binascii.Error, ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError):
        raise BadCursor("not a cursor") from None


async def search(
    conn: TrioConnection,
    query: str,
    parsed: ParsedQuery,
    filters: Filters,
    viewer_params: dict[str, object],
    *,
    sort: Sort = "recent",
    limit: int = 20,
    cursor: str | None = None,
) -> Results:
    """One page of readable hits, newest (or best ranked) first; none while the
    workspace is being built (:func:`is_ready` tells an empty page from that)."""
    fingerprint = _fingerprint(query, filters, sort)
    after = decode_cursor(cursor, fingerprint, sort) if cursor else None
    statement, params = build_query(
        parsed, filters, viewer_params, sort=sort, limit=limit, after=after
    )
    with map_errors():
        # Never prepared: a generic plan cannot tell a rare word (GIN bitmap, then
        # sort) from a common one (newest first, stop at the limit), and after a
        # few executions PostgreSQL may keep one for every term.
        cur = await conn.execute(statement, params, prepare=False)
        rows = await cur.fetchall()
    hits = [
        Hit(ReadableMessage(message_from_row(r), r[15], r[16]), float(r[-1])) for r in rows[:limit]
    ]
    more = len(rows) > limit
    return Results(hits, encode_cursor(fingerprint, sort, hits[-1]) if more else None)


# -------------------------------------------------------------- readiness


@dataclass(frozen=True, slots=True)
class Status:
    state: str  # read_ready or building
    indexed: int  # documents of the workspace
    messages: int  # live (not deleted) messages of the workspace

    def view(self) -> dict[str, object]:
        return {"state": self.state, "indexed": self.indexed, "messages": self.messages}


SELECT_READY = """
SELECT read_ready FROM scope_message_search_state
WHERE workspace_id = %s AND scope_key = '*'
"""
COUNT_INDEXED = "SELECT count(*) FROM scope_message_search_docs WHERE workspace_id = %s"
COUNT_LIVE = "SELECT count(*) FROM scope_messages WHERE workspace_id = %s AND deleted_at IS NULL"
# Only a ready projection may stop being ready by an import; a rebuild's own
# progress never clears read_ready (it never writes a ready row).
MARK_BUILDING = """
INSERT INTO scope_message_search_state
    (workspace_id, scope_key, migration_state, backfill_state, finalize_state, read_ready)
VALUES (%(workspace_id)s, '*', 'complete', %(backfill)s, %(finalize)s, false)
ON CONFLICT (workspace_id, scope_key) DO UPDATE
SET backfill_state = EXCLUDED.backfill_state, finalize_state = EXCLUDED.finalize_state,
    read_ready = false, updated_at = now()
WHERE NOT scope_message_search_state.read_ready OR %(force)s
"""
MARK_READY = """
INSERT INTO scope_message_search_state
    (workspace_id, scope_key, migration_state, backfill_state, finalize_state, read_ready)
VALUES (%s, '*', 'complete', 'complete', 'complete', true)
ON CONFLICT (workspace_id, scope_key) DO UPDATE
SET migration_state = 'complete', backfill_state = 'complete', finalize_state = 'complete',
    read_ready = true, updated_at = now()
"""
# One batch of the backfill, in global-seq order: every live message gets its
# document (the same row the send statement writes), a document whose body
# differs is rewritten, a deleted message's document goes. FOR SHARE makes a
# concurrent edit wait or be seen, so an old body never overwrites a new one.
BACKFILL_BATCH = """
WITH batch AS (
    SELECT m.id, m.workspace_id, m.scope_id, m.seq, m.author_member_id, m.content,
           m.created_at, m.deleted_at, m.workspace_global_seq
    FROM scope_messages m
    WHERE m.workspace_id = %(workspace_id)s AND m.workspace_global_seq > %(after)s
    ORDER BY m.workspace_global_seq
    LIMIT %(batch)s
    FOR SHARE
), written AS (
    INSERT INTO scope_message_search_docs
        (message_id, workspace_id, scope_id, seq, author_member_id, body, created_at)
    SELECT b.id, b.workspace_id, b.scope_id, b.seq, b.author_member_id, b.content, b.created_at
    FROM batch b WHERE b.deleted_at IS NULL
    ON CONFLICT (message_id) DO UPDATE SET body = EXCLUDED.body
    WHERE scope_message_search_docs.body IS DISTINCT FROM EXCLUDED.body
    RETURNING 1
), dropped AS (
    DELETE FROM scope_message_search_docs d USING batch b
    WHERE d.message_id = b.id AND b.deleted_at IS NOT NULL
    RETURNING 1
)
SELECT max(workspace_global_seq), count(*), (SELECT count(*) FROM written),
       (SELECT count(*) FROM dropped)
FROM batch
"""


async def is_ready(conn: TrioConnection, workspace_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(SELECT_READY, (workspace_id,))
        row = await cur.fetchone()
    return row is None or bool(row[0])


async def status(conn: TrioConnection, workspace_id: str) -> Status:
    ready = await is_ready(conn, workspace_id)
    with map_errors():
        indexed = await (await conn.execute(COUNT_INDEXED, (workspace_id,))).fetchone()
        live = await (await conn.execute(COUNT_LIVE, (workspace_id,))).fetchone()
    assert indexed is not None
    assert live is not None
    return Status(READY if ready else BUILDING, int(indexed[0]), int(live[0]))


async def mark_building(conn: TrioConnection, workspace_id: str, *, force: bool = True) -> None:
    """Before messages are written beside the send path (an import, a restore):
    search answers ``search_unavailable`` until :func:`rebuild` completes."""
    params = {
        "workspace_id": workspace_id,
        "backfill": "pending",
        "finalize": "pending",
        "force": force,
    }
    with map_errors():
        await conn.execute(MARK_BUILDING, params)


async def rebuild(
    conn: TrioConnection,
    workspace_id: str,
    *,
    batch: int = REBUILD_BATCH,
    progress: Callable[[int], None] | None = None,
) -> Status:
    """Backfill then finalize; the workspace is ``read_ready`` afterwards.

    ``conn`` is in autocommit: each batch commits alone, so a rebuild holds no
    long transaction and a stopped one is resumed by running it again.
    """
    if not await is_ready(conn, workspace_id):
        await _set_building(conn, workspace_id, "running", "pending")
    after = 0
    examined = 0
    while True:
        with map_errors():
            cur = await conn.execute(
                BACKFILL_BATCH, {"workspace_id": workspace_id, "after": after, "batch": batch}
            )
            row = await cur.fetchone()
        assert row is not None
        if not row[1]:
            break
        after = int(row[0])
        examined += int(row[1])
        if progress is not None:
            progress(examined)
    if not await is_ready(conn, workspace_id):
        await _set_building(conn, workspace_id, "complete", "running")
    with map_errors():
        # Fresh statistics, so the planner picks the text indexes for the new rows.
        await conn.execute("ANALYZE scope_message_search_docs")
        await conn.execute(MARK_READY, (workspace_id,))
    return await status(conn, workspace_id)


async def _set_building(
    conn: TrioConnection, workspace_id: str, backfill: str, finalize: str
) -> None:
    params = {
        "workspace_id": workspace_id,
        "backfill": backfill,
        "finalize": finalize,
        "force": False,
    }
    with map_errors():
        await conn.execute(MARK_BUILDING, params)
