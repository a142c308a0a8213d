"""The in-memory twin of the SQL readable predicate (docs/design.md#visibility).

``storage/visibility.py`` holds the SQL predicate; a property test proves the
two agree. The twin decides fan-out (who gets a ``message`` event) and the
freshness private-gap check, so it must never be more generous than the SQL.

Rules:
- a human or public agent reads a conversational scope while it has a current
  membership; a thread it reads only while it is a current public member of
  the thread's parent scope: reason ``member`` when it also holds a current
  thread membership, else ``parent_member`` (a public parent member reads the
  whole parent, the root included). A thread membership without the parent
  grants nothing: leaving the parent ends reading its threads, and re-joining
  reads them through the parent again;
- a private agent reads, within one of its private membership intervals:
  its own messages, its owner's, those of grantees of its owner (within the
  grant's wall-clock interval; thread scopes also use the parent's grants),
  and those of same-owner private agents that had a private membership
  covering the message too;
- a private agent also reads (reason ``context``) the messages an explicit-
  context send addressed to it opened: ``VisibilityContext.context`` holds
  them per agent. An actor loads none: no row can name a message it is only
  now sending, so fan-out is exact without them, and freshness is held only by
  what the agent reads by membership.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from actors.model import Member, Membership, PrivateGrant


class Readable(msgspec.Struct, frozen=True):
    reason: str
    grant_id: str | None = None


@dataclass(frozen=True, slots=True)
class VisibilityContext:
    """Roster facts of one scope (and the grants that apply to it)."""

    memberships: Mapping[str, tuple[Membership, ...]]
    members: Mapping[str, Member]
    grants: tuple[PrivateGrant, ...]
    # Threads only: current public members of the parent (never private agents).
    parent_readers: frozenset[str] = frozenset()
    # The scope is a reply thread: humans and public agents read it through the parent.
    thread: bool = False
    # Private agent id → message ids its recipient_context rows open to it.
    context: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def intervals(self, member_id: str) -> tuple[Membership, ...]:
        return self.memberships.get(member_id, ())


def readable(
    ctx: VisibilityContext,
    viewer: Member,
    author_id: str,
    seq: int,
    created_at: datetime,
    message_id: str | None = None,
) -> Readable | None:
    """Why ``viewer`` may read the message (author, seq, created_at), or None.

    ``message_id`` is needed only for the ``context`` reason."""
    found = _readable(ctx, viewer, author_id, seq, created_at)
    if (
        found is None
        and message_id is not None
        and viewer.is_private_agent
        and message_id in ctx.context.get(viewer.id, ())
    ):
        return Readable("context")
    return found


def _readable(
    ctx: VisibilityContext,
    viewer: Member,
    author_id: str,
    seq: int,
    created_at: datetime,
) -> Readable | None:
    intervals = ctx.intervals(viewer.id)
    if not viewer.is_private_agent:
        if ctx.thread and viewer.id not in ctx.parent_readers:
            return None
        if any(m.is_current for m in intervals):
            return Readable("member")
        if viewer.id in ctx.parent_readers:
            return Readable("parent_member")
        return None
    covering = [m for m in intervals if m.is_private and m.covers(seq)]
    if not covering:
        return None
    if author_id == viewer.id:
        return Readable("own")
    owner = viewer.owner_member_id
    if author_id == owner:
        return Readable("owner")
    covering_grants = [
        grant
        for grant in ctx.grants
        if grant.owner_member_id == owner
        and grant.grantee_member_id == author_id
        and grant.covers(created_at)
    ]
    if covering_grants:
        # The SQL picks the earliest grant (created_at, then id): so must the twin,
        # whatever order the context holds its grants in.
        grant = min(covering_grants, key=lambda g: (g.created_at, g.id))
        return Readable("grant", grant.id)
    author = ctx.members.get(author_id)
    if (
        author is not None
        and author.is_private_agent
        and author.owner_member_id == owner
        and any(m.is_private and m.covers(seq) for m in ctx.intervals(author_id))
    ):
        return Readable("same_owner_private")
    return None


def readers(
    ctx: VisibilityContext,
    candidates: Iterable[str],
    author_id: str,
    seq: int,
    created_at: datetime,
) -> frozenset[str]:
    """The member ids among ``candidates`` that may read the message."""
    out = []
    for member_id in candidates:
        member = ctx.members.get(member_id)
        if member is not None and readable(ctx, member, author_id, seq, created_at):
            out.append(member_id)
    return frozenset(out)
