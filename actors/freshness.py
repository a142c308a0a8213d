"""The freshness gate (docs/design.md#freshness) as a pure decision.

The gate runs on the actor's view of ``latest_seq``; the database fence
(the conditional update of ``scopes.latest_seq``) is what makes it true.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from protocol.errors import ErrorCode, OperationError


class Verdict(enum.Enum):
    APPEND = "append"
    HELD = "held"


@dataclass(frozen=True, slots=True)
class GateDecision:
    verdict: Verdict
    latest_seq: int


def check(*, scope_id: str, target_key: str, seen_up_to_seq: int, latest_seq: int) -> GateDecision:
    """Raw CAS path: append iff the sender saw the latest seq, else held.

    Raises ``target_key_mismatch`` / ``invalid_frontier`` for requests that can
    never succeed. The private-gap refinement is applied by the caller.
    """
    if target_key != scope_id:
        raise OperationError(
            ErrorCode.TARGET_KEY_MISMATCH,
            "freshness.targetKey does not name the target scope",
            path="$.freshness.targetKey",
            details={"targetKey": scope_id},
        )
    if seen_up_to_seq > latest_seq:
        raise OperationError(
            ErrorCode.INVALID_FRONTIER,
            "freshness.seenUpToSeq is ahead of the scope",
            path="$.freshness.seenUpToSeq",
            details={"latestSeq": latest_seq},
        )
    if seen_up_to_seq == latest_seq:
        return GateDecision(Verdict.APPEND, latest_seq)
    return GateDecision(Verdict.HELD, latest_seq)
