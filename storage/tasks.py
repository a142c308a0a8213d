"""Tasks (docs/tasks.md): task scopes, their profile, their assignees and activity.

A task is a top-level scope of type ``task``. Its members are ordinary
memberships (the creator and the assignees); a change of assignees changes the
roster in the same transaction as the profile, and bumps the roster generation
so that a send decided on the older roster is fenced out. Status and
assignment changes are activity (``scope_activity_events``), never messages;
an agent's (un)assignment also writes its wake here, under
``worker_first_targeted``: the outbox worker delivers it, exactly to that
agent, and an unassignment before it ran suppresses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from actors.ids import new_id
from actors.model import DeliveryPolicy, Member, MemberType, NotificationState
from storage.directory import get_members
from storage.errors import map_errors
from storage.pg import TrioConnection
from storage.scopes import (
    BUMP_ROSTER,
    CLOSE_MEMBERSHIP,
    INSERT_MEMBERSHIP,
    INSERT_SCOPE,
    UPSERT_NOTIFICATION,
)

# Activity wakes name their policy here, where the row is produced.
ASSIGNMENT_WAKE_POLICY = DeliveryPolicy.WORKER_FIRST_TARGETED
ASSIGNED = "task_assigned"
UNASSIGNED = "task_unassigned"

INSERT_TASK = """
INSERT INTO scope_task_profiles
    (scope_id, workspace_id, title, description, creator_member_id, channel_scope_id,
     assignee_ids)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
_TASK_COLUMNS = """t.scope_id, t.title, t.description, t.status, t.creator_member_id,
    t.channel_scope_id, t.assignee_ids, t.created_at, t.updated_at, s.latest_seq"""
