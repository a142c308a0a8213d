"""Messages: the send path from a request to the scope actor.

A send is not awaited: the session hands the command to the scope's actor in
the order read, and the actor answers through ``reply`` after commit.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.mentions import mode_for_forward
from actors.model import Member
from actors.scope_state import SendCommand
from node.services import Services
from protocol.errors import OperationError
from protocol.frames import CAPABILITY_FRESHNESS, Send, SendResult

SendReply = Callable[[SendResult | OperationError], None]


def send_command(
    member: Member, request: Send, capabilities: frozenset[str], reply: SendReply
) -> SendCommand:
    return SendCommand(
        author=member,
        content=request.content,
        client_message_id=request.client_message_id,
        reply=reply,
        message_type=request.message_type,
        attachment_ids=tuple(request.attachment_ids),
        recipients=tuple(request.recipients),
        mention_mode=mode_for_forward(request.forward.mode if request.forward else None),
        forward=request.forward,
        freshness=request.freshness,
        freshness_declared=CAPABILITY_FRESHNESS in capabilities,
        explain=request.explain,
    )


async def submit_send(
    services: Services,
    member: Member,
    request: Send,
    capabilities: frozenset[str],
    reply: SendReply,
) -> None:
    """Resolve the target (cached) and queue the send on its scope actor."""
    scope_id = services.resolver.cached(member, request.target)
    if scope_id is None:
        scope_id = await services.resolver.resolve(member, request.target)
    await services.registry.submit(scope_id, send_command(member, request, capabilities, reply))
