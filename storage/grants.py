"""Private grants: an owner lets a grantee direct its private agents in one scope.

A grant or revoke bumps the scope's ``roster_generation`` first, which locks
the scope row, and only then takes its timestamp from ``clock_timestamp()``.
A send either committed before that lock, so its ``created_at`` (database time,
``actors/clock.py``) is earlier than the grant change, or it is fenced on the
old generation and misses, reloads and sees the change. Either way the fan-out
decided in memory and the readable predicate agree about the message.
"""

from __future__ import annotations

from datetime import datetime

from actors.ids import new_id
from storage.errors import map_errors
from storage.pg import TrioConnection

INSERT_GRANT = """
INSERT INTO scope_private_grants
    (id, workspace_id, scope_id, owner_member_id, grantee_member_id, granted_by_member_id,
     expires_at, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, clock_timestamp())
"""
LOCK_GRANT = """
SELECT scope_id FROM scope_private_grants
WHERE id = %s AND owner_member_id = %s AND revoked_at IS NULL
FOR UPDATE
"""
STAMP_REVOKE = "UPDATE scope_private_grants SET revoked_at = clock_timestamp() WHERE id = %s"
BUMP_ROSTER = "UPDATE scopes SET roster_generation = roster_generation + 1 WHERE id = %s"


async def create(
    conn: TrioConnection,
    *,
    workspace_id: str,
    scope_id: str,
    owner_id: str,
    grantee_id: str,
    expires_at: datetime | None,
) -> str:
    grant_id = new_id("grt")
    with map_errors():
        async with conn.transaction():
            await conn.execute(BUMP_ROSTER, (scope_id,))
            await conn.execute(
                INSERT_GRANT,
                (grant_id, workspace_id, scope_id, owner_id, grantee_id, owner_id, expires_at),
            )
    return grant_id


async def revoke(conn: TrioConnection, grant_id: str, *, owner_id: str) -> str | None:
    """Revoke a grant the owner made; the grant's scope id, or None if there was none."""
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(LOCK_GRANT, (grant_id, owner_id))
            row = await cur.fetchone()
            if row is None:
                return None
            # The scope row is locked before the revoke's timestamp is taken (see above).
            await conn.execute(BUMP_ROSTER, (row[0],))
            await conn.execute(STAMP_REVOKE, (grant_id,))
    return str(row[0])
