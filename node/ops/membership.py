"""Membership: channels, join/leave/invite/remove, member and people lists, notifications.

Who may change a roster is decided by :mod:`actors.policy` inside the scope's
actor (serialised with its sends); these handlers only check that the scope
and the member named exist in the caller's workspace (``not_found``
otherwise) and that the request is well formed.
"""

from __future__ import annotations

from typing import Any

from actors.model import Member, MemberType, NotificationState
from actors.scope_roster import RosterCommand
from node.ops.context import Context, member_of
from node.ops.reading import scope_viewer
from protocol.errors import ErrorCode, OperationError
from protocol.frames import (
    ChannelEntry,
    CreateChannel,
    Invite,
    Join,
    Leave,
    Members,
    PersonEntry,
    Remove,
    SetNotification,
    to_builtins,
)
from storage import directory, schedules, scopes
from storage.errors import UniqueViolation


async def list_members(ctx: Context, request: Members) -> dict[str, Any]:
    member = member_of(ctx)
    _, info = await scope_viewer(ctx, request.scope_id)
    async with ctx.services.pool.connection() as conn:
        listing = await scopes.current_members(conn, request.scope_id)
    shown = []
    for row in listing:
        if row.visibility == "private" and member.id not in (row.member.id, row.owner_member_id):
            continue  # private members only to themselves and their owner (design.md#private-agents)
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
    result: dict[str, Any] = {"members": shown}
    if info.channel_owner_id is not None:
        # Additive: lets a client offer ``remove`` to the one member who may use it.
        result["channelOwnerId"] = info.channel_owner_id
    return result


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
    return await ctx.services.registry.ask(scope_id, cmd)


def _noop(_: Any) -> None:
    pass


async def roster(ctx: Context, request: Join | Leave) -> Any:
    member = member_of(ctx)
    await ctx.services.resolver.scope(member, request.scope_id)
    op = "join" if isinstance(request, Join) else "leave"
    return await _submit_roster(ctx, request.scope_id, RosterCommand(op, member, member, _noop))


async def _workspace_member(ctx: Context, caller: Member, member_id: str) -> Member:
    async with ctx.services.pool.connection() as conn:
        found = await directory.get_member(conn, member_id)
    if found is None or found.workspace_id != caller.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member", path="$.memberId")
    return found


async def invite(ctx: Context, request: Invite) -> Any:
    member = member_of(ctx)
    await ctx.services.resolver.scope(member, request.scope_id)
    invitee = await _workspace_member(ctx, member, request.member_id)
    visibility = request.visibility or ("private" if invitee.is_private_agent else "public")
    if invitee.is_private_agent and visibility != "private":
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "a private agent joins as private", path="$.visibility"
        )
    cmd = RosterCommand("invite", member, invitee, _noop, visibility=visibility)
    return await _submit_roster(ctx, request.scope_id, cmd)


async def remove(ctx: Context, request: Remove) -> Any:
    """End another member's membership: the channel's owner, or the owner of a private agent."""
    member = member_of(ctx)
    await ctx.services.resolver.scope(member, request.scope_id)
    target = await _workspace_member(ctx, member, request.member_id)
    return await _submit_roster(
        ctx, request.scope_id, RosterCommand("remove", member, target, _noop)
    )


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


async def list_channels(ctx: Context) -> dict[str, Any]:
    """The channel browser: public channels, and private ones the caller is in."""
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        listing = await scopes.channels_for(conn, member)
    channels = [
        ChannelEntry(
            id=c.id,
            slug=c.slug,
            name=c.name,
            description=c.description,
            visibility="private" if c.visibility == "private" else "public",
            member_count=c.member_count,
            joined=c.joined,
        )
        for c in listing
    ]
    return {"channels": to_builtins(channels)}


async def list_people(ctx: Context) -> dict[str, Any]:
    """Members the caller may name (DMs, mentions): private agents only to their owner."""
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        listing = await scopes.people_for(conn, member)
        scheduler_id = await schedules.service_id(conn, member.workspace_id)
    people = [
        PersonEntry(
            id=p.id,
            handle=p.handle,
            display_name=p.display_name,
            type=p.type,
            owner_member_id=p.owner_member_id if p.private else None,
            avatar_color=p.avatar_color,
            service_kind="schedule" if p.id == scheduler_id else None,
        )
        for p in listing
    ]
    return {"people": to_builtins(people)}
