"""Workflow frames (docs/workflows.md): plans, their transcript, requests and replies.

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
ClientMessageId = Annotated[str, Meta(min_length=1, max_length=200)]
PlanStatus = Literal["draft", "active", "archived"]
_NAME: dict[str, Any] = {"text": "name"}
_CONTENT: dict[str, Any] = {"text": "content"}
Title = Annotated[str, Meta(min_length=1, max_length=200, extra=_NAME)]
# One stored row: a request or a reply is never split into chunks.
Content = Annotated[str, Meta(min_length=1, max_length=16_000, extra=_CONTENT)]

# The message types only the workflow adapter writes (a client's ``send`` may not set them).
REQUEST_TYPE = "workflow_request"
REPLY_TYPE = "workflow_reply"
# ``metadata.source.kind`` of those messages: what caused them, never who wrote them.
REQUEST_SOURCE = "workflow_request"
RUN_SOURCE = "workflow_run"


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class CreateWorkflowPlan(_Frame, tag="createWorkflowPlan"):
    """A new plan and its transcript scope: the calling human is its creator,
    ``agentId`` the agent that answers its requests."""

    id: RequestId
    title: Title
    agent_id: Identifier


class ShareWorkflowPlan(_Frame, tag="shareWorkflowPlan"):
    """Let another human of the workspace read the plan and send it requests."""

    id: RequestId
    plan_id: Identifier
    member_id: Identifier


class UpdateWorkflowPlan(_Frame, tag="updateWorkflowPlan"):
    """The creator renames the plan or changes its status (``archived`` takes no
    request until it is restored; the transcript stays as it is)."""

    id: RequestId
    plan_id: Identifier
    status: PlanStatus | None = None
    title: Title | None = None


class WorkflowPlans(_Frame, tag="workflowPlans"):
    """The plans the caller created or that were shared with it, newest first."""

    id: RequestId


class WorkflowTranscript(_Frame, tag="workflowTranscript"):
    """A page of the plan's transcript, newest first before ``beforeSeq``."""

    id: RequestId
    plan_id: Identifier
    before_seq: Annotated[int, Meta(ge=1, le=2**63 - 1)] | None = None
    limit: Annotated[int, Meta(ge=1, le=200)] = 50


class WorkflowRequest(_Frame, tag="workflowRequest"):
    """A human's request to the plan's agent; it supersedes the plan's earlier
    request still waiting for its final reply."""

    id: RequestId
    plan_id: Identifier
    content: Content
    client_message_id: ClientMessageId


class WorkflowReply(_Frame, tag="workflowReply"):
    """The plan's agent answers a request whose wake it holds; ``final`` closes it."""

    id: RequestId
    request_id: Identifier
    content: Content
    client_message_id: ClientMessageId
    final: bool = False


class WorkflowPlanEntry(Struct, rename="camel", kw_only=True):
    plan_id: str
    scope_id: str
    title: str
    status: PlanStatus
    creator_id: str
    agent_id: str
    shared_with: list[str]
    draft: str
    revision: int
    latest_seq: int
    # The request holding the agent's wake, if any.
    active_request_id: str | None = None


class WorkflowUpdatedEvent(_Frame, tag="workflowUpdated"):
    plan_id: str
    status: PlanStatus
    revision: int
    scope_id: str = ""
    title: str = ""
    # What changed: ``created``, ``shared``, ``updated``, ``request``, ``reply``, ``final``.
    change: str = ""
    request_id: str | None = None


RESULTS: dict[str, str] = {
    "createWorkflowPlan": (
        "`{planId, scopeId}`. Humans only (an agent or a service gets `forbidden`);"
        " `agentId` must be an agent the caller may address (`not_found` at"
        " `$.agentId` otherwise; another owner's private agent likewise). The plan"
        " starts as a `draft` at revision 0; its scope has type `workflow` and is read"
        " only through `workflowTranscript`."
    ),
    "shareWorkflowPlan": (
        "`{plan: WorkflowPlanEntry}`. The creator only (`not_found` for anyone the plan"
        " is not shared with, `forbidden` for the others); `memberId` must be a human of"
        " the workspace (`not_found` at `$.memberId` otherwise)."
    ),
    "updateWorkflowPlan": (
        "`{plan: WorkflowPlanEntry}`. The creator only (`forbidden` for the humans it is"
        " shared with and the plan's agent, `not_found` for anyone else). The plan's"
        " scope is unchanged by any status."
    ),
    "workflowPlans": "`{plans: [WorkflowPlanEntry]}`: created by the caller or shared with it.",
    "workflowTranscript": (
        "`{planId, scopeId, messages: [MessageView], latestSeq, hasMore}`, oldest first. The"
        " creator and the humans the plan is shared with; the plan's agent gets"
        " `forbidden`, anyone else `not_found`."
    ),
    "workflowRequest": (
        "`{requestId, messageId, seq}`. The creator and the humans the plan is shared"
        " with (`forbidden` for the plan's agent, `not_found` for anyone else). The"
        " message (`messageType: workflow_request`, `metadata.source: {kind:"
        " workflow_request, planId, requestId}`) is routed to the plan's agent alone:"
        " its `deliver` names `planId` and `requestId`. An earlier request without its"
        " final reply is superseded and its unacknowledged wake withdrawn. The same"
        " `clientMessageId` again answers the same request. An archived plan takes"
        " none: `conflict`."
    ),
    "workflowReply": (
        "`{requestId, messageId, seq, final}`. Only the plan's agent (`not_found` for"
        " anyone else), only for the request holding its wake: a superseded or"
        " already finally answered request is `conflict`, and so is a second final"
        " reply racing the first. The message (`messageType: workflow_reply`,"
        " `metadata.source: {kind: workflow_run, planId, requestId, final}`) is authored"
        " by the agent; a final reply becomes the plan's draft, one revision up."
    ),
}
EVENTS: dict[str, str] = {
    "workflowUpdated": (
        "A plan was created, shared or updated, got a request or a reply: to the sessions of its"
        " creator and the humans it is shared with. Not a message: it is not counted"
        " as unread."
    ),
}


def wake_names(metadata: dict[str, Any]) -> tuple[str | None, str | None]:
    """The ``(planId, requestId)`` a request message's wake names, else ``(None, None)``."""
    source = metadata.get("source")
    if isinstance(source, dict) and source.get("kind") == REQUEST_SOURCE:
        return source.get("planId"), source.get("requestId")
    return None, None
