"""Workflow plans (docs/workflows.md): the plan row, its scope, its requests.

A plan and its ``workflow`` scope (identity ``workflow:{plan_id}``) are created
in one transaction with the creator's and the agent's memberships. Every
request and every final reply is decided under the plan's row lock
(``SELECT … FOR UPDATE``): at most one request holds the agent's wake (the
partial unique index backs it), and a final reply first *claims* its request
(``final_client_message_id``) so that a second one, from any session, finds
the claim and is refused. The messages themselves are appended by the scope
actor like every other message; these rows only order them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.ids import new_id
from actors.model import Member, NotificationState
from storage.errors import map_errors
from storage.pg import TrioConnection
from storage.scopes import BUMP_ROSTER, INSERT_MEMBERSHIP, INSERT_SCOPE, UPSERT_NOTIFICATION

ACTIVE, ANSWERED, SUPERSEDED, FAILED = "active", "answered", "superseded", "failed"
ARCHIVED = "archived"  # a plan status

INSERT_PLAN = """
INSERT INTO workflow_plans
    (id, workspace_id, scope_id, title, creator_member_id, agent_member_id)
VALUES (%s, %s, %s, %s, %s, %s)
"""
_PLAN_COLUMNS = """p.id, p.scope_id, p.title, p.status, p.creator_member_id, p.agent_member_id,
    p.shared_with, p.draft, p.revision, s.latest_seq, p.workspace_id,
    (SELECT r.id FROM workflow_requests r WHERE r.plan_id = p.id AND r.status = 'active')"""
SELECT_PLAN = f"""
SELECT {_PLAN_COLUMNS}
FROM workflow_plans p JOIN scopes s ON s.id = p.scope_id
WHERE p.id = %s
"""
LOCK_PLAN = "SELECT status FROM workflow_plans WHERE id = %s FOR UPDATE"
LIST_PLANS = f"""
SELECT {_PLAN_COLUMNS}
FROM workflow_plans p JOIN scopes s ON s.id = p.scope_id
WHERE p.workspace_id = %(workspace)s
  AND (p.creator_member_id = %(member)s OR %(member)s = ANY(p.shared_with))
ORDER BY p.id DESC
LIMIT 500
"""
SHARE = """
UPDATE workflow_plans
SET shared_with = array_append(shared_with, %(member)s), updated_at = now()
WHERE id = %(plan)s AND NOT %(member)s = ANY(shared_with)
RETURNING id
"""
UPDATE_PLAN = """
UPDATE workflow_plans
SET status = coalesce(%(status)s, status), title = coalesce(%(title)s, title), updated_at = now()
WHERE id = %(plan)s
"""
IS_MEMBER = """
SELECT 1 FROM scope_memberships
WHERE scope_id = %s AND member_id = %s AND effective_to_seq IS NULL
"""
_REQUEST_COLUMNS = """r.id, r.plan_id, r.requester_member_id, r.client_message_id, r.message_id,
    r.seq, r.status, r.final_client_message_id, r.final_message_id"""
SELECT_REQUEST = f"SELECT {_REQUEST_COLUMNS} FROM workflow_requests r WHERE r.id = %s"
SELECT_REQUEST_BY_CLIENT_ID = f"""
SELECT {_REQUEST_COLUMNS} FROM workflow_requests r
WHERE r.plan_id = %s AND r.requester_member_id = %s AND r.client_message_id = %s
"""
# The superseded request's wakes the worker has not delivered are withdrawn:
# the agent holds the wake of the current request alone.
SUPERSEDE = """
WITH old AS (
    UPDATE workflow_requests SET status = 'superseded', updated_at = now()
    WHERE plan_id = %(plan)s AND status = 'active'
    RETURNING message_id
)
UPDATE scope_fanout_outbox o
SET status = 'suppressed', suppressed_at = now(), suppression_reason = 'superseded',
    lease_owner = NULL, lease_expires_at = NULL
FROM old
WHERE o.message_id = old.message_id AND o.fanout_type = 'agent_wake'
  AND o.status IN ('pending', 'leased')
"""
INSERT_REQUEST = """
INSERT INTO workflow_requests (id, plan_id, requester_member_id, client_message_id)
VALUES (%s, %s, %s, %s)
"""
# A request superseded while its message was being appended holds no wake either.
SET_REQUEST_MESSAGE = """
WITH written AS (
    UPDATE workflow_requests SET message_id = %(message)s, seq = %(seq)s, updated_at = now()
    WHERE id = %(request)s AND message_id IS NULL
    RETURNING status
)
UPDATE scope_fanout_outbox o
SET status = 'suppressed', suppressed_at = now(), suppression_reason = 'superseded',
    lease_owner = NULL, lease_expires_at = NULL
