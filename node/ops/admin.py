"""The workspace admin ops (protocol/admin.py): the web admin page's actions.

Each asks the database whether the caller is an admin of its workspace now,
so a demotion or deactivation counts from the next request on, whatever the
session's ``welcome`` said. They write through the same storage functions as
``scopenode admin`` (node/admin_commands.py): one code path for an operator
at a shell and an admin in a browser.
"""

from __future__ import annotations

from typing import Any

import structlog

from actors.model import Member, MemberType
from node.config import web_origin
from node.ops.context import Context, member_of
from protocol.admin import (
    AdminChannels,
    AdminCreateChannel,
    AdminCreateInvite,
    AdminCreateMember,
    AdminDeactivateMember,
    AdminInviteEntry,
    AdminInvites,
    AdminIssueToken,
    AdminMemberEntry,
    AdminMembers,
    AdminRevokeInvite,
    AdminRevokeTokens,
    AdminSetAdmin,
)
from protocol.errors import ErrorCode, OperationError
from protocol.frames import to_builtins
from protocol.invites import handle_problem
from storage import directory, invites, scopes, services
from storage.errors import UniqueViolation
from storage.pg import TrioConnection

log = structlog.get_logger(__name__)


async def handle(ctx: Context, request: Any) -> dict[str, Any]:
    """Answer one admin op, or ``forbidden`` when the caller is no admin."""
    admin = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        if not await directory.is_admin(conn, admin.id):
            raise OperationError(ErrorCode.FORBIDDEN, "only a workspace admin may do this")
        result: dict[str, Any] = await _HANDLERS[type(request)](ctx, conn, admin, request)
    log.info("admin_op", op=request.__struct_config__.tag)
    return result


def _invalid(path: str, message: str) -> OperationError:
    return OperationError(ErrorCode.VALIDATION_FAILED, message, path=path)


async def _target(conn: TrioConnection, admin: Member, member_id: str) -> Member:
    member = await directory.get_member(conn, member_id)
    if member is None or member.workspace_id != admin.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member", path="$.memberId")
    return member


async def _members(ctx: Context, conn: TrioConnection, admin: Member, _: AdminMembers) -> Any:
    listed = await directory.list_members(conn, admin.workspace_id)
    entries = [
        AdminMemberEntry(
            id=m.id,
            handle=m.handle,
            display_name=m.display_name,
            type=m.type.value,
            private=m.is_private,
            owner_member_id=m.owner_member_id,
            active=status == "active",
            admin=is_admin,
        )
        for m, status, is_admin in listed
    ]
    return {"members": to_builtins(entries)}


async def _channel_ids(conn: TrioConnection, workspace_id: str, slugs: list[str]) -> list[str]:
    found = []
    for i, slug in enumerate(slugs):
        scope_id = await scopes.channel_by_slug(conn, workspace_id, slug)
        if scope_id is None:
            raise OperationError(ErrorCode.NOT_FOUND, f"no channel #{slug}", path=f"$.join[{i}]")
        found.append(scope_id)
    return found


async def _owner(conn: TrioConnection, admin: Member, request: AdminCreateMember) -> None:
    if request.owner_member_id is None:
        if request.private:
            raise _invalid("$.ownerMemberId", "a private agent needs an owner")
        return
    owner = await directory.get_member(conn, request.owner_member_id)
    if owner is None or owner.workspace_id != admin.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member", path="$.ownerMemberId")
    if owner.type is not MemberType.HUMAN:
        raise _invalid("$.ownerMemberId", "the owner must be a human member")


async def _create_member(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminCreateMember
) -> Any:
    handle = request.handle.strip().lower()
    if (problem := handle_problem(handle)) is not None:
        raise _invalid("$.handle", problem)
    if request.private and request.kind != MemberType.AGENT.value:
        raise _invalid("$.private", "only agents can be private")
    if request.private and request.join:
        raise _invalid("$.join", "a private agent joins channels through its owner")
    await _owner(conn, admin, request)
    join = await _channel_ids(conn, admin.workspace_id, request.join)
    try:
        # One transaction: a member is never left half onboarded.
        async with conn.transaction():
            member = await directory.create_member(
                conn,
                workspace_id=admin.workspace_id,
                type_=MemberType(request.kind),
                handle=handle,
                display_name=(request.display_name or "").strip() or None,
                owner_member_id=request.owner_member_id,
                private=request.private,
            )
            joined = await scopes.join_on_creation(conn, member, join)
    except UniqueViolation as exc:
        if "handle" not in (exc.constraint or ""):
            raise
        raise _invalid("$.handle", f"{handle} is taken") from None
    return {"memberId": member.id, "channels": await invites.channel_slugs(conn, joined)}


