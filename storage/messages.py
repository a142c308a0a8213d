"""Reading messages: history pages, resume, idempotency lookups.

Every row passes the readable predicate of ``storage/visibility.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from actors.model import IdempotencyRecord, StoredMessage
from storage.directory import member_from_row
from storage.errors import map_errors
from storage.pg import TrioConnection
from storage.visibility import READABLE_JOIN, Viewer

CANDIDATE_BUDGET = 1000


def message_columns(reason: str, grant_id: str) -> str:
    """The columns ``message_from_row`` reads off ``m`` (the message) and
    ``mem`` (its author), with ``reason`` and ``grant_id`` as the readable
    predicate's answer."""
    return f"""
m.id, m.scope_id, m.seq, m.workspace_global_seq, m.message_type, m.content, m.created_at,
m.metadata, mem.id, mem.workspace_id, mem.type, mem.handle, mem.display_name,
mem.owner_member_id, mem.is_private, {reason}, {grant_id},
m.revision, m.edited_at, m.deleted_at
"""


# A message as the predicate ``v`` (storage/visibility.py) lets the viewer read it.
MESSAGE_COLUMNS = message_columns("v.reason", "v.grant_id")
# A message read without asking the predicate (no reason, no grant).
STORED_COLUMNS = message_columns("NULL", "NULL")

# Candidates are bounded first (newest-first below a seq, or oldest-first above
# one), then filtered by the predicate: a page may come back short or empty
# with candidate_budget_exhausted set, and the client pages on.
_PAGE = """
SELECT {columns}
FROM (
    SELECT * FROM scope_messages
    WHERE scope_id = %(scope_id)s AND seq > %(after)s AND seq < %(before)s
    ORDER BY seq {order}
    LIMIT %(budget)s
) m
JOIN members mem ON mem.id = m.author_member_id
{readable}
WHERE v.reason IS NOT NULL
ORDER BY m.seq {order}
LIMIT %(limit)s
"""
HISTORY_DESC = _PAGE.format(columns=MESSAGE_COLUMNS, order="DESC", readable=READABLE_JOIN)
HISTORY_ASC = _PAGE.format(columns=MESSAGE_COLUMNS, order="ASC", readable=READABLE_JOIN)
COUNT_CANDIDATES = """
SELECT count(*), max(seq), min(seq) FROM (
    SELECT seq FROM scope_messages
    WHERE scope_id = %(scope_id)s AND seq > %(after)s AND seq < %(before)s
    ORDER BY seq {order} LIMIT %(budget)s
) c
"""
FIND_IDEMPOTENT = """
SELECT id, seq, idempotency_payload_digest FROM scope_messages
WHERE scope_id = %s AND author_member_id = %s AND idempotency_subject_member_id = %s
  AND client_message_id = %s
"""
SELECT_MESSAGE = f"""
SELECT {STORED_COLUMNS}
FROM scope_messages m JOIN members mem ON mem.id = m.author_member_id
WHERE m.id = %s
"""

# One message through the readable predicate (read-checks, thread root context).
SELECT_READABLE = f"""
SELECT {MESSAGE_COLUMNS}
FROM scope_messages m
JOIN members mem ON mem.id = m.author_member_id
{READABLE_JOIN}
WHERE m.id = %(message_id)s AND m.scope_id = %(scope_id)s
"""
MESSAGE_IN_SCOPE = "SELECT 1 FROM scope_messages WHERE id = %s AND scope_id = %s"


@dataclass(frozen=True, slots=True)
class ReadableMessage:
    message: StoredMessage
    reason: str
    grant_id: str | None


@dataclass(frozen=True, slots=True)
class Page:
    messages: list[ReadableMessage]  # oldest first
    has_more: bool
    candidate_budget_exhausted: bool
    examined_low: int | None
    examined_high: int | None


def message_from_row(row: tuple[Any, ...]) -> StoredMessage:
    metadata = dict(row[7] or {})
    return StoredMessage(
        id=row[0],
        scope_id=row[1],
        seq=row[2],
        global_seq=row[3],
        author=member_from_row(row[8:15]),
        message_type=row[4],
        content=row[5],
        created_at=row[6],
        metadata=metadata,
        mentions=tuple(metadata.get("mentions", ())),
        revision=row[17],
        edited_at=row[18],
        deleted_at=row[19],
    )


