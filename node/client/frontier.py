"""What an agent runtime has seen: the observed frontier, and deliveries. Pure, no I/O.

Per targetKey the daemon keeps two numbers. *Observed* is the highest target
seq the agent runtime has actually seen; it is the ``seenUpToSeq`` of every
fresh send, so it must only move at boundaries where the runtime really got
the messages: a delivery handed to the runtime, a history page, the agent's
own accepted send. Receiving a ``deliver`` frame or a ``message`` event, a
``held`` result or a search hit does not move it: the transport saw those,
the runtime did not. *Latest known* is a refresh hint: the node said newer
messages exist (``held``), so the runtime should read before it speaks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Delivery", "Frontier"]


def as_seq(value: Any) -> int | None:
    """``value`` as a target seq, or None when it is not one (bools are not seqs)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class Frontier:
    """Per-targetKey observed frontier and latest-known refresh hint.

    Pure bookkeeping, no I/O. Both values are high-water marks and start at 0.
    The frontier belongs to the agent runtime, not to one WebSocket session:
    hand the same instance to every :func:`open_daemon` for as long as the
    runtime's context lives.
    """

    __slots__ = ("_latest", "_observed")

    def __init__(self) -> None:
        self._observed: dict[str, int] = {}
        self._latest: dict[str, int] = {}

    def observed(self, target_key: str) -> int:
        """The highest target seq of ``target_key`` the runtime has seen (0: none)."""
        return self._observed.get(target_key, 0)

    def latest_known(self, target_key: str) -> int:
        """The newest target seq the daemon has heard of; never below :meth:`observed`."""
        return max(self._latest.get(target_key, 0), self.observed(target_key))

    def needs_refresh(self, target_key: str) -> bool:
        """The node reported messages in ``target_key`` that the runtime has not seen."""
        return self.latest_known(target_key) > self.observed(target_key)

    def advance(self, target_key: str, seq: int) -> None:
        """A runtime-visible boundary covered ``seq``: raise observed to it (never lowers)."""
        if seq > self._observed.get(target_key, 0):
            self._observed[target_key] = seq

    def hint(self, target_key: str, latest_seq: int) -> None:
        """The node reported ``latest_seq`` (``held``, ``partial_held``): remember it.

        A hint never advances observed: the runtime has not seen those messages.
        """
        if latest_seq > self._latest.get(target_key, 0):
            self._latest[target_key] = latest_seq

    def is_stale(self, target_key: str, target_seq: int) -> bool:
        """A delivery at ``target_seq`` is stale once the runtime has seen that far."""
        return target_seq <= self.observed(target_key)

    def __repr__(self) -> str:
        keys = sorted(self._observed.keys() | self._latest.keys())
        parts = (f"{k}: {self.observed(k)}/{self.latest_known(k)}" for k in keys)
        return f"Frontier({', '.join(parts)})"


@dataclass(frozen=True, slots=True, eq=False)
class Delivery:
    """One ``deliver`` event (``docs/protocol.md``, server events)."""

    delivery_id: str
    agent_id: str
    target_key: str
    target_seq: int
    reason: str
    message: dict[str, Any]
    # A task (un)assignment (``reason: task_assigned``): the task; ``message`` is its card.
    task_id: str | None = None
    # A workflow request (docs/workflows.md): answer with ``workflow_reply(request_id, …)``.
    plan_id: str | None = None
    request_id: str | None = None

    @property
    def message_id(self) -> str:
        return str(self.message.get("id", ""))

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> Delivery:
        """Parse a ``deliver`` event; raises ``ValueError`` if a field is missing or mistyped."""
        delivery_id = event.get("deliveryId")
        target_key = event.get("targetKey")
        target_seq = as_seq(event.get("targetSeq"))
        message = event.get("message")
        if (
            not isinstance(delivery_id, str)
            or not isinstance(target_key, str)
            or target_seq is None
            or not isinstance(message, dict)
        ):
            raise ValueError(f"malformed deliver event: {dict(event)!r}")
        return cls(
            delivery_id=delivery_id,
            agent_id=str(event.get("agentId", "")),
            target_key=target_key,
            target_seq=target_seq,
            reason=str(event.get("reason", "")),
            message=message,
            task_id=_text(event.get("taskId")),
            plan_id=_text(event.get("planId")),
            request_id=_text(event.get("requestId")),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