SELECT_TASK = f"""
SELECT {_TASK_COLUMNS}
FROM scope_task_profiles t JOIN scopes s ON s.id = t.scope_id
WHERE t.scope_id = %s
"""
LOCK_TASK = f"""
SELECT {_TASK_COLUMNS}
FROM scope_task_profiles t JOIN scopes s ON s.id = t.scope_id
WHERE t.scope_id = %s
FOR UPDATE OF t
"""
UPDATE_TASK = """
UPDATE scope_task_profiles
SET title = %(title)s, status = %(status)s, assignee_ids = %(assignees)s, updated_at = now()
WHERE scope_id = %(scope_id)s
"""
IS_MEMBER = """
SELECT 1 FROM scope_memberships
WHERE scope_id = %s AND member_id = %s AND effective_to_seq IS NULL
"""
INSERT_ACTIVITY = """
INSERT INTO scope_activity_events
    (id, workspace_id, scope_id, activity_type, activity_ref_type, activity_ref_id,
     activity_global_seq, actor_member_id, reason, payload)
VALUES (%(id)s, %(workspace_id)s, %(scope_id)s, 'task_activity', 'task', %(scope_id)s,
        nextval('scope_activity_global_seq'), %(actor)s, %(reason)s, %(payload)s)
"""
INSERT_WAKE = """
INSERT INTO scope_fanout_outbox (
    workspace_id, scope_id, message_id, event_ref_type, event_ref_id, fanout_type,
    delivery_policy, target_member_id, target_seq, dedupe_key, payload)
VALUES (%(workspace_id)s, %(scope_id)s, NULL, 'activity', %(activity_id)s, 'agent_wake',
        %(policy)s, %(agent)s, NULL, %(key)s, %(payload)s)
"""
# An unassignment suppresses the agent's assignment wakes the worker has not run.
SUPPRESS_WAKES = """
UPDATE scope_fanout_outbox
SET status = 'suppressed', suppressed_at = now(), suppression_reason = 'unassigned',
    lease_owner = NULL, lease_expires_at = NULL
WHERE scope_id = %s AND target_member_id = %s AND event_ref_type = 'activity'
  AND fanout_type = 'agent_wake' AND status IN ('pending', 'leased')
"""
SELECT_ACTIVITY = """
SELECT a.actor_member_id, a.created_at FROM scope_activity_events a WHERE a.id = %s
"""
PENDING_ASSIGNMENTS = """
SELECT o.scope_id, o.event_ref_id, coalesce(o.payload->>'reason', '')
FROM scope_fanout_outbox o
WHERE o.target_member_id = %s AND o.fanout_type = 'agent_wake' AND o.event_ref_type = 'activity'
  AND (o.status IN ('pending', 'leased') OR (o.status = 'failed' AND o.last_error = %s))
ORDER BY o.id
LIMIT %s
"""
STILL_ASSIGNED = """
SELECT %s = ANY(assignee_ids) FROM scope_task_profiles WHERE scope_id = %s
"""
_FILTERS = {
    "mine": "(t.creator_member_id = %(member)s OR %(member)s = ANY(t.assignee_ids))",
    "assigned": "%(member)s = ANY(t.assignee_ids)",
    "created": "t.creator_member_id = %(member)s",
}
# Only tasks the member belongs to (or belonged to) are listed.
_LIST = """
SELECT {columns}, m.last_read_seq,
       (SELECT count(*) FROM scope_messages x
        WHERE x.scope_id = s.id AND x.seq > m.last_read_seq
          AND x.author_member_id <> m.member_id) AS unread
FROM scope_task_profiles t
JOIN scopes s ON s.id = t.scope_id
JOIN scope_memberships m ON m.scope_id = t.scope_id AND m.member_id = %(member)s
    AND m.effective_to_seq IS NULL
WHERE t.workspace_id = %(workspace)s AND {filter}
  AND (%(status)s::text IS NULL OR t.status = %(status)s)
  AND (%(channel)s::text IS NULL OR t.channel_scope_id = %(channel)s)
  AND (%(cursor)s::text IS NULL OR t.scope_id < %(cursor)s)
ORDER BY t.scope_id DESC
LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    title: str
    description: str
    status: str
    creator_id: str
    channel_id: str | None
    assignees: tuple[str, ...]
    created_at: datetime
    updated_at: datetime
    latest_seq: int
    unread: int = 0


def _task(row: Sequence[Any], unread: int = 0) -> Task:
    return Task(
        id=row[0],
        title=row[1],
        description=row[2],
        status=row[3],
        creator_id=row[4],
        channel_id=row[5],
        assignees=tuple(row[6]),
        created_at=row[7],
        updated_at=row[8],
        latest_seq=int(row[9]),
        unread=unread,
    )


def _membership_of(member: Member) -> tuple[str, str | None]:
    """A private agent is a private member of its owner; anyone else a public one."""
    if member.is_private_agent:
        return "private", member.owner_member_id
    return "public", None


async def _join(conn: TrioConnection, scope_id: str, member: Member) -> None:
    visibility, owner = _membership_of(member)
    await conn.execute(
        INSERT_MEMBERSHIP,
        {"scope_id": scope_id, "member_id": member.id, "visibility": visibility, "owner_id": owner},
    )
    await conn.execute(UPSERT_NOTIFICATION, (scope_id, member.id, NotificationState.ACTIVE.value))


async def _activity(
    conn: TrioConnection,
    workspace_id: str,
    scope_id: str,
    actor: Member,
    reason: str,
    payload: dict[str, Any],
) -> str:
    activity_id = new_id("act")
    params = {
        "id": activity_id,
        "workspace_id": workspace_id,
        "scope_id": scope_id,
        "actor": actor.id,
        "reason": reason,
        "payload": _json(payload),
    }
    await conn.execute(INSERT_ACTIVITY, params)
    return activity_id


def _json(value: dict[str, Any]) -> Jsonb:
    return Jsonb(value)


async def _assignment(
    conn: TrioConnection, workspace_id: str, scope_id: str, actor: Member, member: Member, op: str
) -> None:
    """One (un)assignment: its activity, and for an agent its wake or the wake's suppression."""
    activity_id = await _activity(conn, workspace_id, scope_id, actor, op, {"memberId": member.id})
    if member.type is not MemberType.AGENT:
        return
    if op == UNASSIGNED:
        await conn.execute(SUPPRESS_WAKES, (scope_id, member.id))
        return
    await conn.execute(
        INSERT_WAKE,
        {
            "workspace_id": workspace_id,
            "scope_id": scope_id,
            "activity_id": activity_id,
            "policy": ASSIGNMENT_WAKE_POLICY.value,
            "agent": member.id,
            "key": f"wake:{activity_id}:{member.id}",
            "payload": _json({"reason": ASSIGNED, "taskId": scope_id}),
        },
    )


async def create_task(
    conn: TrioConnection,
    *,
    creator: Member,
    title: str,
    description: str,
    assignees: Sequence[Member],
    channel_id: str | None,
) -> Task:
    """Scope + profile + the creator's and the assignees' memberships, in one transaction."""
    scope_id = new_id("scp")
    workspace_id = creator.workspace_id
    assignee_ids = [a.id for a in assignees]
    with map_errors():
        async with conn.transaction():
            await conn.execute(
                INSERT_SCOPE, (scope_id, workspace_id, "task", None, creator.id, None, None)
            )
            await conn.execute(
                INSERT_TASK,
                (scope_id, workspace_id, title, description, creator.id, channel_id, assignee_ids),
            )
            await _join(conn, scope_id, creator)
            for member in assignees:
                if member.id != creator.id:
                    await _join(conn, scope_id, member)
                await _assignment(conn, workspace_id, scope_id, creator, member, ASSIGNED)
            cur = await conn.execute(SELECT_TASK, (scope_id,))
            row = await cur.fetchone()
    assert row is not None
    return _task(row)


