"""What a node reads to relay another node's events to its own sessions.

One statement per batch: the scope's messages in a seq range, each with the
ids of the given candidate members that may read it. Readability is the one
SQL predicate (:func:`storage.visibility.readable_join`) bound per candidate
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
from typing import Any

from actors.model import StoredMessage
from storage.errors import map_errors
from storage.messages import STORED_COLUMNS, message_from_row
from storage.pg import Prepared, TrioConnection
from storage.visibility import ViewerTerms, readable_join, scope_shape

# Bound per candidate row: the predicate's text is shared, only its inputs
# differ. The scope's shape (grant scopes, thread or not) is read by the same
# statement, so it is a column of the candidate row too.
_PER_CANDIDATE = readable_join(ViewerTerms.columns_of("c"))

_SOURCES = """ARRAY(SELECT s.source_kind FROM scope_message_sources s
             WHERE s.message_id = m.id AND s.context_member_id IS NULL ORDER BY s.ordinal)"""
# The roster the answer was decided on: the scope's generation and, for a
# thread, its parent's (every membership or grant change bumps one of them).
_ROSTER = """(SELECT r.roster_generation::text || ':'
               || COALESCE((SELECT p.roster_generation FROM scopes p
                            WHERE p.id = r.parent_scope_id)::text, '')
        FROM scopes r WHERE r.id = (SELECT %(scope_id)s::text))"""


def _readers(msgs: str) -> str:
    """The messages ``msgs`` selects, each with its readers among the candidates.

    One round trip. ``msgs`` is read once; each candidate (sent as one JSON
    array) costs one probe of scope_memberships by (scope_id, member_id),
    which says both whether it may read anything here (any membership of the
    scope; failing that, of a thread's parent, or an explicit-context row
    opening one of the messages) and whether it holds a current public
    membership. The predicate then runs once per (message, remaining
    candidate). Every parameter enters as an initplan, so no estimate depends
    on a value and PostgreSQL keeps the generic plan (no planning per
    notification).
    """
    return f"""
WITH shape AS (
    SELECT s.id AS scope_id, s.parent_scope_id AS parent_id,
        {scope_shape("s")}
    FROM scopes s WHERE s.id = (SELECT %(scope_id)s::text)
), msgs AS MATERIALIZED (
    {msgs}
), cand AS MATERIALIZED (
    SELECT c.id AS viewer_id,
           (c.is_private AND c.type = 'agent') AS viewer_private,
           CASE WHEN c.is_private AND c.type = 'agent' THEN c.owner_member_id END AS owner_id,
           (NOT (c.is_private AND c.type = 'agent') AND COALESCE(ms.current_public, false))
               AS viewer_public,
           sh.grant_scopes, sh.in_thread
    FROM shape sh
    CROSS JOIN json_array_elements_text((SELECT %(candidates)s::json)) AS asked(id)
    JOIN members c ON c.id = asked.id AND c.status = 'active'
    LEFT JOIN LATERAL (
        SELECT bool_or(sm.visibility = 'public' AND sm.effective_to_seq IS NULL)
                   AS current_public
        FROM scope_memberships sm
        WHERE sm.scope_id = sh.scope_id AND sm.member_id = c.id
        HAVING count(*) > 0
    ) ms ON true
    WHERE ms.current_public IS NOT NULL OR EXISTS (
        SELECT 1 FROM scope_memberships pm
        WHERE pm.scope_id = sh.parent_id AND pm.member_id = c.id
    ) OR EXISTS (
        SELECT 1 FROM scope_message_sources cx JOIN msgs ON msgs.id = cx.source_message_id
        WHERE cx.context_member_id = c.id
    )
)
SELECT {STORED_COLUMNS},
       ARRAY(SELECT c.viewer_id FROM cand c {_PER_CANDIDATE} WHERE v.reason IS NOT NULL),
       {_SOURCES},
       {_ROSTER}
