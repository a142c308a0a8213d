"""What a request handler needs from the session that received the request.

Handlers take this Protocol, never the session class, so ``node.session``
imports the operations and nothing imports it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from actors.model import Member
from node.config import Settings
from node.services import Services
from protocol.errors import ErrorCode, OperationError


class Pushable(Protocol):
    def push(self, payload: bytes) -> None: ...


class Outgoing(Protocol):
    async def wait_for_room(self, size: int) -> None: ...

    def hold(self) -> None: ...

    def release(self) -> None: ...


class Context(Protocol):
    """The requesting session: who asks, the node's services, and its outbound path."""

    services: Services
    settings: Settings
    session_id: str

    @property
    def member(self) -> Member | None: ...

    @property
    def outbound(self) -> Outgoing: ...

    def push(self, payload: bytes) -> None: ...


class Replied:
    """What a handler returns when it has pushed its reply itself."""


# A handler whose answer is decided in an actor pushes it from there: the
# reply leaves at once, ahead of the events the same commit publishes,
# instead of after the handler's task is next scheduled.
REPLIED = Replied()


def member_of(ctx: Context) -> Member:
    member = ctx.member
    if member is None:
        raise OperationError(ErrorCode.UNAUTHORIZED, "hello first")
    return member


def push_to_others(ctx: Context, sessions: Iterable[Pushable], payload: bytes) -> None:
    """Push to every given session except the requesting one."""
    me: object = ctx
    for other in sessions:
        if other is not me:
            other.push(payload)
