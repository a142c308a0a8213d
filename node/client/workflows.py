"""Workflow plans from the client library (docs/workflows.md).

A mixin of :class:`node.client.Client`: each method is one request. A human
creates and shares plans, reads their transcript and sends requests; the
plan's agent answers the ``deliver`` that names ``planId`` and ``requestId``
with :meth:`WorkflowOps.workflow_reply`.
"""

from __future__ import annotations

import uuid
from typing import Any


class WorkflowOps:
    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def create_workflow_plan(self, title: str, agent_id: str) -> dict[str, Any]:
        """``createWorkflowPlan``: ``{planId, scopeId}``; ``agent_id`` answers its requests."""
        return await self.request("createWorkflowPlan", title=title, agentId=agent_id)

    async def share_workflow_plan(self, plan_id: str, member_id: str) -> dict[str, Any]:
        """``shareWorkflowPlan``: another human reads the plan and sends it requests."""
        return await self.request("shareWorkflowPlan", planId=plan_id, memberId=member_id)

    async def update_workflow_plan(self, plan_id: str, **fields: Any) -> dict[str, Any]:
        """``updateWorkflowPlan`` (the creator): ``status`` and ``title`` as keywords."""
        return await self.request("updateWorkflowPlan", planId=plan_id, **fields)

    async def workflow_plans(self) -> list[dict[str, Any]]:
        """``workflowPlans``: the plans the caller created or that were shared with it."""
        return list((await self.request("workflowPlans"))["plans"])

    async def workflow_transcript(self, plan_id: str, **fields: Any) -> dict[str, Any]:
        """``workflowTranscript``: ``{messages, latestSeq}`` (``beforeSeq``, ``limit``)."""
        return await self.request("workflowTranscript", planId=plan_id, **fields)

    async def workflow_request(
        self, plan_id: str, content: str, client_message_id: str | None = None
    ) -> dict[str, Any]:
        """``workflowRequest``: ``{requestId, messageId, seq}``."""
        return await self.request(
            "workflowRequest",
            planId=plan_id,
            content=content,
            clientMessageId=client_message_id or f"wf-{uuid.uuid4().hex}",
        )

    async def workflow_reply(
        self,
        request_id: str,
        content: str,
        *,
        final: bool = False,
        client_message_id: str | None = None,
    ) -> dict[str, Any]:
        """``workflowReply`` (the plan's agent): ``{requestId, messageId, seq, final}``;
        a superseded request, or a second final reply, raises ``conflict``."""
        return await self.request(
            "workflowReply",
            requestId=request_id,
            content=content,
            final=final,
            clientMessageId=client_message_id or f"wf-{uuid.uuid4().hex}",
        )
