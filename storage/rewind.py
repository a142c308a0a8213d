"""Recovery points and rewinds (docs/rewind.md).

A rewind is one transaction on the scope row's lock: it suppresses every
outbox row of the scope still pending after the point (deliveries, wakes,
projections; status ``suppressed``, reason ``rewind:<id>``), sets aside the
scope's later activity (``suppressed_at``), and records the seqs it set aside
in ``scope_rewinds``. It writes no message: its notice is an ordinary append
of the scope's actor through the Applier (``node/ops/rewind.py``), recorded
here afterwards. Nothing is deleted: history after the point stays readable
through the one predicate, and :func:`rewound_ranges` tells history which
seqs to mark.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from actors.ids import new_id
from storage.errors import map_errors
from storage.pg import TrioConnection

MARK_POINT = """
INSERT INTO message_recovery_points
    (id, workspace_id, scope_id, message_id, strategy, prepared_at, created_by_member_id)
VALUES (%(id)s, %(workspace_id)s, %(scope_id)s, %(message_id)s, 'truncate_after', now(),
        %(member_id)s)
ON CONFLICT (message_id) DO UPDATE SET message_id = excluded.message_id
RETURNING id
"""
SELECT_POINT = """
SELECT p.id, p.scope_id, p.message_id, m.seq, m.created_at
FROM message_recovery_points p
JOIN scope_messages m ON m.id = p.message_id
WHERE p.id = %s
"""
LOCK_SCOPE = "SELECT latest_seq FROM scopes WHERE id = %s FOR UPDATE"
# The scope's last rewind, with its notice's seq: rewinding to the same point
# with nothing written since answers that rewind again.
LAST_REWIND = """
SELECT r.id, r.recovery_point_id, r.from_seq, r.through_seq, r.notice_message_id, n.seq
FROM scope_rewinds r
LEFT JOIN scope_messages n ON n.id = r.notice_message_id
WHERE r.scope_id = %s
ORDER BY r.created_at DESC, r.id DESC
LIMIT 1
"""
# Pending after the point: rows about a later message, and rows about no
# message (an activity's wake) made after the point's message.
REWIND = """
WITH suppressed AS (
    UPDATE scope_fanout_outbox o
    SET status = 'suppressed', suppressed_at = now(), suppression_reason = %(reason)s,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE o.scope_id = %(scope_id)s AND o.status IN ('pending', 'leased')
      AND (o.target_seq > %(point_seq)s
           OR (o.target_seq IS NULL AND o.created_at > %(point_at)s))
    RETURNING o.id
), activity AS (
    UPDATE scope_activity_events a SET suppressed_at = now()
    WHERE a.scope_id = %(scope_id)s AND a.suppressed_at IS NULL
      AND a.created_at > %(point_at)s
    RETURNING a.id
)
INSERT INTO scope_rewinds
    (id, workspace_id, scope_id, recovery_point_id, from_seq, through_seq,
     rewound_by_member_id, suppressed)
SELECT %(id)s, s.workspace_id, s.id, %(point_id)s, %(point_seq)s + 1, s.latest_seq,
       %(member_id)s, (SELECT count(*) FROM suppressed)
FROM scopes s
WHERE s.id = %(scope_id)s
RETURNING from_seq, through_seq, suppressed, (SELECT count(*) FROM activity)
"""
SET_NOTICE = "UPDATE scope_rewinds SET notice_message_id = %s WHERE id = %s"
RANGES = """
SELECT from_seq, through_seq FROM scope_rewinds
WHERE scope_id = %s AND through_seq >= from_seq AND from_seq <= %s AND through_seq >= %s
ORDER BY from_seq
"""


@dataclass(frozen=True, slots=True)
class Point:
    id: str
    scope_id: str
    message_id: str
    seq: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Rewound:
    """A committed rewind: seqs ``from_seq``..``through_seq`` were set aside."""

    id: str
    from_seq: int
    through_seq: int
    suppressed: int
    activity: int
    # The notice of a rewind answered again (nothing written since); None for a new one.
    notice_message_id: str | None = None
    repeated: bool = False


async def mark_point(
    conn: TrioConnection, workspace_id: str, scope_id: str, message_id: str, member_id: str
) -> str:
    """The recovery point at ``message_id`` (one per message: marking again returns it)."""
    params = {
        "id": new_id("rcp"),
        "workspace_id": workspace_id,
        "scope_id": scope_id,
        "message_id": message_id,
        "member_id": member_id,
    }
    with map_errors():
        cur = await conn.execute(MARK_POINT, params)
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def get_point(conn: TrioConnection, point_id: str) -> Point | None:
    with map_errors():
        cur = await conn.execute(SELECT_POINT, (point_id,))
        row = await cur.fetchone()
    if row is None:
        return None
    return Point(row[0], row[1], row[2], int(row[3]), row[4])


async def rewind(conn: TrioConnection, point: Point, member_id: str) -> Rewound:
    """Set aside everything of the point's scope after the point (module docstring)."""
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(LOCK_SCOPE, (point.scope_id,))
            locked = await cur.fetchone()
            assert locked is not None
            latest = int(locked[0])
            cur = await conn.execute(LAST_REWIND, (point.scope_id,))
            last = await cur.fetchone()
            if last is not None and last[1] == point.id and last[5] == latest:
                return Rewound(last[0], int(last[2]), int(last[3]), 0, 0, last[4], repeated=True)
            rewind_id = new_id("rwd")
            cur = await conn.execute(
                REWIND,
                {
                    "id": rewind_id,
                    "reason": f"rewind:{rewind_id}",
                    "scope_id": point.scope_id,
                    "point_id": point.id,
                    "point_seq": point.seq,
                    "point_at": point.created_at,
                    "member_id": member_id,
                },
            )
            row = await cur.fetchone()
    assert row is not None
    return Rewound(rewind_id, int(row[0]), int(row[1]), int(row[2]), int(row[3]))


async def set_notice(conn: TrioConnection, rewind_id: str, message_id: str) -> None:
    with map_errors():
        await conn.execute(SET_NOTICE, (message_id, rewind_id))


async def rewound_ranges(
    conn: TrioConnection, scope_id: str, low: int, high: int
) -> list[tuple[int, int]]:
    """The scope's set-aside seq ranges that meet ``low``..``high``."""
    with map_errors():
        cur = await conn.execute(RANGES, (scope_id, high, low))
        rows = await cur.fetchall()
    return [(int(a), int(b)) for a, b in rows]


def is_rewound(seq: int, ranges: list[tuple[int, int]]) -> bool:
    return any(low <= seq <= high for low, high in ranges)
