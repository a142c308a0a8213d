"""What a node reads to relay another node's events to its own sessions.

One statement per batch: the scope's messages in a seq range, each with the
ids of the given candidate members that may read it. Readability is the one
SQL predicate (:data:`storage.visibility.READABLE_JOIN`) bound per candidate
row instead of per statement parameter, so a relayed event and history can
never disagree about who reads what. Candidates are first narrowed to members
with any membership of the scope (or of its parent, for a thread) or an
explicit-context row opening one of the messages: nobody else can read it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from actors.model import StoredMessage
from storage.errors import map_errors
from storage.messages import MESSAGE_COLUMNS, message_from_row
from storage.pg import Prepared, TrioConnection
from storage.visibility import READABLE_JOIN

# Bound per candidate row: the predicate's text is shared, only its inputs differ.
_PER_CANDIDATE = (
    READABLE_JOIN.replace("%(viewer_public)s", "c.viewer_public")
    .replace("%(viewer_private)s", "c.viewer_private")
    .replace("%(viewer_id)s", "c.viewer_id")
    .replace("%(owner_id)s", "c.owner_id")
)
_COLUMNS = MESSAGE_COLUMNS.replace("v.reason, v.grant_id", "NULL, NULL")

READERS_IN_RANGE = f"""
WITH msgs AS (
    SELECT * FROM scope_messages
    WHERE scope_id = %(scope_id)s AND seq >= %(from_seq)s AND seq <= %(to_seq)s
), cand AS (
    SELECT c.id AS viewer_id,
           (c.is_private AND c.type = 'agent') AS viewer_private,
           CASE WHEN c.is_private AND c.type = 'agent' THEN c.owner_member_id END AS owner_id,
           (NOT (c.is_private AND c.type = 'agent') AND EXISTS (
               SELECT 1 FROM scope_memberships cm
               WHERE cm.scope_id = %(scope_id)s AND cm.member_id = c.id
                 AND cm.visibility = 'public' AND cm.effective_to_seq IS NULL
           )) AS viewer_public
    FROM members c
    WHERE c.id = ANY(%(candidates)s) AND c.status = 'active'
      AND (EXISTS (
               SELECT 1 FROM scope_memberships sm
               WHERE sm.scope_id = ANY(%(grant_scopes)s) AND sm.member_id = c.id
           ) OR EXISTS (
               SELECT 1 FROM scope_message_sources cx JOIN msgs ON msgs.id = cx.source_message_id
               WHERE cx.context_member_id = c.id
           ))
)
SELECT {_COLUMNS},
       ARRAY(SELECT c.viewer_id FROM cand c {_PER_CANDIDATE} WHERE v.reason IS NOT NULL),
       ARRAY(SELECT s.source_kind FROM scope_message_sources s
             WHERE s.message_id = m.id AND s.context_member_id IS NULL ORDER BY s.ordinal)
FROM msgs m
JOIN members mem ON mem.id = m.author_member_id
ORDER BY m.seq
"""
SCOPE_SHAPE = "SELECT type, parent_scope_id FROM scopes WHERE id = %s"
# Roster audience on another node: the scope's current members, and for a
# thread the parent's current public members (they read it without joining).
CURRENT_READERS = """
SELECT DISTINCT member_id FROM scope_memberships
WHERE member_id = ANY(%(candidates)s) AND effective_to_seq IS NULL
  AND (scope_id = %(scope_id)s
       OR (scope_id = %(parent_id)s AND visibility = 'public'))
"""
# Scopes that got messages since ``cutoff`` (a relay gap): where to catch up.
ACTIVE_SINCE = """
SELECT s.id, s.latest_seq,
       (SELECT min(m.seq) FROM scope_messages m
        WHERE m.scope_id = s.id AND m.created_at >= %(cutoff)s)
