"""Reactions: ``react`` from a request to the scope actor (docs/design.md#reactions).

The handler checks the emoji's form (``actors.policy``) and finds the
message's scope (``not_found`` for an unknown message or another
workspace's); the scope's actor decides who may react and writes the
reaction in one statement. A message never changes scope, so where it lives
is remembered here: a burst of reactions on the same messages goes straight
to the actor.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import trio

from actors.model import Member
from actors.policy import reaction_emoji_error
from actors.scope_actor import ReactCommand
from node.ops.context import REPLIED, Context, Replied, member_of
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import React, Reply
from storage import reactions

HOMES_REMEMBERED = 50_000
_homes: OrderedDict[str, tuple[str, str]] = OrderedDict()


async def message_home(ctx: Context, message_id: str) -> tuple[str, str] | None:
    """(scope, workspace) of a message, remembered (a message never moves)."""
    home = _homes.get(message_id)
    if home is not None:
        _homes.move_to_end(message_id)
        return home
    async with ctx.services.pool.connection() as conn:
        home = await reactions.message_home(conn, message_id)
    if home is not None:
        _homes[message_id] = home
        if len(_homes) > HOMES_REMEMBERED:
            _homes.popitem(last=False)
    return home


Finished = Callable[[OperationError | None], None]


def submit_remembered(ctx: Context, request: React, finished: Finished) -> bool:
    """Queue ``request`` on its scope's running actor from the caller, without
    a task of its own, when the message's scope is remembered; the actor's
    callback pushes the reply and calls ``finished`` once (with the refusal,
    if any). False when the scope or its actor is not at hand: take
    :func:`react`. Raises a refusal found before queueing."""
    member = _checked(ctx, request)
    home = _homes.get(request.message_id)
    if home is None:
        return False
    actor = ctx.services.registry.actor_nowait(home[0])
    if actor is None:
        return False
    _in_workspace(home, member)
    _homes.move_to_end(request.message_id)
    actor.submit_nowait(_command(ctx, request, member, finished))
    return True


async def react(ctx: Context, request: React) -> Replied:
    member = _checked(ctx, request)
    home = await message_home(ctx, request.message_id)
    _in_workspace(home, member)
    assert home is not None
    done = trio.Event()
    refused: list[OperationError] = []

    def finished(error: OperationError | None) -> None:
        if error is not None:
            refused.append(error)
        done.set()

    await ctx.services.registry.submit(home[0], _command(ctx, request, member, finished))
    await done.wait()
    if refused:
        raise refused[0]
    return REPLIED


def _checked(ctx: Context, request: React) -> Member:
    member = member_of(ctx)
    error = reaction_emoji_error(request.emoji)
    if error is not None:
        raise OperationError(ErrorCode.VALIDATION_FAILED, error, path="$.emoji")
    return member


def _in_workspace(home: tuple[str, str] | None, member: Member) -> None:
    if home is None or home[1] != member.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId")


def _command(ctx: Context, request: React, member: Member, finished: Finished) -> ReactCommand:
    def reply(result: dict[str, object] | OperationError) -> None:
        if isinstance(result, OperationError):
            finished(result)
        else:
            # With the reactor's own event, if the actor publishes one (Hub.publish_reaction).
            ctx.services.hub.hold_reply(ctx.outbound)
            ctx.push(encode(Reply(id=request.id, op="react", result=result)))
            finished(None)

    return ReactCommand(member, request.message_id, request.emoji, request.op, reply)