FROM msgs m
JOIN members mem ON mem.id = m.author_member_id
ORDER BY m.seq
"""


_MSGS_IN_RANGE = (
    "SELECT * FROM scope_messages WHERE scope_id = (SELECT %(scope_id)s::text)"
    " AND seq >= (SELECT %(from_seq)s::int8) AND seq <= (SELECT %(to_seq)s::int8)"
)
_MSG_BY_ID = (
    "SELECT * FROM scope_messages"
    " WHERE id = (SELECT %(message_id)s::text) AND scope_id = (SELECT %(scope_id)s::text)"
)
READERS_IN_RANGE = _readers(_MSGS_IN_RANGE)
READERS_OF_MESSAGE = _readers(_MSG_BY_ID)
# The messages alone, with the roster they were read under: for readers whose
# right does not depend on the message (see readers_in_range).
MESSAGES_IN_RANGE = f"""
SELECT {STORED_COLUMNS}, NULL::text[], {_SOURCES}, {_ROSTER}
FROM ({_MSGS_IN_RANGE}) m
JOIN members mem ON mem.id = m.author_member_id
ORDER BY m.seq
"""
# Roster audience on another node: the scope's current members, and for a
# thread the parent's current public members (they read it without joining).
CURRENT_READERS = """
SELECT DISTINCT sm.member_id
FROM scopes s
JOIN scope_memberships sm
  ON sm.effective_to_seq IS NULL
 AND (sm.scope_id = s.id OR (sm.scope_id = s.parent_scope_id AND sm.visibility = 'public'))
WHERE s.id = (SELECT %(scope_id)s::text)
  AND sm.member_id IN (SELECT value FROM json_array_elements_text((SELECT %(candidates)s::json)))
"""
# Scopes that got messages since ``cutoff`` (a relay gap): where to catch up.
ACTIVE_SINCE = """
SELECT s.id, s.latest_seq,
       (SELECT min(m.seq) FROM scope_messages m
        WHERE m.scope_id = s.id AND m.created_at >= %(cutoff)s)
