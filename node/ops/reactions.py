"""Reactions: ``react`` from a request to the scope actor (docs/design.md#reactions).

The handler checks the emoji's form (``actors.policy``) and finds the
message's scope (``not_found`` for an unknown message, another
workspace's, or one of a private scope the caller never belonged to); the scope's actor decides who may react and writes the
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
from actors.scope_reactions import ReactCommand
from node.ops.context import REPLIED, Context, Replied, member_of
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import React, Reply
from storage import access

HOMES_REMEMBERED = 50_000
_homes: OrderedDict[str, str] = OrderedDict()  # message id → its scope id


async def known_home(ctx: Context, member: Member, message_id: str) -> str:
    """The scope of a message, if that scope exists for the member.

    ``not_found`` for a missing message, one of another workspace and one of a
    private scope the member never belonged to alike (one statement each:
    docs/authorization.md). Where a message lives is remembered (it never
    moves), and so is which scopes a member knows (the resolver).
    """
    resolver = ctx.services.resolver
    home = _homes.get(message_id)
    if home is not None and resolver.knows_nowait(member, home):
        _homes.move_to_end(message_id)
        return home
    async with ctx.services.pool.connection() as conn:
        found = await access.known_message_scope(conn, message_id, member)
    if found is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId")
    resolver.remember(member, found)
    _homes[message_id] = found.info.id
    _homes.move_to_end(message_id)
    if len(_homes) > HOMES_REMEMBERED:
        _homes.popitem(last=False)
    return found.info.id


Finished = Callable[[OperationError | None], None]


def submit_remembered(ctx: Context, request: React, finished: Finished) -> bool:
    """Queue ``request`` on its scope's running actor from the caller, without
    a task of its own, when the message's scope is remembered; the actor's
    callback pushes the reply and calls ``finished`` once (with the refusal,
    if any). False when the scope or its actor is not at hand: take
    :func:`react`. Raises a refusal found before queueing."""
    member = _checked(ctx, request)
    home = _homes.get(request.message_id)
    if home is None or not ctx.services.resolver.knows_nowait(member, home):
        return False
    actor = ctx.services.registry.actor_nowait(home)
    if actor is None:
        return False
    _homes.move_to_end(request.message_id)
    actor.submit_nowait(_command(ctx, request, member, finished))
    return True


async def react(ctx: Context, request: React) -> Replied:
    member = _checked(ctx, request)
    home = await known_home(ctx, member, request.message_id)
    done = trio.Event()
    refused: list[OperationError] = []

    def finished(error: OperationError | None) -> None:
        if error is not None:
            refused.append(error)
        done.set()

    await ctx.services.registry.submit(home, _command(ctx, request, member, finished))
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
