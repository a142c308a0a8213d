"""Task and rewind ops for :class:`node.client.Client` (docs/tasks.md,
docs/rewind.md), as a mixin: tasks with their discussion, recovery points and
the rewind to one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TaskOps:
    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def create_task(
        self,
        title: str,
        *,
        description: str = "",
        assignees: Sequence[str] = (),
        channel_id: str | None = None,
    ) -> dict[str, Any]:
        """The ``createTask`` op (docs/tasks.md): ``{taskId, scopeId}``. Its discussion
        is ``send``/``history``/``markRead`` on ``task:<taskId>``."""
        fields: dict[str, Any] = {"title": title, "assignees": list(assignees)}
        if description:
            fields["description"] = description
        if channel_id is not None:
            fields["channelId"] = channel_id
        return await self.request("createTask", **fields)

    async def update_task(
        self,
        task_id: str,
        *,
        status: str | None = None,
        title: str | None = None,
        assignees: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The ``updateTask`` op: ``{task}``; ``assignees`` is the whole new list."""
        fields: dict[str, Any] = {"taskId": task_id}
        if status is not None:
            fields["status"] = status
        if title is not None:
            fields["title"] = title
        if assignees is not None:
            fields["assignees"] = list(assignees)
        return await self.request("updateTask", **fields)

    async def tasks(self, filter: str = "mine", **fields: Any) -> list[dict[str, Any]]:  # noqa: A002
        """The ``tasks`` op, every page: ``filter`` is ``mine``, ``assigned`` or
        ``created``; ``status`` and ``channelId`` as keywords."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.request(
                "tasks", filter=filter, **fields, **({"cursor": cursor} if cursor else {})
            )
            out += page["tasks"]
            cursor = page.get("nextCursor")
            if not cursor:
                return out

    async def mark_recovery_point(self, message_id: str) -> dict[str, Any]:
        """``markRecoveryPoint`` (docs/rewind.md): ``{recoveryPointId, scopeId, seq}``."""
        return await self.request("markRecoveryPoint", messageId=message_id)

    async def rewind(self, scope_id: str, recovery_point_id: str) -> dict[str, Any]:
        """``rewind`` (docs/rewind.md): ``{suppressed, noticeMessageId, fromSeq, throughSeq}``."""
        return await self.request("rewind", scopeId=scope_id, recoveryPointId=recovery_point_id)
