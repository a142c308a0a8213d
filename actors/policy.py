"""Policy: admission and authority questions with structured reasons. Writes nothing."""

from __future__ import annotations

import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from actors.model import (
    Member,
    Membership,
    MemberType,
    NotificationState,
    ScopeInfo,
    ScopeType,
)
from actors.visibility import VisibilityContext


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    grant_id: str | None = None

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True, slots=True)
class ThreadFacts:
    """The parent side of a reply thread, as admission needs it (docs/design.md#thread-admission).

    ``parent`` holds the parent's current memberships and the parent scope's
    grants only (root admission uses parent grants, never thread or sibling
    grants); ``root_mentions`` are the root's live mentions as parsed when it
    was sent.
    """

    parent_scope_id: str
    parent_generation: int
    parent: VisibilityContext
    root_author: Member | None = None
    root_mentions: frozenset[str] = frozenset()
    root_created_at: datetime | None = None


def _through_parent(ctx: VisibilityContext, member: Member) -> Decision | None:
    """Threads: a human or public agent is in only while it reads the parent.

    A thread membership left over from before the member left the parent
    grants nothing; re-joining the parent lets it in again as a parent reader.
    """
    if not ctx.thread or member.is_private_agent:
        return None
    if member.id not in ctx.parent_readers:
        return Decision(False, "not_parent_member")
    if any(m.is_current for m in ctx.intervals(member.id)):
        return Decision(True, "member")
    return Decision(True, "parent_member")


def can_post(ctx: VisibilityContext, author: Member) -> Decision:
    """Writing to a conversational scope needs a current membership.

    In a thread, a human or public agent posts while it is a current public
    member of the parent (it reads the thread; posting makes it a thread
    member). Private agents need admission (:func:`thread_admission`).
    """
    through_parent = _through_parent(ctx, author)
    if through_parent is not None:
        return through_parent
    if any(m.is_current for m in ctx.intervals(author.id)):
        return Decision(True, "member")
    return Decision(False, "not_member")


def can_author_in(scope: ScopeInfo, author: Member) -> Decision:
    """A service account's conversation is written by its service alone: its
    audience reads it (a manager posts there as the service, never as itself)."""
    if scope.type is ScopeType.SERVICE_ACCOUNT and author.type is not MemberType.SERVICE:
        return Decision(False, "service_conversation")
    return Decision(True, "any_member")


def can_read_scope(ctx: VisibilityContext, viewer: Member) -> Decision:
    """Whether the viewer may open the scope's history at all (rows are filtered further)."""
    through_parent = _through_parent(ctx, viewer)
    if through_parent is not None:
        return through_parent
    if any(m.is_current for m in ctx.intervals(viewer.id)):
        return Decision(True, "member")
    if viewer.is_private_agent and ctx.intervals(viewer.id):
        return Decision(True, "former_private_member")
    return Decision(False, "not_member")


# ---------------------------------------------------------------- roster rules
#
# Who may change a scope's roster, per scope type. A new public member reads
# the whole history, so every way in is a decision about past messages:
# channels take members from their current public members (private agents
# only from their owner), DMs never change, threads take readers from their
# parent and private agents only by admission.


def _current(ctx: VisibilityContext, member_id: str) -> Membership | None:
    return next((m for m in ctx.intervals(member_id) if m.is_current), None)


def _fixed_roster(scope: ScopeInfo) -> Decision | None:
    """DMs, threads and non-channel scopes: no one changes their roster by request."""
    if scope.type is ScopeType.DM:
        return Decision(False, "dm_fixed_membership")
    if scope.type is ScopeType.THREAD:
        return Decision(False, "thread_through_parent")
    if scope.type is not ScopeType.CHANNEL:
        return Decision(False, "not_a_channel")
    return None


def can_join(scope: ScopeInfo, member: Member) -> Decision:
    """``join``: public channels only, and never a private agent (its owner adds it)."""
    fixed = _fixed_roster(scope)
    if fixed is not None:
        return fixed
    if member.is_private_agent:
        return Decision(False, "private_agent_added_by_owner")
    if scope.channel_visibility != "public":
        return Decision(False, "private_channel_needs_invitation")
    return Decision(True, "public_channel")