FROM written
WHERE written.status <> 'active' AND o.message_id = %(message)s
  AND o.fanout_type = 'agent_wake' AND o.status IN ('pending', 'leased')
"""
SET_STATUS = "UPDATE workflow_requests SET status = %s, updated_at = now() WHERE id = %s"
CLAIM_FINAL = """
UPDATE workflow_requests SET final_client_message_id = %s, updated_at = now() WHERE id = %s
"""
RELEASE_FINAL = """
UPDATE workflow_requests SET final_client_message_id = NULL, updated_at = now()
WHERE id = %s AND final_message_id IS NULL AND final_client_message_id = %s
"""
ANSWER = """
UPDATE workflow_requests
SET final_message_id = %s, status = CASE WHEN status = 'active' THEN 'answered' ELSE status END,
    updated_at = now()
WHERE id = %s AND final_message_id IS NULL
RETURNING plan_id
"""
NEW_DRAFT = """
UPDATE workflow_plans SET draft = %s, revision = revision + 1, updated_at = now()
WHERE id = %s
"""


@dataclass(frozen=True, slots=True)
class Plan:
    id: str
    scope_id: str
    title: str
    status: str
    creator_id: str
    agent_id: str
    shared_with: tuple[str, ...]
    draft: str
    revision: int
    latest_seq: int
    workspace_id: str
    active_request_id: str | None

    def reads(self, member_id: str) -> bool:
        """The plan's authoring gate: its creator and the humans it is shared with."""
        return member_id == self.creator_id or member_id in self.shared_with

    @property
    def audience(self) -> list[str]:
        return [self.creator_id, *self.shared_with]


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    plan_id: str
    requester_id: str
    client_message_id: str
    message_id: str | None
    seq: int | None
    status: str
    final_claim: str | None
    final_message_id: str | None


def _plan(row: Sequence[Any]) -> Plan:
    return Plan(
        id=row[0],
        scope_id=row[1],
        title=row[2],
        status=row[3],
        creator_id=row[4],
        agent_id=row[5],
        shared_with=tuple(row[6]),
        draft=row[7],
        revision=int(row[8]),
        latest_seq=int(row[9]),
        workspace_id=row[10],
        active_request_id=row[11],
    )


def _request(row: Sequence[Any]) -> Request:
    return Request(
        id=row[0],
        plan_id=row[1],
        requester_id=row[2],
        client_message_id=row[3],
        message_id=row[4],
        seq=None if row[5] is None else int(row[5]),
        status=row[6],
        final_claim=row[7],
        final_message_id=row[8],
    )


async def _join(conn: TrioConnection, scope_id: str, member: Member) -> None:
    private = member.is_private_agent
    await conn.execute(
        INSERT_MEMBERSHIP,
        {
            "scope_id": scope_id,
            "member_id": member.id,
            "visibility": "private" if private else "public",
            "owner_id": member.owner_member_id if private else None,
        },
    )
    await conn.execute(UPSERT_NOTIFICATION, (scope_id, member.id, NotificationState.ACTIVE.value))


async def _select_plan(conn: TrioConnection, plan_id: str) -> Plan | None:
    cur = await conn.execute(SELECT_PLAN, (plan_id,))
    row = await cur.fetchone()
    return _plan(row) if row else None


async def create_plan(conn: TrioConnection, *, creator: Member, agent: Member, title: str) -> Plan:
    """The plan, its scope, the creator's and the agent's memberships: one transaction."""
    plan_id = new_id("wfp")
    scope_id = new_id("scp")
    workspace_id = creator.workspace_id
    with map_errors():
        async with conn.transaction():
            await conn.execute(
                INSERT_SCOPE,
                (scope_id, workspace_id, "workflow", f"workflow:{plan_id}", creator.id, None, None),
            )
            await conn.execute(
                INSERT_PLAN, (plan_id, workspace_id, scope_id, title, creator.id, agent.id)
            )
            await _join(conn, scope_id, creator)
            await _join(conn, scope_id, agent)
            plan = await _select_plan(conn, plan_id)
    assert plan is not None
    return plan


async def get_plan(conn: TrioConnection, plan_id: str) -> Plan | None:
    with map_errors():
        return await _select_plan(conn, plan_id)


async def share_plan(conn: TrioConnection, plan: Plan, member: Member) -> Plan:
    """Add a human to the plan's readers; it becomes a member of the scope (to send requests)."""
    with map_errors():
        async with conn.transaction():
            await conn.execute(LOCK_PLAN, (plan.id,))
            await conn.execute(SHARE, {"plan": plan.id, "member": member.id})
            cur = await conn.execute(IS_MEMBER, (plan.scope_id, member.id))
            if await cur.fetchone() is None:
                await conn.execute(BUMP_ROSTER, (plan.scope_id,))
                await _join(conn, plan.scope_id, member)
            shared = await _select_plan(conn, plan.id)
    assert shared is not None
    return shared


