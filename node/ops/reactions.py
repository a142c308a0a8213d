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

import trio

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


async def react(ctx: Context, request: React) -> Replied:
    member = member_of(ctx)
    error = reaction_emoji_error(request.emoji)
    if error is not None:
        raise OperationError(ErrorCode.VALIDATION_FAILED, error, path="$.emoji")
    home = await message_home(ctx, request.message_id)
    if home is None or home[1] != member.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId")
    done = trio.Event()
    refused: list[OperationError] = []

    def reply(result: dict[str, object] | OperationError) -> None:
        if isinstance(result, OperationError):
            refused.append(result)
        else:
            ctx.push(encode(Reply(id=request.id, op="react", result=result)))
        done.set()

    cmd = ReactCommand(member, request.message_id, request.emoji, request.op, reply)
    await ctx.services.registry.submit(home[0], cmd)
    await done.wait()
    if refused:
        raise refused[0]
    return REPLIED
