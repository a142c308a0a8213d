"""Private grants: an owner lets a grantee direct its private agents in one scope.

Grants are written here, outside the scope's actor: ``storage/grants.py`` bumps
the scope's ``roster_generation`` in the same transaction, so any actor on any
node that planned a send on the old grants misses the fence and reloads. The
actor on this node is also marked stale, so its next send reloads first
instead of spending a round trip on the miss.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from actors.model import MemberType
from node.ops.context import Context, member_of
from protocol.errors import ErrorCode, OperationError
from protocol.frames import Grant, RevokeGrant
from storage import access, directory, grants
from storage.errors import ConstraintViolation

CHECK_VIOLATION = "23514"


async def grant(ctx: Context, request: Grant) -> dict[str, Any]:
    member = member_of(ctx)
    expires_at = _in_utc(request.expires_at)
    await ctx.services.resolver.scope(member, request.scope_id)
    async with ctx.services.pool.connection() as conn:
        grantee = await directory.get_member(conn, request.grantee_member_id)
        rights = await access.read_rights(conn, request.scope_id, member.id)
        if grantee is None or grantee.workspace_id != member.workspace_id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such member")
        if member.type is not MemberType.HUMAN or not rights.current_public:
            raise OperationError(ErrorCode.FORBIDDEN, "only a human member can grant")
        if grantee.id == member.id:
            raise OperationError(ErrorCode.VALIDATION_FAILED, "cannot grant to yourself")
        try:
            grant_id = await grants.create(
                conn,
                workspace_id=member.workspace_id,
                scope_id=request.scope_id,
                owner_id=member.id,
                grantee_id=grantee.id,
                expires_at=expires_at,
            )
        except ConstraintViolation as exc:
            # The one check left (the grantee is not the owner, checked above):
            # it expires after the database stamps it. The database's clock
            # decides, as for every grant (actors/clock.py), never the node's.
            if exc.sqlstate == CHECK_VIOLATION:
                raise _expired() from None
            raise
    _mark_stale(ctx, request.scope_id)
    return {"grantId": grant_id}


async def revoke_grant(ctx: Context, request: RevokeGrant) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        scope_id = await grants.revoke(conn, request.grant_id, owner_id=member.id)
    if scope_id is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such grant", path="$.grantId")
    _mark_stale(ctx, scope_id)
    return {}


def _in_utc(expires_at: datetime | None) -> datetime | None:
    """``expiresAt`` in UTC. A time outside the years 1 to 9999 there
    (9999-12-31T23:59:59-14:00) would be stored, and then every load of the
    scope, which reads its grants, would fail: it is refused."""
    if expires_at is None:
        return None
    try:
        return expires_at.astimezone(UTC)
    except OverflowError:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED,
            "expiresAt is out of range (the years 1 to 9999 in UTC)",
            path="$.expiresAt",
        ) from None


def _expired() -> OperationError:
    return OperationError(
        ErrorCode.VALIDATION_FAILED, "expiresAt must be later than now", path="$.expiresAt"
    )


def _mark_stale(ctx: Context, scope_id: str) -> None:
    actor = ctx.services.registry.actor_nowait(scope_id)
    if actor is not None:
        actor.stale = True
