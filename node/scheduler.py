"""The scheduler: every node runs one; each occurrence is posted once (docs/schedules.md).

A tick is one transaction on one connection: it claims the due schedule
rows (locked, skipping rows another node holds), posts each occurrence through the
schedule service's send path (scope actor, Policy, Planner, Applier: the
message's seq comes through the scope's fence and reaches live readers as
any send's), and advances ``next_at`` before it commits. The message's
idempotency key is the schedule id and the occurrence time, so whatever
dies between the message's commit and the claim's (this node, its
connection) leaves a row that the next claimer, on any node, posts again
only to be told ``already_sent`` — and then advances. The row lock keeps two
nodes from posting the same occurrence at once; the key keeps a retried one
from being stored twice; ``next_at`` moves only after the message is
stored, so none is lost. The in-memory wake-up only decides when to look.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import structlog
import trio

from actors.model import Member, ScopeType
from actors.scope_roster import RosterCommand
from node.ops.schedules import next_at
from node.ops.services import post_as_service
from node.services import Services
from node.views import rfc3339
from protocol.errors import ErrorCode, OperationError
from storage import directory, schedules, scopes
from storage.errors import DatabaseUnavailable
from storage.pg import TrioConnection
from storage.schedules import Schedule

log = structlog.get_logger(__name__)

BATCH = 20
LONGEST_NAP_S = 1.0
# An occurrence posted this much after its time says so in its source ref.
LATE_AFTER = timedelta(seconds=5)
RUN_KIND = "schedule_run"
# A rule's occurrence missed by more than this, with a later one also due, is
# skipped: after a long outage a daily prompt is posted once, not once a day.
CATCH_UP = timedelta(hours=1)


def client_message_id(schedule: Schedule, occurrence: datetime) -> str:
    """The idempotency key of one occurrence (the schedule service is the subject)."""
    return f"sch:{schedule.id}:{rfc3339(occurrence)}"


class Scheduler:
    def __init__(self, services: Services) -> None:
        self._services = services
        self._poke = trio.Event()

    def wake(self) -> None:
        """Look again now (a schedule was created or changed here)."""
        self._poke.set()

    async def run(self) -> None:
        while True:
            try:
                fired = await self.tick()
                nap = await self._nap() if fired < BATCH else 0.0
            except DatabaseUnavailable:
                log.warning("scheduler.database_unavailable")
                nap = LONGEST_NAP_S
            except Exception:
                # Rolled back: the claimed rows are due again at the next tick.
                # The node keeps serving whatever one schedule does.
                log.exception("scheduler.tick_failed")
                nap = LONGEST_NAP_S
            with trio.move_on_after(nap):
                await self._poke.wait()
            self._poke = trio.Event()

    async def _nap(self) -> float:
        async with self._services.pool.connection() as conn:
            due_in = await schedules.seconds_to_next(conn)
        if due_in is None:
            return LONGEST_NAP_S
        return min(LONGEST_NAP_S, max(0.0, due_in))

    async def tick(self) -> int:
        """Post the due occurrences this node could claim; how many."""
        async with self._services.pool.connection() as conn, conn.transaction():
            due, now = await schedules.claim_due(conn, BATCH)
            for schedule in due:
                assert now is not None
                assert schedule.next_at is not None
                occurrence = schedule.next_at
                fired = replace(schedule, fired=schedule.fired + 1)
                following = next_at(fired, occurrence)
                if superseded(occurrence, following, now):
                    run = _superseded_run(occurrence)
                else:
                    run = await self._fire(conn, schedule, occurrence, now)
                await schedules.advance(conn, schedule.id, following, run)
        return len(due)

    async def _fire(
        self, conn: TrioConnection, schedule: Schedule, occurrence: datetime, now: datetime
    ) -> dict[str, Any]:
        services = self._services
        owner = await directory.get_member(conn, schedule.owner_member_id)
        service = await schedules.schedule_service(conn, schedule.workspace_id)
        run: dict[str, Any] = {"occurrenceAt": rfc3339(occurrence)}
        if owner is None or not await directory.is_active(conn, owner.id):
            return {**run, "outcome": "skipped", "reason": "owner_deactivated"}
        if not await schedules.is_current_member(conn, schedule.target_scope_id, owner.id):
            await self._notify_skip(conn, schedule, occurrence, owner, service)
            return {**run, "outcome": "skipped", "reason": "owner_not_member"}
        source: dict[str, Any] = {
            "kind": RUN_KIND,
            "scheduleId": schedule.id,
            "occurrenceAt": rfc3339(occurrence),
            "ownerMemberId": owner.id,
        }
        delay = now - occurrence
        if delay >= LATE_AFTER:
            source["delaySeconds"] = math.floor(delay.total_seconds())
            run["delaySeconds"] = source["delaySeconds"]
        try:
            await self._seat(conn, schedule, owner, service)
            _, result = await post_as_service(
                services,
                service,
                target=f"scope:{schedule.target_scope_id}",
                content=schedule.content,
                client_message_id=client_message_id(schedule, occurrence),
                metadata={"source": source},
                explain=True,
            )
        except OperationError as refused:
            if refused.code in (ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL):
                raise DatabaseUnavailable(refused.message) from refused
            if refused.code is ErrorCode.IDEMPOTENCY_CONFLICT:
                # Stored by an earlier attempt before the content was edited.
                return {**run, "outcome": "sent", "scopeId": schedule.target_scope_id}
            await self._notify_skip(conn, schedule, occurrence, owner, service)
            return {**run, "outcome": "skipped", "reason": refused.code.value}
        log.info("scheduler.fired", schedule_id=schedule.id, occurrence=rfc3339(occurrence))
        explain = {
            **(result.explain or {}),
            "author": service.id,
            "owner": owner.id,
            "scheduleId": schedule.id,
        }
        return {
            **run,
            "outcome": "sent",
            "scopeId": schedule.target_scope_id,
            "messageId": result.message_id,
            "explain": explain,
        }

    async def _seat(
        self, conn: TrioConnection, schedule: Schedule, owner: Member, service: Member
    ) -> None:
        """Put the service back into the target channel if it was removed: the
        owner invites it, under the owner's own rights."""
        if await schedules.is_current_member(conn, schedule.target_scope_id, service.id):
            return
        await self._services.registry.ask(
            schedule.target_scope_id, RosterCommand("invite", owner, service, _noop)
        )

    async def _notify_skip(
        self,
        conn: TrioConnection,
        schedule: Schedule,
        occurrence: datetime,
        owner: Member,
        service: Member,
    ) -> None:
        """Tell the owner, in their DM with the schedule service, that a run was skipped."""
        info = await scopes.get_scope(conn, schedule.target_scope_id)
        where = f"#{info.slug}" if info and info.type is ScopeType.CHANNEL else "its conversation"
        # Its own connection: the DM must be committed before the send resolves it.
        async with self._services.pool.connection() as other:
            dm = await scopes.get_or_create_dm(other, owner, service)
        await post_as_service(
            self._services,
            service,
            target=f"scope:{dm}",
            content=(
                f"Skipped a scheduled message to {where}: you can no longer post there."
                f" The schedule is still on; edit or delete it under Scheduled."
            ),
            client_message_id=client_message_id(schedule, occurrence) + ":skipped",
            metadata={
                "source": {
                    "kind": RUN_KIND,
                    "scheduleId": schedule.id,
                    "occurrenceAt": rfc3339(occurrence),
                    "ownerMemberId": owner.id,
                    "skipped": True,
                }
            },
        )


def superseded(occurrence: datetime, following: datetime | None, now: datetime) -> bool:
    """Whether a missed occurrence gives way to a later one that is also due."""
    return following is not None and following <= now and now - occurrence > CATCH_UP


def _superseded_run(occurrence: datetime) -> dict[str, Any]:
    return {"occurrenceAt": rfc3339(occurrence), "outcome": "skipped", "reason": "superseded"}


def _noop(_: Any) -> None:
    pass
