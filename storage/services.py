"""Service accounts: a service member, its one ``service_account`` scope, its
managers and its audience (docs/services.md).

The audience is every active human of the workspace, kept as ordinary
memberships: a service's creation adds every human at once, a human's
creation joins it to every service of its workspace
(``scopes.join_on_creation``), and a member's deactivation ends its
memberships (:func:`deactivate_member`). Agents
are never in the audience.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actors.ids import new_id
from actors.model import Member, MemberType, NotificationState
from storage import directory, scopes
from storage.errors import map_errors
from storage.pg import TrioConnection

SELECT_ACTIVE_HUMANS = f"""
SELECT {directory.MEMBER_COLUMNS} FROM members
WHERE workspace_id = %s AND type = 'human' AND status = 'active'
ORDER BY created_at, id
"""
SELECT_SERVICE_SCOPE = "SELECT id FROM scopes WHERE identity_key = %s"
INSERT_MANAGER = """
INSERT INTO service_managers (service_member_id, manager_member_id) VALUES (%s, %s)
ON CONFLICT DO NOTHING
"""
DELETE_MANAGER = """
DELETE FROM service_managers WHERE service_member_id = %s AND manager_member_id = %s
RETURNING manager_member_id
"""
SELECT_IS_MANAGER = """
SELECT 1 FROM service_managers sm JOIN members m ON m.id = sm.manager_member_id
WHERE sm.service_member_id = %s AND sm.manager_member_id = %s AND m.status = 'active'
"""
SELECT_MANAGERS = """
SELECT manager_member_id FROM service_managers WHERE service_member_id = %s
ORDER BY manager_member_id
"""
SELECT_MANAGED = """
SELECT service_member_id FROM service_managers WHERE manager_member_id = %s
ORDER BY service_member_id
"""
SELECT_CURRENT_SCOPES = """
SELECT scope_id FROM scope_memberships WHERE member_id = %s AND effective_to_seq IS NULL
ORDER BY scope_id
"""


@dataclass(frozen=True, slots=True)
class Service:
    member: Member
    scope_id: str


def identity(member: Member) -> str:
    return f"service_account:{member.workspace_id}:{member.id}"


async def create_service(
    conn: TrioConnection,
    *,
    workspace_id: str,
    handle: str,
    display_name: str | None,
    managers: Sequence[Member] = (),
) -> Service:
    """The service member, its scope with every active human in it, and its
    managers, in one transaction."""
    with map_errors():
        async with conn.transaction():
            member = await directory.create_member(
                conn,
                workspace_id=workspace_id,
                type_=MemberType.SERVICE,
                handle=handle,
                display_name=display_name,
            )
            cur = await conn.execute(
                scopes.INSERT_SCOPE,
                (
                    new_id("scp"),
                    workspace_id,
                    "service_account",
                    identity(member),
                    member.id,
                    None,
                    None,
                ),
            )
            row = await cur.fetchone()
            assert row is not None
            scope_id = str(row[0])
            await _add(conn, scope_id, member)
            cur = await conn.execute(SELECT_ACTIVE_HUMANS, (workspace_id,))
            for human in [directory.member_from_row(r) for r in await cur.fetchall()]:
                await _add(conn, scope_id, human)
            for manager in managers:
                await conn.execute(INSERT_MANAGER, (member.id, manager.id))
    return Service(member, scope_id)


async def _add(conn: TrioConnection, scope_id: str, member: Member) -> None:
    await scopes.join(
        conn,
        scope_id,
        member,
        visibility="public",
        owner_member_id=None,
        state=NotificationState.ACTIVE,
    )


async def service_by_handle(conn: TrioConnection, workspace_id: str, handle: str) -> Service | None:
    """The workspace's active service with this handle, or None."""
    member = await directory.get_member_by_handle(conn, workspace_id, handle.lower())
    if member is None or member.type is not MemberType.SERVICE:
        return None
    if not await directory.is_active(conn, member.id):
        return None
    scope_id = await service_scope(conn, member)
    return Service(member, scope_id) if scope_id is not None else None


async def service_scope(conn: TrioConnection, member: Member) -> str | None:
    with map_errors():
        cur = await conn.execute(SELECT_SERVICE_SCOPE, (identity(member),))
        row = await cur.fetchone()
    return str(row[0]) if row else None


async def add_manager(conn: TrioConnection, service: Member, manager: Member) -> None:
    with map_errors():
        await conn.execute(INSERT_MANAGER, (service.id, manager.id))


async def remove_manager(conn: TrioConnection, service: Member, manager: Member) -> bool:
    """False when ``manager`` was not one."""
    with map_errors():
        cur = await conn.execute(DELETE_MANAGER, (service.id, manager.id))
        return await cur.fetchone() is not None


async def is_manager(conn: TrioConnection, service_id: str, member_id: str) -> bool:
    """Whether ``member_id`` is an active manager of the service now."""
    with map_errors():
        cur = await conn.execute(SELECT_IS_MANAGER, (service_id, member_id))
        return await cur.fetchone() is not None


async def managers(conn: TrioConnection, service_id: str) -> list[str]:
    with map_errors():
        cur = await conn.execute(SELECT_MANAGERS, (service_id,))
        return [str(row[0]) for row in await cur.fetchall()]


async def managed_by(conn: TrioConnection, member_id: str) -> list[str]:
    """The service members ``member_id`` manages."""
    with map_errors():
        cur = await conn.execute(SELECT_MANAGED, (member_id,))
        return [str(row[0]) for row in await cur.fetchall()]


async def deactivate_member(conn: TrioConnection, member_id: str) -> int | None:
    """Deactivate a member, revoke its tokens and end every membership it holds,
    in one transaction; the tokens revoked, or None when there is no such member.

    Each leave bumps its scope's roster generation, so an actor holding the
    old roster reloads before its next send instead of delivering to a
    deactivated member.
    """
    with map_errors():
        async with conn.transaction():
            revoked = await directory.deactivate_member(conn, member_id)
            if revoked is None:
                return None
            cur = await conn.execute(SELECT_CURRENT_SCOPES, (member_id,))
            for row in await cur.fetchall():
                await scopes.leave(conn, str(row[0]), member_id)
    return revoked
