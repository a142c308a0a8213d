"""What the scope actor needs from the outside world, as typing Protocols.

``storage`` implements :class:`ScopeStore`; ``node`` implements
:class:`Publisher`. The actor never imports either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import msgspec

from actors.cards import CardChange, CardTarget
from actors.model import (
    IdempotencyRecord,
    Member,
    Membership,
    NotificationState,
    ScopeSnapshot,
    StoredMessage,
)
from actors.planner import MessagePlan, MutationPlan
from actors.reactions import ReactionSummary, StoredReaction


class FenceLost(Exception):
    """The fenced update of the scope row matched nothing: memory is stale.

    The fence is ``latest_seq``, the scope's ``roster_generation`` (and the
    parent's for a thread), and the message time not being ahead of the
    database clock.
    """


class IdempotencyRace(Exception):
    """The message key already exists in the database (another writer, or a stale cache)."""

    def __init__(self, record: IdempotencyRecord, author_id: str, client_message_id: str) -> None:
        super().__init__(client_message_id)
        self.record = record
        self.author_id = author_id
        self.client_message_id = client_message_id


class ScopeMissing(Exception):
    """The scope does not exist."""


class CommittedSend(msgspec.Struct, frozen=True):
    message_id: str
    seq: int
    global_seq: int
    created_at: datetime
    # The database clock when the statement ran: re-anchors the actor's clock.
    db_now: datetime | None = None


@dataclass(frozen=True, slots=True)
class ThreadActivity:
    """A thread after a committed send, as its parent's readers learn of it
    (``threadUpdated``, docs/design.md#thread-summary)."""

    parent_scope_id: str
    root_message_id: str
    thread_scope_id: str
    reply_count: int
    last_reply_at: datetime
    participants: tuple[str, ...]
    # Who reads the replies, private agents left out (they get no summaries).
    audience: frozenset[str]


@dataclass(frozen=True, slots=True)
class ReactionOutcome:
    """What one reaction statement found and did (docs/design.md#reactions)."""

    fenced: bool  # the scope's roster generation was still the one decided on
    found: bool  # the message is in the scope
    readable: bool  # the reactor may read it (the SQL predicate)
    room: bool  # under the distinct-emoji cap (always True for remove)
    changed: bool
    author_id: str | None = None
    seq: int | None = None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ReactionWrite:
    """One decided reaction of a group the actor writes in one statement."""

    op: str  # "add" | "remove"
    reactor: Member
    message_id: str
    emoji: str
    # The reactor holds a current public membership (the readable predicate's
    # ``viewer_public``).
    public_reader: bool
    wake: frozenset[str]


@dataclass(frozen=True, slots=True)
class ReactionActivity:
    """A committed reaction change, as its readers learn of it (``reaction``)."""

    scope_id: str
    message_id: str
    member_id: str
    emoji: str
    op: str
    # Readers of the message shown this reactor's reactions.
    audience: frozenset[str]
    # Agents the reaction wakes: their daemon sessions get the event too.
    wakes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RosterChange:
    """A roster write and the scope's ``roster_generation`` right after it."""

    membership: Membership | None
    generation: int


@dataclass(frozen=True, slots=True)
class MutationTarget:
    """A stored message about to be edited or deleted, and who owns its channel
    (for a thread: the parent channel's owner; None in a DM)."""

    message: StoredMessage
    channel_owner_id: str | None


@dataclass(frozen=True, slots=True)
class CommittedMutation:
    """An edit or delete that committed: its database time and the wakes it wrote
    (an agent already woken for the message gets no second row)."""

    at: datetime
    woken: frozenset[str]
    # An edit's: the message's reactions as stored (read by its statement),
    # and the summary each reader is shown, which the actor fills in.
    reactions: tuple[StoredReaction, ...] = ()
    reactions_shown: Mapping[str, tuple[ReactionSummary, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MutationConflict:
    """The conditional write matched nothing: the message moved on (or is gone)."""

    revision: int
    deleted: bool


class LockedScope(Protocol):
    """A transaction in which no other writer can move the scope (``ScopeStore.locked``)."""

    async def load_scope(self) -> ScopeSnapshot: ...

    async def find_idempotent(
        self, author_id: str, client_message_id: str
    ) -> IdempotencyRecord | None: ...

    async def apply_sends(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        """Write inside the transaction: committed only when the ``locked`` block ends."""


class ScopeStore(Protocol):
    async def load_scope(self, scope_id: str) -> ScopeSnapshot: ...

    def locked(self, scope_id: str) -> AbstractAsyncContextManager[LockedScope]:
        """Hold the scope's send locks for the block, then commit: another
        writer's send or roster change waits for it, so a send loaded, decided
        and applied inside cannot lose the fence to another writer."""

    async def roster_generation(self, scope_id: str) -> int: ...

    async def find_idempotent(
        self, scope_id: str, author_id: str, client_message_id: str
    ) -> IdempotencyRecord | None: ...

    async def apply_sends(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]: ...

    async def join(
        self,
        scope_id: str,
        member: Member,
        *,
        visibility: str,
        owner_member_id: str | None,
        state: NotificationState,
    ) -> RosterChange: ...

    async def leave(self, scope_id: str, member_id: str) -> RosterChange: ...

    async def set_notification(
        self, scope_id: str, member_id: str, state: NotificationState
    ) -> int:
        """Store the setting; returns the scope's new roster generation."""

    async def mutation_target(self, scope_id: str, message_id: str) -> MutationTarget | None:
        """The message of this scope as stored now, or None."""

    async def apply_mutation(self, plan: MutationPlan) -> CommittedMutation | MutationConflict:
        """Write an edit or delete; raises FenceLost when the roster moved."""

    async def card_target(self, scope_id: str, message_id: str) -> CardTarget | None:
        """A card message of the scope with its card's stored state (docs/cards.md)."""
        ...

    async def apply_card(
        self, plan: MutationPlan, change: CardChange
    ) -> CommittedMutation | MutationConflict:
        """Write a card change under the card's row lock; FenceLost as an edit's."""
        ...

    async def react_many(
        self,
        scope_id: str,
        generation: int,
        writes: Sequence[ReactionWrite],
        *,
        grant_scopes: tuple[str, ...],
        in_thread: bool,
    ) -> list[ReactionOutcome]:
        """Add or remove reactions on distinct messages in one statement, each
        only if its reactor reads the message, all only if the roster is still
        at ``generation``; never touches ``latest_seq``. One outcome per write,
        in order."""


class Publisher(Protocol):
    def batch(self) -> AbstractContextManager[None]:
        """Hold the writes queued inside the block and send them per session at its end."""

    def publish_messages(
        self, scope_id: str, sends: Sequence[tuple[MessagePlan, CommittedSend]]
    ) -> None:
        """Hand committed messages to live sessions. Must not block or raise."""

    def publish_membership(
        self, scope_id: str, member_id: str, op: str, visibility: str, audience: frozenset[str]
    ) -> None:
        """Tell current readers about a roster change. Must not block or raise."""

    def publish_thread(self, activity: ThreadActivity) -> None:
        """Tell the parent's readers a thread grew. Must not block or raise."""

    def publish_mutation(self, plan: MutationPlan, commit: CommittedMutation) -> None:
        """Push ``messageUpdated``/``messageDeleted`` (and new wakes). Must not block or raise."""

    def publish_reaction(self, activity: ReactionActivity) -> None:
        """Push ``reaction`` to the readers shown it (no outbox). Must not block or raise."""
