"""Policy: admission and authority questions with structured reasons. Writes nothing."""

from __future__ import annotations

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


def can_post(ctx: VisibilityContext, author: Member) -> Decision:
    """Writing to a conversational scope needs a current membership."""
    if any(m.is_current for m in ctx.intervals(author.id)):
        return Decision(True, "member")
    return Decision(False, "not_member")


def can_read_scope(ctx: VisibilityContext, viewer: Member) -> Decision:
    """Whether the viewer may open the scope's history at all (rows are filtered further)."""
    if any(m.is_current for m in ctx.intervals(viewer.id)):
        return Decision(True, "member")
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
