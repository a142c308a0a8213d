"""``typing``, ``setPresence`` and ``presence`` (docs/presence.md).

Nothing here writes: a ``typing`` is checked against the scope actor's
cached roster (the scope's existence for the caller is the resolver's cached
answer), then pushed to the sessions of the members who could read a message
the caller sent now. A scope the caller cannot read is answered as one that
does not exist.
"""

from __future__ import annotations

import trio

from actors.visibility import readable, readers
from node.ops.context import Context, member_of
from node.resolver import SCOPE_ID, no_such_scope
from protocol.codec import encode
from protocol.presence import PresenceList, SetPresence, Typing, TypingEvent
from storage import access

# A relayed event names its audience; past this many bytes of member ids it
# would not fit a relay payload, and a typing hint is not worth a re-read
# there: such a scope's typing stays on this node.
RELAY_AUDIENCE_BYTES = 6_000


async def typing(ctx: Context, request: Typing) -> dict[str, bool]:
    member = member_of(ctx)
    services = ctx.services
    scope_id = request.scope_id
    await services.resolver.known(member, scope_id)
    actor = await services.registry.actor(scope_id)
    state = actor.state
    if state is None:
        raise no_such_scope(SCOPE_ID)
    roster = state.visibility
    created_at = actor.now()
    seq = state.latest_seq + 1
    if readable(roster, member, member.id, seq, created_at) is None:
        raise no_such_scope(SCOPE_ID)
    board = services.presence
    clock = trio.current_time()
    if board.typing_coalesced(member.id, scope_id, clock):
        return {"forwarded": False}
    if state.thread is not None:
        # A thread is read through its parent, whose roster this actor holds a
        # copy of that a leave on the parent may not have reached yet: the
        # database answers (once per forwarded typing, threads only).
        async with services.pool.connection() as conn:
            if await access.viewer_for(conn, state.scope, member) is None:
                raise no_such_scope(SCOPE_ID)
    board.typing_forwarded(member.id, scope_id, clock)
    payload = encode(TypingEvent(scope_id=scope_id, member_id=member.id))
    hub = services.hub
    others = {*roster.memberships, *roster.parent_readers}
    others.discard(member.id)
    here = [other for other in others if hub.sessions_of(other)]
    for reader in readers(roster, here, member.id, seq, created_at):
        for session in hub.sessions_of(reader):
            # A daemon gets messages as wakes; typing is for people watching.
            if not session.is_daemon and not session.is_muted(scope_id):
                session.push(payload)
    relay = hub.relay
    if relay is not None and not getattr(relay, "alone", False):
        audience = readers(roster, others, member.id, seq, created_at)
        if sum(len(reader) + 3 for reader in audience) <= RELAY_AUDIENCE_BYTES:
            hub.relay_event(scope_id, payload, audience=audience, daemons=False)
    return {"forwarded": True}


def set_presence(ctx: Context, request: SetPresence) -> dict[str, str]:
    member = member_of(ctx)
    board = ctx.services.presence
    board.report(ctx, request.state == "idle", trio.current_time())
    return {"state": board.state_of(member.id)}


def presence(ctx: Context, request: PresenceList) -> dict[str, list[dict[str, str]]]:
    board = ctx.services.presence
    return {"members": board.follow(ctx, member_of(ctx), request.member_ids)}