async def get_task(conn: TrioConnection, scope_id: str) -> Task | None:
    with map_errors():
        cur = await conn.execute(SELECT_TASK, (scope_id,))
        row = await cur.fetchone()
    return _task(row) if row else None


@dataclass(frozen=True, slots=True)
class TaskChange:
    """What an ``updateTask`` asks for; None: unchanged."""

    status: str | None = None
    title: str | None = None
    assignees: Sequence[Member] | None = None


async def update_task(
    conn: TrioConnection, workspace_id: str, scope_id: str, actor: Member, change: TaskChange
) -> tuple[Task, Task] | None:
    """Apply a change under the task's row lock; (before, after), or None if no such task."""
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(LOCK_TASK, (scope_id,))
            row = await cur.fetchone()
            if row is None:
                return None
            before = _task(row)
            assignees = list(before.assignees)
            if change.assignees is not None:
                assignees = await _reassign(conn, workspace_id, before, actor, change.assignees)
            status = change.status or before.status
            title = change.title or before.title
            if status != before.status:
                payload = {"from": before.status, "to": status}
                await _activity(conn, workspace_id, scope_id, actor, "task_status", payload)
            await conn.execute(
                UPDATE_TASK,
                {"scope_id": scope_id, "title": title, "status": status, "assignees": assignees},
            )
            cur = await conn.execute(SELECT_TASK, (scope_id,))
            after = await cur.fetchone()
    assert after is not None
    return before, _task(after)


async def _reassign(
    conn: TrioConnection, workspace_id: str, before: Task, actor: Member, wanted: Sequence[Member]
) -> list[str]:
    scope_id = before.id
    wanted_ids = [m.id for m in wanted]
    added = [m for m in wanted if m.id not in before.assignees]
    removed = [a for a in before.assignees if a not in wanted_ids]
    if added or removed:
        await conn.execute(BUMP_ROSTER, (scope_id,))
    for member in added:
        cur = await conn.execute(IS_MEMBER, (scope_id, member.id))
        if await cur.fetchone() is None:
            await _join(conn, scope_id, member)
        await _assignment(conn, workspace_id, scope_id, actor, member, ASSIGNED)
    removed_members = {m.id: m for m in await _members(conn, removed)}
    for member_id in removed:
        if member_id != before.creator_id:
            # The creator stays a member of its task whoever is assigned.
            await conn.execute(CLOSE_MEMBERSHIP, {"scope_id": scope_id, "member_id": member_id})
        gone = removed_members.get(member_id)
        if gone is not None:
            await _assignment(conn, workspace_id, scope_id, actor, gone, UNASSIGNED)
    return wanted_ids


async def _members(conn: TrioConnection, ids: list[str]) -> list[Member]:
    return list((await get_members(conn, ids)).values()) if ids else []


async def still_assigned(conn: TrioConnection, scope_id: str, agent_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(STILL_ASSIGNED, (agent_id, scope_id))
        row = await cur.fetchone()
    return bool(row and row[0])


async def list_tasks(
    conn: TrioConnection,
    member: Member,
    *,
    which: str,
    status: str | None,
    channel_id: str | None,
    cursor: str | None,
    limit: int,
) -> list[Task]:
    sql = _LIST.format(columns=_TASK_COLUMNS, filter=_FILTERS.get(which, "true"))
    params = {
        "member": member.id,
        "workspace": member.workspace_id,
        "status": status,
        "channel": channel_id,
        "cursor": cursor,
        "limit": limit,
    }
    with map_errors():
        cur = await conn.execute(sql, params)
        rows = await cur.fetchall()
    return [_task(row[:10], int(row[11])) for row in rows]


@dataclass(frozen=True, slots=True)
class Assignment:
    """An assignment wake's content: the task now, who assigned it and when."""

    task: Task
    actor: Member
    at: datetime


async def assignment(conn: TrioConnection, scope_id: str, activity_id: str) -> Assignment | None:
    with map_errors():
        cur = await conn.execute(SELECT_ACTIVITY, (activity_id,))
        row = await cur.fetchone()
    task = await get_task(conn, scope_id)
    if row is None or task is None:
        return None
    actor = (await get_members(conn, [row[0]])).get(row[0])
    return Assignment(task, actor, row[1]) if actor is not None else None


async def pending_assignments(
    conn: TrioConnection, agent_id: str, gave_up: str, limit: int
) -> list[tuple[str, str, str]]:
    """An agent's unacknowledged assignment wakes, oldest first: (task, activity, reason)."""
    with map_errors():
        cur = await conn.execute(PENDING_ASSIGNMENTS, (agent_id, gave_up, limit))
        rows = await cur.fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]
