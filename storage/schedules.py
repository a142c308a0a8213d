"""Schedules and the workspace's schedule service (docs/schedules.md).

A schedule row holds what to post, where, as whose authority and when next;
the scheduler (node/scheduler.py) claims due rows here with
``FOR UPDATE SKIP LOCKED`` and advances them in the transaction that holds
the claim. The schedule service is one service member per workspace,
created on the first schedule of the workspace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from actors.ids import new_id
from actors.model import Member, MemberType
from storage import directory
from storage.applier import json_text
from storage.errors import map_errors
from storage.pg import TrioConnection

SERVICE_HANDLE = "schedule"
SERVICE_NAME = "Schedule"
COLUMNS = (
    "id, workspace_id, owner_member_id, target_scope_id, content, at, rule, time_zone,"
    " starts_at, next_at, paused, fired, last_run, created_at"
)
LOCK_WORKSPACE = "SELECT pg_advisory_xact_lock(hashtext('schedule_service:' || %s))"
SELECT_SERVICE = "SELECT member_id FROM schedule_services WHERE workspace_id = %s"
INSERT_SERVICE = "INSERT INTO schedule_services (workspace_id, member_id) VALUES (%s, %s)"
INSERT_SCHEDULE = f"""
INSERT INTO schedules (id, workspace_id, owner_member_id, target_scope_id, content, at, rule,
                       time_zone, starts_at, next_at)
VALUES (%(id)s, %(workspace_id)s, %(owner)s, %(target)s, %(content)s, %(at)s, %(rule)s::jsonb,
        %(time_zone)s, %(starts_at)s, %(next_at)s)
RETURNING {COLUMNS}
"""
SELECT_OWN = f"""
SELECT {COLUMNS} FROM schedules WHERE owner_member_id = %s ORDER BY created_at, id
"""
SELECT_ONE_FOR_UPDATE = f"SELECT {COLUMNS} FROM schedules WHERE id = %s FOR UPDATE"
UPDATE_SCHEDULE = f"""
UPDATE schedules SET target_scope_id = %(target)s, content = %(content)s, at = %(at)s,
    rule = %(rule)s::jsonb, time_zone = %(time_zone)s, starts_at = %(starts_at)s,
    next_at = %(next_at)s, paused = %(paused)s, updated_at = now()
WHERE id = %(id)s
RETURNING {COLUMNS}
"""
DELETE_SCHEDULE = "DELETE FROM schedules WHERE id = %s"
# The claim: due rows another node is not firing; a locked row is skipped,
# never waited for, so each node fires a different due schedule.
CLAIM_DUE = f"""
SELECT {COLUMNS}, now() FROM schedules
WHERE next_at IS NOT NULL AND NOT paused AND next_at <= now()
ORDER BY next_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""
ADVANCE = """
UPDATE schedules SET next_at = %s, fired = fired + 1, last_run = %s::jsonb, updated_at = now()
WHERE id = %s
"""
SELECT_NEXT_DUE = """
SELECT EXTRACT(EPOCH FROM min(next_at) - now()) FROM schedules
WHERE next_at IS NOT NULL AND NOT paused
"""
SELECT_CURRENT_MEMBER = """
SELECT 1 FROM scope_memberships
WHERE scope_id = %s AND member_id = %s AND effective_to_seq IS NULL
"""


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    workspace_id: str
    owner_member_id: str
    target_scope_id: str
    content: str
    at: datetime | None
    rule: dict[str, Any] | None
    time_zone: str
    starts_at: datetime
    next_at: datetime | None
    paused: bool
    fired: int
    last_run: dict[str, Any] | None
    created_at: datetime


def _schedule(row: tuple[Any, ...]) -> Schedule:
    return Schedule(*row[:14])


async def schedule_service(conn: TrioConnection, workspace_id: str) -> Member:
    """The workspace's schedule service, created on first use (one per workspace,
    whichever node asks first: the workspace's advisory lock orders them)."""
    with map_errors():
        async with conn.transaction():
            await conn.execute(LOCK_WORKSPACE, (workspace_id,))
            cur = await conn.execute(SELECT_SERVICE, (workspace_id,))
            row = await cur.fetchone()
            if row is not None:
                found = await directory.get_member(conn, str(row[0]))
                assert found is not None
                return found
            handle = SERVICE_HANDLE
            if await directory.get_member_by_handle(conn, workspace_id, handle) is not None:
                handle = f"{SERVICE_HANDLE}-{new_id('x')[-6:].lower()}"
            member = await directory.create_member(
                conn,
                workspace_id=workspace_id,
                type_=MemberType.SERVICE,
                handle=handle,
                display_name=SERVICE_NAME,
            )
            await conn.execute(INSERT_SERVICE, (workspace_id, member.id))
    return member


