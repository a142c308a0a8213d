"""Messages: the send path from a request to the scope actor.

A send is not awaited: the session hands the command to the scope's actor in
the order read, and the actor answers through ``reply`` after commit.

Before that, the fields a client may not set freely are checked: the pure
rules of ``actors/send_rules.py`` first, then (only when the send has them)
its recipients, forward sources, attachments and live mentions (for the
``not_in_scope`` hints) against the database. A plain send, with none of
them, takes no extra round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from actors.mentions import live_handles, mode_for_forward, not_in_scope
from actors.model import Member, MemberType
from actors.scope_mutations import DeleteCommand, EditCommand
from actors.scope_state import SendCommand
from actors.send_rules import check_send_fields, recipient_errors
from actors.sources import SOURCE_COUNTS
from node.ops.context import Context, member_of
from node.services import Services
from protocol.errors import ErrorCode, OperationError
from protocol.frames import (
    CAPABILITY_FRESHNESS,
    Delete,
    Edit,
    Send,
    SendHint,
    SendResult,
    SourceRef,
)
from storage import access, directory, messages, moderation
from storage import attachments as storage_attachments
from storage.attachments import Attachment

SendReply = Callable[[SendResult | OperationError], None]


def send_command(
    member: Member,
    request: Send,
    capabilities: frozenset[str],
    reply: SendReply,
    recipient_members: tuple[Member, ...] = (),
    attachments: Sequence[Attachment] = (),
) -> SendCommand:
    return SendCommand(
        author=member,
        content=request.content,
        client_message_id=request.client_message_id,
        reply=reply,
        message_type=request.message_type,
        attachment_ids=tuple(request.attachment_ids),
        recipients=tuple(request.recipients),
        recipient_members=recipient_members,
        mention_mode=mode_for_forward(request.forward.mode if request.forward else None),
        forward=request.forward,
        freshness=request.freshness,
        freshness_declared=CAPABILITY_FRESHNESS in capabilities,
        explain=request.explain,
        # What readers are shown of each upload, stored with the message
        # (node/views.py): history, resume and live events need no lookup.
        metadata={"attachments": [a.view() for a in attachments]} if attachments else {},
    )


async def submit_send(
    services: Services,
    member: Member,
    request: Send,
    capabilities: frozenset[str],
    reply: SendReply,
) -> None:
    """Check what the client set, resolve the target (cached) and queue the send
    on its scope actor."""
    sources = request.forward.sources if request.forward is not None else []
    check_send_fields(
        member,
        message_type=request.message_type,
        client_message_id=request.client_message_id,
        attachment_ids=request.attachment_ids,
        source_ids=[source.message_id for source in sources],
    )
    if request.forward is not None:
        source_count_check(request.forward.mode, len(sources))
    recipients = (
        await recipient_members(services, member, request.recipients) if request.recipients else ()
    )
    if sources:
        await check_sources(services, member, sources)
    if member.type is MemberType.HUMAN:
        await check_moderation(services, member, request.target, request.content)
    scope_id = services.resolver.cached(member, request.target)
    if scope_id is None:
        scope_id = await services.resolver.resolve(member, request.target)
    mode = mode_for_forward(request.forward.mode if request.forward else None)
    handles = live_handles(request.content, mode) if "@" in request.content else frozenset()
    if handles:
        reply = await with_hints(services, member, scope_id, handles, reply)
    attachments = (
        await reserve_attachments(services, member, scope_id, request)
        if request.attachment_ids
        else ()
    )
    await services.registry.submit(
        scope_id, send_command(member, request, capabilities, reply, recipients, attachments)
    )


async def with_hints(
    services: Services, member: Member, scope_id: str, handles: frozenset[str], reply: SendReply
) -> SendReply:
    """``reply``, adding a ``not_in_scope`` hint for each mentioned member who
    will not read the message, so the sender can invite them.

    Looked up before the send: a roster change racing it only makes the hint
    stale, never the send wrong.
    """
    async with services.pool.connection() as conn:
        mentioned = await directory.mentioned_members(
            conn, member.workspace_id, scope_id, sorted(handles)
        )
    hints = [
        SendHint(kind="not_in_scope", member_id=m.id, handle=m.handle)
        for m in not_in_scope(member, mentioned)
    ]
    if not hints:
        return reply

    def hinted(result: SendResult | OperationError) -> None:
        if isinstance(result, SendResult) and result.state in ("sent", "already_sent"):
            result = msgspec.structs.replace(result, hints=hints)
        reply(result)

    return hinted


async def reserve_attachments(
    services: Services, member: Member, scope_id: str, request: Send
) -> tuple[Attachment, ...]:
    """The sender's own unclaimed uploads the send names, reserved for it
    (docs/design.md#attachments); any other id is ``validation_failed``.

    Checked last, after everything that could refuse the send here, so a
    refused send reserves nothing. The send's statement claims them only if
    they are still the author's and unclaimed, and the reservation keeps
    every other send off them meanwhile: two sends of one upload cannot both
    pass, so a message is never stored without an upload it was accepted with.
    """
    async with services.pool.connection() as conn:
        found = await storage_attachments.reserve_for_send(
            conn,
            author_id=member.id,
            scope_id=scope_id,
            client_message_id=request.client_message_id,
            attachment_ids=request.attachment_ids,
        )
    for index, attachment_id in enumerate(request.attachment_ids):
        if attachment_id not in found:
            raise OperationError(
                ErrorCode.VALIDATION_FAILED,
                "no such upload of yours, or it is already attached to another message",
                path=f"$.attachmentIds[{index}]",
            )
    return tuple(found[attachment_id] for attachment_id in request.attachment_ids)


async def recipient_members(
    services: Services, member: Member, recipients: Sequence[str]
) -> tuple[Member, ...]:
    """The recipients as members of the sender's workspace (``validation_failed``
    otherwise); authority over private agents is the actor's check."""
    async with services.pool.connection() as conn:
        found = await directory.get_members(conn, sorted(set(recipients)))
    error = recipient_errors(member, recipients, found)
    if error is not None:
        raise error
    return tuple(found[member_id] for member_id in recipients)


