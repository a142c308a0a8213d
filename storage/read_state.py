"""Unread counts that honour visibility (docs/design.md#read-state)."""

from __future__ import annotations

from storage.errors import map_errors
from storage.pg import TrioConnection
from storage.visibility import READABLE_JOIN, Viewer

# Bounded: unread badges stop counting at this many.
UNREAD_CAP = 1000

COUNT_READABLE_UNREAD = f"""
SELECT count(*) FROM (
    SELECT m.seq
    FROM (
        SELECT * FROM scope_messages
        WHERE scope_id = %(scope_id)s AND seq > %(after)s AND author_member_id <> %(viewer_id)s
          -- A rewind's notice raises no unread (docs/rewind.md).
          AND message_type <> 'rewind_notice'
        ORDER BY seq
        LIMIT %(cap)s
    ) m
    {READABLE_JOIN}
    WHERE v.reason IS NOT NULL
) readable
"""


async def readable_unread(
    conn: TrioConnection, scope_id: str, viewer: Viewer, after_seq: int
) -> int:
    """Messages above ``after_seq`` the viewer may read, excluding its own."""
    params = {"scope_id": scope_id, "after": after_seq, "cap": UNREAD_CAP, **viewer.params()}
    with map_errors():
        cur = await conn.execute(COUNT_READABLE_UNREAD, params)
        row = await cur.fetchone()
    return int(row[0]) if row else 0
