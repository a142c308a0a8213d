"""A message's reactions summary as each reader is shown it (docs/design.md#reactions).

The rule is :func:`actors.policy.sees_reaction` and the SQL of
``storage.reactions.SUMMARIES``: a private agent's reaction is shown only to
the agent and its owner; a private agent is shown only its own reactions,
its owner's and those of its owner's other private agents. History reads
summaries with that SQL; a ``messageUpdated`` projection, encoded once for
many readers, builds them here from the message's stored reactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actors.model import Member

# Reactors named per emoji in a summary; ``count`` is always the full count.
SHOWN_MEMBERS = 20


@dataclass(frozen=True, slots=True)
class ReactionSummary:
    emoji: str
    count: int
    member_ids: tuple[str, ...]

    def view(self) -> dict[str, Any]:
        return {"emoji": self.emoji, "count": self.count, "memberIds": list(self.member_ids)}


@dataclass(frozen=True, slots=True)
class StoredReaction:
    """One reaction of a message, with what decides who is shown it."""

    member_id: str
    emoji: str
    # Order of its time among the message's reactions (equal times share one).
    rank: int
    # The reactor's owner when the reactor is private (else None).
    private_owner: str | None


def shown_to(viewer: Member, reaction: StoredReaction) -> bool:
    if reaction.member_id == viewer.id:
        return True
    if viewer.is_private_agent:
        owner = viewer.owner_member_id
        return reaction.member_id == owner or reaction.private_owner == owner
    return reaction.private_owner is None or reaction.private_owner == viewer.id


def summarize(reactions: Iterable[StoredReaction]) -> tuple[ReactionSummary, ...]:
    """Per emoji by first reaction (ties by emoji), reactors by time then id."""
    by_emoji: dict[str, list[StoredReaction]] = {}
    for reaction in reactions:
        by_emoji.setdefault(reaction.emoji, []).append(reaction)
    ordered = sorted(by_emoji.items(), key=lambda kv: (min(r.rank for r in kv[1]), kv[0]))
    return tuple(
        ReactionSummary(
            emoji,
            len(rows),
            tuple(r.member_id for r in sorted(rows, key=lambda r: (r.rank, r.member_id)))[
                :SHOWN_MEMBERS
            ],
        )
        for emoji, rows in ordered
    )


def summaries_by_reader(
    reactions: Sequence[StoredReaction], readers: Iterable[str], members: Mapping[str, Member]
) -> dict[str, tuple[ReactionSummary, ...]]:
    """Reader id → the summary it is shown. Readers shown no private reaction
    share one summary, so a projection is encoded once for all of them."""
    public = summarize(r for r in reactions if r.private_owner is None)
    owners = {r.private_owner for r in reactions if r.private_owner is not None}
    out: dict[str, tuple[ReactionSummary, ...]] = {}
    for reader in readers:
        member = members.get(reader)
        if member is None:
            out[reader] = public
        elif member.is_private_agent or member.id in owners:
            out[reader] = summarize(r for r in reactions if shown_to(member, r))
        else:
            out[reader] = public
    return out
