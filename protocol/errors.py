"""Error and close codes of protocol v1, and the one exception type that carries them.

Every layer raises :class:`OperationError` (or a subclass) with a stable
:class:`ErrorCode`; the session turns it into an ``error`` frame. Codes are the
wire contract (``docs/protocol.md``) and never change meaning.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.StrEnum):
    BAD_FRAME = "bad_frame"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    GONE = "gone"
    INVALID_TARGET = "invalid_target"
    VALIDATION_FAILED = "validation_failed"
    TARGET_KEY_MISMATCH = "target_key_mismatch"
    INVALID_FRONTIER = "invalid_frontier"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    CONFLICT = "conflict"
    MODERATION_BLOCKED = "moderation_blocked"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    SEARCH_UNAVAILABLE = "search_unavailable"
    INTERNAL = "internal"

    @property
    def retryable(self) -> bool:
        return self in _RETRYABLE


# A search index being built becomes ready by itself: the same request succeeds later.
_RETRYABLE = frozenset(
    {
        ErrorCode.OVERLOADED,
        ErrorCode.UNAVAILABLE,
        ErrorCode.RATE_LIMITED,
        ErrorCode.SEARCH_UNAVAILABLE,
    }
)


class CloseCode(enum.IntEnum):
    NORMAL = 1000
    INTERNAL_ERROR = 1011
    UNAUTHENTICATED = 4401
    FORBIDDEN_WORKSPACE = 4403
    HEARTBEAT_TIMEOUT = 4408
    SLOW_CONSUMER = 4429
    DRAINING = 4503


class OperationError(Exception):
    """A failed operation, reported to the client as an ``error`` frame.

    ``path`` names the offending field (``$.freshness.seenUpToSeq``) when the
    client sent it; ``details`` is free-form structured context.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        path: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path
        self.details = dict(details or {})
        if path is not None:
            self.details.setdefault("path", path)

    @property
    def retryable(self) -> bool:
        return self.code.retryable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value!r}, {self.message!r})"


class FrameError(OperationError):
    """An inbound frame that could not be decoded or validated.

    ``request_id`` is the client's ``id`` when it could be recovered, so the
    error can be correlated; it is ``None`` for frames that are not JSON or
    carry no known ``type``.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        request_id: int | str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(code, message, path=path)
        self.request_id = request_id
