"""Every frame of protocol v1 as a msgspec Struct.

Client frames form one tagged union (:data:`ClientFrame`) keyed by ``type``;
server frames are Structs encoded with the shared encoder in :mod:`protocol.codec`.
Field names are snake_case here and camelCase on the wire. New fields must
get defaults; existing fields never change type.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from protocol.admin import AdminRequest
from protocol.cards import CardAction, PostCard, RevokeShare, ShareChannel, ShareMessage, UpdateCard
from protocol.presence import PresenceList, SetPresence, Typing
from protocol.rewind import MarkRecoveryPoint, Rewind
from protocol.schedules import (
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    Schedules,
    UpdateSchedule,
)
from protocol.services import ServicePost
from protocol.tasks import CreateTask, Tasks, UpdateTask
from protocol.workflows import (
    CreateWorkflowPlan,
    ShareWorkflowPlan,
    UpdateWorkflowPlan,
    WorkflowPlans,
    WorkflowReply,
    WorkflowRequest,
    WorkflowTranscript,
)

RequestId = int | str
# A bigint column holds every seq and count: a larger one is refused at the door.
NonNegative = Annotated[int, Meta(ge=0, le=2**63 - 1)]
ShortText = Annotated[str, Meta(min_length=1, max_length=256)]
ClientMessageId = Annotated[str, Meta(min_length=1, max_length=200)]
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
PageLimit = Annotated[int, Meta(ge=1, le=200)]

# protocol/text.py's kind of a string field, read by protocol/codec.py when it
# decodes a frame; a string without one is an identifier (``TextKind.KEY``).
CONTENT: dict[str, Any] = {"text": "content"}
NAME: dict[str, Any] = {"text": "name"}
EMOJI: dict[str, Any] = {"text": "emoji"}
TERM: dict[str, Any] = {"text": "term"}

CAPABILITY_FRESHNESS = "freshness"
CAPABILITY_ACK = "ack"

NotificationState = Literal["active", "quiet", "mute", "auto-wake", "no-wake"]
Visibility = Literal["public", "private"]
AvatarColor = Literal["blue", "green", "orange", "purple", "red", "teal", "pink", "gray"]


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


# ---------------------------------------------------------------- client frames


class ClientInfo(Struct, rename="camel", kw_only=True):
    kind: Literal["browser", "daemon"]
    name: Annotated[str, Meta(max_length=128, extra=NAME)] = ""
    version: Annotated[str, Meta(max_length=64, extra=NAME)] = ""


class Hello(_Frame, tag="hello"):
    token: Annotated[str, Meta(max_length=512)]
    client: ClientInfo
    capabilities: Annotated[list[str], Meta(max_length=32)] = []
    resume: dict[str, NonNegative] | None = None


class Ping(_Frame, tag="ping"):
    id: RequestId


class Pong(_Frame, tag="pong"):
    id: RequestId


class FreshnessIn(Struct, rename="camel", kw_only=True):
    target_key: Identifier
    seen_up_to_seq: NonNegative
    source_message_ids: Annotated[list[Identifier], Meta(max_length=200)] = []


class SourceRef(Struct, rename="camel", kw_only=True):
    message_id: Identifier


class ForwardIn(Struct, rename="camel", kw_only=True):
    """What a send cites (docs/design.md#sources): `quote` and `single` take one
    source, `multi` and `explicit_context` one or more; every source must be
    readable by the sender. `explicit_context` also opens the sources to the
    private agents named in `recipients`. Readers see them in `MessageView.sources`."""

    # ``quote``: a reply citing one message (mentions stay live, as in a plain
    # send); the others forward (docs/design.md#sources).
    mode: Literal["quote", "single", "multi", "explicit_context"]
    sources: Annotated[list[SourceRef], Meta(max_length=100)] = []


class Send(_Frame, tag="send"):
    id: RequestId
    target: ShortText
    content: Annotated[str, Meta(extra=CONTENT)]
    client_message_id: ClientMessageId
    attachment_ids: Annotated[list[Identifier], Meta(max_length=32)] = []
    message_type: Annotated[str, Meta(min_length=1, max_length=64)] = "text"
    freshness: FreshnessIn | None = None
    recipients: Annotated[list[Identifier], Meta(max_length=100)] = []
    forward: ForwardIn | None = None
    explain: bool = False


class History(_Frame, tag="history"):
    id: RequestId
    target: ShortText
    before_seq: NonNegative | None = None
    after_seq: NonNegative | None = None
    limit: PageLimit = 50
    # A page centred on this seq (opening a search hit); excludes the other two.
    around_seq: NonNegative | None = None


class Search(_Frame, tag="search"):
    """Find readable messages (docs/design.md#search). ``query``: words (a word
    of the message starts with each, or with its stem in the node's search
    language), ``"exact phrase"``, ``-excluded``, ``from:@handle``,
    ``in:#channel`` (and its threads), ``in:@handle`` (the viewer's DM with
    them), ``before:``/``after:``/``on:YYYY-MM-DD`` (UTC days; before and after
    exclude the day named); any other token is a literal matched as a
    substring. ``fromMember`` (``@handle``), ``inScope`` (``#channel`` or
    ``@handle``), ``before``, ``after`` and ``on`` are the same filters as
    fields, and a search may consist of filters only. An unknown handle or
    channel, or one the viewer cannot read, finds nothing. ``scopeId`` keeps
    one scope, ``authorId`` one author; ``cursor`` is the previous page's
    ``nextCursor``, with the same query, filters and sort."""

    id: RequestId
    query: Annotated[str, Meta(max_length=256, extra=TERM)] = ""
    scope_id: Identifier | None = None
    author_id: Identifier | None = None
    sort: Literal["recent", "relevance"] = "recent"
    limit: Annotated[int, Meta(ge=1, le=50)] = 20
    cursor: Annotated[str, Meta(max_length=512)] | None = None
    from_member: Annotated[str, Meta(min_length=1, max_length=80)] | None = None
    in_scope: Annotated[str, Meta(min_length=1, max_length=100)] | None = None
    before: Annotated[str, Meta(min_length=1, max_length=32)] | None = None
    after: Annotated[str, Meta(min_length=1, max_length=32)] | None = None
    on: Annotated[str, Meta(min_length=1, max_length=32)] | None = None


class MarkRead(_Frame, tag="markRead"):
    id: RequestId
    scope_id: Identifier
    seq: NonNegative


class React(_Frame, tag="react"):
    id: RequestId
    message_id: Identifier
    emoji: Annotated[str, Meta(min_length=1, max_length=64, extra=EMOJI)]
    op: Literal["add", "remove"] = "add"


class Edit(_Frame, tag="edit"):
    """Replace the content of one's own text message (docs/design.md#edits-and-deletes)."""

    id: RequestId
    message_id: Identifier
    content: Annotated[str, Meta(extra=CONTENT)]
    # The revision the client edited: a newer stored one answers ``conflict``.
    revision: NonNegative | None = None