def can_leave(scope: ScopeInfo) -> Decision:
    """``leave``: anywhere but a DM, whose two members are fixed, a service
    account's conversation, whose audience is every human (who may mute it),
    and a task, whose members follow its assignees (``updateTask``)."""
    if scope.type is ScopeType.DM:
        return Decision(False, "dm_fixed_membership")
    if scope.type is ScopeType.TASK:
        return Decision(False, "task_membership_by_assignment")
    if scope.type is ScopeType.SERVICE_ACCOUNT:
        return Decision(False, "service_audience_fixed")
    return Decision(True, "member_leaves")


def can_invite(
    scope: ScopeInfo, ctx: VisibilityContext, actor: Member, invitee: Member, visibility: str
) -> Decision:
    """``invite`` into a channel.

    A current public member invites humans and public agents (as public
    members); a private agent is added (as a private member) only by its owner,
    and only where the owner is a current public member. Private agents never
    invite: their own membership is private, so they would open the channel's
    history to someone their owner never chose.
    """
    fixed = _fixed_roster(scope)
    if fixed is not None:
        return fixed
    if actor.is_private_agent:
        return Decision(False, "private_agent_never_invites")
    current = _current(ctx, actor.id)
    if current is None or current.is_private:
        return Decision(False, "not_public_member")
    if invitee.is_private_agent:
        if invitee.owner_member_id != actor.id:
            return Decision(False, "not_agent_owner")
        return Decision(True, "owner_adds_private_agent")
    if visibility == "private":
        return Decision(False, "not_private_agent")
    return Decision(True, "public_member_invites")


def can_remove(scope: ScopeInfo, ctx: VisibilityContext, actor: Member, target: Member) -> Decision:
    """``remove`` from a channel.

    The channel's owner removes any member while it is a current public
    member; an owner removes its own private agent (whether or not the owner
    still belongs to the channel); nobody removes the channel's owner.
    """
    fixed = _fixed_roster(scope)
    if fixed is not None:
        return fixed
    if target.id == scope.channel_owner_id:
        return Decision(False, "channel_owner_stays")
    if target.is_private_agent and target.owner_member_id == actor.id:
        return Decision(True, "agent_owner")
    if actor.id != scope.channel_owner_id:
        return Decision(False, "not_channel_owner")
    current = _current(ctx, actor.id)
    if current is None or current.is_private:
        return Decision(False, "owner_not_member")
    return Decision(True, "channel_owner")


def knows_member(member: Member, other: Member) -> bool:
    """Whether ``other`` exists for ``member`` at all (as ``people`` lists it).

    A private agent exists only for its owner and itself: anyone else who names
    it is answered as if no such member existed, so its id reveals nothing.
    """
    return not other.is_private_agent or member.id in (other.id, other.owner_member_id)


def can_open_dm(member: Member, other: Member) -> Decision:
    """``dm:<id>``: a DM has exactly its two members, fixed at creation.

    A private agent takes part only in its owner's private DM with it, as a
    private member: another owner's private agent is never a DM participant,
    and a private agent opens no DM but its owner's.
    """
    if member.id == other.id:
        return Decision(True, "self")
    if other.is_private_agent and other.owner_member_id != member.id:
        return Decision(False, "other_owners_private_agent")
    if member.is_private_agent and other.id != member.owner_member_id:
        return Decision(False, "private_agent_dms_owner_only")
    if member.is_private_agent or other.is_private_agent:
        return Decision(True, "owner_private")
    return Decision(True, "members")


def dm_membership(member: Member) -> tuple[str, str | None]:
    """(visibility, owner) of a DM participant: a private agent is a private member."""
    if member.is_private_agent:
        return "private", member.owner_member_id
    return "public", None


def private_authority(
    ctx: VisibilityContext, actor: Member, agent: Member, at: datetime
) -> Decision:
    """May ``actor`` direct a message to ``agent`` (a private agent)? docs/design.md#private-agents."""
    owner = agent.owner_member_id
    if actor.id == owner:
        return Decision(True, "owner")
    for grant in ctx.grants:
        if (
            grant.owner_member_id == owner
            and grant.grantee_member_id == actor.id
            and grant.covers(at)
        ):
            return Decision(True, "grant", grant.id)
    if (
        actor.is_private_agent
        and actor.owner_member_id == owner
        and any(m.is_private and m.is_current for m in ctx.intervals(actor.id))
    ):
        return Decision(True, "same_owner_private")
    if actor.type is MemberType.SERVICE:
        return Decision(False, "service_without_grant")
    return Decision(False, "no_private_authority")


