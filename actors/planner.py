"""Planner: intent + actor context + scope context → MessagePlan. Pure, no SQL.

Every entry point (human, agent, thread, DM, forward, service) builds the same
plan; only the intent and the actor context differ. The plan records why each
member of the roster is or is not a recipient (``Explain``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import msgspec

from actors.mentions import MentionMode, live_handles
from actors.model import (
    DeliveryPolicy,
    Member,
    Membership,
    MemberType,
    NotificationState,
    StoredMessage,
)
from actors.policy import ThreadFacts, private_authority, thread_admission
from actors.sources import SourceSpec
from actors.visibility import VisibilityContext, readable
from protocol.rewind import REWIND_NOTICE

_NEVER_WAKE = frozenset(
    {NotificationState.QUIET, NotificationState.MUTE, NotificationState.NO_WAKE}
)


class MessageIntent(msgspec.Struct, frozen=True):
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
    metadata: Mapping[str, Any] = msgspec.field(default_factory=dict)
    # A chunk of a logical send: live mentions are parsed on the whole logical
    # content and restricted to this chunk (a fence opened in an earlier chunk
    # keeps its tokens inert). None: parse ``content``.
    live_mentions: frozenset[str] | None = None
    # Quotes, forwards and explicit context, written with the message
    # (actors/sources.py); they never decide delivery.
    sources: tuple[SourceSpec, ...] = ()


class ScopeContext(msgspec.Struct, frozen=True):
    visibility: VisibilityContext
    notification: Mapping[str, NotificationState]
    latest_seq: int
    thread: ThreadFacts | None = None
    # The scope's ``roster_generation`` this context reflects (the send's fence).
    roster_generation: int = 0
    # A DM: every message in it is addressed to the other member.
    dm: bool = False
    # A task: its messages are discussion, delivered to recipients frozen at send.
    task: bool = False

    def roster(self) -> list[str]:
        """Potential readers: members of the scope, and for a thread the parent's
        current public members (computed, never materialised)."""
        roster = list(self.visibility.memberships)
        if self.visibility.parent_readers:
            roster += sorted(self.visibility.parent_readers.difference(roster))
        return roster


@dataclass(frozen=True, slots=True)
class MembershipMutation:
    """A membership (and its notification setting) the send writes, from ``plan.seq`` on.

    ``reason``: ``thread_poster`` (posting in a thread makes the poster a member),
    ``root_author`` (the root's author joins on the first reply it did not write),
    or the admission reason of a private agent (docs/design.md#thread-admission).
    """

    member: Member
    visibility: str
    owner_member_id: str | None
    state: NotificationState
    reason: str
    read_through_message: bool  # last_read_seq = the message's seq (the poster's own)


class RecipientExplain(msgspec.Struct, frozen=True):
    member_id: str
    reader: bool
    wake: bool
    reason: str


class Explain(msgspec.Struct, frozen=True):
    recipients: tuple[RecipientExplain, ...]
    # Threads: (member id, admitted, reason) for the poster and every private
    # agent this send addressed (admitted or why not).
    admissions: tuple[tuple[str, bool, str], ...] = ()
    # What the author may not see by name, as ``members`` would hide it from
    # them (docs/design.md#private-agents): other owners' private agents (counted) and former members
    # (left out). The full Explain stays for the operator's debug log.
    hidden_private: frozenset[str] = frozenset()
    former: frozenset[str] = frozenset()

    def __structlog__(self) -> dict[str, Any]:
        """Rendered only when a log line is emitted (structlog's JSON fallback)."""
        return self.as_dict()

    def for_author(self) -> dict[str, Any]:
        """What ``send`` with ``explain: true`` returns: only members the author may
        see in ``members`` are named; other private agents are a count."""
        unnamed = self.hidden_private | self.former
        if not unnamed:
            return {**self.as_dict(), "hiddenPrivate": 0}
        return {
            **Explain(
                tuple(r for r in self.recipients if r.member_id not in unnamed),
                tuple(a for a in self.admissions if a[0] not in unnamed),
            ).as_dict(),
            "hiddenPrivate": len(self.hidden_private),
        }

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "recipients": [
                {"memberId": r.member_id, "reader": r.reader, "wake": r.wake, "reason": r.reason}
                for r in self.recipients
            ]
        }
        if self.admissions:
            out["admissions"] = [
                {"memberId": member_id, "admitted": admitted, "reason": reason}
                for member_id, admitted, reason in self.admissions
            ]
        return out


class OutboxEvent(msgspec.Struct, frozen=True):
    fanout_type: str
    dedupe_key: str
    delivery_policy: DeliveryPolicy
    target_member_id: str | None = None
    reason: str | None = None
    # ``inline_targeted``: the readers frozen in the send transaction, with their
    # notification state then; a replay goes to exactly these (docs/tasks.md).
    recipients: tuple[tuple[str, str], ...] | None = None


TASK_DISCUSSION = "task_discussion"
# The policy of each row a send produces (named here, where the rows are made).
SEND_REALTIME_POLICY = DeliveryPolicy.INLINE_ORDINARY
SEND_WAKE_POLICY = DeliveryPolicy.INLINE_ORDINARY
TASK_DISCUSSION_POLICY = DeliveryPolicy.INLINE_TARGETED
EDIT_PROJECTION_POLICY = DeliveryPolicy.WORKER_FIRST_MUTATION
EDIT_WAKE_POLICY = DeliveryPolicy.INLINE_ORDINARY
DELETE_PROJECTION_POLICY = DeliveryPolicy.WORKER_FIRST_MUTATION


class MessagePlan(msgspec.Struct, frozen=True):
    intent: MessageIntent
    author: Member
    seq: int
    expected_seq: int
    mentions: tuple[str, ...]
    readers: frozenset[str]
    wakes: tuple[tuple[str, str], ...]
    outbox: tuple[OutboxEvent, ...]
    explain: Explain
    memberships: tuple[MembershipMutation, ...] = ()
    # Threads: the parent scope and the roster generation the plan was built on.
    parent_fence: tuple[str, int] | None = None
    # The scope's own roster generation the plan was built on: a roster or grant
    # change committed since (on any node) makes the send a fence miss.
    expected_generation: int = 0

    @property
    def roster_bump(self) -> int:
        """What the send adds to the scope's roster generation (it writes memberships)."""
        return 1 if self.memberships else 0


def mentions_of(intent: MessageIntent) -> frozenset[str]:
    if intent.live_mentions is not None:
        return intent.live_mentions
    return live_handles(intent.content, intent.mention_mode)


def thread_mutations(
    intent: MessageIntent, author: Member, scope: ScopeContext, mentioned: frozenset[str]
) -> tuple[tuple[MembershipMutation, ...], tuple[tuple[str, bool, str], ...]]:
    """Memberships a thread send writes: the poster's, and admitted private agents'."""
    thread = scope.thread
    if thread is None:
        return (), ()
    vis = scope.visibility
    mutations: list[MembershipMutation] = []
    admissions: list[tuple[str, bool, str]] = []

    def is_member(member_id: str) -> bool:
        return any(m.is_current for m in vis.intervals(member_id))

    if not is_member(author.id):
        if author.is_private_agent:
            # Its own mention or recipient list never admits the poster itself.
            decision = thread_admission(
                thread, vis, author, author, frozenset(), (), intent.created_at
            )
            if decision:
                mutations.append(_private(author, decision.reason, own=True))
            admissions.append((author.id, decision.allowed, decision.reason))
        else:
            mutations.append(
                MembershipMutation(
                    author, "public", None, NotificationState.ACTIVE, "thread_poster", True
                )
            )
            admissions.append((author.id, True, "thread_poster"))
    root_author = thread.root_author
    if (
        root_author is not None
        and root_author.id != author.id
        and not root_author.is_private_agent
        and root_author.id in vis.parent_readers
        and not is_member(root_author.id)
    ):
        # The root's author is told of replies: as a thread member it gets the
        # thread in ``scopes`` with the reply unread (design.md#thread-root-author).
        # A private agent root author is admitted below instead.
        mutations.append(
            MembershipMutation(
                root_author, "public", None, NotificationState.ACTIVE, "root_author", False
            )
        )
        admissions.append((root_author.id, True, "root_author"))
    for member_id, intervals in thread.parent.memberships.items():
        agent = thread.parent.members.get(member_id)
        if (
            agent is None
            or agent.id == author.id
            or not agent.is_private_agent
            or not any(m.is_private and m.is_current for m in intervals)
            or is_member(agent.id)
        ):
            continue
        decision = thread_admission(
            thread, vis, agent, author, mentioned, intent.recipients, intent.created_at
        )
        if decision:
            mutations.append(_private(agent, decision.reason, own=False))
            admissions.append((agent.id, True, decision.reason))
        elif decision.reason != "not_addressed" or (
            root_author is not None and agent.handle in thread.root_mentions
        ):
            admissions.append((agent.id, False, decision.reason))
    # Private agents addressed here that are no private members of the parent.
    addressed = set(intent.recipients)
    if mentioned:
        addressed |= {m.id for m in vis.members.values() if m.handle in mentioned}
    for member_id in sorted(addressed):
        agent = vis.members.get(member_id)
        if (
            agent is not None
            and agent.is_private_agent
            and agent.id != author.id
            and not is_member(agent.id)
            and member_id not in thread.parent.memberships
        ):
            admissions.append((member_id, False, "not_parent_private_member"))
    return tuple(mutations), tuple(admissions)


def _private(agent: Member, reason: str, *, own: bool) -> MembershipMutation:
    return MembershipMutation(
        agent, "private", agent.owner_member_id, NotificationState.ACTIVE, reason, own
    )


def with_memberships(
    vis: VisibilityContext, mutations: tuple[MembershipMutation, ...], seq: int
) -> VisibilityContext:
    """The visibility context once ``mutations`` hold from ``seq`` on."""
    if not mutations:
        return vis
    intervals = dict(vis.memberships)
    members = dict(vis.members)
    for mutation in mutations:
        member = mutation.member
        interval = Membership(
            member.id, mutation.visibility, mutation.owner_member_id, seq, None, seq
        )
        intervals[member.id] = (*intervals.get(member.id, ()), interval)
        members[member.id] = member
    return replace(vis, memberships=intervals, members=members)


def plan_message(
    intent: MessageIntent, author: Member, scope: ScopeContext, *, expected_seq: int
) -> MessagePlan:
    """Compile one append at ``expected_seq + 1``."""
    seq = expected_seq + 1
    # A rewind's notice is a direct/no-outbox exception (docs/direct-no-outbox.md):
    # shown to its readers, it writes no outbox row, wakes no one and admits no one.
    notice = intent.message_type == REWIND_NOTICE
    mentioned = frozenset() if notice else mentions_of(intent)
    mutations, admissions = (
        ((), ()) if notice else thread_mutations(intent, author, scope, mentioned)
    )
    vis = with_memberships(scope.visibility, mutations, seq)
    if mutations:
        scope = msgspec.structs.replace(scope, visibility=vis)
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
        wake_reason = "notice" if notice else _wake_reason(intent, author, member, scope, mentioned)
        if wake_reason.startswith("wake:"):
            reason = wake_reason.removeprefix("wake:")
            wakes.append((member_id, reason))
            explain.append(RecipientExplain(member_id, True, True, reason))
        else:
            explain.append(RecipientExplain(member_id, True, False, wake_reason))
    readers.add(author.id)
    hidden, former = _unnamed(vis, author, (r.member_id for r in explain), admissions)
    outbox = [] if notice else [_realtime_row(intent, scope, readers)]
    outbox += [
        OutboxEvent(
            "agent_wake",
            f"wake:{intent.message_id}:{member_id}",
            SEND_WAKE_POLICY,
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
        explain=Explain(tuple(explain), admissions, hidden, former),
        memberships=mutations,
        parent_fence=(
            (scope.thread.parent_scope_id, scope.thread.parent_generation)
            if scope.thread is not None
            else None
        ),
        expected_generation=scope.roster_generation,
    )


def _realtime_row(intent: MessageIntent, scope: ScopeContext, readers: set[str]) -> OutboxEvent:
    """A send's realtime row: a task's discussion freezes its recipients
    (``inline_targeted``); any other send replays to whoever reads it then."""
    key = f"rt:{intent.message_id}"
    if not scope.task:
        return OutboxEvent("realtime", key, SEND_REALTIME_POLICY)
    frozen = tuple(
        (member_id, scope.notification.get(member_id, NotificationState.ACTIVE).value)
        for member_id in sorted(readers)
    )
    return OutboxEvent("realtime", key, TASK_DISCUSSION_POLICY, recipients=frozen)


def _unnamed(
    vis: VisibilityContext,
    author: Member,
    roster: Iterable[str],
    admissions: tuple[tuple[str, bool, str], ...],
) -> tuple[frozenset[str], frozenset[str]]:
    """Which members of an Explain the author may not see by name: (hidden private
    members, former members).

    The same rule as ``members``: a private membership is shown only to the
    agent itself and its owner; a thread's parent readers are public members.
    """
    hidden: set[str] = set()
    former: set[str] = set()
    for member_id in roster:
        current = [m for m in vis.intervals(member_id) if m.is_current]
        if not current:
            if member_id not in vis.parent_readers:
                former.add(member_id)
        elif all(m.is_private for m in current) and not _owns(vis, author, member_id, current):
            hidden.add(member_id)
    for member_id, _, _ in admissions:
        # Admission candidates need not be members of the thread (yet).
        agent = vis.members.get(member_id)
        if (
            member_id not in former
            and agent is not None
            and agent.is_private_agent
            and author.id not in (agent.id, agent.owner_member_id)
        ):
            hidden.add(member_id)
    return frozenset(hidden), frozenset(former)


def _owns(
    vis: VisibilityContext, author: Member, member_id: str, current: list[Membership]
) -> bool:
    if author.id == member_id or any(m.owner_member_id == author.id for m in current):
        return True
    member = vis.members.get(member_id)
    return member is not None and member.owner_member_id == author.id


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
    elif scope.dm:
        addressed = "dm"
    elif state is NotificationState.AUTO_WAKE:
        addressed = "auto_wake"
    else:
        return "not_addressed"
    if state in _NEVER_WAKE:
        return "muted" if state is not NotificationState.NO_WAKE else "no_wake"
    return f"wake:{addressed}"


# ---------------------------------------------------------------- edits and deletes


@dataclass(frozen=True, slots=True)
class MutationPlan:
    """An edit or a delete of one stored message (docs/design.md#edits-and-deletes).

    ``message`` is the message as it will be once the mutation commits (for a
    delete: the tombstone); ``expected_revision`` is the stored revision the plan
    was built on, and the write is conditional on it. Seqs never move.
    """

    kind: str  # "edit" | "delete"
    actor: Member
    message: StoredMessage
    expected_revision: int
    readers: frozenset[str]
    wakes: tuple[tuple[str, str], ...]
    outbox: tuple[OutboxEvent, ...]
    expected_generation: int = 0
    parent_fence: tuple[str, int] | None = None

    @property
    def projection_key(self) -> str:
        """The dedupe key of the mutation's outbox row (one per revision, one per delete)."""
        return self.outbox[0].dedupe_key


def mutation_readers(message: StoredMessage, scope: ScopeContext) -> frozenset[str]:
    """Who reads ``message`` now: the twin's answer over the current roster."""
    vis = scope.visibility
    readers = {message.author.id}
    for member_id in scope.roster():
        member = vis.members.get(member_id)
        if member is None or member_id == message.author.id:
            continue
        if readable(vis, member, message.author.id, message.seq, message.created_at) is not None:
            readers.add(member_id)
    return frozenset(readers)


def _fences(scope: ScopeContext) -> dict[str, Any]:
    return {
        "expected_generation": scope.roster_generation,
        "parent_fence": (
            (scope.thread.parent_scope_id, scope.thread.parent_generation)
            if scope.thread is not None
            else None
        ),
    }


def plan_edit(
    stored: StoredMessage, editor: Member, content: str, scope: ScopeContext, at: datetime
) -> MutationPlan:
    """Replace the content of ``stored`` (one revision up) and wake only agents the
    new text mentions live for the first time; earlier wakes stand."""
    mentioned = live_handles(content)
    newly = mentioned - frozenset(stored.mentions)
    metadata = dict(stored.metadata)
    metadata.pop("mentions", None)
    if mentioned:
        metadata["mentions"] = sorted(mentioned)
    message = msgspec.structs.replace(
        stored,
        content=content,
        metadata=metadata,
        mentions=tuple(sorted(mentioned)),
        revision=stored.revision + 1,
        edited_at=at,
    )
    readers = mutation_readers(message, scope)
    wakes: list[tuple[str, str]] = []
    if newly:
        # Recipients and auto-wake woke at send time; only a new mention is new.
        intent = MessageIntent(
            scope_id=stored.scope_id,
            workspace_id=stored.author.workspace_id,
            message_id=stored.id,
            content=content,
            message_type=stored.message_type,
            client_message_id="",
            digest=b"",
            created_at=stored.created_at,
            live_mentions=newly,
        )
        vis = scope.visibility
        for member_id in sorted(readers):
            member = vis.members.get(member_id)
            if member is None or member_id == stored.author.id or member.handle not in newly:
                continue
            reason = _wake_reason(intent, stored.author, member, scope, newly)
            if reason.startswith("wake:"):
                wakes.append((member_id, reason.removeprefix("wake:")))
    outbox = [
        OutboxEvent(
            "mutation",
            f"edit:{stored.id}:{message.revision}",
            EDIT_PROJECTION_POLICY,
            reason="edit",
        )
    ]
    outbox += [
        OutboxEvent(
            "agent_wake",
            f"wake:{stored.id}:{member_id}",
            EDIT_WAKE_POLICY,
            member_id,
            reason,
        )
        for member_id, reason in wakes
    ]
    return MutationPlan(
        "edit",
        editor,
        message,
        stored.revision,
        readers,
        tuple(wakes),
        tuple(outbox),
        **_fences(scope),
    )


def plan_delete(
    stored: StoredMessage, actor: Member, scope: ScopeContext, at: datetime
) -> MutationPlan:
    """Turn ``stored`` into a tombstone; its readers are told, nobody is woken."""
    message = msgspec.structs.replace(stored, content="", metadata={}, mentions=(), deleted_at=at)
    outbox = (
        OutboxEvent("mutation", f"delete:{stored.id}", DELETE_PROJECTION_POLICY, reason="delete"),
    )
    return MutationPlan(
        "delete",
        actor,
        message,
        stored.revision,
        mutation_readers(stored, scope),
        (),
        outbox,
        **_fences(scope),
    )
