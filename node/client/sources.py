"""Building a send's ``forward`` (docs/design.md#sources).

``await client.send("#ops", "see above", clientMessageId=c, forward=quote(mid))``;
``forward_of(a, b)`` forwards one message (``single``) or several (``multi``);
``context(a, b)`` with ``recipients=[agent]`` opens the messages to a private agent.
"""

from __future__ import annotations

from typing import Any


def _cite(mode: str, message_ids: tuple[str, ...]) -> dict[str, Any]:
    if not message_ids:
        raise ValueError("cite at least one message")
    return {"mode": mode, "sources": [{"messageId": m} for m in message_ids]}


def quote(message_id: str) -> dict[str, Any]:
    """A reply citing one message; mentions in the reply stay live."""
    return _cite("quote", (message_id,))


def forward_of(*message_ids: str) -> dict[str, Any]:
    """Forward one message (``single``) or several (``multi``, mentions inert)."""
    return _cite("single" if len(message_ids) == 1 else "multi", message_ids)


def context(*message_ids: str) -> dict[str, Any]:
    """Explicit context for the send's ``recipients`` (mentions inert)."""
    return _cite("explicit_context", message_ids)