async def page(
    conn: TrioConnection,
    scope_id: str,
    viewer: Viewer,
    *,
    after: int = 0,
    before: int | None = None,
    limit: int = 50,
    ascending: bool = False,
    budget: int = CANDIDATE_BUDGET,
) -> Page:
    """One page of readable messages in ``(after, before)``, returned oldest first."""
    budget = max(budget, limit)  # a page never examines fewer rows than it may return
    params: dict[str, object] = {
        "scope_id": scope_id,
        "after": after,
        "before": before if before is not None else 2**62,
        "budget": budget,
        "limit": limit,
        **viewer.params(),
    }
    order = "ASC" if ascending else "DESC"
    with map_errors():
        cur = await conn.execute(HISTORY_ASC if ascending else HISTORY_DESC, params)
        rows = await cur.fetchall()
        cur = await conn.execute(COUNT_CANDIDATES.format(order=order), params)
        count_row = await cur.fetchone()
    assert count_row is not None
    examined, high, low = count_row
    found = [ReadableMessage(message_from_row(r), r[15], r[16]) for r in rows]
    exhausted = examined >= budget and len(found) < limit
    if len(found) == limit:
        # Everything between the page edge and the start was examined.
        edge = found[-1].message.seq
        low, high = (low, edge) if ascending else (edge, high)
    if not ascending:
        found.reverse()
    has_more = len(found) == limit or exhausted
    return Page(found, has_more, exhausted, low, high)


async def find_idempotent(
    conn: TrioConnection, scope_id: str, author_id: str, client_message_id: str
) -> IdempotencyRecord | None:
    with map_errors():
        cur = await conn.execute(
            FIND_IDEMPOTENT, (scope_id, author_id, author_id, client_message_id)
        )
        row = await cur.fetchone()
    return IdempotencyRecord(row[0], row[1], bytes(row[2])) if row else None


async def get_message(conn: TrioConnection, message_id: str) -> StoredMessage | None:
    with map_errors():
        cur = await conn.execute(SELECT_MESSAGE, (message_id,))
        row = await cur.fetchone()
    return message_from_row(row) if row else None


async def message_in_scope(conn: TrioConnection, scope_id: str, message_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(MESSAGE_IN_SCOPE, (message_id, scope_id))
        return await cur.fetchone() is not None


async def readable_message(
    conn: TrioConnection, scope_id: str, message_id: str, viewer: Viewer
) -> ReadableMessage | None:
    """The message if it is in ``scope_id`` and the viewer may read it, else None."""
    params = {"scope_id": scope_id, "message_id": message_id, **viewer.params()}
    with map_errors():
        cur = await conn.execute(SELECT_READABLE, params)
        row = await cur.fetchone()
    if row is None or row[15] is None:
        return None
    return ReadableMessage(message_from_row(row), row[15], row[16])


# Reply threads of the given roots: the thread's latest seq is its reply count,
# and its participants are the most recent distinct authors. Threads whose first
# send never committed (latest_seq 0) have no summary.
THREAD_SUMMARIES = """
SELECT t.root_message_id, t.id, t.latest_seq, t.latest_message_at,
       ARRAY(SELECT a.author_member_id FROM (
                SELECT x.author_member_id, max(x.seq) AS last_seq FROM scope_messages x
                WHERE x.scope_id = t.id GROUP BY x.author_member_id
             ) a ORDER BY a.last_seq DESC LIMIT %(participants)s)
FROM scopes t
WHERE t.parent_scope_id = %(scope_id)s AND t.type = 'thread'
  AND t.root_message_id = ANY(%(roots)s) AND t.latest_seq > 0
"""
THREAD_PARTICIPANTS = 3


@dataclass(frozen=True, slots=True)
class ThreadStats:
    scope_id: str
    reply_count: int
    last_reply_at: datetime
    participants: tuple[str, ...]


async def thread_summaries(
    conn: TrioConnection, scope_id: str, root_ids: list[str]
) -> dict[str, ThreadStats]:
    """Root message id → its thread's summary, for the roots that have replies."""
    if not root_ids:
        return {}
    params = {"scope_id": scope_id, "roots": root_ids, "participants": THREAD_PARTICIPANTS}
    with map_errors():
        cur = await conn.execute(THREAD_SUMMARIES, params)
        rows = await cur.fetchall()
    return {row[0]: ThreadStats(row[1], row[2], row[3], tuple(row[4])) for row in rows}