class Delete(_Frame, tag="delete"):
    """Recall a message: its author, or the channel's owner (docs/design.md#edits-and-deletes)."""

    id: RequestId
    message_id: Identifier


class Ack(_Frame, tag="ack"):
    id: RequestId
    delivery_id: Identifier


class Scopes(_Frame, tag="scopes"):
    id: RequestId


class Members(_Frame, tag="members"):
    id: RequestId
    scope_id: Identifier


class CreateChannel(_Frame, tag="createChannel"):
    id: RequestId
    slug: Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,79}$")]
    name: Annotated[str, Meta(min_length=1, max_length=200, extra=NAME)]
    visibility: Visibility = "public"
    description: Annotated[str, Meta(max_length=4000, extra=CONTENT)] = ""


class Join(_Frame, tag="join"):
    id: RequestId
    scope_id: Identifier


class Leave(_Frame, tag="leave"):
    id: RequestId
    scope_id: Identifier


class Invite(_Frame, tag="invite"):
    id: RequestId
    scope_id: Identifier
    member_id: Identifier
    visibility: Visibility | None = None


class Remove(_Frame, tag="remove"):
    """End another member's membership of a channel (its owner, or a private agent's owner)."""

    id: RequestId
    scope_id: Identifier
    member_id: Identifier


class SetNotification(_Frame, tag="setNotification"):
    id: RequestId
    scope_id: Identifier
    state: NotificationState


class Grant(_Frame, tag="grant"):
    id: RequestId
    scope_id: Identifier
    grantee_member_id: Identifier
    # RFC 3339 with an offset, later than now.
    expires_at: Annotated[datetime, Meta(tz=True)] | None = None


class RevokeGrant(_Frame, tag="revokeGrant"):
    id: RequestId
    grant_id: Identifier


class Channels(_Frame, tag="channels"):
    """The workspace's channels the caller may see, for a channel browser."""

    id: RequestId


