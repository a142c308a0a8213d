"""Share cards and app cards (docs/cards.md).

A card is posted through the same path as a send (the target's scope actor,
Policy, Planner, Applier) with a message type the node owns; the sidecar
row travels in the plan. Revoking, acting on and updating a card are
mutations of the card's message, decided by the scope's actor
(``actors/scope_cards.py``). What a share card points at is shown to each
reader only when it may see it, by ``history`` (``storage/cards.py``).
"""

from __future__ import annotations

from typing import Any

from actors.cards import APP_CARD, APP_KEY, SHARE_CARD, SHARE_KEY, CardChange, CardCommand
from actors.ids import new_id
from actors.model import Member, MemberType, ScopeType
from actors.send_rules import client_message_id_error
from node.ops.context import Context, member_of
from node.ops.messages import readable_message_scope
from node.ops.services import post_as
from node.services import Services
from protocol.cards import (
    CardAction,
    CardActionEvent,
    CardBody,
    PostCard,
    RevokeShare,
    ShareChannel,
    ShareMessage,
    UpdateCard,
)
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import SendResult, to_builtins
from storage import access, cards, messages
from storage.pg import TrioConnection

# A share card's content: what search finds and a client without cards shows.
# It never names what was shared, which not every reader may see.
SHARED_CHANNEL = "shared a channel"
SHARED_MESSAGE = "shared a message"


async def share_channel(ctx: Context, request: ShareChannel) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        visible = await _sees_channel(conn, request.channel_id, member)
    if not visible:
        raise OperationError(ErrorCode.NOT_FOUND, "no such channel", path="$.channelId")
    return await _share(
        ctx,
        member,
        request.target,
        request.client_message_id,
        SHARED_CHANNEL,
        {"kind": "channel", "source_scope_id": request.channel_id},
    )


async def _sees_channel(conn: TrioConnection, channel_id: str, member: Member) -> bool:
    """A public channel of the member's workspace, or a private one it is in now:
    the channels a share card may show it (storage/cards.py asks the same)."""
    found = await access.known_scope(conn, channel_id, member)
    if found is None or found.info.type is not ScopeType.CHANNEL:
        return False
    if found.shared:
        return True
    rights = await access.read_rights(conn, found.info.id, member.id)
    return rights.current_public or rights.current_private


async def share_message(ctx: Context, request: ShareMessage) -> dict[str, Any]:
    member = member_of(ctx)
    scope_id = await readable_message_scope(ctx.services, member, request.message_id)
    return await _share(
        ctx,
        member,
        request.target,
        request.client_message_id,
        SHARED_MESSAGE,
        {"kind": "message", "source_scope_id": scope_id, "source_message_id": request.message_id},
    )


async def _share(
    ctx: Context,
    member: Member,
    target: str,
    client_message_id: str | None,
    content: str,
    card: dict[str, Any],
) -> dict[str, Any]:
    error = client_message_id_error(client_message_id) if client_message_id else None
    if error is not None:
        raise error
    card_id = new_id("shc")
    _, result = await post_as(
        ctx.services,
        member,
        target=target,
        content=content,
        client_message_id=client_message_id or new_id("share"),
        message_type=SHARE_CARD,
        metadata={SHARE_KEY: {"id": card_id, **card}},
    )
    message_id, seq = _posted(result)
    if result.state == "already_sent":
        async with ctx.services.pool.connection() as conn:
            card_id = await cards.share_card_of(conn, message_id) or card_id
    return {"cardId": card_id, "messageId": message_id, "seq": seq}


async def revoke_share(ctx: Context, request: RevokeShare) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        found = await cards.share_card(conn, request.card_id, member.workspace_id)
    if found is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such card", path="$.cardId")
    scope_id, message_id = found
    try:
        await readable_message_scope(ctx.services, member, message_id)
    except OperationError as exc:
        # A card the caller cannot read answers as one that does not exist.
        raise OperationError(ErrorCode.NOT_FOUND, "no such card", path="$.cardId") from exc
    change = CardChange("revoke", request.card_id)
    return await ctx.services.registry.ask(scope_id, CardCommand(member, message_id, change))


async def post_card(ctx: Context, request: PostCard) -> dict[str, Any]:
    member = member_of(ctx)
    if member.type is not MemberType.SERVICE:
        raise OperationError(
            ErrorCode.FORBIDDEN, "only a service posts cards", details={"reason": "not_service"}
        )
    error = client_message_id_error(request.client_message_id)
    if error is not None:
        raise error
    render, actions = _render(request.card)
    expires = request.expires_at.isoformat() if request.expires_at is not None else None
    _, result = await post_as(
        ctx.services,
        member,
        target=request.target,
        content=request.fallback,
        client_message_id=request.client_message_id,
        message_type=APP_CARD,
        metadata={APP_KEY: {"render": render, "actions": actions, "expires_at": expires}},
    )
    message_id, seq = _posted(result)
    return {"messageId": message_id, "seq": seq, "revision": 1}


async def card_action(ctx: Context, request: CardAction) -> dict[str, Any]:
    member = member_of(ctx)
    scope_id = await readable_message_scope(ctx.services, member, request.message_id)
    async with ctx.services.pool.connection() as conn:
        message = await messages.get_message(conn, request.message_id)
    if message is None or message.message_type != APP_CARD:
        raise OperationError(ErrorCode.NOT_FOUND, "not an app card", path="$.messageId")
    change = CardChange(
        "act",
        request.message_id,
        expected_revision=request.revision,
        action_id=request.action_id,
        value=request.value,
    )
    result = await ctx.services.registry.ask(
        scope_id, CardCommand(member, request.message_id, change)
    )
    _tell_service(
        ctx.services,
        message.author.id,
        CardActionEvent(
            scope_id=scope_id,
            message_id=request.message_id,
            action_id=request.action_id,
            value=request.value,
            member_id=member.id,
            revision=request.revision + 1,
        ),
    )
    return result


async def update_card(ctx: Context, request: UpdateCard) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        message = await messages.get_message(conn, request.message_id)
    own = (
        message is not None and message.author.id == member.id and message.message_type == APP_CARD
    )
    if message is None or not own:
        # Someone else's card is refused as its readers' edits are; an
        # unreadable one reads as missing.
        await readable_message_scope(ctx.services, member, request.message_id)
        raise OperationError(
            ErrorCode.FORBIDDEN,
            "only the service that posted the card updates it",
            details={"reason": "not_author"},
        )
    render, actions = _render(request.card)
    change = CardChange(
        "update",
        request.message_id,
        expected_revision=request.revision,
        render=render,
        actions=actions,
        content=request.fallback,
    )
    return await ctx.services.registry.ask(
        message.scope_id, CardCommand(member, request.message_id, change)
    )


def _render(card: CardBody) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    body = to_builtins(card)
    actions = body.pop("actions", [])
    body.setdefault("text", "")
    body.setdefault("fields", [])
    return body, actions


def _tell_service(services: Services, service_id: str, event: CardActionEvent) -> None:
    """``cardAction`` to the service's daemon sessions, here and on the other
    nodes (direct: the action itself is stored, and the card's state is read
    with ``history``)."""
    payload = encode(event)
    for session in services.hub.sessions_of(service_id):
        if session.is_daemon:
            session.push(payload)
    services.hub.relay_event(event.scope_id, payload, audience=[service_id])


def _posted(result: SendResult) -> tuple[str, int]:
    assert result.message_id is not None
    return result.message_id, result.accepted_seq or result.latest_seq
