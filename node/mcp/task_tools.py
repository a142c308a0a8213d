"""The task tools (docs/tasks.md): create a task, change it, list the agent's own."""

from __future__ import annotations

from typing import Any

from node.client import ClientError
from node.mcp.agent import Agent, ToolFailure
from node.mcp.names import UnknownConversation
from node.mcp.tools import Answer, node_call, optional, required

STATUSES = ["open", "in_progress", "blocked", "done", "cancelled"]


async def _assignees(agent: Agent, args: dict[str, Any]) -> list[str] | None:
    named = args.get("assignees")
    if named is None:
        return None
    if not isinstance(named, list) or not all(isinstance(n, str) and n for n in named):
        raise ToolFailure(
            "validation_failed", "assignees must be a list of '@handle's", {"path": "$.assignees"}
        )
    try:
        return [await agent.directory.member_id(n) for n in named]
    except UnknownConversation as exc:
        raise ToolFailure("not_found", str(exc), {"path": "$.assignees"}) from None


def _task_line(task: dict[str, Any]) -> str:
    return f"{task.get('taskId')} [{task.get('status')}] {task.get('title')} · conversation id {task.get('scopeId')}"


async def create_task(agent: Agent, args: dict[str, Any]) -> Answer:
    title = required(args, "title")
    channel = optional(args, "channel")
    channel_id = None
    if channel:
        try:
            channel_id = (await agent.directory.resolve(channel)).scope_id
        except UnknownConversation as exc:
            raise ToolFailure("not_found", str(exc), {"path": "$.channel"}) from None
    result = await node_call(
        agent.client.create_task(
            title,
            description=optional(args, "description") or "",
            assignees=await _assignees(agent, args) or [],
            channel_id=channel_id,
        )
    )
    text = (
        f"Created task {result.get('taskId')}; discuss it in conversation "
        f"task:{result.get('taskId')} (id {result.get('scopeId')})."
    )
    return text, result


async def update_task(agent: Agent, args: dict[str, Any]) -> Answer:
    task_id = required(args, "task_id")
    status = optional(args, "status")
    if status is not None and status not in STATUSES:
        raise ToolFailure(
            "validation_failed", f"status is one of {', '.join(STATUSES)}", {"path": "$.status"}
        )
    result = await node_call(
        agent.client.update_task(
            task_id,
            status=status,
            title=optional(args, "title"),
            assignees=await _assignees(agent, args),
        )
    )
    task = result.get("task") or {}
    return f"Updated: {_task_line(task)}", result


async def my_tasks(agent: Agent, args: dict[str, Any]) -> Answer:
    status = optional(args, "status")
    fields = {"status": status} if status else {}
    try:
        found = await agent.client.tasks("mine", **fields)
    except ClientError as exc:
        raise ToolFailure.of(exc) from None
    text = "\n".join(_task_line(t) for t in found) if found else "You have no tasks."
    return text, {"tasks": found}