async def update_plan(
    conn: TrioConnection, plan_id: str, *, status: str | None, title: str | None
) -> Plan | None:
    """A new status or title; the plan's scope is left as it is."""
    with map_errors():
        async with conn.transaction():
            await conn.execute(UPDATE_PLAN, {"plan": plan_id, "status": status, "title": title})
            return await _select_plan(conn, plan_id)


async def list_plans(conn: TrioConnection, member: Member) -> list[Plan]:
    with map_errors():
        cur = await conn.execute(
            LIST_PLANS, {"workspace": member.workspace_id, "member": member.id}
        )
        rows = await cur.fetchall()
    return [_plan(row) for row in rows]


async def get_request(conn: TrioConnection, request_id: str) -> Request | None:
    with map_errors():
        cur = await conn.execute(SELECT_REQUEST, (request_id,))
        row = await cur.fetchone()
    return _request(row) if row else None


async def open_request(
    conn: TrioConnection, plan_id: str, requester_id: str, client_message_id: str
) -> tuple[Request, bool] | None:
    """The request for this ``clientMessageId`` (``False``: it existed already) or a new
    one, made the plan's active request under the plan's row lock; None while the
    plan is archived."""
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(LOCK_PLAN, (plan_id,))
            locked = await cur.fetchone()
            if locked is None or locked[0] == ARCHIVED:
                return None
            cur = await conn.execute(
                SELECT_REQUEST_BY_CLIENT_ID, (plan_id, requester_id, client_message_id)
            )
            row = await cur.fetchone()
            if row is not None:
                return _request(row), False
            await conn.execute(SUPERSEDE, {"plan": plan_id})
            request_id = new_id("wfr")
            await conn.execute(
                INSERT_REQUEST, (request_id, plan_id, requester_id, client_message_id)
            )
            cur = await conn.execute(SELECT_REQUEST, (request_id,))
            row = await cur.fetchone()
    assert row is not None
    return _request(row), True


async def request_written(conn: TrioConnection, request_id: str, message_id: str, seq: int) -> None:
    with map_errors():
        await conn.execute(
            SET_REQUEST_MESSAGE, {"request": request_id, "message": message_id, "seq": seq}
        )


async def request_failed(conn: TrioConnection, request_id: str) -> None:
    """A request whose message was refused holds no wake."""
    with map_errors():
        await conn.execute(SET_STATUS, (FAILED, request_id))


@dataclass(frozen=True, slots=True)
class ReplyCheck:
    """Why a reply may or may not be written now: ``ok``, ``retry`` (the same final
    reply again), ``superseded``, ``answered`` or ``claimed`` (another final reply)."""

    outcome: str
    request: Request


async def begin_reply(
    conn: TrioConnection, request: Request, *, final: bool, client_message_id: str
) -> ReplyCheck:
    """Under the plan's row lock: is the request still the one holding the agent's
    wake, and (a final reply) is its final reply still free? A final reply claims it."""
    with map_errors():
        async with conn.transaction():
            await conn.execute(LOCK_PLAN, (request.plan_id,))
            cur = await conn.execute(SELECT_REQUEST, (request.id,))
            row = await cur.fetchone()
            assert row is not None
            now = _request(row)
            if now.final_claim is not None and now.final_claim == client_message_id:
                return ReplyCheck("retry", now)
            if now.status == SUPERSEDED or now.status == FAILED:
                return ReplyCheck("superseded", now)
            if now.final_message_id is not None or now.status == ANSWERED:
                return ReplyCheck("answered", now)
            if now.final_claim is not None:
                return ReplyCheck("claimed", now)
            if final:
                await conn.execute(CLAIM_FINAL, (client_message_id, request.id))
    return ReplyCheck("ok", now)


async def release_final(conn: TrioConnection, request_id: str, client_message_id: str) -> None:
    """The claimed final reply was not written: the request may be answered again."""
    with map_errors():
        await conn.execute(RELEASE_FINAL, (request_id, client_message_id))


async def finish_final(
    conn: TrioConnection, request: Request, message_id: str, content: str
) -> Plan | None:
    """The final reply was written: the request is answered and its content is the
    plan's draft, one revision up (once, whoever records it first)."""
    with map_errors():
        async with conn.transaction():
            await conn.execute(LOCK_PLAN, (request.plan_id,))
            cur = await conn.execute(ANSWER, (message_id, request.id))
            if await cur.fetchone() is not None:
                await conn.execute(NEW_DRAFT, (content, request.plan_id))
            return await _select_plan(conn, request.plan_id)
