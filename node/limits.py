"""Rate limits: token buckets per member and per workspace, held node-wide.

Every session of a member draws on the same three buckets: one for sends,
one for every other request except ping/pong, and a smaller one that
``search`` and ``history`` (the expensive reads) take from as well. Above
the members, each workspace has the same three kinds of bucket, larger, so
that one workspace cannot take a shared node from the others. A request
takes a token from each of its buckets or from none: one that finds any of
them empty is answered ``rate_limited`` with ``details.retryAfterMs`` (and
which bucket it met), is not executed, and the session stays open.

The buckets live in one :class:`Limiter` per node, in two bounded
:class:`~actors.lru.Lru` tables keyed by member id and by workspace id. The
least recently used entry is forgotten to take a new one; it is normally a
bucket idle long enough to have refilled, which is the same as no bucket.

The defaults (``node.config.Settings``) are above what a person typing or a
busy agent does; load tests raise them with :data:`RAISED_LIMITS_ENV`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import trio

from actors.lru import Lru
from protocol.errors import ErrorCode, OperationError

SEND_RATE_ENV = "SCOPENODE_SEND_RATE"
SEND_BURST_ENV = "SCOPENODE_SEND_BURST"
REQUEST_RATE_ENV = "SCOPENODE_REQUEST_RATE"
REQUEST_BURST_ENV = "SCOPENODE_REQUEST_BURST"
READ_RATE_ENV = "SCOPENODE_READ_RATE"
READ_BURST_ENV = "SCOPENODE_READ_BURST"
WORKSPACE_SEND_RATE_ENV = "SCOPENODE_WORKSPACE_SEND_RATE"
WORKSPACE_SEND_BURST_ENV = "SCOPENODE_WORKSPACE_SEND_BURST"
WORKSPACE_REQUEST_RATE_ENV = "SCOPENODE_WORKSPACE_REQUEST_RATE"
WORKSPACE_REQUEST_BURST_ENV = "SCOPENODE_WORKSPACE_REQUEST_BURST"
WORKSPACE_READ_RATE_ENV = "SCOPENODE_WORKSPACE_READ_RATE"
WORKSPACE_READ_BURST_ENV = "SCOPENODE_WORKSPACE_READ_BURST"
READS_AT_ONCE_ENV = "SCOPENODE_READS_AT_ONCE"
MAX_SESSIONS_ENV = "SCOPENODE_MAX_SESSIONS_PER_MEMBER"
INVITE_RATE_ENV = "SCOPENODE_INVITE_RATE"
INVITE_BURST_ENV = "SCOPENODE_INVITE_BURST"

# Bucket sets remembered: a member or workspace seen again after being
# forgotten starts with full buckets.
MEMBERS_LIMITED = 10_000
WORKSPACES_LIMITED = 1_000
ADDRESSES_LIMITED = 10_000

# What the bench and the test suite run with: high enough that no workload
# meets a limit, while the limit code stays on the measured path.
RAISED_LIMITS_ENV: dict[str, str] = dict.fromkeys(
    (
        SEND_RATE_ENV,
        SEND_BURST_ENV,
        REQUEST_RATE_ENV,
        REQUEST_BURST_ENV,
        READ_RATE_ENV,
        READ_BURST_ENV,
        WORKSPACE_SEND_RATE_ENV,
        WORKSPACE_SEND_BURST_ENV,
        WORKSPACE_REQUEST_RATE_ENV,
        WORKSPACE_REQUEST_BURST_ENV,
        WORKSPACE_READ_RATE_ENV,
        WORKSPACE_READ_BURST_ENV,
        READS_AT_ONCE_ENV,
        MAX_SESSIONS_ENV,
        INVITE_RATE_ENV,
        INVITE_BURST_ENV,
    ),
    "1000000",
)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second of ``now`` (trio's clock).

    O(1) and allocation-free apart from the float results: no timers, no
    queues; the refill is computed from the time since the last look.

    A refused request is told when to come back (:meth:`turn`): at the first
    token not yet promised to an earlier refused request. Clients that wait as
    told then come back one per token instead of all at once at the next one,
    and each is refused about once per token it gets, however many sessions
    share the bucket.
    """

    __slots__ = ("burst", "promised", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now
        # When the last token promised to a refused request comes in.
        self.promised = now

    def wait(self, now: float) -> float:
        """Refill up to ``now``: 0.0 when a token is there, else seconds until one is."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        self.tokens = tokens
        self.stamp = now
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def take(self, now: float) -> float:
        """Take one token: 0.0 when taken, else seconds until one is available."""
        wait = self.wait(now)
        if not wait:
            self.tokens -= 1.0
        return wait

    def turn(self, now: float, wait: float) -> float:
        """Promise a refused request the first token no earlier refused request
        was promised (``wait``: seconds until the next token); seconds until it."""
        ahead = self.next_turn(now, wait)
        self.promised = now + ahead
        return ahead

    def next_turn(self, now: float, wait: float) -> float:
        """What :meth:`turn` would answer, promising nothing. At most a bucketful
        ahead: a caller refused that often is given no later turn."""
        at = now + wait
        if self.promised >= at:
            at = min(self.promised + 1.0 / self.rate, now + self.burst / self.rate)
        return at - now


class Kind(IntEnum):
    """Which buckets a request takes from (an index: no hashing on the hot path)."""

    SEND = 0  # send
    REQUEST = 1  # request
    READ = 2  # request and read


# The bucket names of each kind, in the order of Buckets.by_kind.
_NAMES = (("send",), ("request",), ("request", "read"))


@dataclass(frozen=True, slots=True)
class Rate:
    """Tokens per second and bucket size."""

    per_s: float
    burst: int


@dataclass(frozen=True, slots=True)
class Rates:
    """The three buckets of one member, or of one workspace."""

    send: Rate
    request: Rate
    read: Rate


class Buckets:
    """A member's or a workspace's three buckets, by kind of request (``_NAMES``),
    and a member's reads in flight (see :meth:`Limiter.reading`)."""

    __slots__ = ("by_kind", "reading")

    def __init__(self, rates: Rates, now: float) -> None:
        send = TokenBucket(rates.send.per_s, rates.send.burst, now)
        request = TokenBucket(rates.request.per_s, rates.request.burst, now)
        read = TokenBucket(rates.read.per_s, rates.read.burst, now)
        self.by_kind: tuple[tuple[TokenBucket, ...], ...] = ((send,), (request,), (request, read))
        self.reading: trio.Semaphore | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which bucket was empty (``per``: member or workspace) and for how long."""

    bucket: str
    per: str
    wait: float

    def error(self) -> OperationError:
        return rate_limited(self.bucket, self.per, self.wait)


class Limiter:
    """The node's buckets by member and by workspace (see the module doc)."""

    __slots__ = ("_members", "_workspaces", "member_rates", "reads_at_once", "workspace_rates")

    def __init__(self, member: Rates, workspace: Rates, reads_at_once: int) -> None:
        if reads_at_once < 1:
            raise ValueError("a member needs at least one read at once")
        self.member_rates = member
        self.workspace_rates = workspace
        self.reads_at_once = reads_at_once
        self._members: Lru[str, Buckets] = Lru("limit_members", MEMBERS_LIMITED)
        self._workspaces: Lru[str, Buckets] = Lru("limit_workspaces", WORKSPACES_LIMITED)

    def _member(self, member_id: str, now: float) -> Buckets:
        member = self._members.get(member_id)
        if member is None:
            member = Buckets(self.member_rates, now)
            self._members.put(member_id, member)
        return member

    def reading(self, member_id: str, now: float) -> trio.Semaphore:
        """Held while one of the member's ``search`` or ``history`` requests runs:
        ``reads_at_once`` of them at a time on this node, the others wait their
        turn. However many sessions it holds, a member keeps no more of the
        database busy than that."""
        member = self._member(member_id, now)
        if member.reading is None:
            member.reading = trio.Semaphore(self.reads_at_once)
        return member.reading

    def admit(self, kind: Kind, member_id: str, workspace_id: str, now: float) -> Refusal | None:
        """Take a token from each of the request's buckets, or from none and say why."""
        member = self._member(member_id, now)
        workspace = self._workspaces.get(workspace_id)
        if workspace is None:
            workspace = Buckets(self.workspace_rates, now)
            self._workspaces.put(workspace_id, workspace)
        mine, shared = member.by_kind[kind], workspace.by_kind[kind]
        for bucket in mine:
            if bucket.wait(now):
                return _refusal(kind, mine, shared, now)
        for bucket in shared:
            if bucket.wait(now):
                return _refusal(kind, mine, shared, now)
        for bucket in mine:
            bucket.tokens -= 1.0
        for bucket in shared:
            bucket.tokens -= 1.0
        return None


class AddressLimiter:
    """One bucket per client address, for requests made before there is a
    member to charge (invite lookups and redemptions): a guesser of codes or a
    script creating members gets a few tries a minute from one address.

    Behind a proxy every request comes from the proxy's address, so the
    bucket is then shared by everyone who reaches the node through it.
    """

    __slots__ = ("_buckets", "rate")

    def __init__(self, rate: Rate) -> None:
        if rate.per_s <= 0 or rate.burst < 1:
            raise ValueError("a bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self._buckets: Lru[str, TokenBucket] = Lru("limit_addresses", ADDRESSES_LIMITED)

    def admit(self, address: str, now: float) -> float:
        """Take a token for ``address``: 0.0 when taken, else seconds until its turn."""
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = TokenBucket(self.rate.per_s, self.rate.burst, now)
            self._buckets.put(address, bucket)
        wait = bucket.take(now)
        return bucket.turn(now, wait) if wait else 0.0


def _refusal(
    kind: Kind, mine: tuple[TokenBucket, ...], shared: tuple[TokenBucket, ...], now: float
) -> Refusal:
    """The empty bucket whose next unpromised token is furthest off: retrying
    then finds every bucket of the request ready, unless requests that were not
    refused took the tokens first. That token is promised."""
    refusal = Refusal("", "", 0.0)
    binding: TokenBucket | None = None
    for per, buckets in (("member", mine), ("workspace", shared)):
        for name, bucket in zip(_NAMES[kind], buckets, strict=True):
            wait = bucket.wait(now)
            if wait and (turn := bucket.next_turn(now, wait)) > refusal.wait:
                refusal = Refusal(name, per, turn)
                binding = bucket
    assert binding is not None
    binding.turn(now, binding.wait(now))
    return refusal


def retry_after_ms(wait: float) -> int:
    # Rounded up: retrying after the advertised time always finds a token.
    return max(1, math.ceil(wait * 1000))


_WHAT = {"send": "sends", "request": "requests", "read": "searches and history reads"}


def rate_limited(bucket: str, per: str, wait: float) -> OperationError:
    details: dict[str, Any] = {
        "retryAfterMs": retry_after_ms(wait),
        "bucket": bucket,
        "per": per,
    }
    message = f"too many {_WHAT[bucket]} for this {per}; retry later"
    return OperationError(ErrorCode.RATE_LIMITED, message, details=details)