FROM scopes s
WHERE s.latest_message_at >= %(cutoff)s
"""
# Prepared, parameters bound as text the caller encodes (0: the server infers
# text); candidates travel as one JSON array, not an adapted text[].
_TYPES = {"scope_id": 0, "from_seq": 20, "to_seq": 20, "message_id": 0, "candidates": 0}
READERS_IN_RANGE_NAME = "scopenode_relay_readers_v3"
_IN_RANGE, _IN_RANGE_NAMES = Prepared.from_named(READERS_IN_RANGE_NAME, READERS_IN_RANGE, _TYPES)
_OF_MESSAGE, _OF_MESSAGE_NAMES = Prepared.from_named(
    "scopenode_relay_readers_of_v2", READERS_OF_MESSAGE, _TYPES
)
_MESSAGES, _MESSAGES_NAMES = Prepared.from_named(
    "scopenode_relay_messages_v1", MESSAGES_IN_RANGE, _TYPES
)
_CURRENT, _CURRENT_NAMES = Prepared.from_named(
    "scopenode_relay_current_readers_v2", CURRENT_READERS, _TYPES
)


@dataclass(frozen=True, slots=True)
class RelayedMessage:
    message: StoredMessage
    readers: tuple[str, ...]
    source_kinds: tuple[str, ...]
    # "<scope roster_generation>:<parent's or empty>" when it was read.
    roster: str = ""


@dataclass(frozen=True, slots=True)
class ScopeActivity:
    scope_id: str
    latest_seq: int
    first_seq_since: int | None


def _encode(names: Sequence[str], values: dict[str, str | int]) -> list[bytes | None]:
    return [str(values[name]).encode() for name in names]


def _relayed(rows: list[tuple[Any, ...]]) -> list[RelayedMessage]:
    return [
        RelayedMessage(
            message_from_row(row), tuple(row[-3] or ()), tuple(row[-2] or ()), row[-1] or ""
        )
        for row in rows
    ]


async def readers_in_range(
    conn: TrioConnection,
    scope_id: str,
    from_seq: int,
    to_seq: int,
    candidates: Sequence[str],
) -> list[RelayedMessage]:
    """Messages ``from_seq..to_seq`` of the scope, oldest first, with their readers
    among ``candidates`` (the one predicate decides). One prepared statement;
    ``conn`` must be in autocommit mode."""
    values: dict[str, str | int] = {
        "scope_id": scope_id,
        "from_seq": from_seq,
        "to_seq": to_seq,
        "candidates": json.dumps(list(candidates)),
    }
    with map_errors():
        rows = await conn.run_prepared(_IN_RANGE, _encode(_IN_RANGE_NAMES, values))
    return _relayed(rows)


async def messages_in_range(
    conn: TrioConnection, scope_id: str, from_seq: int, to_seq: int
) -> list[RelayedMessage]:
    """Messages ``from_seq..to_seq`` of the scope, oldest first, without readers,
    each with the roster it was read under. Humans and public agents read every
    message of a scope or none, by the roster alone: once
    :func:`readers_in_range` has decided them for a roster, this lean read
    (a third cheaper, and less again on a cold cache) and that roster answer
    for them."""
    values: dict[str, str | int] = {"scope_id": scope_id, "from_seq": from_seq, "to_seq": to_seq}
    with map_errors():
        rows = await conn.run_prepared(_MESSAGES, _encode(_MESSAGES_NAMES, values))
    return _relayed(rows)


async def readers_of_message(
    conn: TrioConnection, scope_id: str, message_id: str, candidates: Sequence[str]
) -> RelayedMessage | None:
    """One message of the scope by id (None if it is not there) with its readers
    among ``candidates``, decided as in :func:`readers_in_range` (autocommit)."""
    values: dict[str, str | int] = {
        "scope_id": scope_id,
        "message_id": message_id,
        "candidates": json.dumps(list(candidates)),
    }
    with map_errors():
        rows = await conn.run_prepared(_OF_MESSAGE, _encode(_OF_MESSAGE_NAMES, values))
    found = _relayed(rows)
    return found[0] if found else None


async def current_readers(
    conn: TrioConnection, scope_id: str, candidates: Sequence[str]
) -> set[str]:
    """Those of ``candidates`` with a current membership of the scope (or, for a
    thread, a current public one of its parent); autocommit."""
    values: dict[str, str | int] = {
        "scope_id": scope_id,
        "candidates": json.dumps(list(candidates)),
    }
    with map_errors():
        rows = await conn.run_prepared(_CURRENT, _encode(_CURRENT_NAMES, values))
    return {row[0] for row in rows}


FIRST_RECENT = """
SELECT min(seq) FROM scope_messages
WHERE scope_id = %(scope_id)s AND seq < %(below)s AND seq >= %(below)s - %(window)s
  AND created_at >= now() - %(margin)s * interval '1 second'
"""


async def first_recent_seq(
    conn: TrioConnection, scope_id: str, below: int, *, window: int, margin_s: float
) -> int | None:
    """The lowest seq under ``below`` (at most ``window`` back) written in the
    last ``margin_s`` seconds: one whose notification may still be on its way."""
    params = {"scope_id": scope_id, "below": below, "window": window, "margin": margin_s}
    with map_errors():
        cur = await conn.execute(FIRST_RECENT, params)
        row = await cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


async def active_since(conn: TrioConnection, cutoff: datetime) -> list[ScopeActivity]:
    with map_errors():
        cur = await conn.execute(ACTIVE_SINCE, {"cutoff": cutoff})
        rows = await cur.fetchall()
    return [ScopeActivity(row[0], int(row[1]), row[2]) for row in rows]


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
        params = _notify_params(channel, payloads)
        if conn.autocommit:
            await conn.run_prepared(NOTIFY_MANY, params)
        else:
            async with conn.transaction():
                await conn.run_prepared(NOTIFY_MANY, params)


def _notify_params(channel: str, payloads: Sequence[str]) -> tuple[bytes, bytes]:
    return channel.encode(), json.dumps(payloads).encode()


def start_notify_many(conn: TrioConnection, channel: str, payloads: Sequence[str]) -> bool:
    """Send ``notify_many``'s statement now, from synchronous code, when ``conn``
    is idle (True); :func:`finish_notify` then reads its result."""
    return conn.start_prepared(NOTIFY_MANY, _notify_params(channel, payloads))


async def finish_notify(conn: TrioConnection) -> None:
    with map_errors():
        await conn.finish_started()


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