class People(_Frame, tag="people"):
    """The workspace's members the caller may see, for DMs and mentions."""

    id: RequestId


class UpdateProfile(_Frame, tag="updateProfile"):
    """Change a member's display name and avatar colour (docs/design.md#profiles):
    the caller's own, or with ``memberId`` an agent the caller owns. Without
    ``avatarColor`` the colour stays as it is."""

    id: RequestId
    display_name: Annotated[str, Meta(min_length=1, max_length=80, extra=NAME)]
    member_id: Identifier | None = None
    avatar_color: AvatarColor | None = None


Request = (
    Send
    | History
    | Search
    | MarkRead
    | React
    | Edit
    | Delete
    | Ack
    | Scopes
    | Members
    | CreateChannel
    | Join
    | Leave
    | Invite
    | Remove
    | SetNotification
    | Grant
    | RevokeGrant
    | Channels
    | People
    | AdminRequest
    | Typing
    | SetPresence
    | PresenceList
    | UpdateProfile
    | ServicePost
    | CreateTask
    | UpdateTask
    | Tasks
    | CreateWorkflowPlan
    | ShareWorkflowPlan
    | UpdateWorkflowPlan
    | WorkflowPlans
    | WorkflowTranscript
    | WorkflowRequest
    | WorkflowReply
    | MarkRecoveryPoint
    | Rewind
    | CreateSchedule
    | UpdateSchedule
    | PauseSchedule
    | DeleteSchedule
    | Schedules
    | ShareChannel
    | ShareMessage
    | RevokeShare
    | PostCard
    | CardAction
    | UpdateCard
)
ClientFrame = Hello | Ping | Pong | Request
CLIENT_FRAME_TYPES: frozenset[str] = frozenset(
    str(cls.__struct_config__.tag) for cls in ClientFrame.__args__
)


# ---------------------------------------------------------------- server frames


class MemberView(Struct, rename="camel", kw_only=True):
    id: str
    type: str
    handle: str
    display_name: str


class AuthorView(Struct, rename="camel", kw_only=True):
    member_id: str
    type: str
    handle: str
    display_name: str


class MessageView(Struct, rename="camel", kw_only=True):
    """A stored message as one viewer may see it. `sources` (what it cites, see
    `ForwardIn`) is re-checked for the viewer: `{messageId, scopeId, seq, kind}`
    (`kind`: `quote`, `forward` or `context`) when the viewer may read the cited
    message, else `{messageId: null, kind, unavailable: true}`; live `message`
    events carry `{messageId: null, kind, pending: true}` (read the message with
    `history` to resolve it). A scheduled message's `sources` start with what
    caused it, `{kind: "schedule_run", scheduleId, occurrenceAt, ownerMemberId,
    delaySeconds?}` (see [schedules.md](schedules.md))."""

    id: str
    scope_id: str
    seq: int
    global_seq: int
    author: AuthorView
    message_type: str
    content: str
    created_at: str
    metadata: dict[str, Any] = {}
    sources: list[dict[str, Any]] = []
    attachments: list[dict[str, Any]] = []
    mentions: list[str] = []
    # Edits and deletes (additive): 0 until edited; a deleted message is a
    # tombstone with empty content, attachments and sources.
    revision: int = 0
    edited_at: str | None = None
    deleted: bool = False
    # docs/design.md#reactions: [{emoji, count, memberIds}] by first reaction,
    # at most 20 memberIds each; filled by history and resume, empty on a new message.
    reactions: list[dict[str, Any]] = []
    # A card message's card (docs/cards.md), computed for each viewer; absent on
    # every other message.
    card: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class ThreadSummary(Struct, rename="camel", kw_only=True):
    """A root message's reply thread, carried as ``thread`` on the root (additive).

    ``replyCount`` is the thread's latest seq (a chunked send counts each row);
    ``participants`` are the most recent distinct authors, newest first.
    """

    scope_id: str
    reply_count: int
    last_reply_at: str
    participants: list[str]


class ChannelEntry(Struct, rename="camel", kw_only=True):
    """One channel of a ``channels`` reply."""

    id: str
    slug: str
    name: str
    description: str
    visibility: Visibility
    # Current public members: private memberships are never counted.
    member_count: int
    joined: bool


