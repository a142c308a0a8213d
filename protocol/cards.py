"""Share cards and interactive app cards (docs/cards.md).

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``). No I/O.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
ShortText = Annotated[str, Meta(min_length=1, max_length=256)]
ClientMessageId = Annotated[str, Meta(min_length=1, max_length=200)]
Revision = Annotated[int, Meta(ge=1, le=2**31 - 1)]
CONTENT: dict[str, Any] = {"text": "content"}
NAME: dict[str, Any] = {"text": "name"}

SHARE_CARD = "channel_share_card"
APP_CARD = "app_interactive_card"


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class ShareChannel(_Frame, tag="shareChannel"):
    """Post a card of channel ``channelId`` into ``target`` (a channel, a DM
    ``@handle``, a thread or a task, as ``send`` names it). The card message
    (``messageType: channel_share_card``) is the caller's; each reader sees the
    channel's name, description and member count only while it may see the
    channel (see `MessageView.card`)."""

    id: RequestId
    channel_id: Identifier
    target: ShortText
    # Idempotent per target like a send's; the node makes one when absent.
    client_message_id: ClientMessageId | None = None


class ShareMessage(_Frame, tag="shareMessage"):
    """Post a card of message ``messageId`` into ``target``: its preview is shown
    only to readers who may read the message itself."""

    id: RequestId
    message_id: Identifier
    target: ShortText
    client_message_id: ClientMessageId | None = None


class RevokeShare(_Frame, tag="revokeShare"):
    """Revoke a share card: its creator, or the owner of the shared channel."""

    id: RequestId
    card_id: Identifier


class CardField(Struct, rename="camel", kw_only=True):
    label: Annotated[str, Meta(min_length=1, max_length=80, extra=NAME)]
    value: Annotated[str, Meta(max_length=500, extra=CONTENT)] = ""


class CardButton(Struct, rename="camel", kw_only=True, omit_defaults=True):
    id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    label: Annotated[str, Meta(min_length=1, max_length=80, extra=NAME)]
    style: Literal["primary", "danger"] | None = None


class CardOption(Struct, rename="camel", kw_only=True):
    value: Annotated[str, Meta(min_length=1, max_length=100, extra=CONTENT)]
    label: Annotated[str, Meta(min_length=1, max_length=80, extra=NAME)]


class CardSelect(Struct, rename="camel", kw_only=True):
    """A choice among ``options``: choosing one is a ``cardAction`` with
    ``actionId`` the select's ``id`` and ``value`` the option's."""

    id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    label: Annotated[str, Meta(min_length=1, max_length=80, extra=NAME)]
    options: Annotated[list[CardOption], Meta(min_length=1, max_length=25)]


class CardBody(Struct, rename="camel", kw_only=True, omit_defaults=True):
    """What an app card shows: a title, optional text (Markdown), label/value
    fields, buttons and one select. The set of components may grow; each is
    optional but the title."""

    title: Annotated[str, Meta(min_length=1, max_length=200, extra=NAME)]
    text: Annotated[str, Meta(max_length=4000, extra=CONTENT)] = ""
    fields: Annotated[list[CardField], Meta(max_length=10)] = []
    actions: Annotated[list[CardButton], Meta(max_length=5)] = []
    select: CardSelect | None = None


class PostCard(_Frame, tag="postCard"):
    """Post an interactive card as the calling service (a session opened with a
    service token). ``fallback`` is the message's content: what search finds,
    what a client without cards shows and the card's accessible name. After
    ``expiresAt`` the card takes no action."""

    id: RequestId
    target: ShortText
    fallback: Annotated[str, Meta(min_length=1, max_length=4000, extra=CONTENT)]
    card: CardBody
    client_message_id: ClientMessageId
    expires_at: Annotated[datetime, Meta(tz=True)] | None = None


class CardAction(_Frame, tag="cardAction"):
    """Press button ``actionId`` of the app card ``messageId`` as seen at
    ``revision``: the card's service is told, and the card moves one revision
    on. A stale revision is a ``conflict`` with the current one."""

    id: RequestId
    message_id: Identifier
    action_id: Identifier
    revision: Revision
    value: Annotated[str, Meta(max_length=500, extra=CONTENT)] = ""


class UpdateCard(_Frame, tag="updateCard"):
    """Replace the card of app card ``messageId`` (the service that posted it),
    from ``revision`` (the current one) on. With ``fallback`` the message's
    content changes too; it keeps its id, seq and everyone's read state."""

    id: RequestId
    message_id: Identifier
    revision: Revision
    card: CardBody
    fallback: Annotated[str, Meta(min_length=1, max_length=4000, extra=CONTENT)] | None = None


class CardActionEvent(_Frame, tag="cardAction"):
    """A human pressed a button of one of the service's cards."""

    scope_id: str
    message_id: str
    action_id: str
    value: str
    member_id: str
    # The card's revision after the action: what ``updateCard`` names next.
    revision: int


RESULTS: dict[str, str] = {
    "shareChannel": (
        "`{cardId, messageId, seq}`. The caller must see the channel (a public channel,"
        " or a private one it is a member of: else `not_found` at `$.channelId`) and be"
        " allowed to send to `target` (the errors of a `send`). A replayed"
        " `clientMessageId` answers the first card. See [cards.md](cards.md)."
    ),
    "shareMessage": (
        "`{cardId, messageId, seq}`. The caller must read the message (`not_found` or"
        " `forbidden` as for `edit`) and be allowed to send to `target`."
    ),
    "revokeShare": (
        "`{cardId, revoked: true}`; revoking again changes nothing. Only the card's"
        " creator or the owner of the shared channel (`forbidden` for anyone else,"
        " `not_found` for a card the caller cannot read). Every reader gets"
        " `messageUpdated` with `card.revoked: true` and no `source`."
    ),
    "postCard": (
        "`{messageId, seq, revision: 1}`. Services only (`forbidden` for humans and"
        " agents); `target` as in a `send` by the service. A replayed `clientMessageId`"
        " answers the first card."
    ),
    "cardAction": (
        "`{revision}`: the card's revision after the action. A reader of the card only"
        " (humans; `forbidden` for agents and services); `conflict` with"
        " `details.revision` (the current revision) when `revision` is not the current"
        " one, and with `details.expired: true` after the card's `expiresAt`;"
        " `validation_failed` at `$.actionId` for a button the card does not have, and at"
        " `$.value` for a choice its select does not offer."
        " Readers get `messageUpdated`; the service's sessions get `cardAction`."
    ),
    "updateCard": (
        "`{revision}`: the new revision. The posting service only (`forbidden` for"
        " anyone else); `conflict` with `details.revision` for a stale `revision`."
        " Readers get `messageUpdated` (no unread, no wake)."
    ),
}
EVENTS: dict[str, str] = {
    "cardAction": (
        "A human pressed a button of an app card the service posted: to the service's"
        " daemon sessions, once, when the action is stored (a service that was not"
        " connected reads the card's state with `history`)."
    ),
}
