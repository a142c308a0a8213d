"""Tasks (docs/tasks.md): ``createTask``, ``updateTask``, ``tasks`` and the ``taskUpdated`` event.

Who may do what is :mod:`actors.policy`'s; the writes (profile, roster,
activity and an assigned agent's wake) are one transaction in
:mod:`storage.tasks`. A task's discussion is an ordinary ``send`` to
``task:<id>`` (the scope actor's path). Assignees that are private agents are
shown only to their owner and themselves, as everywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from actors.mentions import MentionMode
from actors.model import Member, Membership, MemberType, ScopeType
from actors.policy import can_assign, can_create_task, can_update_task, knows_member
from actors.scope_state import SendCommand, SendReply
from node.ops.context import Context, member_of
from node.ops.messages import check_moderation
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import SendResult, to_builtins
from protocol.tasks import CreateTask, TaskEntry, Tasks, TaskUpdatedEvent, UpdateTask
from storage import access, directory, scopes
from storage import tasks as task_store
from storage.tasks import Task, TaskChange

TASK_ID = "$.taskId"
TASK_CARD = "task_card"
CARD_WAIT_S = 5.0
log = structlog.get_logger(__name__)


def _forbidden(reason: str, message: str) -> OperationError:
    return OperationError(ErrorCode.FORBIDDEN, message, details={"reason": reason})


async def _assignees(ctx: Context, actor: Member, ids: Sequence[str]) -> list[Member]:
    """The members named, each one the actor may see and assign (in the order given)."""
    unique = list(dict.fromkeys(ids))
    async with ctx.services.pool.connection() as conn:
        found = await directory.get_members(conn, unique)
    out: list[Member] = []
    for member_id in unique:
        member = found.get(member_id)
        if (
            member is None
            or member.workspace_id != actor.workspace_id
            or not knows_member(actor, member)
        ):
            raise OperationError(
                ErrorCode.NOT_FOUND, "no such member", path=f"$.assignees[{ids.index(member_id)}]"
            )
        allowed = can_assign(actor, member)
        if not allowed:
            raise _forbidden(allowed.reason, f"{member.handle} may be assigned by its owner only")
        out.append(member)
    return out


async def _linked_channel(ctx: Context, actor: Member, channel_id: str | None) -> str | None:
    if channel_id is None:
        return None
    info = await ctx.services.resolver.scope(actor, channel_id, "$.channelId")
    if info.type is not ScopeType.CHANNEL:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "channelId must name a channel", path="$.channelId"
        )
    async with ctx.services.pool.connection() as conn:
        viewer = await access.viewer_for(conn, info, actor)
    if viewer is None:
        raise _forbidden("not_channel_reader", "the channel is not readable")
    return info.id


async def create_task(ctx: Context, request: CreateTask) -> dict[str, Any]:
    member = member_of(ctx)
    allowed = can_create_task(member)
    if not allowed:
        raise _forbidden(allowed.reason, "private agents cannot create tasks")
    assignees = await _assignees(ctx, member, request.assignees)
    channel_id = await _linked_channel(ctx, member, request.channel_id)
    if channel_id is not None and member.type is MemberType.HUMAN:
        # The card carries the title into the channel: a human's words, moderated as such.
        await check_moderation(ctx.services, member, f"scope:{channel_id}", request.title)
    async with ctx.services.pool.connection() as conn:
        task = await task_store.create_task(
            conn,
            creator=member,
            title=request.title,
            description=request.description,
            assignees=assignees,
            channel_id=channel_id,
        )
    await _publish(ctx, task, ["created"], member, ())
    if channel_id is not None:
        await _post_card(ctx, member, task, channel_id)
    return {"taskId": task.id, "scopeId": task.id}


async def _post_card(ctx: Context, member: Member, task: Task, channel_id: str) -> None:
    """The task card in the channel it came from: an ordinary send of the creator
    (the channel's send path and its named policies), ``messageType: task_card``.
    Its title wakes no one (mentions in it are inert, as in a forward)."""

    def command(reply: SendReply) -> SendCommand:
        return SendCommand(
            author=member,
            content=f"Task: {task.title}",
            client_message_id=f"task-card:{task.id}",
            reply=reply,
            message_type=TASK_CARD,
            mention_mode=MentionMode.MULTI_FORWARD,
            metadata={"taskId": task.id, "title": task.title},
        )

    result = await ctx.services.registry.send(channel_id, command, CARD_WAIT_S)
    if not isinstance(result, SendResult):
        # The task stands without its card (the channel refused or was slow).
        log.warning("task_card_not_posted", task_id=task.id, outcome=repr(result))


async def _task_of(ctx: Context, member: Member, task_id: str) -> Membership | None:
    """The caller's current membership of the task (``not_found`` for what is no task to it)."""
    info = await ctx.services.resolver.scope(member, task_id, TASK_ID)
    if info.type is not ScopeType.TASK:
        raise OperationError(ErrorCode.NOT_FOUND, "no such task", path=TASK_ID)
    async with ctx.services.pool.connection() as conn:
        rights = await access.read_rights(conn, task_id, member.id)
    if rights.current_private:
        return Membership(member.id, "private", member.owner_member_id, 1)
    if rights.current_public and not member.is_private_agent:
        return Membership(member.id, "public", None, 1)
    return None


async def update_task(ctx: Context, request: UpdateTask) -> dict[str, Any]:
    member = member_of(ctx)
    membership = await _task_of(ctx, member, request.task_id)
    async with ctx.services.pool.connection() as conn:
        current = await task_store.get_task(conn, request.task_id)
    if current is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such task", path=TASK_ID)
    allowed = can_update_task(
        member,
        member=membership,
        creator_id=current.creator_id,
        assignees=current.assignees,
        reassigns=request.assignees is not None,
        retitles=request.title is not None,
    )
    if not allowed:
        if allowed.reason == "not_member":
            raise OperationError(ErrorCode.NOT_FOUND, "no such task", path=TASK_ID)
        raise _forbidden(allowed.reason, f"updateTask is not allowed ({allowed.reason})")
    wanted = None
    if request.assignees is not None:
        wanted = await _kept_private(ctx, member, current, request.assignees)
    change = TaskChange(status=request.status, title=request.title, assignees=wanted)
    async with ctx.services.pool.connection() as conn:
        changed = await task_store.update_task(
            conn, member.workspace_id, request.task_id, member, change
        )
    if changed is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such task", path=TASK_ID)
    before, after = changed
    changes = _changes(before, after)
    removed = [a for a in before.assignees if a not in after.assignees]
    if changes:
        await _publish(ctx, after, changes, member, removed)
    return {"task": to_builtins(await _entry_for(ctx, after, member))}


async def _kept_private(
    ctx: Context, actor: Member, current: Task, wanted_ids: Sequence[str]
) -> list[Member]:
    """The new assignee list: another owner's private agents stay as they are (the
    caller cannot see them, so its list cannot name or drop them)."""
    wanted = await _assignees(ctx, actor, wanted_ids)
    async with ctx.services.pool.connection() as conn:
        present = await directory.get_members(conn, list(current.assignees))
    hidden = [m for m in present.values() if not knows_member(actor, m)]
    return [*wanted, *hidden]


def _changes(before: Task, after: Task) -> list[str]:
    out = []
    if before.status != after.status:
        out.append("status")
    if before.title != after.title:
        out.append("title")
    if set(after.assignees) - set(before.assignees):
        out.append("assigned")
    if set(before.assignees) - set(after.assignees):
        out.append("unassigned")
    return out


def _shown_assignees(task: Task, viewer: Member, members: dict[str, Member]) -> list[str]:
    return [a for a in task.assignees if (m := members.get(a)) is None or knows_member(viewer, m)]


def _entry(task: Task, viewer: Member, members: dict[str, Member]) -> TaskEntry:
    return TaskEntry(
        task_id=task.id,
        scope_id=task.id,
        title=task.title,
        description=task.description,
        status=task.status,  # type: ignore[arg-type]
        creator_id=task.creator_id,
        channel_id=task.channel_id,
        assignees=_shown_assignees(task, viewer, members),
        latest_seq=task.latest_seq,
        unread=task.unread,
    )


async def _entry_for(ctx: Context, task: Task, viewer: Member) -> TaskEntry:
    async with ctx.services.pool.connection() as conn:
        members = await directory.get_members(conn, list(task.assignees))
    return _entry(task, viewer, members)


async def _publish(
    ctx: Context, task: Task, changes: list[str], actor: Member, removed: Iterable[str]
) -> None:
    """``taskUpdated`` to the task's current members and those just unassigned."""
    async with ctx.services.pool.connection() as conn:
        listing = await scopes.current_members(conn, task.id)
        audience = {row.member.id: row.member for row in listing}
        gone = await directory.get_members(conn, [r for r in removed if r not in audience])
        assignees = await directory.get_members(conn, list(task.assignees))
    audience.update(gone)
    hub = ctx.services.hub
    by_payload: dict[bytes, list[str]] = {}
    for viewer in audience.values():
        event = TaskUpdatedEvent(
            task_id=task.id,
            scope_id=task.id,
            title=task.title,
            status=task.status,  # type: ignore[arg-type]
            assignees=_shown_assignees(task, viewer, assignees),
            changes=changes,
            actor_id=actor.id if knows_member(viewer, actor) else None,
        )
        payload = encode(event)
        by_payload.setdefault(payload, []).append(viewer.id)
        for session in hub.sessions_of(viewer.id):
            session.push(payload)
    for payload, shown in by_payload.items():
        hub.relay_event(task.id, payload, audience=shown, daemons=True)


async def list_tasks(ctx: Context, request: Tasks) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        found = await task_store.list_tasks(
            conn,
            member,
            which=request.filter,
            status=request.status,
            channel_id=request.channel_id,
            cursor=request.cursor,
            limit=request.limit + 1,
        )
        ids = sorted({a for t in found for a in t.assignees})
        members = await directory.get_members(conn, ids)
    page = found[: request.limit]
    next_cursor = page[-1].id if len(found) > request.limit else None
    entries = [_entry(t, member, members) for t in page]
    return {"tasks": to_builtins(entries), "nextCursor": next_cursor}
