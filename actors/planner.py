"""Planner: intent + actor context + scope context → MessagePlan. Pure, no SQL.

Every entry point (human, agent, thread, DM, forward, service) builds the same
plan; only the intent and the actor context differ. The plan records why each
member of the roster is or is not a recipient (``Explain``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from actors.mentions import MentionMode, live_handles
from actors.model import DeliveryPolicy, Member, MemberType, NotificationState
from actors.policy import private_authority
from actors.visibility import VisibilityContext, readable

_NEVER_WAKE = frozenset(
    {NotificationState.QUIET, NotificationState.MUTE, NotificationState.NO_WAKE}
)


@dataclass(frozen=True, slots=True)
class MessageIntent:
    scope_id: str
    workspace_id: str
    message_id: str
    content: str
    message_type: str
    client_message_id: str
    digest: bytes
    created_at: datetime
    recipients: tuple[str, ...] = ()
    mention_mode: MentionMode = MentionMode.NORMAL
    attachment_ids: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScopeContext:
    visibility: VisibilityContext
    notification: Mapping[str, NotificationState]
    latest_seq: int

    def roster(self) -> list[str]:
        return list(self.visibility.memberships)


@dataclass(frozen=True, slots=True)
class RecipientExplain:
    member_id: str
    reader: bool
    wake: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Explain:
    recipients: tuple[RecipientExplain, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipients": [
                {"memberId": r.member_id, "reader": r.reader, "wake": r.wake, "reason": r.reason}
                for r in self.recipients
            ]
        }


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    fanout_type: str
    dedupe_key: str
    delivery_policy: DeliveryPolicy
    target_member_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class MessagePlan:
    intent: MessageIntent
    author: Member
    seq: int
    expected_seq: int
    mentions: tuple[str, ...]
    readers: frozenset[str]
    wakes: tuple[tuple[str, str], ...]
    outbox: tuple[OutboxEvent, ...]
    explain: Explain


def plan_message(
    intent: MessageIntent, author: Member, scope: ScopeContext, *, expected_seq: int
) -> MessagePlan:
    """Compile one append at ``expected_seq + 1``."""
    seq = expected_seq + 1
    mentioned = live_handles(intent.content, intent.mention_mode)
    vis = scope.visibility
    readers: set[str] = set()
    wakes: list[tuple[str, str]] = []
    explain: list[RecipientExplain] = []
    for member_id in scope.roster():
        member = vis.members.get(member_id)
        if member is None or member_id == author.id:
            continue
        if readable(vis, member, author.id, seq, intent.created_at) is None:
            reason = "not_visible"
            if member.is_private_agent and not private_authority(
                vis, author, member, intent.created_at
            ):
                reason = "no_private_authority"
            explain.append(RecipientExplain(member_id, False, False, reason))
            continue
        readers.add(member_id)
        wake_reason = _wake_reason(intent, author, member, scope, mentioned)
        if wake_reason.startswith("wake:"):
            reason = wake_reason.removeprefix("wake:")
            wakes.append((member_id, reason))
            explain.append(RecipientExplain(member_id, True, True, reason))
        else:
            explain.append(RecipientExplain(member_id, True, False, wake_reason))
    readers.add(author.id)
    outbox = [OutboxEvent("realtime", f"rt:{intent.message_id}", DeliveryPolicy.INLINE_ORDINARY)]
    outbox += [
        OutboxEvent(
            "agent_wake",
            f"wake:{intent.message_id}:{member_id}",
            DeliveryPolicy.INLINE_ORDINARY,
            member_id,
            reason,
        )
        for member_id, reason in wakes
    ]
    return MessagePlan(
        intent=intent,
        author=author,
        seq=seq,
        expected_seq=expected_seq,
        mentions=tuple(sorted(mentioned)),
        readers=frozenset(readers),
        wakes=tuple(wakes),
        outbox=tuple(outbox),
        explain=Explain(tuple(explain)),
    )


def _wake_reason(
    intent: MessageIntent,
    author: Member,
    member: Member,
    scope: ScopeContext,
    mentioned: frozenset[str],
) -> str:
    """``wake:<reason>`` for an agent to wake, otherwise why it does not."""
    if member.type is not MemberType.AGENT:
        return "reader"
    state = scope.notification.get(member.id, NotificationState.ACTIVE)
    if member.is_private_agent and not private_authority(
        scope.visibility, author, member, intent.created_at
    ):
        return "no_private_authority"
    if member.id in intent.recipients:
        addressed = "explicit_recipient"
    elif member.handle in mentioned:
        addressed = "mention"
    elif state is NotificationState.AUTO_WAKE:
        addressed = "auto_wake"
    else:
        return "not_addressed"
    if state in _NEVER_WAKE:
        return "muted" if state is not NotificationState.NO_WAKE else "no_wake"
    return f"wake:{addressed}"