async def service_id(conn: TrioConnection, workspace_id: str) -> str | None:
    """The workspace's schedule service, if it has one yet."""
    with map_errors():
        cur = await conn.execute(SELECT_SERVICE, (workspace_id,))
        row = await cur.fetchone()
    return str(row[0]) if row is not None else None


async def is_current_member(conn: TrioConnection, scope_id: str, member_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(SELECT_CURRENT_MEMBER, (scope_id, member_id))
        return await cur.fetchone() is not None


async def create(
    conn: TrioConnection,
    *,
    owner: Member,
    target_scope_id: str,
    content: str,
    at: datetime | None,
    rule: dict[str, Any] | None,
    time_zone: str,
    starts_at: datetime,
    next_at: datetime | None,
) -> Schedule:
    with map_errors():
        cur = await conn.execute(
            INSERT_SCHEDULE,
            {
                "id": new_id("sch"),
                "workspace_id": owner.workspace_id,
                "owner": owner.id,
                "target": target_scope_id,
                "content": content,
                "at": at,
                "rule": json_text(rule) if rule is not None else None,
                "time_zone": time_zone,
                "starts_at": starts_at,
                "next_at": next_at,
            },
        )
        row = await cur.fetchone()
    assert row is not None
    return _schedule(row)


async def owned_by(conn: TrioConnection, owner_id: str) -> list[Schedule]:
    with map_errors():
        cur = await conn.execute(SELECT_OWN, (owner_id,))
        return [_schedule(row) for row in await cur.fetchall()]


@asynccontextmanager
async def locked(conn: TrioConnection, schedule_id: str) -> AsyncIterator[Schedule | None]:
    """The schedule, its row locked for the caller's transaction (an update
    waits for a firing of the same schedule to finish)."""
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(SELECT_ONE_FOR_UPDATE, (schedule_id,))
            row = await cur.fetchone()
            yield _schedule(row) if row is not None else None


async def save(conn: TrioConnection, schedule: Schedule) -> Schedule:
    """Write the editable fields of a schedule (inside :func:`locked`)."""
    with map_errors():
        cur = await conn.execute(
            UPDATE_SCHEDULE,
            {
                "id": schedule.id,
                "target": schedule.target_scope_id,
                "content": schedule.content,
                "at": schedule.at,
                "rule": json_text(schedule.rule) if schedule.rule is not None else None,
                "time_zone": schedule.time_zone,
                "starts_at": schedule.starts_at,
                "next_at": schedule.next_at,
                "paused": schedule.paused,
            },
        )
        row = await cur.fetchone()
    assert row is not None
    return _schedule(row)


async def delete(conn: TrioConnection, schedule_id: str) -> None:
    with map_errors():
        await conn.execute(DELETE_SCHEDULE, (schedule_id,))


async def claim_due(conn: TrioConnection, limit: int) -> tuple[list[Schedule], datetime | None]:
    """Lock up to ``limit`` due schedules no other node holds (inside the
    caller's transaction), and the database's now."""
    with map_errors():
        cur = await conn.execute(CLAIM_DUE, (limit,))
        rows = await cur.fetchall()
    return [_schedule(row) for row in rows], (rows[0][14] if rows else None)


async def advance(
    conn: TrioConnection, schedule_id: str, next_at: datetime | None, last_run: dict[str, Any]
) -> None:
    with map_errors():
        await conn.execute(ADVANCE, (next_at, json_text(last_run), schedule_id))


async def seconds_to_next(conn: TrioConnection) -> float | None:
    """Seconds until the earliest unpaused occurrence (negative when overdue)."""
    with map_errors():
        cur = await conn.execute(SELECT_NEXT_DUE)
        row = await cur.fetchone()
    return float(row[0]) if row is not None and row[0] is not None else None