FROM scopes s
WHERE s.latest_message_at >= %(cutoff)s
"""
MESSAGE_SCOPE_SEQ = "SELECT scope_id, seq FROM scope_messages WHERE id = %s"


@dataclass(frozen=True, slots=True)
class RelayedMessage:
    message: StoredMessage
    readers: tuple[str, ...]
    source_kinds: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ScopeActivity:
    scope_id: str
    latest_seq: int
    first_seq_since: int | None


async def grant_scopes(conn: TrioConnection, scope_id: str) -> tuple[tuple[str, ...], bool]:
    """The scope and its parent (for a thread), and whether it is a thread."""
    with map_errors():
        cur = await conn.execute(SCOPE_SHAPE, (scope_id,))
        row = await cur.fetchone()
    if row is None:
        return (scope_id,), False
    return ((scope_id, row[1]) if row[1] else (scope_id,)), row[0] == "thread"


async def readers_in_range(
    conn: TrioConnection,
    scope_id: str,
    from_seq: int,
    to_seq: int,
    candidates: Sequence[str],
) -> list[RelayedMessage]:
    """Messages ``from_seq..to_seq`` of the scope, oldest first, with their readers
    among ``candidates`` (the one predicate decides)."""
    scopes, in_thread = await grant_scopes(conn, scope_id)
    params = {
        "scope_id": scope_id,
        "from_seq": from_seq,
        "to_seq": to_seq,
        "candidates": list(candidates),
        "grant_scopes": list(scopes),
        "in_thread": in_thread,
    }
    with map_errors():
        cur = await conn.execute(READERS_IN_RANGE, params)
        rows = await cur.fetchall()
    return [
        RelayedMessage(message_from_row(row), tuple(row[-2] or ()), tuple(row[-1] or ()))
        for row in rows
    ]


async def current_readers(
    conn: TrioConnection, scope_id: str, candidates: Sequence[str]
) -> set[str]:
    scopes, _ = await grant_scopes(conn, scope_id)
    params = {
        "scope_id": scope_id,
        "parent_id": scopes[1] if len(scopes) > 1 else None,
        "candidates": list(candidates),
    }
    with map_errors():
        cur = await conn.execute(CURRENT_READERS, params)
        return {row[0] for row in await cur.fetchall()}


async def active_since(conn: TrioConnection, cutoff: datetime) -> list[ScopeActivity]:
    with map_errors():
        cur = await conn.execute(ACTIVE_SINCE, {"cutoff": cutoff})
        rows = await cur.fetchall()
    return [ScopeActivity(row[0], int(row[1]), row[2]) for row in rows]


async def message_seq(conn: TrioConnection, message_id: str) -> tuple[str, int] | None:
    with map_errors():
        cur = await conn.execute(MESSAGE_SCOPE_SEQ, (message_id,))
        row = await cur.fetchone()
    return (row[0], int(row[1])) if row else None


# Prepared, parameters bound as text: the payloads travel as one JSON array
# (a json.dumps call) rather than a text[] that psycopg adapts element by
# element; json_array_elements_text keeps their order.
NOTIFY_MANY = Prepared(
    b"scopenode_notify_many_v1",
    b"SELECT pg_notify($1::text, p) FROM json_array_elements_text($2::json) AS p",
    (0, 0),
)
LISTENER_IDENTITY = "SELECT pg_backend_pid(), now()"
# Backends of this database connected under ``application_name`` (the other
# nodes' relay listeners, and this node's own).
LISTENER_PIDS = Prepared(
    b"scopenode_relay_listeners_v1",
    b"SELECT pid FROM pg_stat_activity"
    b" WHERE application_name = $1 AND datname = current_database()",
    (0,),
)
DATABASE_NOW = "SELECT now()"


async def notify_many(conn: TrioConnection, channel: str, payloads: Sequence[str]) -> None:
    """One round trip for every queued notification (delivered at commit, in order)."""
    with map_errors():
        params = (channel.encode(), json.dumps(payloads).encode())
        if conn.autocommit:
            await conn.run_prepared(NOTIFY_MANY, params)
        else:
            async with conn.transaction():
                await conn.run_prepared(NOTIFY_MANY, params)


async def listener_pids(conn: TrioConnection, application_name: str) -> set[int]:
    """Backend pids of the connections named ``application_name`` on this database."""
    with map_errors():
        rows = await conn.run_prepared(LISTENER_PIDS, (application_name.encode(),))
    return {int(row[0]) for row in rows}


async def listen(conn: TrioConnection, channel: str) -> tuple[int, datetime]:
    """LISTEN on ``channel``; the listener's backend pid and the database's time.

    ``channel`` is a constant identifier of the node, never user input.
    """
    with map_errors():
        await conn.execute(f"LISTEN {channel}")
        cur = await conn.execute(LISTENER_IDENTITY)
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), row[1]


async def database_now(conn: TrioConnection) -> datetime:
    """The database's clock (also a liveness probe of ``conn``)."""
    with map_errors():
        cur = await conn.execute(DATABASE_NOW)
        row = await cur.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now
