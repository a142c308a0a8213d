"""Workflow plans (docs/workflows.md): the plan ops, the request/reply adapter, ``workflowUpdated``.

A plan's transcript is a scope of type ``workflow`` that no generic path reads
or writes (``storage.access`` knows it to no one). These handlers are its only
door: the plan's authoring gate (creator and the humans it is shared with)
decides who reads it; a human's request and the agent's replies are appended
by the scope actor like every message, with the request's exact routing (the
plan's agent as the one recipient) and the trusted ``metadata.source`` set
here. Who may answer, and how often finally, is decided under the plan's row
lock in :mod:`storage.workflows` before the message is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.model import Member, MemberType
from actors.policy import knows_member
from actors.scope_state import SendCommand
from node.ops.context import Context, member_of
from node.ops.messages import SendReply, check_moderation
from node.views import stored_message_view
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import to_builtins
from protocol.workflows import (
    REPLY_TYPE,
    REQUEST_SOURCE,
    REQUEST_TYPE,
    RUN_SOURCE,
    CreateWorkflowPlan,
    ShareWorkflowPlan,
    UpdateWorkflowPlan,
    WorkflowPlanEntry,
    WorkflowReply,
    WorkflowRequest,
    WorkflowTranscript,
    WorkflowUpdatedEvent,
)
from storage import directory, messages
from storage import workflows as store
from storage.visibility import Viewer
from storage.workflows import Plan, Request

PLAN_ID = "$.planId"
REQUEST_ID = "$.requestId"
# A send that is queued behind others in its scope's actor: long enough for a
# busy actor, bounded so that a request never hangs.
SEND_WAIT_S = 10.0
# The send may still commit after this answer: retry with the same clientMessageId.
NO_ANSWER = "no_answer"


def _no_plan() -> OperationError:
    return OperationError(ErrorCode.NOT_FOUND, "no such workflow plan", path=PLAN_ID)


def _forbidden(reason: str, message: str) -> OperationError:
    return OperationError(ErrorCode.FORBIDDEN, message, details={"reason": reason})


def _conflict(reason: str, message: str) -> OperationError:
    return OperationError(ErrorCode.CONFLICT, message, details={"reason": reason})


def _entry(plan: Plan) -> WorkflowPlanEntry:
    return WorkflowPlanEntry(
        plan_id=plan.id,
        scope_id=plan.scope_id,
        title=plan.title,
        status=plan.status,  # type: ignore[arg-type]
        creator_id=plan.creator_id,
        agent_id=plan.agent_id,
        shared_with=list(plan.shared_with),
        draft=plan.draft,
        revision=plan.revision,
        latest_seq=plan.latest_seq,
        active_request_id=plan.active_request_id,
    )


async def _plan_for(ctx: Context, member: Member, plan_id: str) -> Plan:
    """The plan, if it passes its authoring gate for ``member``: its agent gets
    ``forbidden`` (it knows the plan, it may not read it), anyone else ``not_found``."""
    async with ctx.services.pool.connection() as conn:
        plan = await store.get_plan(conn, plan_id)
    if plan is None or plan.workspace_id != member.workspace_id:
        raise _no_plan()
    if plan.reads(member.id):
        return plan
    if member.id == plan.agent_id:
        raise _forbidden("workflow_agent", "the plan's agent answers through workflowReply")
    raise _no_plan()


async def _agent(ctx: Context, caller: Member, agent_id: str) -> Member:
    async with ctx.services.pool.connection() as conn:
        found = (await directory.get_members(conn, [agent_id])).get(agent_id)
    if (
        found is None
        or found.workspace_id != caller.workspace_id
        or found.type is not MemberType.AGENT
        or not knows_member(caller, found)
    ):
        raise OperationError(ErrorCode.NOT_FOUND, "no such agent", path="$.agentId")
    return found


async def create_plan(ctx: Context, request: CreateWorkflowPlan) -> dict[str, Any]:
    member = member_of(ctx)
    if member.type is not MemberType.HUMAN:
        raise _forbidden("humans_only", "only a human creates a workflow plan")
    agent = await _agent(ctx, member, request.agent_id)
    async with ctx.services.pool.connection() as conn:
        plan = await store.create_plan(conn, creator=member, agent=agent, title=request.title)
    _publish(ctx, plan, "created")
    return {"planId": plan.id, "scopeId": plan.scope_id}


async def share_plan(ctx: Context, request: ShareWorkflowPlan) -> dict[str, Any]:
    member = member_of(ctx)
    plan = await _plan_for(ctx, member, request.plan_id)
    if member.id != plan.creator_id:
        raise _forbidden("creator_only", "only the plan's creator shares it")
    async with ctx.services.pool.connection() as conn:
        found = (await directory.get_members(conn, [request.member_id])).get(request.member_id)
        if (
            found is None
            or found.workspace_id != member.workspace_id
            or found.type is not MemberType.HUMAN
        ):
            raise OperationError(ErrorCode.NOT_FOUND, "no such human", path="$.memberId")
        shared = await store.share_plan(conn, plan, found)
    _publish(ctx, shared, "shared")
    return {"plan": to_builtins(_entry(shared))}


async def update_plan(ctx: Context, request: UpdateWorkflowPlan) -> dict[str, Any]:
    member = member_of(ctx)
    plan = await _plan_for(ctx, member, request.plan_id)
    if member.id != plan.creator_id:
        raise _forbidden("creator_only", "only the plan's creator changes it")
    async with ctx.services.pool.connection() as conn:
        updated = await store.update_plan(conn, plan.id, status=request.status, title=request.title)
    if updated is None:
        raise _no_plan()
    _publish(ctx, updated, "updated")
    return {"plan": to_builtins(_entry(updated))}


async def list_plans(ctx: Context) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        plans = await store.list_plans(conn, member)
    return {"plans": to_builtins([_entry(p) for p in plans])}


async def transcript(ctx: Context, request: WorkflowTranscript) -> dict[str, Any]:
    member = member_of(ctx)
    plan = await _plan_for(ctx, member, request.plan_id)
    # The product gate passed: the caller reads the transcript as a public reader
    # of the plan's scope (rows still go through the readable predicate).
    viewer = Viewer(member, True, (plan.scope_id,))
    async with ctx.services.pool.connection() as conn:
        page = await messages.page(
            conn, plan.scope_id, viewer, before=request.before_seq, limit=request.limit
        )
    shown = [to_builtins(stored_message_view(r.message, member.id)) for r in page.messages]
    return {
        "planId": plan.id,
        "scopeId": plan.scope_id,
        "messages": shown,
        "latestSeq": plan.latest_seq,
        "hasMore": page.has_more,
    }


async def _append(
    ctx: Context, scope_id: str, command: Callable[[SendReply], SendCommand]
) -> tuple[str, int]:
    """One message through the scope's actor (its roster, idempotency, seq and
    outbox): ``command`` builds it around the reply callback; a refusal is the
    caller's answer."""
    result = await ctx.services.registry.send(scope_id, command, SEND_WAIT_S)
    if result is None:
        raise OperationError(
            ErrorCode.UNAVAILABLE,
            "the transcript did not answer in time",
            details={"reason": NO_ANSWER},
        )
    if isinstance(result, OperationError):
        raise result
    if result.message_id is None or result.accepted_seq is None:
        raise OperationError(ErrorCode.UNAVAILABLE, "the message was not written")
    return result.message_id, result.accepted_seq


