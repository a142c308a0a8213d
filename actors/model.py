"""Domain values shared by the actor, Policy, Planner and the storage layer.

Plain frozen values: no I/O, no database, cheap to build in tests. Those built
for every send are frozen msgspec Structs (their ``__init__`` is several times
cheaper than a frozen dataclass's); the rest are frozen dataclasses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec


class MemberType(enum.StrEnum):
    HUMAN = "human"
    AGENT = "agent"
    SERVICE = "service"


class ScopeType(enum.StrEnum):
    CHANNEL = "channel"
    DM = "dm"
    THREAD = "thread"
    TASK = "task"
    SERVICE_ACCOUNT = "service_account"
    WORKFLOW = "workflow"


class NotificationState(enum.StrEnum):
    ACTIVE = "active"
    QUIET = "quiet"
    MUTE = "mute"
    AUTO_WAKE = "auto-wake"
    NO_WAKE = "no-wake"


class DeliveryPolicy(enum.StrEnum):
    """The committed-delivery policies an outbox row can name (docs/design.md#delivery).

    Sends' realtime and wake rows, and edits' wake rows, are ``INLINE_ORDINARY``;
    an edit's or delete's projection row is ``WORKER_FIRST_MUTATION``; a task
    discussion message's realtime row is ``INLINE_TARGETED`` (recipients frozen
    at send) and a task assignment's agent wake ``WORKER_FIRST_TARGETED``
    (docs/tasks.md). ``AUTONOMOUS_STORE_RECOVERABLE`` is allowed by the schema
    and written by nothing. Each producer names its policy where it makes the
    row (tests/test_delivery_policies.py lists them).
    """

    INLINE_ORDINARY = "inline_ordinary"
    AUTONOMOUS_STORE_RECOVERABLE = "autonomous_store_recoverable"
    INLINE_TARGETED = "inline_targeted"
    WORKER_FIRST_TARGETED = "worker_first_targeted"
    WORKER_FIRST_MUTATION = "worker_first_mutation"


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    workspace_id: str
    type: MemberType
    handle: str
    display_name: str
    owner_member_id: str | None = None
    is_private: bool = False

    @property
    def is_private_agent(self) -> bool:
        return self.is_private and self.type is MemberType.AGENT


@dataclass(frozen=True, slots=True)
class Membership:
    """One membership interval: ``[from_seq, to_seq)``, open when ``to_seq`` is None."""

    member_id: str
    visibility: str
    owner_member_id: str | None
    from_seq: int
    to_seq: int | None = None
    last_read_seq: int = 0

    def covers(self, seq: int) -> bool:
        return self.from_seq <= seq and (self.to_seq is None or seq < self.to_seq)

    @property
    def is_current(self) -> bool:
        return self.to_seq is None

    @property
    def is_private(self) -> bool:
        return self.visibility == "private"


@dataclass(frozen=True, slots=True)
class PrivateGrant:
    id: str
    scope_id: str
    owner_member_id: str
    grantee_member_id: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def covers(self, at: datetime) -> bool:
        """Grant interval is wall clock: created_at up to the earlier of revoke/expiry."""
        end = min((t for t in (self.revoked_at, self.expires_at) if t is not None), default=None)
        return self.created_at <= at and (end is None or at < end)


@dataclass(frozen=True, slots=True)
class ScopeInfo:
    id: str
    workspace_id: str
    type: ScopeType
    latest_seq: int
    parent_scope_id: str | None = None
    root_message_id: str | None = None
    slug: str | None = None
    name: str | None = None
    channel_visibility: str | None = None
    roster_generation: int = 0
    # Channels: the member who created the channel (it may remove members).
    channel_owner_id: str | None = None


class StoredMessage(msgspec.Struct, frozen=True):
    """A committed message row (what history and events show)."""

    id: str
    scope_id: str
    seq: int
    global_seq: int
    author: Member
    message_type: str
    content: str
    created_at: datetime
    client_message_id: str | None = None
    digest: bytes | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    mentions: tuple[str, ...] = ()
    # docs/design.md#edits-and-deletes: 0 until edited; a deleted row is a tombstone.
    revision: int = 0
    edited_at: datetime | None = None
    deleted_at: datetime | None = None


class IdempotencyRecord(msgspec.Struct, frozen=True):
    message_id: str
    seq: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class ThreadContext:
    """What a thread's actor caches about its parent scope (docs/design.md#threads).

    ``parent_memberships`` are the parent's *current* memberships: the public
    ones make their members readers of the thread (computed, never
    materialised); the private ones are the only private agents that may be
    admitted. ``parent_generation`` is the parent's ``roster_generation`` when
    this was read: thread sends are fenced on it, so a stale parent roster (a
    join, leave or grant in the parent) makes the send reload instead.
    """

    parent_scope_id: str
    parent_generation: int
    root: StoredMessage | None
    parent_memberships: tuple[Membership, ...]
    parent_members: dict[str, Member]


@dataclass(frozen=True, slots=True)
class ScopeSnapshot:
    """Everything a scope actor loads from the database when it starts."""

    scope: ScopeInfo
    memberships: tuple[Membership, ...]
    members: dict[str, Member]
    notification: dict[str, NotificationState]
    grants: tuple[PrivateGrant, ...]
    recent: tuple[StoredMessage, ...]
    idempotency: dict[tuple[str, str], IdempotencyRecord]
    thread: ThreadContext | None = None
    # The database's clock when the snapshot was taken (the actor's clock anchor).
    db_now: datetime | None = None
