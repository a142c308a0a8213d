"""How a scope actor retries after losing the send fence to another writer.

Two nodes hosting one scope at once (a route moved, a client connected
straight to a node) both append to it. The conditional update of
``scopes.latest_seq`` lets one commit win each round; the loser reloads and
decides its sends again. The first retry is immediate: after a route moved,
one reload catches the cache up and nobody is racing any more.

When the other node keeps writing, optimism alone can starve the loser: the
winner's cache stays current, so it commits again while the loser reloads
(several statements) and decides, and the loser's next commit misses again,
for as long as the winner writes. So from the second loss in a row on, each
attempt holds the scope's lock (``ScopeStore.locked``) from its load to its
commit: the winner's next statement waits for it, then misses the fence
itself and reloads. The attempts are spaced by waits drawn with full jitter
from a range that doubles with each loss in a row, up to a cap, so that
attempts that still lose (the clock, a thread's parent) do not come in step.

Pure: the actor owns the clock, the sleeping and the lock; a send's deadline
(:data:`SEND_DEADLINE`) bounds how long it is retried.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Seconds from the moment a send reaches its scope actor (a row of a logical
# send: from its turn) until it is answered ``unavailable`` if its commits
# keep losing the fence. A node draining waits as long for its actors.
SEND_DEADLINE = 10.0


@dataclass(frozen=True, slots=True)
class FenceBackoff:
    """Full jitter: after ``n`` losses in a row the wait is uniform in
    ``[0, min(cap, base * 2**(n - 2))]``, and nothing after the first."""

    base: float = 0.002
    cap: float = 0.05
    # Losses in a row after which an attempt holds the scope's lock.
    lock_after: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError("FenceBackoff needs 0 < base <= cap")
        if self.lock_after < 1:
            raise ValueError("FenceBackoff.lock_after must be at least 1")

    def ceiling(self, losses: int) -> float:
        """The longest wait before the retry that follows ``losses`` losses in a row."""
        if losses <= 1:
            return 0.0
        return min(self.cap, self.base * 2.0 ** min(losses - 2, 64))

    def wait(self, losses: int, rng: random.Random) -> float:
        return rng.uniform(0.0, self.ceiling(losses))

    def locks(self, losses: int) -> bool:
        """Whether the attempt after ``losses`` losses in a row holds the lock."""
        return losses >= self.lock_after
