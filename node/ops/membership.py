"""Membership: channels, join/leave/invite, the member list, notification settings."""

from __future__ import annotations

from typing import Any

import trio

from actors.model import MemberType, NotificationState
from actors.scope_actor import RosterCommand
from node.ops.context import Context, member_of
from node.ops.reading import viewer_for
from protocol.errors import ErrorCode, OperationError
from protocol.frames import CreateChannel, Invite, Join, Leave, Members, SetNotification
from storage import directory, scopes
from storage.errors import UniqueViolation


async def list_members(ctx: Context, request: Members) -> dict[str, Any]:
    member = member_of(ctx)
    await viewer_for(ctx, request.scope_id)
    async with ctx.services.pool.connection() as conn:
        listing = await scopes.current_members(conn, request.scope_id)
    shown = []
    for row in listing:
        if row.visibility == "private" and member.id not in (row.member.id, row.owner_member_id):
            continue  # private members only where the viewer may see them
        entry: dict[str, Any] = {
            "id": row.member.id,
            "handle": row.member.handle,
            "displayName": row.member.display_name,
            "type": row.member.type.value,
            "visibility": row.visibility,
        }
        if row.visibility == "private":
            entry["ownerMemberId"] = row.owner_member_id
        shown.append(entry)
    return {"members": shown}


async def create_channel(ctx: Context, request: CreateChannel) -> dict[str, Any]:
    member = member_of(ctx)
    if member.is_private_agent:
        raise OperationError(ErrorCode.FORBIDDEN, "private agents cannot create channels")
    try:
        async with ctx.services.pool.connection() as conn:
            scope_id = await scopes.create_channel(
                conn,
                creator=member,
                slug=request.slug,
                name=request.name,
                visibility=request.visibility,
                description=request.description,
            )
    except UniqueViolation:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, f"channel #{request.slug} already exists", path="$.slug"
        ) from None
    return {"scopeId": scope_id}


async def _submit_roster(ctx: Context, scope_id: str, cmd: RosterCommand) -> Any:
    done = trio.Event()
    outcome: list[Any] = []

    def reply(result: Any) -> None:
        outcome.append(result)
        done.set()

    cmd.reply = reply
    await ctx.services.registry.submit(scope_id, cmd)
    await done.wait()
    if isinstance(outcome[0], OperationError):
        raise outcome[0]
    return outcome[0]


def _noop(_: Any) -> None:
    pass


async def roster(ctx: Context, request: Join | Leave) -> Any:
    member = member_of(ctx)
    info = await ctx.services.resolver.scope(member, request.scope_id)
    if isinstance(request, Join):
        if info.type.value != "channel":
            raise OperationError(ErrorCode.FORBIDDEN, "only channels can be joined")
        if info.channel_visibility == "private" or member.is_private_agent:
            raise OperationError(ErrorCode.FORBIDDEN, "this channel needs an invitation")
        cmd = RosterCommand("join", member, member, _noop)
    else:
        cmd = RosterCommand("leave", member, member, _noop)
    return await _submit_roster(ctx, request.scope_id, cmd)


async def invite(ctx: Context, request: Invite) -> Any:
    member = member_of(ctx)
    await ctx.services.resolver.scope(member, request.scope_id)
    async with ctx.services.pool.connection() as conn:
        invitee = await directory.get_member(conn, request.member_id)
        rights = await scopes.read_rights(conn, request.scope_id, member.id)
    if invitee is None or invitee.workspace_id != member.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member")
    if not rights.current_public and not rights.current_private:
        raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
    visibility = request.visibility or ("private" if invitee.is_private_agent else "public")
    if visibility == "private":
        if not invitee.is_private_agent or invitee.owner_member_id != member.id:
            raise OperationError(
                ErrorCode.FORBIDDEN, "only its owner can add a private agent", path="$.memberId"
            )
    elif invitee.is_private_agent:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "a private agent joins as private", path="$.visibility"
        )
    cmd = RosterCommand("invite", member, invitee, _noop, visibility=visibility)
    return await _submit_roster(ctx, request.scope_id, cmd)


async def set_notification(ctx: Context, request: SetNotification) -> Any:
    member = member_of(ctx)
    await ctx.services.resolver.scope(member, request.scope_id)
    state = NotificationState(request.state)
    if state in (NotificationState.AUTO_WAKE, NotificationState.NO_WAKE) and (
        member.type is not MemberType.AGENT
    ):
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, f"{state.value} applies to agents only", path="$.state"
        )
    cmd = RosterCommand("setNotification", member, member, _noop, state=state)
    return await _submit_roster(ctx, request.scope_id, cmd)
