"""Agent deliveries: acknowledgement and redelivery after reconnect."""

from __future__ import annotations

from typing import Any

import trio

from node.hub import delivery_id, wake_dedupe_key
from node.ops.context import Context, member_of
from node.views import stored_message_view, task_wake
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import Ack, Deliver
from protocol.workflows import wake_names
from storage import outbox, tasks


async def ack(ctx: Context, request: Ack) -> dict[str, Any]:
    member = member_of(ctx)
    message_part, _, agent_part = request.delivery_id.removeprefix("dlv_").partition(".")
    if not agent_part or f"mem_{agent_part}" != member.id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such delivery", path="$.deliveryId")
    # A task assignment's wake is named by its activity (``act_…``), a message's by the message.
    ref = message_part if message_part.startswith("act_") else f"msg_{message_part}"
    async with ctx.services.pool.connection() as conn:
        found = await outbox.ack_wake(conn, wake_dedupe_key(ref, member.id), member.id)
    if not found:
        raise OperationError(ErrorCode.NOT_FOUND, "no such delivery", path="$.deliveryId")
    return {}


async def redeliver(ctx: Context) -> set[str]:
    """Push an agent daemon every unacknowledged delivery, oldest first;
    returns their delivery ids."""
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        pending = await outbox.pending_wakes(conn, member.id, ctx.settings.redeliver_limit)
        allowed = []
        for wake in pending:
            reason = await outbox.wake_suppression(conn, wake.message.id, member.id)
            if reason is None:
                allowed.append(wake)
            else:
                await outbox.suppress(conn, wake.outbox_id, reason)
    pushed: set[str] = set()
    for wake in allowed:
        wake_id = delivery_id(wake.message.id, member.id)
        view = stored_message_view(wake.message, member.id)
        plan_id, request_id = wake_names(view.metadata)
        frame = Deliver(
            delivery_id=wake_id,
            agent_id=member.id,
            target_key=wake.message.scope_id,
            target_seq=wake.target_seq,
            reason=wake.reason,
            message=view,
            plan_id=plan_id,
            request_id=request_id,
        )
        payload = encode(frame)
        # Paced like resume: a reading daemon on a slow link is not a slow consumer.
        with trio.move_on_after(ctx.settings.slow_consumer_grace):
            await ctx.outbound.wait_for_room(len(payload))
        ctx.push(payload)
        pushed.add(wake_id)
    for wake_id, payload in await _assignment_wakes(ctx, member.id):
        with trio.move_on_after(ctx.settings.slow_consumer_grace):
            await ctx.outbound.wait_for_room(len(payload))
        ctx.push(payload)
        pushed.add(wake_id)
    return pushed


async def _assignment_wakes(ctx: Context, agent_id: str) -> list[tuple[str, bytes]]:
    """Task assignment wakes still pending (docs/tasks.md), each re-checked: an
    agent unassigned since gets none."""
    out: list[tuple[str, bytes]] = []
    async with ctx.services.pool.connection() as conn:
        pending = await tasks.pending_assignments(
            conn, agent_id, outbox.NOT_ACKNOWLEDGED, ctx.settings.redeliver_limit
        )
        for task_id, activity_id, reason in pending:
            if not await tasks.still_assigned(conn, task_id, agent_id):
                continue
            found = await tasks.assignment(conn, task_id, activity_id)
            if found is not None:
                wake_id, event = task_wake(activity_id, agent_id, found, reason)
                out.append((wake_id, encode(event)))
    return out
