"""Who may mark a recovery point and who may rewind (docs/rewind.md). Pure.

A rewind sets aside everything after a point for every reader of the
conversation, so it belongs to whoever owns the conversation: a channel's
owner (a thread's: its parent channel's), and in a DM its people or the owner
of the private agent it talks to. Private agents never rewind: their runtime
marks points, their owner decides. Task and service conversations are not
rewound (their messages are records others act on).
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.model import Member, MemberType, ScopeInfo, ScopeType
from actors.policy import Decision

REWINDABLE = frozenset({ScopeType.CHANNEL, ScopeType.DM, ScopeType.THREAD})


def can_mark_point(scope: ScopeInfo) -> Decision:
    """Any reader of the message may mark it, where rewinding exists at all."""
    if scope.type not in REWINDABLE:
        return Decision(False, "not_rewindable")
    return Decision(True, "reader")


def can_rewind(
    scope: ScopeInfo,
    actor: Member,
    *,
    channel_owner_id: str | None,
    owner_is_public_member: bool,
    dm_members: Sequence[Member] = (),
) -> Decision:
    """``channel_owner_id``: the channel's (a thread's parent's) owner, and whether
    the actor holds a current public membership there; ``dm_members``: a DM's two."""
    if scope.type not in REWINDABLE:
        return Decision(False, "not_rewindable")
    if actor.is_private_agent:
        return Decision(False, "private_agent_never_rewinds")
    if scope.type is ScopeType.DM:
        if actor.id not in {m.id for m in dm_members}:
            return Decision(False, "not_dm_member")
        if any(m.is_private_agent and m.owner_member_id == actor.id for m in dm_members):
            return Decision(True, "agent_owner")
        if actor.type is MemberType.HUMAN:
            return Decision(True, "dm_member")
        return Decision(False, "not_dm_owner")
    if actor.id != channel_owner_id:
        return Decision(False, "not_channel_owner")
    if not owner_is_public_member:
        return Decision(False, "owner_not_member")
    return Decision(True, "channel_owner")