def thread_admission(
    thread: ThreadFacts,
    ctx: VisibilityContext,
    agent: Member,
    author: Member,
    mentioned: Collection[str],
    recipients: Collection[str],
    at: datetime,
) -> Decision:
    """May this send admit private agent ``agent`` to the thread? docs/design.md#thread-admission.

    Only a current private member of the parent can be admitted, and only by:
    being the root's author; a live mention in the root by an author with
    private authority (parent grants, at the root's time); a live mention in
    this thread message, or being its explicit recipient, by an author with
    authority in the thread (thread ∪ parent grants, never sibling threads).
    """
    if not agent.is_private_agent:
        return Decision(False, "not_private_agent")
    if not any(m.is_private and m.is_current for m in thread.parent.intervals(agent.id)):
        return Decision(False, "not_parent_private_member")
    root_author = thread.root_author
    if root_author is not None and root_author.id == agent.id:
        return Decision(True, "root_author")
    if (
        root_author is not None
        and thread.root_created_at is not None
        and agent.handle in thread.root_mentions
    ):
        authority = private_authority(thread.parent, root_author, agent, thread.root_created_at)
        if authority:
            return Decision(True, "root_mention", authority.grant_id)
    addressed = (
        "thread_mention"
        if agent.handle in mentioned
        else "explicit_recipient"
        if agent.id in recipients
        else None
    )
    if addressed is None:
        return Decision(False, "not_addressed")
    authority = private_authority(ctx, author, agent, at)
    if not authority:
        return Decision(False, authority.reason)
    return Decision(True, addressed, authority.grant_id)


# ---------------------------------------------------------------- edits and deletes
#
# docs/design.md#edits-and-deletes. A message belongs to its author: only the
# author rewrites it. Recalling it is the author's too, and the channel owner's
# (who answers for the channel, its threads included). Either needs the right
# to write in the scope now: a member who left recalls nothing.


def can_edit(ctx: VisibilityContext, editor: Member, author_id: str, message_type: str) -> Decision:
    """``edit``: the author, of a ``text`` message (or a task's discussion message),
    while it may still post here."""
    if editor.id != author_id:
        return Decision(False, "not_author")
    if message_type not in ("text", "task_discussion"):
        return Decision(False, "not_text_message")
    posting = can_post(ctx, editor)
    if not posting:
        return Decision(False, posting.reason)
    return Decision(True, "author")


def can_delete(
    ctx: VisibilityContext, actor: Member, author_id: str, channel_owner_id: str | None
) -> Decision:
    """``delete``: the author, or the channel's owner (of the channel or, for a
    thread, of its parent) while it is a current public reader of the scope."""
    posting = can_post(ctx, actor)
    if actor.id == author_id:
        return Decision(True, "author") if posting else Decision(False, posting.reason)
    if channel_owner_id is None or actor.id != channel_owner_id or actor.is_private_agent:
        return Decision(False, "not_author")
    current = _current(ctx, actor.id)
    if not posting or (current is not None and current.is_private):
        return Decision(False, "owner_not_member")
    return Decision(True, "channel_owner")


# ---------------------------------------------------------------- reactions
#
# docs/design.md#reactions. A reaction is activity on a message, not a
# message: whoever reads the message may react, and who sees a reaction
# follows who may see the reactor (private memberships stay private).

MAX_EMOJI_CODE_POINTS = 16
MAX_SHORT_NAME = 32
_SHORT_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_+-")
# Whitespace, controls, surrogates: never part of an emoji. Format characters
# (ZWJ, tag characters) stay allowed: emoji sequences are built with them.
_REFUSED_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cs"})


