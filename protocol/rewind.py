"""Rewind frames (docs/rewind.md): mark a recovery point at a message, rewind a
conversation to one. The ``invalidate`` event they cause is
:class:`protocol.frames.InvalidateEvent` (``reason: "rewind"``).

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]

# The stored type of the one notice a rewind writes: it raises no unread and
# wakes no one (docs/rewind.md); clients show it as a system line.
REWIND_NOTICE = "rewind_notice"
# ``invalidate.reason`` of a rewind.
REWIND_REASON = "rewind"


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class MarkRecoveryPoint(_Frame, tag="markRecoveryPoint"):
    """Prepare a point a conversation can be rewound to: the message itself stays,
    everything after it is what a rewind sets aside."""

    id: RequestId
    message_id: Identifier


class Rewind(_Frame, tag="rewind"):
    """Rewind the conversation ``scopeId`` to a recovery point of it."""

    id: RequestId
    scope_id: Identifier
    recovery_point_id: Identifier


RESULTS: dict[str, str] = {
    "markRecoveryPoint": (
        "`{recoveryPointId, scopeId, seq}`: the point at that message (marking the same"
        " message again answers the same point). Any member who may read the message in"
        " a channel, DM or thread may mark it; another message is `not_found` at"
        " `$.messageId`, a task's or service's conversation `forbidden`"
        " (`details.reason: not_rewindable`). See [rewind.md](rewind.md)."
    ),
    "rewind": (
        "`{suppressed, noticeMessageId, fromSeq, throughSeq}`: every delivery and wake"
        " of the scope still pending after the point is suppressed (`suppressed` counts"
        " the outbox rows), later activity is set aside, and one notice"
        " (`messageType: rewind_notice`) is written that raises no unread and wakes no"
        ' one. Every session that reads the scope gets `invalidate {reason: "rewind",'
        " fromSeq}`; `history` then marks messages `fromSeq`..`throughSeq` with"
        " `rewound: true`. Allowed to the channel's owner (a thread: the parent"
        " channel's), and in a DM to a human member or to the owner of the private"
        " agent in it; others get `forbidden` with `details.reason`. Rewinding again"
        " with nothing new since answers the same notice. See [rewind.md](rewind.md)."
    ),
}