async def request(ctx: Context, frame: WorkflowRequest) -> dict[str, Any]:
    member = member_of(ctx)
    plan = await _plan_for(ctx, member, frame.plan_id)
    await check_moderation(ctx.services, member, f"scope:{plan.scope_id}", frame.content)
    async with ctx.services.pool.connection() as conn:
        agent = (await directory.get_members(conn, [plan.agent_id]))[plan.agent_id]
        found = await store.open_request(conn, plan.id, member.id, frame.client_message_id)
    if found is None:
        raise _conflict("archived", "an archived plan takes no request: restore it first")
    opened, new = found
    source = {"kind": REQUEST_SOURCE, "planId": plan.id, "requestId": opened.id}
    try:
        message_id, seq = await _append(
            ctx,
            plan.scope_id,
            lambda answer: SendCommand(
                author=member,
                content=frame.content,
                client_message_id=frame.client_message_id,
                reply=answer,
                message_type=REQUEST_TYPE,
                recipients=(agent.id,),
                recipient_members=(agent,),
                metadata={"source": source},
            ),
        )
    except OperationError as refused:
        if new and refused.details.get("reason") != NO_ANSWER:
            async with ctx.services.pool.connection() as conn:
                await store.request_failed(conn, opened.id)
        raise
    async with ctx.services.pool.connection() as conn:
        await store.request_written(conn, opened.id, message_id, seq)
    if new:
        _publish(ctx, plan, "request", opened.id)
    return {"requestId": opened.id, "messageId": message_id, "seq": seq}