def reaction_emoji_error(emoji: str) -> str | None:
    """Why ``emoji`` is not a reaction, or None.

    A reaction is ``:short_name:`` (at most 32 characters, the name in
    ``[a-z0-9_+-]``) or one emoji. "One grapheme cluster" is approximated by
    a bounded check: 1-16 code points, no whitespace or control characters,
    and not plain ASCII (ASCII text is only accepted as a short name).
    """
    if len(emoji) >= 2 and emoji.startswith(":") and emoji.endswith(":"):
        name = emoji[1:-1]
        if len(emoji) > MAX_SHORT_NAME:
            return f"a short name has at most {MAX_SHORT_NAME} characters"
        if not name or not set(name) <= _SHORT_NAME_CHARS:
            return "a short name is :name: with [a-z0-9_+-] only"
        return None
    if not emoji or len(emoji) > MAX_EMOJI_CODE_POINTS:
        return f"an emoji has 1 to {MAX_EMOJI_CODE_POINTS} code points"
    if any(c.isspace() or unicodedata.category(c) in _REFUSED_CATEGORIES for c in emoji):
        return "an emoji has no whitespace or control characters"
    if emoji.isascii():
        return "plain text is not an emoji; use :short_name:"
    return None


def can_react(ctx: VisibilityContext, reactor: Member) -> Decision:
    """May ``reactor`` react in this scope at all (the message decides the rest)?

    A human or public agent reads every message of a scope it reads, so this
    is the whole answer for it. A private agent reads message by message: it
    needs a private membership interval here, and the SQL predicate then
    decides on the message itself.
    """
    if reactor.is_private_agent:
        if any(m.is_private for m in ctx.intervals(reactor.id)):
            return Decision(True, "private_member_reads_per_message")
        return Decision(False, "not_member")
    decision = can_read_scope(ctx, reactor)
    if decision.reason == "former_private_member":
        return Decision(False, "not_member")
    return decision


def sees_reaction(viewer: Member, reactor: Member) -> bool:
    """Whether a reader of the message is shown ``reactor``'s reaction.

    A private agent's reaction would reveal its private membership: only the
    agent and its owner see it. A private agent sees only the reactions of
    itself, its owner and its owner's other private agents, as it reads no one
    else's activity by itself.
    """
    if viewer.id == reactor.id:
        return True
    if viewer.is_private_agent:
        owner = viewer.owner_member_id
        return reactor.id == owner or (
            reactor.is_private_agent and reactor.owner_member_id == owner
        )
    return not reactor.is_private_agent or reactor.owner_member_id == viewer.id


def reaction_wakes(
    notification: NotificationState | None, author: Member | None, reactor: Member
) -> bool:
    """A reaction wakes an agent only on its own message, only under ``auto-wake``,
    and only when the agent is shown the reaction."""
    return (
        author is not None
        and author.type is MemberType.AGENT
        and author.id != reactor.id
        and notification is NotificationState.AUTO_WAKE
        and sees_reaction(author, reactor)
    )


# ---------------------------------------------------------------- task rules (docs/tasks.md)


def can_create_task(creator: Member) -> Decision:
    """Humans and public agents create tasks; a private agent acts only inside its owner's."""
    if creator.is_private_agent:
        return Decision(False, "private_agent_never_creates_tasks")
    return Decision(True, "creator")


def can_assign(actor: Member, assignee: Member) -> Decision:
    """Anyone the actor may name, but a private agent only by its owner (as with invites)."""
    if assignee.is_private_agent and assignee.owner_member_id != actor.id:
        return Decision(False, "not_agent_owner")
    return Decision(True, "assignable")


def can_update_task(
    actor: Member,
    *,
    member: Membership | None,
    creator_id: str,
    assignees: Collection[str],
    reassigns: bool,
    retitles: bool,
) -> Decision:
    """``updateTask``: a current member changes status and title; the creator and the
    assignees who are public members also change the assignees. A private agent
    member changes the status only: its membership is its owner's choice, not a
    say over who else works on the task."""
    if member is None:
        return Decision(False, "not_member")
    if member.is_private:
        if reassigns or retitles:
            return Decision(False, "private_agent_status_only")
        return Decision(True, "private_member_status")
    if reassigns and actor.id != creator_id and actor.id not in assignees:
        return Decision(False, "not_creator_or_assignee")
    return Decision(True, "member")
