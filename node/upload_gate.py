"""Who may start an upload on this node: uploads at once and bytes per second, per member.

One :class:`UploadGate` per node (``Services.uploads``). A member holds at most
``UploadSettings.per_member`` uploads in progress, and a byte bucket of
``burst`` bytes refilled at ``rate`` bytes per second. An upload is admitted
while the bucket holds what it declares (``Content-Length``; a chunked body
declares nothing); it is charged what it declares up front and, past that,
every byte as it arrives, which may take the bucket below zero: the member's
next upload then waits until the debt is paid back. A refusal says how long
to wait. The unclaimed-bytes quota lives in the database
(``storage.attachments``), since it must hold across nodes.

Plain methods on trio's clock, no I/O: nothing here awaits, so an admission
and its registration cannot interleave with another's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from node.config import UploadSettings

# A refusal for too many uploads at once cannot know when one ends; a second
# is about what one small upload takes.
CONCURRENCY_RETRY = 1.0
# Members remembered before the first prune of idle ones.
PRUNE_FLOOR = 1024


class Limit(enum.StrEnum):
    UPLOADS = "uploads"
    RATE = "rate"


@dataclass(frozen=True, slots=True)
class Refusal:
    limit: Limit
    wait: float  # seconds


@dataclass(slots=True)
class _Member:
    active: int
    tokens: float
    stamp: float


class UploadGate:
    """Per-member admission of uploads on this node (see the module docstring)."""

    def __init__(self) -> None:
        self._members: dict[str, _Member] = {}
        self._prune_at = PRUNE_FLOOR

    def __len__(self) -> int:
        return len(self._members)

    def active(self, member_id: str) -> int:
        found = self._members.get(member_id)
        return found.active if found else 0

    def admit(
        self, member_id: str, declared: int, limits: UploadSettings, now: float
    ) -> Refusal | None:
        """Register an upload of ``declared`` bytes (0: not known), or say why not."""
        member = self._members.get(member_id)
        if member is None:
            if len(self._members) >= self._prune_at:
                self._prune(limits, now)
            member = self._members[member_id] = _Member(0, float(limits.burst), now)
        self._refill(member, limits, now)
        if member.active >= limits.per_member:
            return Refusal(Limit.UPLOADS, CONCURRENCY_RETRY)
        # An upload larger than the bucket waits for a full one, not forever.
        needed = min(max(declared, 1), limits.burst)
        if member.tokens < needed:
            return Refusal(Limit.RATE, (needed - member.tokens) / limits.rate)
        member.active += 1
        member.tokens -= declared
        return None

    def charge(self, member_id: str, nbytes: int, limits: UploadSettings, now: float) -> None:
        """Bytes an admitted upload received beyond what it declared."""
        member = self._members[member_id]
        self._refill(member, limits, now)
        member.tokens -= nbytes

    def release(self, member_id: str, refund: int = 0) -> None:
        """An admitted upload is over (stored, refused or cut); ``refund``: bytes
        it paid for and never sent (refused before its body was read)."""
        member = self._members[member_id]
        member.active -= 1
        member.tokens += refund

    @staticmethod
    def _refill(member: _Member, limits: UploadSettings, now: float) -> None:
        member.tokens = min(float(limits.burst), member.tokens + (now - member.stamp) * limits.rate)
        member.stamp = now

    def _prune(self, limits: UploadSettings, now: float) -> None:
        # A member with nothing in progress and a full bucket is the same as
        # one never seen. Amortised: the next prune waits until the map doubles.
        for member_id, member in list(self._members.items()):
            self._refill(member, limits, now)
            if member.active == 0 and member.tokens >= limits.burst:
                del self._members[member_id]
        self._prune_at = max(PRUNE_FLOOR, 2 * len(self._members))