async def _request_for_agent(ctx: Context, member: Member, request_id: str) -> tuple[Request, Plan]:
    async with ctx.services.pool.connection() as conn:
        found = await store.get_request(conn, request_id)
        plan = await store.get_plan(conn, found.plan_id) if found is not None else None
    if found is None or plan is None or plan.agent_id != member.id:
        # A request exists only for the agent that answers it.
        raise OperationError(ErrorCode.NOT_FOUND, "no such workflow request", path=REQUEST_ID)
    return found, plan


_REFUSED = {
    "superseded": "a later request superseded this one: its wake is no longer current",
    "answered": "this request already has its final reply",
    "claimed": "another final reply to this request came first",
}


async def reply(ctx: Context, frame: WorkflowReply) -> dict[str, Any]:
    member = member_of(ctx)
    found, plan = await _request_for_agent(ctx, member, frame.request_id)
    async with ctx.services.pool.connection() as conn:
        check = await store.begin_reply(
            conn, found, final=frame.final, client_message_id=frame.client_message_id
        )
    if check.outcome in _REFUSED:
        raise _conflict(check.outcome, _REFUSED[check.outcome])
    source = {"kind": RUN_SOURCE, "planId": plan.id, "requestId": found.id, "final": frame.final}
    claimed = frame.final and check.outcome == "ok"
    try:
        message_id, seq = await _append(
            ctx,
            plan.scope_id,
            lambda answer: SendCommand(
                author=member,
                content=frame.content,
                client_message_id=frame.client_message_id,
                reply=answer,
                message_type=REPLY_TYPE,
                metadata={"source": source},
            ),
        )
    except OperationError as refused:
        # A refused final reply frees its claim; one that may still commit keeps it
        # (its own retry, same clientMessageId, is the only one that can finish it).
        if claimed and refused.details.get("reason") != NO_ANSWER:
            async with ctx.services.pool.connection() as conn:
                await store.release_final(conn, found.id, frame.client_message_id)
        raise
    updated = plan
    if frame.final:
        async with ctx.services.pool.connection() as conn:
            after = await store.finish_final(conn, found, message_id, frame.content)
        updated = after or plan
    _publish(ctx, updated, "final" if frame.final else "reply", found.id)
    return {
        "requestId": found.id,
        "messageId": message_id,
        "seq": seq,
        "final": frame.final,
    }


def _publish(ctx: Context, plan: Plan, change: str, request_id: str | None = None) -> None:
    """``workflowUpdated`` to the sessions of the plan's readers (not its agent:
    it learns of requests by its wake)."""
    event = WorkflowUpdatedEvent(
        plan_id=plan.id,
        status=plan.status,  # type: ignore[arg-type]
        revision=plan.revision,
        scope_id=plan.scope_id,
        title=plan.title,
        change=change,
        request_id=request_id,
    )
    payload = encode(event)
    hub = ctx.services.hub
    for member_id in plan.audience:
        for session in hub.sessions_of(member_id):
            session.push(payload)
    hub.relay_event(plan.scope_id, payload, audience=plan.audience, daemons=False)