def source_count_check(mode: str, count: int) -> None:
    """A quote and a single forward cite one message; multi and explicit context at least one."""
    low, high = SOURCE_COUNTS[mode]
    if not low <= count <= high:
        wanted = "exactly one source" if low == high else f"{low} to {high} sources"
        raise OperationError(
            ErrorCode.VALIDATION_FAILED,
            f"forward mode {mode!r} takes {wanted}",
            path="$.forward.sources",
        )


async def check_sources(services: Services, member: Member, sources: Sequence[SourceRef]) -> None:
    """Every forwarded message must be readable by the sender (the SQL predicate).

    An unknown id, one of another workspace, or one in a scope that does not
    exist for the sender (docs/authorization.md) is ``not_found``; a message
    of a scope it knows but may not read there is ``forbidden``.
    """
    async with services.pool.connection() as conn:
        for index, source in enumerate(sources):
            path = f"$.forward.sources[{index}].messageId"
            found = await access.known_message_scope(conn, source.message_id, member)
            if found is None:
                raise OperationError(ErrorCode.NOT_FOUND, "no such message", path=path)
            viewer = await access.viewer_for(conn, found.info, member)
            if (
                viewer is None
                or await messages.readable_message(conn, found.info.id, source.message_id, viewer)
                is None
            ):
                raise OperationError(
                    ErrorCode.FORBIDDEN, "the sender cannot read this message", path=path
                )


