"""The workspace admin ops: requests only a workspace admin may make
(docs/invites.md#the-admin-page). Every one answers ``forbidden`` to anyone
else; :mod:`protocol.frames` names them in its unions. No I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
Slug = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,79}$")]
Handle = Annotated[str, Meta(min_length=1, max_length=64)]
DisplayName = Annotated[str, Meta(min_length=1, max_length=256, extra={"text": "name"})]
# The longest an invite link lives, as for `scopenode admin create-invite`.
MAX_INVITE_SECONDS = 366 * 86400


class _AdminFrame(Struct, tag_field="type", rename="camel", kw_only=True):
    # The same tagging as protocol.frames' frames, so they share its unions.
    id: RequestId


class AdminMembers(_AdminFrame, tag="adminMembers"):
    """Every member of the caller's workspace, deactivated ones included."""


class AdminCreateMember(_AdminFrame, tag="adminCreateMember"):
    """A human, or an agent: public, or private to ``ownerMemberId`` (a human)."""

    handle: Handle
    display_name: DisplayName | None = None
    kind: Literal["human", "agent"] = "human"
    private: bool = False
    owner_member_id: Identifier | None = None
    # Channel slugs to join besides the workspace's default channels.
    join: Annotated[list[Slug], Meta(max_length=50)] = []


class AdminDeactivateMember(_AdminFrame, tag="adminDeactivateMember"):
    """Deactivate a member and revoke every token it holds; not the caller itself."""

    member_id: Identifier


class AdminSetAdmin(_AdminFrame, tag="adminSetAdmin"):
    """Promote a human member to admin (``admin: true``) or demote one."""

    member_id: Identifier
    admin: bool


class AdminIssueToken(_AdminFrame, tag="adminIssueToken"):
    """A new session token for an active member, shown once."""

    member_id: Identifier


class AdminRevokeTokens(_AdminFrame, tag="adminRevokeTokens"):
    """Revoke every token of a member; its live sessions close."""

    member_id: Identifier


class AdminCreateInvite(_AdminFrame, tag="adminCreateInvite"):
    """An invite link: each use makes one plain human member (never an admin,
    never an agent), who joins the default channels and ``join``'s."""

    expires_in_s: Annotated[int, Meta(ge=60, le=MAX_INVITE_SECONDS)] = 7 * 86400
    max_uses: Annotated[int, Meta(ge=1, le=100_000)] | None = None
    join: Annotated[list[Slug], Meta(max_length=50)] = []


class AdminInvites(_AdminFrame, tag="adminInvites"):
    """The workspace's invites, newest first; a code is never shown again."""


class AdminRevokeInvite(_AdminFrame, tag="adminRevokeInvite"):
    invite_id: Identifier


class AdminChannels(_AdminFrame, tag="adminChannels"):
    """Every channel of the workspace, private ones included, with its default flag."""


class AdminCreateChannel(_AdminFrame, tag="adminCreateChannel"):
    """A channel owned by the caller; a default channel (public) is joined by every newcomer."""

    slug: Slug
    name: Annotated[str, Meta(min_length=1, max_length=200, extra={"text": "name"})]
    visibility: Literal["public", "private"] = "public"
    default: bool = False
    description: Annotated[str, Meta(max_length=4000, extra={"text": "content"})] = ""


AdminRequest = (
    AdminMembers
    | AdminCreateMember
    | AdminDeactivateMember
    | AdminSetAdmin
    | AdminIssueToken
    | AdminRevokeTokens
    | AdminCreateInvite
    | AdminInvites
    | AdminRevokeInvite
    | AdminChannels
    | AdminCreateChannel
)
ADMIN_OPS = frozenset(str(cls.__struct_config__.tag) for cls in AdminRequest.__args__)


class AdminMemberEntry(Struct, rename="camel", kw_only=True):
    """One member of an ``adminMembers`` reply."""

    id: str
    handle: str
    display_name: str
    type: str
    private: bool
    owner_member_id: str | None
    active: bool
    admin: bool


class AdminInviteEntry(Struct, rename="camel", kw_only=True):
    """One invite of an ``adminInvites`` reply; ``status`` is ``usable``,
    ``expired``, ``used_up`` or ``revoked``."""

    id: str
    status: str
    expires_at: str
    max_uses: int | None
    uses: int
    channels: list[str]
    created_at: str


def results() -> dict[str, Any]:
    """Each admin op's reply ``result``, for docs/protocol.md."""
    return {
        "adminMembers": "`{members: [AdminMemberEntry]}` in the order they were created.",
        "adminCreateMember": (
            "`{memberId, channels}` (the `#slug`s it joined). A private agent needs"
            " `ownerMemberId`, a human of the workspace, and joins nothing by itself;"
            " a taken handle is `validation_failed` at `$.handle`."
        ),
        "adminDeactivateMember": "`{memberId, tokensRevoked}`; the caller cannot deactivate itself.",
        "adminSetAdmin": (
            "`{memberId, admin}`; humans only; an admin cannot demote itself (another admin can)."
        ),
        "adminIssueToken": "`{memberId, token}`: the token is shown here only.",
        "adminRevokeTokens": "`{memberId, tokensRevoked}`.",
        "adminCreateInvite": (
            "`{inviteId, inviteUrl, expiresAt, maxUses, channels}`: the link holds the"
            " code, which is shown here only (the node keeps its hash)."
        ),
        "adminInvites": "`{invites: [AdminInviteEntry]}`, newest first.",
        "adminRevokeInvite": "`{inviteId, revoked: true}` (again: no change).",
        "adminChannels": (
            "`{channels: [{scopeId, slug, name, visibility, default, ownerMemberId,"
            " memberCount}]}` by slug."
        ),
        "adminCreateChannel": (
            "`{scopeId, slug, visibility, default}`; a default channel must be public"
            " (`validation_failed` at `$.default`), a taken slug is `validation_failed` at `$.slug`."
        ),
    }
