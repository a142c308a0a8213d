"""Presence and typing frames (docs/presence.md): ephemeral, never stored.

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
PresenceState = Literal["online", "away", "offline"]


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class Typing(_Frame, tag="typing"):
    """The caller is typing in ``scopeId``; send again every 2–3 s while it lasts."""

    id: RequestId
    scope_id: Identifier


class SetPresence(_Frame, tag="setPresence"):
    """This session is ``idle`` (the person stepped away) or ``active`` again."""

    id: RequestId
    state: Literal["active", "idle"]


class PresenceList(_Frame, tag="presence"):
    """The presence of ``memberIds`` (or, without them, of everyone the caller
    may see who is not offline), and from now on their ``presence`` events:
    each call replaces the session's previous choice."""

    id: RequestId
    member_ids: Annotated[list[Identifier], Meta(max_length=500)] | None = None


class TypingEvent(_Frame, tag="typing"):
    scope_id: str
    member_id: str


class PresenceEvent(_Frame, tag="presence"):
    member_id: str
    state: PresenceState
