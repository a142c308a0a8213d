"""Policy: admission and authority questions with structured reasons. Writes nothing."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from actors.model import Member, MemberType
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
    """The parent side of a reply thread, as admission needs it (seed 000 §3.5, §5.2).

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


def can_post(ctx: VisibilityContext, author: Member) -> Decision:
    """Writing to a conversational scope needs a current membership.

    In a thread, a current public member of the parent may post too (it reads
    the thread; posting makes it a thread member). Private agents need
    admission (:func:`thread_admission`).
    """
    if any(m.is_current for m in ctx.intervals(author.id)):
        return Decision(True, "member")
    if not author.is_private_agent and author.id in ctx.parent_readers:
        return Decision(True, "parent_member")
    return Decision(False, "not_member")


def can_read_scope(ctx: VisibilityContext, viewer: Member) -> Decision:
    """Whether the viewer may open the scope's history at all (rows are filtered further)."""
    if any(m.is_current for m in ctx.intervals(viewer.id)):
        return Decision(True, "member")
    if not viewer.is_private_agent and viewer.id in ctx.parent_readers:
        return Decision(True, "parent_member")
    if viewer.is_private_agent and ctx.intervals(viewer.id):
        return Decision(True, "former_private_member")
    return Decision(False, "not_member")


def private_authority(
    ctx: VisibilityContext, actor: Member, agent: Member, at: datetime
) -> Decision:
    """May ``actor`` direct a message to ``agent`` (a private agent)? Seed 000 §2.4."""
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
    """May this send admit private agent ``agent`` to the thread? Seed 000 §5.2.

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
