"""The durable outbox (docs/design.md#delivery): inline-delivery marks, agent deliveries, the worker's lease.

Rows are written by the Applier inside the send transaction. Realtime rows
are marked delivered in batches after the inline fan-out; agent wake rows stay
pending until the agent's daemon acknowledges them. The worker leases due
rows with ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from actors.model import StoredMessage
from storage.errors import map_errors
from storage.messages import STORED_COLUMNS, message_from_row
from storage.pg import TrioConnection

# The worker stops pushing a wake nobody acknowledges (status failed, this
# error); the agent's daemon still gets it on its next connect, and may ack it.
NOT_ACKNOWLEDGED = "not acknowledged"

MARK_DELIVERED = """
UPDATE scope_fanout_outbox
SET status = 'delivered', delivered_at = now(), lease_owner = NULL, lease_expires_at = NULL
WHERE dedupe_key = ANY(%s) AND status IN ('pending', 'leased')
"""
# Acknowledging is idempotent and never overwrites a suppressed or failed row.
ACK_WAKE = """
WITH acked AS (
    UPDATE scope_fanout_outbox
    SET status = 'delivered', delivered_at = now(), lease_owner = NULL, lease_expires_at = NULL
    WHERE dedupe_key = %(key)s AND target_member_id = %(agent)s AND fanout_type = 'agent_wake'
      AND (status IN ('pending', 'leased') OR (status = 'failed' AND last_error = %(gave_up)s))
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM acked) OR EXISTS (
    SELECT 1 FROM scope_fanout_outbox
    WHERE dedupe_key = %(key)s AND target_member_id = %(agent)s AND fanout_type = 'agent_wake'
)
"""
_COLUMNS = STORED_COLUMNS
PENDING_WAKES = f"""
SELECT o.id, o.dedupe_key, o.target_seq, o.payload->>'reason', {_COLUMNS}
FROM scope_fanout_outbox o
JOIN scope_messages m ON m.id = o.message_id
JOIN members mem ON mem.id = m.author_member_id
WHERE o.fanout_type = 'agent_wake' AND o.target_member_id = %s
  AND m.deleted_at IS NULL
  AND (o.status IN ('pending', 'leased')
       OR (o.status = 'failed' AND o.last_error = %s))