class PersonEntry(Struct, rename="camel", kw_only=True, omit_defaults=True):
    """One member of a ``people`` reply."""

    id: str
    handle: str
    display_name: str
    type: str
    # Set for private agents only (shown to their owner alone).
    owner_member_id: str | None = None
    # Set once the member chose one (additive; docs/design.md#profiles).
    avatar_color: str | None = None
    # A service's kind: ``schedule`` for the workspace's schedule service
    # (docs/schedules.md); unset for other services (additive).
    service_kind: str | None = None


class Welcome(_Frame, tag="welcome"):
    protocol: int
    session_id: str
    node_id: str
    workspace_id: str
    member: MemberView
    heartbeat_ms: int
    capabilities: list[str]
    # Whether the member is a workspace admin when it said hello (additive).
    admin: bool = False


class Reply(_Frame, tag="reply"):
    id: RequestId
    op: str
    result: Any


class ErrorFrame(_Frame, tag="error"):
    id: RequestId | None
    code: str
    message: str
    retryable: bool
    details: dict[str, Any] = {}


class MessageEvent(_Frame, tag="message"):
    scope_id: str
    message: MessageView


class Deliver(_Frame, tag="deliver"):
    delivery_id: str
    agent_id: str
    target_key: str
    target_seq: int
    reason: str
    message: MessageView
    # A task (un)assignment wake (``reason: task_assigned``): the task it is about;
    # ``message`` is then the task as a card (docs/tasks.md), not a stored message.
    task_id: str | None = None
    # A workflow request's wake (docs/workflows.md): the plan and the request to
    # answer with ``workflowReply``.
    plan_id: str | None = None
    request_id: str | None = None


class ResumeState(Struct, rename="camel", kw_only=True):
    latest_seq: int
    has_more: bool
    # Where to continue with ``history(afterSeq=…)`` (additive).
    covers_through_seq: int | None = None


class Resumed(_Frame, tag="resumed"):
    scopes: dict[str, ResumeState]


class ReadStateEvent(_Frame, tag="readState"):
    scope_id: str
    last_read_seq: int


class MembershipEvent(_Frame, tag="membership"):
    scope_id: str
    member_id: str
    op: Literal["joined", "left", "invited"]
    visibility: Visibility


class ReactionEvent(_Frame, tag="reaction"):
    scope_id: str
    message_id: str
    member_id: str
    emoji: str
    op: Literal["add", "remove"]


class ThreadUpdatedEvent(_Frame, tag="threadUpdated"):
    """A reply landed in the thread of ``rootMessageId``, a message of ``scopeId`` (the parent)."""

    scope_id: str
    root_message_id: str
    thread: ThreadSummary


class MessageUpdatedEvent(_Frame, tag="messageUpdated"):
    """A message was edited: the whole current message, to its current readers."""

    scope_id: str
    message: MessageView


class MessageDeletedEvent(_Frame, tag="messageDeleted"):
    """A message was deleted; its seq stays taken by the tombstone."""

    scope_id: str
    message_id: str
    seq: int


class MemberUpdatedEvent(_Frame, tag="memberUpdated"):
    """A member's profile changed: its current display name, to the sessions of
    the members who may see it (docs/design.md#profiles), as ``people`` lists it."""

    member: PersonEntry


class InvalidateEvent(_Frame, tag="invalidate"):
    scope_id: str
    reason: str
    from_seq: int


class SendResult(Struct, rename="camel", kw_only=True, omit_defaults=True):
    """The ``result`` of a ``send`` reply; which fields appear depends on ``state``."""

    state: Literal["sent", "already_sent", "held", "partial_held"]
    target_key: str
    client_message_id: str
    latest_seq: int
    message_id: str | None = None
    accepted_seq: int | None = None
    seen_up_to_seq: int | None = None
    needs_refresh_until_seq: int | None = None
    accepted: list[dict[str, Any]] | None = None
    held_chunk: int | None = None
    # A fully accepted chunked logical send: every row, in order (additive).
    chunks: list[dict[str, Any]] | None = None
    explain: dict[str, Any] | None = None
    # Mentioned members who will not read the message (additive).
    hints: list[SendHint] | None = None


class SendHint(Struct, rename="camel", kw_only=True):
    """Something the sender may want to act on; ``kind`` ``not_in_scope``: the
    mentioned member is not in the conversation (the message was still sent)."""

    kind: Literal["not_in_scope"]
    member_id: str
    handle: str


def to_builtins(value: Any) -> Any:
    """Structs to plain dicts with wire (camelCase) names."""
    return msgspec.to_builtins(value)
