"""Profiles: a member's display name (docs/design.md#profiles).

A member renames itself; an owner renames its agents. Anyone else's profile
is ``forbidden``, and a private agent of another owner is answered as an
unknown member (``not_found``), as everywhere else it is hidden.
"""

from __future__ import annotations

from typing import Any

from actors.model import Member, MemberType
from node.ops.context import Context, member_of
from protocol.errors import ErrorCode, OperationError
from protocol.frames import UpdateProfile
from storage import directory


async def update_profile(ctx: Context, request: UpdateProfile) -> dict[str, Any]:
    caller = member_of(ctx)
    # The text rule already refused invisible and direction-changing
    # characters; spaces around a name would only misalign it.
    name = request.display_name.strip()
    target_id = request.member_id or caller.id
    if target_id != caller.id:
        await _check_owner(ctx, caller, target_id)
    async with ctx.services.pool.connection() as conn:
        stored = await directory.set_profile(conn, target_id, name, request.avatar_color)
    if stored is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member", path="$.memberId")
    updated, color = stored
    ctx.services.hub.publish_profile(updated, color)
    result: dict[str, Any] = {"memberId": updated.id, "displayName": updated.display_name}
    if color is not None:
        result["avatarColor"] = color
    return result


async def _check_owner(ctx: Context, caller: Member, target_id: str) -> None:
    """Another member's profile: only an agent the caller owns."""
    async with ctx.services.pool.connection() as conn:
        target = await directory.get_member(conn, target_id)
    hidden = target is None or target.workspace_id != caller.workspace_id
    if target is not None and target.is_private_agent and target.owner_member_id != caller.id:
        hidden = True
    if hidden:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member", path="$.memberId")
    assert target is not None
    if target.type is not MemberType.AGENT or target.owner_member_id != caller.id:
        raise OperationError(
            ErrorCode.FORBIDDEN,
            "a profile is changed by its member, or an agent's by its owner",
            path="$.memberId",
        )
