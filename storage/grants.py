"""Private grants: an owner lets a grantee direct its private agents in one scope."""

from __future__ import annotations

from datetime import datetime

from actors.ids import new_id
from storage.errors import map_errors
from storage.pg import TrioConnection

INSERT_GRANT = """
INSERT INTO scope_private_grants
    (id, workspace_id, scope_id, owner_member_id, grantee_member_id, granted_by_member_id,
     expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
REVOKE_GRANT = """
UPDATE scope_private_grants SET revoked_at = now()
WHERE id = %s AND owner_member_id = %s AND revoked_at IS NULL
RETURNING scope_id
"""
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
            await conn.execute(
                INSERT_GRANT,
                (grant_id, workspace_id, scope_id, owner_id, grantee_id, owner_id, expires_at),
            )
            await conn.execute(BUMP_ROSTER, (scope_id,))
    return grant_id


async def revoke(conn: TrioConnection, grant_id: str, *, owner_id: str) -> str | None:
    """Revoke a grant the owner made; the grant's scope id, or None if there was none."""
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(REVOKE_GRANT, (grant_id, owner_id))
            row = await cur.fetchone()
            if row is None:
                return None
            await conn.execute(BUMP_ROSTER, (row[0],))
    return str(row[0])
