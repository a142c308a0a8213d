"""Rewind (docs/rewind.md): ``markRecoveryPoint``, ``rewind`` and the ``invalidate`` it sends.

Who may do what is :mod:`actors.rewind`'s. The rewind's writes (outbox rows
suppressed, activity set aside, the rewind row) are one transaction in
:mod:`storage.rewind`; its notice is an append of the scope's actor like any
message (the Applier writes it), whose plan writes no outbox row and wakes no
one. Then every session that reads the scope, here and on other nodes, gets
``invalidate`` and reads the scope again. Both direct pushes are on
docs/direct-no-outbox.md.
"""

from __future__ import annotations

from typing import Any

import structlog

from actors.mentions import MentionMode
from actors.model import Member, ScopeInfo, ScopeType
from actors.policy import Decision
from actors.rewind import can_mark_point, can_rewind
from actors.scope_state import SendCommand, SendReply
from node.ops.context import Context, member_of
from node.ops.reading import scope_viewer
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import InvalidateEvent, SendResult
from protocol.rewind import REWIND_NOTICE, REWIND_REASON, MarkRecoveryPoint, Rewind
from storage import access, messages, scopes
from storage import rewind as rewind_store

MESSAGE_ID = "$.messageId"
POINT_ID = "$.recoveryPointId"
NOTICE_WAIT_S = 5.0
log = structlog.get_logger(__name__)


def _forbidden(reason: str, message: str) -> OperationError:
    return OperationError(ErrorCode.FORBIDDEN, message, details={"reason": reason})


async def mark_recovery_point(ctx: Context, request: MarkRecoveryPoint) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        stored = await messages.get_message(conn, request.message_id)
    if stored is None or stored.author.workspace_id != member.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such message", path=MESSAGE_ID)
    try:
        viewer, info = await scope_viewer(ctx, stored.scope_id, MESSAGE_ID)
    except OperationError as error:
        # A message of a scope the caller may not read is no message to it.
        raise OperationError(ErrorCode.NOT_FOUND, "no such message", path=MESSAGE_ID) from error
    async with ctx.services.pool.connection() as conn:
        readable = await messages.readable_message(conn, info.id, stored.id, viewer)
    if readable is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such message", path=MESSAGE_ID)
    allowed = can_mark_point(info)
    if not allowed:
        raise _forbidden(allowed.reason, "this conversation cannot be rewound")
    async with ctx.services.pool.connection() as conn:
        point_id = await rewind_store.mark_point(
            conn, member.workspace_id, info.id, stored.id, member.id
        )
    return {"recoveryPointId": point_id, "scopeId": info.id, "seq": stored.seq}


async def rewind(ctx: Context, request: Rewind) -> dict[str, Any]:
    member = member_of(ctx)
    _, info = await scope_viewer(ctx, request.scope_id)
    async with ctx.services.pool.connection() as conn:
        point = await rewind_store.get_point(conn, request.recovery_point_id)
    if point is None or point.scope_id != info.id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such recovery point", path=POINT_ID)
    allowed = await _may_rewind(ctx, info, member)
    if not allowed.allowed:
        raise _forbidden(allowed.reason, f"rewind is not allowed ({allowed.reason})")
    async with ctx.services.pool.connection() as conn:
        done = await rewind_store.rewind(conn, point, member.id)
    notice_id = done.notice_message_id
    if not done.repeated:
        notice_id = await _post_notice(ctx, member, info, point.seq, done.id)
        if notice_id is not None:
            async with ctx.services.pool.connection() as conn:
                await rewind_store.set_notice(conn, done.id, notice_id)
    await _invalidate(ctx, info, done.from_seq)
    log.info(
        "rewound",
        scope_id=info.id,
        rewind_id=done.id,
        from_seq=done.from_seq,
        through_seq=done.through_seq,
        suppressed=done.suppressed,
        activity=done.activity,
    )
    return {
        "suppressed": done.suppressed,
        "noticeMessageId": notice_id,
        "fromSeq": done.from_seq,
        "throughSeq": done.through_seq,
    }


async def _may_rewind(ctx: Context, info: ScopeInfo, member: Member) -> Decision:
    """The facts :func:`actors.rewind.can_rewind` decides on, read now."""
    owner_scope = info
    dm_members: list[Member] = []
    async with ctx.services.pool.connection() as conn:
        if info.type is ScopeType.THREAD and info.parent_scope_id is not None:
            owner_scope = await scopes.get_scope(conn, info.parent_scope_id) or info
        rights = await access.read_rights(conn, owner_scope.id, member.id)
        if info.type is ScopeType.DM:
            listing = await scopes.current_members(conn, info.id)
            dm_members = [row.member for row in listing]
    return can_rewind(
        info,
        member,
        channel_owner_id=owner_scope.channel_owner_id,
        owner_is_public_member=rights.current_public,
        dm_members=dm_members,
    )


async def _post_notice(
    ctx: Context, member: Member, info: ScopeInfo, point_seq: int, rewind_id: str
) -> str | None:
    """The rewind's one notice, appended by the scope's actor (the Applier writes it)."""

    def command(reply: SendReply) -> SendCommand:
        return SendCommand(
            author=member,
            content=f"{member.display_name} rewound this conversation to message {point_seq}",
            client_message_id=f"rewind:{rewind_id}",
            reply=reply,
            message_type=REWIND_NOTICE,
            mention_mode=MentionMode.MULTI_FORWARD,
            metadata={"rewindId": rewind_id, "toSeq": point_seq},
        )

    result = await ctx.services.registry.send(info.id, command, NOTICE_WAIT_S)
    if not isinstance(result, SendResult) or result.message_id is None:
        # The rewind stands without its notice (the actor refused or was slow).
        log.warning("rewind_notice_not_posted", scope_id=info.id, outcome=repr(result))
        return None
    return result.message_id


async def _invalidate(ctx: Context, info: ScopeInfo, from_seq: int) -> None:
    """``invalidate`` to every session that reads the scope (idempotent: a client
    that gets it twice reads the same history twice)."""
    readers: set[str] = set()
    async with ctx.services.pool.connection() as conn:
        for row in await scopes.current_members(conn, info.id):
            readers.add(row.member.id)
        if info.type is ScopeType.THREAD and info.parent_scope_id is not None:
            for row in await scopes.current_members(conn, info.parent_scope_id):
                if row.visibility == "public":
                    readers.add(row.member.id)
    if not readers:
        return
    payload = encode(InvalidateEvent(scope_id=info.id, reason=REWIND_REASON, from_seq=from_seq))
    hub = ctx.services.hub
    for reader in readers:
        for session in hub.sessions_of(reader):
            session.push(payload)
    hub.relay_event(info.id, payload, audience=sorted(readers))