async def check_moderation(
    services: Services, member: Member, target: str, content: str, author: Member | None = None
) -> None:
    """A human's send that matches the keyword list is refused (docs/design.md#moderation).

    ``author``: the service a manager posts as (the durable author the audit
    row names); the human is always ``member``.

    Nothing of the send is written (no message, outbox row or search document,
    nothing pushed, no DM or thread created for it); the one trace is its
    ``moderation_audit_log`` row.
    """
    matched = services.moderation.matches(content)
    if not matched:
        return
    scope_id = services.resolver.cached(member, target)
    if scope_id is None and (
        target.startswith("scope:") or (target[:1] == "#" and ":" not in target)
    ):
        # These forms resolve without creating anything; a DM or a thread
        # target is only looked up when it is already cached.
        try:
            scope_id = await services.resolver.resolve(member, target)
        except OperationError:
            scope_id = None
    async with services.pool.connection() as conn:
        await moderation.record_blocked(
            conn,
            workspace_id=member.workspace_id,
            scope_id=scope_id,
            target=target,
            human_member_id=member.id,
            author_member_id=(author or member).id,
            content=content,
            matched=matched,
        )
    raise OperationError(
        ErrorCode.MODERATION_BLOCKED,
        "the message matches the deployment's keyword list",
        details={"matched": list(matched)},
    )


# ---------------------------------------------------------------- edits and deletes


async def edit(ctx: Context, request: Edit) -> dict[str, object]:
    """``edit``: checked here for form and readability, decided by the scope's actor
    (docs/design.md#edits-and-deletes)."""
    member = member_of(ctx)
    if not request.content.strip():
        raise OperationError(
            ErrorCode.VALIDATION_FAILED,
            "an edit needs content; delete the message instead",
            path="$.content",
        )
    if len(request.content) > ctx.settings.row_limit:
        # A stored row never grows past the row limit: an edit is not chunked.
        raise OperationError(
            ErrorCode.VALIDATION_FAILED,
            f"an edit has at most {ctx.settings.row_limit} characters",
            path="$.content",
        )
    scope_id = await readable_message_scope(ctx.services, member, request.message_id)
    if member.type is MemberType.HUMAN:
        # The same boundary as a send: a refused edit writes only its audit row
        # and the message keeps its old content.
        await check_moderation(ctx.services, member, f"scope:{scope_id}", request.content)
    cmd = EditCommand(member, request.message_id, request.content, _unset, request.revision)
    return await submit_mutation(ctx.services, scope_id, cmd)


async def delete(ctx: Context, request: Delete) -> dict[str, object]:
    """``delete``: the author's or the channel owner's, decided by the scope's actor."""
    member = member_of(ctx)
    scope_id = await readable_message_scope(ctx.services, member, request.message_id)
    return await submit_mutation(
        ctx.services, scope_id, DeleteCommand(member, request.message_id, _unset)
    )


async def readable_message_scope(services: Services, member: Member, message_id: str) -> str:
    """The scope of a message the member may read.

    ``not_found`` when there is no such message in a scope that exists for the
    member (a private scope it never belonged to reads as missing, in the same
    one statement), ``forbidden`` when the member knows the scope but may not
    read the message (the SQL predicate): the same answers as reading it, so a
    mutation is no oracle.
    """
    async with services.pool.connection() as conn:
        found = await access.known_message_scope(conn, message_id, member)
        if found is None:
            raise OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId")
        viewer = await access.viewer_for(conn, found.info, member)
        if (
            viewer is None
            or await messages.readable_message(conn, found.info.id, message_id, viewer) is None
        ):
            raise OperationError(ErrorCode.FORBIDDEN, "the message is not readable")
    return found.info.id


async def submit_mutation(
    services: Services, scope_id: str, cmd: EditCommand | DeleteCommand
) -> dict[str, object]:
    """Queue the command on the scope's actor and wait for its answer."""
    return await services.registry.ask(scope_id, cmd)


def _unset(_: dict[str, object] | OperationError) -> None:
    """Placeholder until :func:`submit_mutation` sets the reply."""
