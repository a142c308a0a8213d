"""The synchronous state machine behind a scope actor.

Plain methods, no trio: the async shell (``actors/scope_actor.py``) feeds it
commands and I/O results. Memory is a cache; the database fence is the truth.
Tentative changes made while deciding a batch are discarded by reloading the
snapshot when the batch does not commit.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from actors import freshness
from actors.ids import new_id
from actors.mentions import MentionMode
from actors.model import (
    IdempotencyRecord,
    Member,
    Membership,
    MemberType,
    NotificationState,
    ScopeInfo,
    ScopeSnapshot,
    ScopeType,
)
from actors.planner import (
    TASK_DISCUSSION,
    MessageIntent,
    MessagePlan,
    ScopeContext,
    plan_message,
)
from actors.policy import ThreadFacts, can_author_in, can_post, thread_admission
from actors.ports import CommittedSend, ThreadActivity
from actors.send_rules import CHUNK_SUFFIX, recipient_authority_error
from actors.sources import source_specs
from actors.visibility import VisibilityContext, readable
from protocol.errors import ErrorCode, OperationError
from protocol.frames import FreshnessIn, SendResult

IDEMPOTENCY_WINDOW = 256
RECENT_TAIL = 512
THREAD_PARTICIPANTS = 3  # as many as storage.messages.THREAD_PARTICIPANTS
PRIVATE_GAP_BUDGET = 200
# Content longer than this (characters) is split into several rows, one
# logical send (docs/design.md#chunked-sends). The node's ``Settings.row_limit`` overrides it.
ROW_LIMIT = 16_000

SendReply = Callable[[SendResult | OperationError], None]

# timestamptz resolution: "strictly after" a grant timestamp.
_TICK = timedelta(microseconds=1)


@dataclass(slots=True)
class SendCommand:
    """One ``send`` addressed to this scope, already authenticated and resolved."""

    author: Member
    content: str
    client_message_id: str
    reply: SendReply
    message_type: str = "text"
    attachment_ids: tuple[str, ...] = ()
    recipients: tuple[str, ...] = ()
    mention_mode: MentionMode = MentionMode.NORMAL
    forward: Any = None
    freshness: FreshnessIn | None = None
    freshness_declared: bool = False
    explain: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    # ``recipients`` as members (same order), looked up by the node: addressing
    # a private agent is checked against the grants this actor caches.
    recipient_members: tuple[Member, ...] = ()
    # Set on the rows of a chunked logical send (see actors/scope_actor.py).
    live_mentions: frozenset[str] | None = None
    # When (trio's clock) the actor stops retrying a send whose commits lose
    # the fence, and answers ``unavailable``; stamped by the actor when None.
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Immediate:
    """A decision that needs no write: already_sent, held or an error."""

    result: SendResult | OperationError


@dataclass(frozen=True, slots=True)
class NeedsLookup:
    """The idempotency window missed on a path that would not write: ask the database."""


@dataclass(frozen=True, slots=True)
class NeedsReload:
    """The sender claims a frontier beyond this cache: another node may have written."""


@dataclass(frozen=True, slots=True)
class Append:
    plan: MessagePlan
    compat: bool


Decision = Immediate | NeedsLookup | NeedsReload | Append


def payload_digest(scope_id: str, cmd: SendCommand) -> bytes:
    """Canonical digest of what the client asked for (docs/design.md#idempotency)."""
    canonical = msgspec.json.encode(
        [
            scope_id,
            cmd.message_type,
            cmd.content,
            list(cmd.attachment_ids),
            msgspec.to_builtins(cmd.forward),
            list(cmd.recipients),
        ]
    )
    return hashlib.sha256(canonical).digest()


def stored_message_type(scope_type: ScopeType, message_type: str) -> str:
    """What a client's ``text`` is stored as: a task's messages are its discussion."""
    if scope_type is ScopeType.TASK and message_type == "text":
        return TASK_DISCUSSION
    return message_type


class ScopeState:
    def __init__(self, snapshot: ScopeSnapshot) -> None:
        self.scope: ScopeInfo = snapshot.scope
        self.latest_seq = snapshot.scope.latest_seq
        # The roster generation this cache reflects; every send is fenced on it.
        self.roster_generation = snapshot.scope.roster_generation
        self.members: dict[str, Member] = dict(snapshot.members)
        self.intervals: dict[str, tuple[Membership, ...]] = {}
        for membership in snapshot.memberships:
            self.intervals[membership.member_id] = (
                *self.intervals.get(membership.member_id, ()),
                membership,
            )
        self.notification: dict[str, NotificationState] = dict(snapshot.notification)
        self.grants = snapshot.grants
        # Messages are timestamped strictly after every grant change the cache
        # knows, so a message sent after a grant or revoke falls on its far side.
        self._grant_floor = max(
            (
                t + _TICK
                for g in snapshot.grants
                for t in (g.created_at, g.revoked_at)
                if t is not None
            ),
            default=datetime.min.replace(tzinfo=UTC),
        )
        self.thread: ThreadFacts | None = None
        self.parent_readers: frozenset[str] = frozenset()
        if snapshot.thread is not None:
            self._load_thread(snapshot)
        self.idempotency: OrderedDict[tuple[str, str], IdempotencyRecord] = OrderedDict(
            snapshot.idempotency
        )
        self.recent: deque[tuple[int, str, datetime]] = deque(
            ((m.seq, m.author.id, m.created_at) for m in snapshot.recent), maxlen=RECENT_TAIL
        )
        self._ctx: VisibilityContext | None = None

    def _load_thread(self, snapshot: ScopeSnapshot) -> None:
        thread = snapshot.thread
        assert thread is not None
        parent_intervals: dict[str, tuple[Membership, ...]] = {}
        for membership in thread.parent_memberships:
            parent_intervals[membership.member_id] = (
                *parent_intervals.get(membership.member_id, ()),
                membership,
            )
        for member in thread.parent_members.values():
            self.members.setdefault(member.id, member)
        self.parent_readers = frozenset(
            m.member_id
            for m in thread.parent_memberships
            if m.is_current
            and not m.is_private
            and m.member_id in self.members
            and not self.members[m.member_id].is_private_agent
        )
        parent_grants = tuple(g for g in self.grants if g.scope_id == thread.parent_scope_id)
        root = thread.root
        self.thread = ThreadFacts(
            parent_scope_id=thread.parent_scope_id,
            parent_generation=thread.parent_generation,
            parent=VisibilityContext(parent_intervals, dict(thread.parent_members), parent_grants),
            root_author=root.author if root is not None else None,
            root_mentions=frozenset(root.mentions) if root is not None else frozenset(),
            root_created_at=root.created_at if root is not None else None,
        )

    # ------------------------------------------------------------ roster

    @property
    def visibility(self) -> VisibilityContext:
        if self._ctx is None:
            self._ctx = VisibilityContext(
                self.intervals,
                self.members,
                self.grants,
                self.parent_readers,
                thread=self.thread is not None,
            )
        return self._ctx

    def scope_context(self) -> ScopeContext:
        return ScopeContext(
            self.visibility,
            self.notification,
            self.latest_seq,
            self.thread,
            self.roster_generation,
            dm=self.scope.type is ScopeType.DM,
            task=self.scope.type is ScopeType.TASK,
        )

    def roster_changed(self, generation: int) -> None:
        """This actor's own roster write left the scope at ``generation``.

        Adopted only when it is the next one: a gap means another node changed
        the roster too, and keeping the old value makes the next send miss the
        fence and reload.
        """
        if generation == self.roster_generation + 1:
            self.roster_generation = generation

    @property
    def time_floor(self) -> datetime:
        """The earliest time the next message may carry (see ``actors/clock.py``)."""
        if self.recent and self.recent[-1][2] > self._grant_floor:
            return self.recent[-1][2]
        return self._grant_floor

    def thread_activity(
        self, published: list[tuple[MessagePlan, CommittedSend]]
    ) -> ThreadActivity | None:
        """A thread's summary after ``published`` committed, for ``threadUpdated``;
        None outside threads. Participants come from the cached tail, newest first."""
        if self.thread is None or self.scope.root_message_id is None or not published:
            return None
        participants: list[str] = []
        for _, author_id, _ in reversed(self.recent):
            if author_id not in participants:
                participants.append(author_id)
                if len(participants) == THREAD_PARTICIPANTS:
                    break
        readers = frozenset().union(*(plan.readers for plan, _ in published))
        audience = frozenset(
            r for r in readers if (m := self.members.get(r)) is not None and not m.is_private_agent
        )
        last = published[-1][1]
        return ThreadActivity(
            parent_scope_id=self.thread.parent_scope_id,
            root_message_id=self.scope.root_message_id,
            thread_scope_id=self.scope.id,
            reply_count=last.seq,
            last_reply_at=last.created_at,
            participants=tuple(participants),
            audience=audience,
        )

    def current_readers(self) -> frozenset[str]:
        return frozenset(
            member_id
            for member_id, intervals in self.intervals.items()
            if any(m.is_current for m in intervals)
        )

    def apply_membership(self, member: Member, membership: Membership) -> None:
        kept = tuple(
            m for m in self.intervals.get(member.id, ()) if m.from_seq != membership.from_seq
        )
        self.intervals[member.id] = (*kept, membership)
        self.members[member.id] = member
        if membership.is_current:
            self.notification.setdefault(member.id, NotificationState.ACTIVE)
        else:
            self.notification.pop(member.id, None)
        self._ctx = None

    def is_current_member(self, member_id: str) -> bool:
        return any(m.is_current for m in self.intervals.get(member_id, ()))

    # ------------------------------------------------------------ sends

    def remember(self, author_id: str, client_message_id: str, record: IdempotencyRecord) -> None:
        key = (author_id, client_message_id)
        self.idempotency[key] = record
        self.idempotency.move_to_end(key)
        while len(self.idempotency) > IDEMPOTENCY_WINDOW:
            self.idempotency.popitem(last=False)

    def decide(
        self, cmd: SendCommand, now: datetime, *, looked_up: bool = False, reloaded: bool = False
    ) -> Decision:
        """Idempotency first, then admission, then the freshness gate, then the plan."""
        author = cmd.author
        digest = payload_digest(self.scope.id, cmd)
        known = self.idempotency.get((author.id, cmd.client_message_id))
        if known is not None:
            return Immediate(self._replay(known, digest, cmd))
        if not can_post(self.visibility, author) and not self._admits_poster(cmd, now):
            if not reloaded:
                # The roster (a thread's: the parent's) is cached: the author may
                # have joined since through another node or the admin CLI.
                return NeedsReload()
            return Immediate(OperationError(ErrorCode.FORBIDDEN, "not a member of this scope"))
        if not can_author_in(self.scope, author):
            return Immediate(
                OperationError(
                    ErrorCode.FORBIDDEN, "only the service posts in its conversation (servicePost)"
                )
            )
        if cmd.recipient_members:
            refused = recipient_authority_error(self.visibility, author, cmd.recipient_members, now)
            if refused is not None:
                return Immediate(refused)
        compat = False
        expected = self.latest_seq
        if cmd.freshness is not None:
            if cmd.freshness.seen_up_to_seq > self.latest_seq and not reloaded:
                return NeedsReload()
            gate = freshness.check(
                scope_id=self.scope.id,
                target_key=cmd.freshness.target_key,
                seen_up_to_seq=cmd.freshness.seen_up_to_seq,
                latest_seq=self.latest_seq,
            )
            if gate.verdict is freshness.Verdict.HELD:
                if not looked_up:
                    return NeedsLookup()
                visible = self._visible_frontier(author, cmd.freshness.seen_up_to_seq)
                if visible is not None:
                    return Immediate(self._held(cmd, visible))
        elif cmd.freshness_declared and author.type is MemberType.AGENT:
            return Immediate(
                OperationError(
                    ErrorCode.VALIDATION_FAILED,
                    "freshness is required from sessions that declared the freshness capability",
                    path="$.freshness",
                )
            )
        else:
            compat = author.type is MemberType.AGENT
        intent = MessageIntent(
            scope_id=self.scope.id,
            workspace_id=self.scope.workspace_id,
            message_id=new_id("msg"),
            content=cmd.content,
            message_type=stored_message_type(self.scope.type, cmd.message_type),
            client_message_id=cmd.client_message_id,
            digest=digest,
            created_at=now,
            recipients=cmd.recipients,
            mention_mode=cmd.mention_mode,
            attachment_ids=cmd.attachment_ids,
            metadata=cmd.metadata,
            live_mentions=cmd.live_mentions,
            sources=source_specs(cmd.forward, cmd.recipient_members),
        )
        plan = plan_message(intent, author, self.scope_context(), expected_seq=expected)
        self.latest_seq = plan.seq
        self.roster_generation += plan.roster_bump
        for mutation in plan.memberships:
            self.apply_membership(
                mutation.member,
                Membership(
                    mutation.member.id,
                    mutation.visibility,
                    mutation.owner_member_id,
                    plan.seq,
                    None,
                    plan.seq if mutation.read_through_message else plan.seq - 1,
                ),
            )
            self.notification[mutation.member.id] = mutation.state
        self.remember(
            author.id, cmd.client_message_id, IdempotencyRecord(intent.message_id, plan.seq, digest)
        )
        self.recent.append((plan.seq, author.id, now))
        return Append(plan, compat)

    def _admits_poster(self, cmd: SendCommand, now: datetime) -> bool:
        """A private agent not yet in the thread may post if this send admits it."""
        if self.thread is None or not cmd.author.is_private_agent:
            return False
        mentioned: frozenset[str] = frozenset()  # its own mention never admits itself
        return thread_admission(
            self.thread, self.visibility, cmd.author, cmd.author, mentioned, (), now
        ).allowed

    def _replay(
        self, known: IdempotencyRecord, digest: bytes, cmd: SendCommand
    ) -> SendResult | OperationError:
        if known.digest != digest:
            return OperationError(
                ErrorCode.IDEMPOTENCY_CONFLICT,
                "clientMessageId was already used with a different payload",
                details={"messageId": known.message_id, "acceptedSeq": known.seq},
            )
        return SendResult(
            state="already_sent",
            target_key=self.scope.id,
            client_message_id=cmd.client_message_id,
            message_id=known.message_id,
            accepted_seq=known.seq,
            latest_seq=self.latest_seq,
        )

    def _held(self, cmd: SendCommand, frontier: int) -> SendResult:
        assert cmd.freshness is not None
        return SendResult(
            state="held",
            target_key=self.scope.id,
            client_message_id=cmd.client_message_id,
            seen_up_to_seq=cmd.freshness.seen_up_to_seq,
            latest_seq=frontier,
            needs_refresh_until_seq=frontier,
        )

    def _visible_frontier(self, author: Member, seen: int) -> int | None:
        """The seq that should hold ``author``, or None to send anyway.

        Authors without a possible visibility gap are held at the raw latest.
        A private agent is held only by a message it can see (docs/design.md#freshness):
        scan a bounded newest-first tail; not found or budget spent → send.
        """
        if not author.is_private_agent:
            return self.latest_seq
        ctx = self.visibility
        for examined, (seq, author_id, created_at) in enumerate(reversed(self.recent)):
            if seq <= seen or examined >= PRIVATE_GAP_BUDGET:
                break
            if readable(ctx, author, author_id, seq, created_at) is not None:
                return seq
        return None

    def sent_result(self, cmd: SendCommand, plan: MessagePlan) -> SendResult:
        return SendResult(
            state="sent",
            target_key=self.scope.id,
            client_message_id=cmd.client_message_id,
            message_id=plan.intent.message_id,
            accepted_seq=plan.seq,
            latest_seq=plan.seq,
            explain=plan.explain.for_author() if cmd.explain else None,
        )


def split_content(content: str, limit: int) -> list[str]:
    """Deterministic row boundaries of a logical send (docs/design.md#chunked-sends).

    Each piece holds at most ``limit`` characters. A cut prefers the last
    newline, then the last whitespace, in the second half of the window (the
    separator stays at the end of the earlier piece); otherwise it is hard.
    Joining the pieces gives back ``content``.
    """
    if limit < 1:
        raise ValueError("row limit must be positive")
    pieces: list[str] = []
    start = 0
    while len(content) - start > limit:
        window = content[start : start + limit]
        cut = window.rfind("\n") + 1
        if cut <= limit // 2:
            cut = max(window.rfind(" "), window.rfind("\t")) + 1
        if cut <= limit // 2:
            cut = limit
        pieces.append(window[:cut])
        start += cut
    pieces.append(content[start:])
    return pieces


def chunk_client_message_id(client_message_id: str, index: int) -> str:
    return f"{client_message_id}{CHUNK_SUFFIX}{index}"
