"""``servicePost``: a manager posts as a service account (docs/services.md).

The message goes through the same path as a send (the service's scope actor,
Policy, Planner, Applier) with the service as its author and idempotency
subject; the manager is recorded as ``metadata.authorisedBy`` (with the
service's managers at the time, ``metadata.managers``, who are shown it). The webhook
endpoint (node/webhooks.py) posts through :func:`post_as_service` too.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.model import Member, MemberType
from actors.scope_state import SendCommand, SendReply
from actors.send_rules import check_send_fields
from node.ops.context import Context, member_of
from node.ops.messages import check_moderation
from node.services import Services
from node.views import AUTHORISED_BY, MANAGERS
from protocol.errors import ErrorCode, OperationError
from protocol.frames import SendResult
from protocol.services import ServicePost
from storage import services as storage_services


async def service_post(ctx: Context, request: ServicePost) -> SendResult:
    member = member_of(ctx)
    if member.type is not MemberType.HUMAN:
        # Agents and services never post as a service, whatever the list says.
        raise OperationError(ErrorCode.FORBIDDEN, "only a human manager posts as a service")
    async with ctx.services.pool.connection() as conn:
        service = await storage_services.service_by_handle(
            conn, member.workspace_id, request.service
        )
        if service is None:
            raise OperationError(ErrorCode.NOT_FOUND, "no such service", path="$.service")
        if not await storage_services.is_manager(conn, service.member.id, member.id):
            raise OperationError(ErrorCode.FORBIDDEN, "not a manager of this service")
        managers = await storage_services.managers(conn, service.member.id)
    target = request.target or f"scope:{service.scope_id}"
    # The moderation boundary a human's own send passes, with the service as
    # the durable author the audit row names.
    await check_moderation(ctx.services, member, target, request.content, author=service.member)
    _, result = await post_as_service(
        ctx.services,
        service.member,
        target=target,
        content=request.content,
        client_message_id=request.client_message_id,
        # Every manager (as they are now) is shown who posted it.
        metadata={AUTHORISED_BY: member.id, MANAGERS: sorted(managers)},
        explain=request.explain,
    )
    if result.explain is not None:
        explain = {**result.explain, "authorisedBy": member.id, "author": service.member.id}
        result = msgspec.structs.replace(result, explain=explain)
    return result


async def post_as_service(
    services: Services,
    service: Member,
    *,
    target: str,
    content: str,
    client_message_id: str,
    metadata: dict[str, Any],
    explain: bool = False,
) -> tuple[str, SendResult]:
    """Send ``content`` as ``service`` and wait for the actor's answer (a refusal
    raises); the scope it went to, and the answer."""
    check_send_fields(
        service, message_type="text", client_message_id=client_message_id, attachment_ids=()
    )
    return await post_as(
        services,
        service,
        target=target,
        content=content,
        client_message_id=client_message_id,
        metadata=metadata,
        explain=explain,
    )


async def post_as(
    services: Services,
    author: Member,
    *,
    target: str,
    content: str,
    client_message_id: str,
    metadata: dict[str, Any],
    message_type: str = "text",
    explain: bool = False,
) -> tuple[str, SendResult]:
    """A message the node writes for ``author`` (checked by the caller), through
    the scope's actor; the scope it went to, and the answer (a refusal raises)."""
    scope_id = services.resolver.cached(author, target)
    if scope_id is None:
        scope_id = await services.resolver.resolve(author, target)

    def command(reply: SendReply) -> SendCommand:
        return SendCommand(
            author=author,
            content=content,
            client_message_id=client_message_id,
            reply=reply,
            message_type=message_type,
            explain=explain,
            metadata=metadata,
        )

    result = await services.registry.send(scope_id, command)
    if result is None or isinstance(result, OperationError):
        raise result or OperationError(ErrorCode.UNAVAILABLE, "the scope did not answer")
    return scope_id, result