ORDER BY o.id
LIMIT %s
"""
LEASE_DUE = """
WITH due AS (
    SELECT id FROM scope_fanout_outbox
    WHERE (status = 'pending' AND next_attempt_at <= now())
       OR (status = 'leased' AND lease_expires_at <= now())
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE scope_fanout_outbox o
SET status = 'leased', lease_owner = %(owner)s, lease_expires_at = now() + %(lease)s,
    attempts = o.attempts + 1
FROM due WHERE o.id = due.id
RETURNING o.id, o.scope_id, o.message_id, o.fanout_type, o.target_member_id, o.target_seq,
          o.dedupe_key, o.payload->>'reason', o.attempts, o.max_attempts,
          o.payload->'recipients', o.payload->>'taskId', o.event_ref_id
"""
RESCHEDULE = """
UPDATE scope_fanout_outbox
SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
    next_attempt_at = now() + %(delay)s, attempts = attempts - %(refund)s, last_error = %(error)s
WHERE id = %(id)s AND lease_owner = %(owner)s
"""
FINISH = """
UPDATE scope_fanout_outbox
SET status = %(status)s, lease_owner = NULL, lease_expires_at = NULL, last_error = %(error)s,
    delivered_at = CASE WHEN %(status)s = 'delivered' THEN now() END,
    suppressed_at = CASE WHEN %(status)s = 'suppressed' THEN now() END,
    suppression_reason = CASE WHEN %(status)s = 'suppressed' THEN %(error)s END
WHERE id = %(id)s AND lease_owner = %(owner)s
"""
PRUNE = """
DELETE FROM scope_fanout_outbox
WHERE id IN (
    SELECT id FROM scope_fanout_outbox
    WHERE status IN ('delivered', 'suppressed', 'failed') AND created_at < now() - %s
    LIMIT 10000
)
"""
EXPIRE_PENDING = """
UPDATE scope_fanout_outbox
SET status = 'failed', last_error = 'expired: retention', lease_owner = NULL,
    lease_expires_at = NULL
WHERE status = 'pending' AND created_at < now() - %s
"""
SUPPRESS = """
UPDATE scope_fanout_outbox
SET status = 'suppressed', suppressed_at = now(), suppression_reason = %s,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = %s AND status IN ('pending', 'leased')
"""
STATUS_COUNTS = "SELECT status, count(*) FROM scope_fanout_outbox GROUP BY status"
# Whether the worker's lease still stands: a rewind (or a delete) suppresses
# leased rows too, and the worker re-checks before every push.
STILL_LEASED = """
SELECT 1 FROM scope_fanout_outbox WHERE id = %s AND status = 'leased' AND lease_owner = %s
"""
WAKE_STILL_ALLOWED = """
SELECT
    EXISTS (SELECT 1 FROM scope_memberships sm
            WHERE sm.scope_id = m.scope_id AND sm.member_id = %(agent)s
              AND sm.effective_to_seq IS NULL) AS member,
    agent.is_private,
    agent.owner_member_id = m.author_member_id AS by_owner,
    author.is_private AND author.owner_member_id = agent.owner_member_id AS same_owner,
    EXISTS (SELECT 1 FROM scope_private_grants g
            JOIN scopes s ON s.id = m.scope_id
            WHERE g.scope_id IN (s.id, s.parent_scope_id)
              AND g.owner_member_id = agent.owner_member_id
              AND g.grantee_member_id = m.author_member_id
              AND g.created_at <= m.created_at
              AND g.revoked_at IS NULL
              AND (g.expires_at IS NULL OR m.created_at < g.expires_at)) AS granted,
    m.deleted_at IS NOT NULL AS deleted
FROM scope_messages m
JOIN members agent ON agent.id = %(agent)s
JOIN members author ON author.id = m.author_member_id
WHERE m.id = %(message)s
"""


@dataclass(frozen=True, slots=True)
class PendingWake:
    outbox_id: int
    dedupe_key: str
    target_seq: int
    reason: str
    message: StoredMessage


@dataclass(frozen=True, slots=True)
class LeasedRow:
    id: int
    scope_id: str
    message_id: str | None
    fanout_type: str
    target_member_id: str | None
    target_seq: int | None
    dedupe_key: str
    reason: str | None
    attempts: int
    max_attempts: int
    # ``inline_targeted`` rows: [[member id, notification state]] frozen at send.
    recipients: list[list[str]] | None = None
    # Task activity wakes (no message): the task they are about, and the activity.
    task_id: str | None = None
    event_ref_id: str | None = None


async def mark_delivered(conn: TrioConnection, dedupe_keys: Sequence[str]) -> int:
    with map_errors():
        cur = await conn.execute(MARK_DELIVERED, (list(dedupe_keys),))
    return cur.rowcount


# The wakes another node wrote for messages this node relays to its own daemons.
WAKES_OF_MESSAGES = """
SELECT o.message_id, o.target_member_id, coalesce(o.payload->>'reason', '')
FROM scope_fanout_outbox o
WHERE o.message_id = ANY(%s) AND o.target_member_id = ANY(%s)
  AND o.fanout_type = 'agent_wake' AND o.status IN ('pending', 'leased')
ORDER BY o.id
"""


async def wakes_of_messages(
    conn: TrioConnection, message_ids: list[str], agent_ids: list[str]
) -> list[tuple[str, str, str]]:
    """Unacknowledged wakes of ``agent_ids`` for ``message_ids``: (message, agent, reason)."""
    with map_errors():
        cur = await conn.execute(WAKES_OF_MESSAGES, (message_ids, agent_ids))
        rows = await cur.fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


async def ack_wake(conn: TrioConnection, dedupe_key: str, agent_id: str) -> bool:
    """Acknowledge an agent delivery; False when there is no such delivery for the agent."""
    with map_errors():
        cur = await conn.execute(
            ACK_WAKE, {"key": dedupe_key, "agent": agent_id, "gave_up": NOT_ACKNOWLEDGED}
        )
        row = await cur.fetchone()
    return bool(row and row[0])


async def pending_wakes(conn: TrioConnection, agent_id: str, limit: int) -> list[PendingWake]:
    """Unacknowledged deliveries of an agent, oldest first (target-seq order per scope)."""
    with map_errors():
        cur = await conn.execute(PENDING_WAKES, (agent_id, NOT_ACKNOWLEDGED, limit))
        rows = await cur.fetchall()
    return [PendingWake(r[0], r[1], r[2], r[3] or "", message_from_row(r[4:])) for r in rows]


async def lease_due(
    conn: TrioConnection, owner: str, *, limit: int, lease: timedelta
) -> list[LeasedRow]:
    with map_errors():
        cur = await conn.execute(LEASE_DUE, {"owner": owner, "limit": limit, "lease": lease})
        rows = await cur.fetchall()
    return [LeasedRow(*row) for row in rows]


async def reschedule(
    conn: TrioConnection,
    row: LeasedRow,
    owner: str,
    *,
    delay: timedelta,
    error: str | None,
    refund_attempt: bool = False,
) -> None:
    params: dict[str, Any] = {
        "id": row.id,
        "owner": owner,
        "delay": delay,
        "error": error,
        "refund": 1 if refund_attempt else 0,
    }
    with map_errors():
        await conn.execute(RESCHEDULE, params)


async def finish(
    conn: TrioConnection, row: LeasedRow, owner: str, status: str, error: str | None = None
) -> None:
    params = {"id": row.id, "owner": owner, "status": status, "error": error}
    with map_errors():
        await conn.execute(FINISH, params)


async def prune(conn: TrioConnection, retention: timedelta) -> int:
    with map_errors():
        expired = await conn.execute(EXPIRE_PENDING, (retention,))
        cur = await conn.execute(PRUNE, (retention,))
    return cur.rowcount + expired.rowcount


async def suppress(conn: TrioConnection, outbox_id: int, reason: str) -> None:
    with map_errors():
        await conn.execute(SUPPRESS, (reason, outbox_id))


async def still_leased(conn: TrioConnection, row: LeasedRow, owner: str) -> bool:
    """False once the row was suppressed (or otherwise taken) since it was leased."""
    with map_errors():
        cur = await conn.execute(STILL_LEASED, (row.id, owner))
        return await cur.fetchone() is not None


async def status_counts(conn: TrioConnection) -> dict[str, int]:
    with map_errors():
        cur = await conn.execute(STATUS_COUNTS)
        return {str(status): int(count) for status, count in await cur.fetchall()}


async def wake_suppression(conn: TrioConnection, message_id: str, agent_id: str) -> str | None:
    """Why a wake must no longer be pushed (re-checked before every push), or None."""
    with map_errors():
        cur = await conn.execute(WAKE_STILL_ALLOWED, {"agent": agent_id, "message": message_id})
        row = await cur.fetchone()
    if row is None:
        return "message_gone"
    member, private, by_owner, same_owner, granted, deleted = row
    if deleted:
        return "message_deleted"
    if not member:
        return "not_member"
    if private and not (by_owner or same_owner or granted):
        return "authority_revoked"
    return None