async def _deactivate(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminDeactivateMember
) -> Any:
    member = await _target(conn, admin, request.member_id)
    if member.id == admin.id:
        raise _invalid("$.memberId", "an admin cannot deactivate itself")
    revoked = await services.deactivate_member(conn, member.id)
    return {"memberId": member.id, "tokensRevoked": revoked or 0}


async def _set_admin(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminSetAdmin
) -> Any:
    member = await _target(conn, admin, request.member_id)
    if member.type is not MemberType.HUMAN:
        raise _invalid("$.memberId", "only human members are admins")
    if member.id == admin.id and not request.admin:
        # Another admin demotes this one: a workspace never loses its last admin by a click.
        raise _invalid("$.memberId", "an admin cannot demote itself")
    await directory.set_admin(conn, member.id, request.admin)
    return {"memberId": member.id, "admin": request.admin}


async def _issue_token(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminIssueToken
) -> Any:
    member = await _target(conn, admin, request.member_id)
    if not await directory.is_active(conn, member.id):
        raise _invalid("$.memberId", "the member is deactivated")
    return {"memberId": member.id, "token": await directory.issue_token(conn, member.id)}


async def _revoke_tokens(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminRevokeTokens
) -> Any:
    member = await _target(conn, admin, request.member_id)
    revoked = await directory.revoke_member_tokens(conn, member.id)
    return {"memberId": member.id, "tokensRevoked": revoked}


async def _create_invite(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminCreateInvite
) -> Any:
    slugs = list(dict.fromkeys(request.join))
    join = await _channel_ids(conn, admin.workspace_id, slugs)
    created = await invites.create_invite(
        conn,
        admin.workspace_id,
        expires_in_s=request.expires_in_s,
        max_uses=request.max_uses,
        join_scope_ids=join,
    )
    settings = ctx.services.settings
    # The node the admin is using: the link opens the web client it serves.
    origin = web_origin(settings.host, ctx.services.port, settings.public_url)
    return {
        "inviteId": created.id,
        "inviteUrl": f"{origin}/#invite={created.code}",
        "expiresAt": created.expires_at.isoformat(),
        "maxUses": request.max_uses,
        "channels": [f"#{slug}" for slug in slugs],
    }


async def _invites(ctx: Context, conn: TrioConnection, admin: Member, _: AdminInvites) -> Any:
    listed = await invites.list_invites(conn, admin.workspace_id)
    entries = []
    for invite in listed:
        channels = await invites.channel_slugs(conn, invite.join_scope_ids)
        entries.append(
            AdminInviteEntry(
                id=invite.id,
                status=invite.status.value,
                expires_at=invite.expires_at.isoformat(),
                max_uses=invite.max_uses,
                uses=invite.uses,
                channels=channels,
                created_at=invite.created_at.isoformat(),
            )
        )
    return {"invites": to_builtins(entries)}


async def _revoke_invite(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminRevokeInvite
) -> Any:
    if not await invites.revoke_invite(conn, request.invite_id, admin.workspace_id):
        raise OperationError(ErrorCode.NOT_FOUND, "no such invite", path="$.inviteId")
    return {"inviteId": request.invite_id, "revoked": True}


async def _channels(ctx: Context, conn: TrioConnection, admin: Member, _: AdminChannels) -> Any:
    channels = await scopes.admin_channels(conn, admin.workspace_id)
    return {"channels": [c.view() for c in channels]}


async def _create_channel(
    ctx: Context, conn: TrioConnection, admin: Member, request: AdminCreateChannel
) -> Any:
    if request.default and request.visibility == "private":
        # Every newcomer joins a default channel: it must be one anyone may join.
        raise _invalid("$.default", "a default channel is public")
    try:
        scope_id = await scopes.create_channel(
            conn,
            creator=admin,
            slug=request.slug,
            name=request.name,
            visibility=request.visibility,
            description=request.description,
            default=request.default,
        )
    except UniqueViolation:
        raise _invalid("$.slug", f"channel #{request.slug} already exists") from None
    return {
        "scopeId": scope_id,
        "slug": f"#{request.slug}",
        "visibility": request.visibility,
        "default": request.default,
    }


_HANDLERS: dict[type, Any] = {
    AdminMembers: _members,
    AdminCreateMember: _create_member,
    AdminDeactivateMember: _deactivate,
    AdminSetAdmin: _set_admin,
    AdminIssueToken: _issue_token,
    AdminRevokeTokens: _revoke_tokens,
    AdminCreateInvite: _create_invite,
    AdminInvites: _invites,
    AdminRevokeInvite: _revoke_invite,
    AdminChannels: _channels,
    AdminCreateChannel: _create_channel,
}
