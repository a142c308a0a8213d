"""Cards: who may revoke, act on or update one, and the plan of the change. Pure.

A card is a message (docs/cards.md) with a sidecar row: a share card
(``scope_share_cards``) points at a channel or a message; an app card
(``service_notification_cards``) carries a service's render state and the
revision human actions are taken against. Changing either never moves the
message's seq: it is planned as a mutation of the message, whose projection
(``messageUpdated``) is delivered under ``worker_first_mutation`` and raises
no unread and wakes no one.

While a card is being sent, its sidecar travels in the planned message's
metadata (``shareCard``/``appCard``), which the Applier writes to the sidecar
and leaves out of the message row; a published mutation carries the card's
new public state there the same way. :func:`public_card` turns either into
the ``card`` readers are shown, never naming what a share card points at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from actors.model import DeliveryPolicy, Member, MemberType, StoredMessage
from actors.planner import MutationPlan, OutboxEvent, ScopeContext, mutation_readers
from protocol.errors import ErrorCode, OperationError

SHARE_CARD = "channel_share_card"
APP_CARD = "app_interactive_card"
SHARE_KEY = "shareCard"
APP_KEY = "appCard"
# A card change's projection row (named where the row is made).
CARD_PROJECTION_POLICY = DeliveryPolicy.WORKER_FIRST_MUTATION

CardOp = Literal["revoke", "act", "update"]


@dataclass(frozen=True, slots=True)
class ShareCardState:
    id: str
    kind: str  # "channel" | "message"
    source_scope_id: str
    source_message_id: str | None
    created_by: str
    revoked: bool
    # Who owns the shared channel (for a message: the channel it is in), if anyone.
    source_owner_id: str | None


@dataclass(frozen=True, slots=True)
class AppCardState:
    revision: int
    render: dict[str, Any]
    actions: list[dict[str, Any]]
    state: str
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class CardTarget:
    message: StoredMessage
    share: ShareCardState | None = None
    app: AppCardState | None = None


@dataclass(frozen=True, slots=True)
class CardChange:
    """What the Applier writes: ``revoke`` the share card, or move the app card
    from ``expected_revision`` one on (``act`` records the action too)."""

    op: CardOp
    card_id: str
    expected_revision: int = 0
    action_id: str = ""
    value: str = ""
    render: dict[str, Any] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None


@dataclass(slots=True)
class CardCommand:
    """A change to the card message ``message_id`` of this scope, ordered with
    its sends and edits (``actors/scope_cards.py``)."""

    actor: Member
    message_id: str
    change: CardChange
    # Set by the registry before the command is queued (``ActorRegistry.ask``).
    reply: Any = None


def _rfc3339(at: datetime | None) -> str | None:
    return None if at is None else f"{at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"


def app_card_view(message_id: str, app: AppCardState) -> dict[str, Any]:
    """An app card as every reader of its message is shown it."""
    return {
        "cardId": message_id,
        "kind": "app",
        "revision": app.revision,
        "state": app.state,
        "expiresAt": _rfc3339(app.expires_at),
        **app.render,
        "actions": app.actions,
    }


def public_card(message: StoredMessage) -> dict[str, Any] | None:
    """The ``card`` of a message as carried in its metadata (live events, mutations).

    A share card shows no source here: which reader may see it is asked of the
    database, by ``history`` (``pending`` until then, unless revoked).
    """
    share = message.metadata.get(SHARE_KEY)
    if isinstance(share, dict):
        revoked = bool(share.get("revoked"))
        card = {"cardId": share.get("id"), "kind": share.get("kind"), "revoked": revoked}
        return card if revoked else card | {"pending": True}
    app = message.metadata.get(APP_KEY)
    if isinstance(app, dict):
        if "view" in app:
            return dict(app["view"])
        expires = app.get("expires_at")
        at = datetime.fromisoformat(expires) if isinstance(expires, str) else None
        posted = AppCardState(1, app.get("render") or {}, app.get("actions") or [], "active", at)
        return app_card_view(message.id, posted)
    return None


def _forbidden(message: str, reason: str) -> OperationError:
    return OperationError(ErrorCode.FORBIDDEN, message, details={"reason": reason})


def conflict(revision: int, *, expired: bool = False) -> OperationError:
    details: dict[str, Any] = {"revision": revision}
    if expired:
        details["expired"] = True
        return OperationError(
            ErrorCode.CONFLICT, "the card has expired", path="$.revision", details=details
        )
    return OperationError(
        ErrorCode.CONFLICT,
        "the card changed since that revision; read it again",
        path="$.revision",
        details=details,
    )


def decide(target: CardTarget, actor: Member, change: CardChange, now: datetime) -> None:
    """Raise why ``actor`` may not make ``change`` to the card of ``target``."""
    if change.op == "revoke":
        share = target.share
        if share is None:
            raise OperationError(ErrorCode.NOT_FOUND, "no such card", path="$.cardId")
        if actor.id not in (share.created_by, share.source_owner_id):
            raise _forbidden("only who shared it or the channel's owner revokes it", "not_owner")
        return
    app = target.app
    if app is None:
        raise OperationError(ErrorCode.NOT_FOUND, "not an app card", path="$.messageId")
    if change.op == "update":
        if actor.id != target.message.author.id:
            raise _forbidden("only the service that posted the card updates it", "not_author")
    else:
        if actor.type is not MemberType.HUMAN:
            raise _forbidden("only people act on cards", "not_human")
        if app.state != "active" or (app.expires_at is not None and now >= app.expires_at):
            raise conflict(app.revision, expired=True)
        _require_offered(app, change)
    if change.expected_revision != app.revision:
        raise conflict(app.revision)


def _require_offered(app: AppCardState, change: CardChange) -> None:
    """The action is one of the card's buttons, or a choice its select offers."""
    if any(a.get("id") == change.action_id for a in app.actions):
        return
    select = app.render.get("select")
    if isinstance(select, dict) and select.get("id") == change.action_id:
        if any(o.get("value") == change.value for o in select.get("options", ())):
            return
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "the card's select has no such choice", path="$.value"
        )
    raise OperationError(
        ErrorCode.VALIDATION_FAILED, "the card has no such action", path="$.actionId"
    )


