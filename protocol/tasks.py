"""Task frames (docs/tasks.md): create, update and list tasks; the ``taskUpdated`` event.

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
TaskStatus = Literal["open", "in_progress", "blocked", "done", "cancelled"]
TaskFilter = Literal["mine", "assigned", "created"]
_NAME: dict[str, Any] = {"text": "name"}
_CONTENT: dict[str, Any] = {"text": "content"}
Title = Annotated[str, Meta(min_length=1, max_length=200, extra=_NAME)]
Assignees = Annotated[list[Identifier], Meta(max_length=50)]


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class CreateTask(_Frame, tag="createTask"):
    """A new task: the caller is its creator and first member, each assignee a
    member too (a private agent only by its owner, as a private member).
    ``channelId`` links it to a channel the caller reads."""

    id: RequestId
    title: Title
    description: Annotated[str, Meta(max_length=4000, extra=_CONTENT)] = ""
    assignees: Assignees = []
    channel_id: Identifier | None = None


class UpdateTask(_Frame, tag="updateTask"):
    """Change a task's status, title or assignees (the whole new list)."""

    id: RequestId
    task_id: Identifier
    status: TaskStatus | None = None
    title: Title | None = None
    assignees: Assignees | None = None


class Tasks(_Frame, tag="tasks"):
    """The tasks the caller is a member of: ``mine`` (created or assigned),
    ``assigned`` (to the caller), ``created`` (by the caller); newest first.
    ``cursor`` is the previous page's ``nextCursor``."""

    id: RequestId
    filter: TaskFilter = "mine"
    status: TaskStatus | None = None
    channel_id: Identifier | None = None
    cursor: Identifier | None = None
    limit: Annotated[int, Meta(ge=1, le=200)] = 50


class TaskEntry(Struct, rename="camel", kw_only=True):
    task_id: str
    scope_id: str
    title: str
    description: str
    status: TaskStatus
    creator_id: str
    channel_id: str | None
    assignees: list[str]
    latest_seq: int
    unread: int = 0


class TaskUpdatedEvent(_Frame, tag="taskUpdated"):
    task_id: str
    scope_id: str
    title: str
    status: TaskStatus
    assignees: list[str]
    # What changed: ``created``, ``status``, ``title``, ``assigned``, ``unassigned``.
    changes: list[str] = []
    actor_id: str | None = None


RESULTS: dict[str, str] = {
    "createTask": (
        "`{taskId, scopeId}` (the same id). An assignee the caller may not see is"
        " `not_found` at `$.assignees[i]`; another owner's private agent likewise;"
        " `forbidden` for a private agent creating a task, and for a `channelId` the"
        " caller cannot read. The task's members get `taskUpdated`; an assigned agent"
        " gets a `deliver` with `reason: task_assigned`. With `channelId`, a task card"
        " (`messageType: task_card`, `metadata.taskId`) is posted into the channel as the"
        " creator's message (a human's title is moderated as a send)."
    ),
    "updateTask": (
        "`{task: TaskEntry}`. Any current member may change the status or the title; the"
        " assignees may be changed by the creator and the assignees who are public"
        " members (a private agent only by its owner); a private agent member may"
        " change the status only. A non-member gets `not_found`. The members before"
        " and after get `taskUpdated`; an agent unassigned before its wake was"
        " delivered gets none."
    ),
    "tasks": "`{tasks: [TaskEntry], nextCursor}`: `nextCursor` is null on the last page.",
}
EVENTS: dict[str, str] = {
    "taskUpdated": (
        "A task was created or its status, title or assignees changed: to the sessions"
        " of its members (and of members just unassigned). Not a message: it is not"
        " counted as unread."
    ),
}
