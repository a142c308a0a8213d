"""Per-session rate limits: token buckets, and the settings that raise them.

A session owns two buckets (sends; every other request except ping/pong). A
request that finds its bucket empty is answered ``rate_limited`` with
``details.retryAfterMs`` and not executed; the session stays open. The
defaults (``node.config.Settings``) are far above what a person typing or a
well-behaved agent does; load tests raise them with :data:`RAISED_LIMITS_ENV`.
"""

from __future__ import annotations

import math
import os
from typing import Any

from protocol.errors import ErrorCode, OperationError

SEND_RATE_ENV = "SCOPENODE_SEND_RATE"
SEND_BURST_ENV = "SCOPENODE_SEND_BURST"
REQUEST_RATE_ENV = "SCOPENODE_REQUEST_RATE"
REQUEST_BURST_ENV = "SCOPENODE_REQUEST_BURST"
MAX_SESSIONS_ENV = "SCOPENODE_MAX_SESSIONS_PER_MEMBER"

# What the bench and the test suite run with: high enough that no workload
# meets a limit, while the limit code stays on the measured path.
RAISED_LIMITS_ENV: dict[str, str] = {
    SEND_RATE_ENV: "1000000",
    SEND_BURST_ENV: "1000000",
    REQUEST_RATE_ENV: "1000000",
    REQUEST_BURST_ENV: "1000000",
    MAX_SESSIONS_ENV: "1000000",
}


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second of ``now`` (trio's clock).

    O(1) and allocation-free apart from the float results: no timers, no
    queues; the refill is computed from the time since the last take.
    """

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> float:
        """Take one token: 0.0 when taken, else seconds until one is available."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        self.stamp = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return 0.0
        self.tokens = tokens
        return (1.0 - tokens) / self.rate


def retry_after_ms(wait: float) -> int:
    # Rounded up: retrying after the advertised time always finds a token.
    return max(1, math.ceil(wait * 1000))


def rate_limited(what: str, wait: float) -> OperationError:
    details: dict[str, Any] = {"retryAfterMs": retry_after_ms(wait)}
    return OperationError(ErrorCode.RATE_LIMITED, f"too many {what}; retry later", details=details)