def plan_card(
    target: CardTarget, actor: Member, change: CardChange, scope: ScopeContext
) -> MutationPlan:
    """The card's message as readers will see it after ``change``; its projection
    row wakes no one and counts as no unread (``worker_first_mutation``)."""
    stored = target.message
    metadata = {k: v for k, v in stored.metadata.items() if k not in (SHARE_KEY, APP_KEY)}
    content = stored.content
    if change.op == "revoke":
        assert target.share is not None
        share = target.share
        metadata[SHARE_KEY] = {"id": share.id, "kind": share.kind, "revoked": True}
        key = f"card:{share.id}:revoked"
    else:
        assert target.app is not None
        app = target.app
        revision = app.revision + 1
        render = change.render if change.op == "update" else app.render
        actions = change.actions if change.op == "update" else app.actions
        after = AppCardState(revision, render, actions, app.state, app.expires_at)
        metadata[APP_KEY] = {"view": app_card_view(stored.id, after)}
        content = change.content or content
        key = f"card:{stored.id}:{revision}"
    message = msgspec.structs.replace(stored, content=content, metadata=metadata)
    outbox = (OutboxEvent("mutation", key, CARD_PROJECTION_POLICY, reason="card"),)
    readers = mutation_readers(stored, scope)
    fence = (
        (scope.thread.parent_scope_id, scope.thread.parent_generation)
        if scope.thread is not None
        else None
    )
    return MutationPlan(
        "card",
        actor,
        message,
        stored.revision,
        readers,
        (),
        outbox,
        expected_generation=scope.roster_generation,
        parent_fence=fence,
    )
