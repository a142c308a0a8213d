"""What a send cites: quotes, forwards and explicit context (docs/design.md#sources).

A send's ``forward`` names its sources: ``{mode: quote|single|multi|
explicit_context, sources: [{messageId}]}``. Each becomes one
``scope_message_sources`` row written by the Applier in the send's own
statement. An explicit-context send also writes one ``recipient_context`` row
per (private agent recipient, source): the durable row that makes exactly that
message readable to that agent (the readable predicate and its twin). Sources
never decide delivery; the mention mode still comes from ``forward.mode``
alone (``actors/mentions.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.model import Member

# forward.mode → the stored source_kind.
STORED_KIND = {
    "quote": "quote",
    "single": "single_forward",
    "multi": "multi_forward",
    "explicit_context": "explicit_context",
}
RECIPIENT_CONTEXT = "recipient_context"
# The stored source_kind → the ``kind`` a message view shows.
VIEW_KIND = {
    "quote": "quote",
    "single_forward": "forward",
    "multi_forward": "forward",
    "explicit_context": "context",
}
# How many sources each mode takes (quote and single: exactly one).
SOURCE_COUNTS = {
    "quote": (1, 1),
    "single": (1, 1),
    "multi": (1, 100),
    "explicit_context": (1, 100),
}


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One row to write: the cited message, its stored kind, and for a
    ``recipient_context`` row the private agent it opens the message to."""

    message_id: str
    kind: str
    context_member_id: str | None = None

    def row(self, ordinal: int) -> dict[str, Any]:
        return {
            "ordinal": ordinal,
            "message_id": self.message_id,
            "kind": self.kind,
            "member_id": self.context_member_id,
            "dedupe_key": f"{self.kind}:{self.context_member_id or ''}:{self.message_id}",
        }


def source_specs(forward: Any, recipient_members: Sequence[Member]) -> tuple[SourceSpec, ...]:
    """The rows of a send with this ``forward`` (a ``ForwardIn`` or None).

    A message cited twice is written once.
    """
    if forward is None or not forward.sources:
        return ()
    kind = STORED_KIND[forward.mode]
    ids = list(dict.fromkeys(source.message_id for source in forward.sources))
    specs = [SourceSpec(message_id, kind) for message_id in ids]
    if forward.mode == "explicit_context":
        private = dict.fromkeys(m.id for m in recipient_members if m.is_private_agent)
        specs += [
            SourceSpec(message_id, RECIPIENT_CONTEXT, member_id)
            for member_id in private
            for message_id in ids
        ]
    return tuple(specs)


def source_rows(specs: Sequence[SourceSpec]) -> list[dict[str, Any]]:
    return [spec.row(ordinal) for ordinal, spec in enumerate(specs)]
