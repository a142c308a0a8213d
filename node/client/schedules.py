"""Schedule ops for :class:`node.client.Client` (docs/schedules.md), as a mixin:
messages that post themselves on time, authored by the workspace's schedule
service with the caller as owner."""

from __future__ import annotations

from typing import Any


class ScheduleOps:
    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def create_schedule(
        self,
        target: str,
        content: str,
        *,
        at: str | None = None,
        rule: dict[str, Any] | None = None,
        time_zone: str = "UTC",
    ) -> dict[str, Any]:
        """``createSchedule``: once ``at`` (RFC 3339) or at each occurrence of
        ``rule`` (``{"every": "weekday", "time": "09:30"}``); ``target`` is a channel
        or ``"me"`` (a reminder in the caller's DM with the schedule service).
        ``{scheduleId, nextAt, schedule}``."""
        timing: dict[str, Any] = {"at": at} if at is not None else {"rule": rule}
        return await self.request(
            "createSchedule", target=target, content=content, timeZone=time_zone, **timing
        )

    async def update_schedule(self, schedule_id: str, **fields: Any) -> dict[str, Any]:
        """``updateSchedule``: ``target``, ``content``, ``at``, ``rule``, ``timeZone``."""
        reply = await self.request("updateSchedule", scheduleId=schedule_id, **fields)
        return dict(reply["schedule"])

    async def pause_schedule(self, schedule_id: str, paused: bool = True) -> dict[str, Any]:
        reply = await self.request("pauseSchedule", scheduleId=schedule_id, paused=paused)
        return dict(reply["schedule"])

    async def delete_schedule(self, schedule_id: str) -> None:
        await self.request("deleteSchedule", scheduleId=schedule_id)

    async def schedules(self) -> list[dict[str, Any]]:
        """The caller's schedules, oldest first."""
        return list((await self.request("schedules"))["schedules"])
