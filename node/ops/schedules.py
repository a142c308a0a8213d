"""``createSchedule``, ``updateSchedule``, ``pauseSchedule``, ``deleteSchedule``,
``schedules``: a human's messages that post themselves on time (docs/schedules.md).

The caller is the schedule's owner, the authorisation principal every run
is checked against; the messages are the workspace's schedule service's.
Only humans own schedules. A schedule is its owner's alone: another
member's id answers ``not_found``, as one that does not exist.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import msgspec

from actors.model import Member, MemberType, ScopeType
from actors.schedule_rules import RuleError, next_occurrence, parse_rule, zone
from actors.scope_roster import RosterCommand
from node.ops.context import Context, member_of
from node.ops.messages import check_moderation
from node.views import rfc3339
from protocol.errors import ErrorCode, OperationError
from protocol.schedules import (
    CreateSchedule,
    DeleteSchedule,
    PauseSchedule,
    RuleIn,
    ScheduleEntry,
    UpdateSchedule,
)
from storage import schedules, scopes
from storage.schedules import Schedule

ME = "me"
Change = CreateSchedule | UpdateSchedule | PauseSchedule | DeleteSchedule


def entry(schedule: Schedule) -> dict[str, Any]:
    view = ScheduleEntry(
        schedule_id=schedule.id,
        target_scope_id=schedule.target_scope_id,
        content=schedule.content,
        time_zone=schedule.time_zone,
        paused=schedule.paused,
        fired=schedule.fired,
        created_at=rfc3339(schedule.created_at),
        next_at=rfc3339(schedule.next_at) if schedule.next_at is not None else None,
        at=rfc3339(schedule.at) if schedule.at is not None else None,
        rule=schedule.rule,
        last_run=schedule.last_run,
    )
    return msgspec.to_builtins(view)  # type: ignore[no-any-return]


def _invalid(field: str, message: str) -> OperationError:
    return OperationError(ErrorCode.VALIDATION_FAILED, message, path=f"$.{field}")


def _owner(ctx: Context) -> Member:
    member = member_of(ctx)
    if member.type is not MemberType.HUMAN:
        raise OperationError(ErrorCode.FORBIDDEN, "only a human owns schedules")
    return member


def _rule(rule: RuleIn) -> dict[str, Any]:
    try:
        parsed = parse_rule(rule.every, rule.time, rule.weekday, rule.day, rule.seconds)
    except RuleError as exc:
        raise _invalid(f"rule.{exc.field}", str(exc)) from None
    return parsed.view()


def _at(text: str, now: datetime) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise _invalid("at", "at must be an RFC 3339 time") from None
    if at.tzinfo is None:
        raise _invalid("at", "at needs an offset (Z or ±HH:MM)")
    if at < now:
        raise _invalid("at", "at is in the past")
    return at.astimezone(UTC)


def next_at(schedule: Schedule, after: datetime) -> datetime | None:
    """The schedule's first occurrence after ``after`` (a one-off: its time, until it fired)."""
    if schedule.rule is None:
        return schedule.at if schedule.fired == 0 else None
    rule = schedule.rule
    parsed = parse_rule(
        rule["every"], rule.get("time"), rule.get("weekday"), rule.get("day"), rule.get("seconds")
    )
    return next_occurrence(parsed, zone(schedule.time_zone), after, schedule.starts_at)


async def _target(ctx: Context, owner: Member, target: str) -> str:
    """The scope a schedule posts into, with the schedule service in it: a channel
    the owner may post in (the owner invites the service) or ``me``."""
    services = ctx.services
    async with services.pool.connection() as conn:
        service = await schedules.schedule_service(conn, owner.workspace_id)
        if target == ME:
            return await scopes.get_or_create_dm(conn, owner, service)
    scope_id = await services.resolver.resolve(owner, target)
    info = await services.resolver.scope(owner, scope_id, "$.target")
    if info.type is not ScopeType.CHANNEL:
        raise _invalid("target", "a schedule posts into a channel or `me`")
    async with services.pool.connection() as conn:
        if not await schedules.is_current_member(conn, scope_id, owner.id):
            raise OperationError(ErrorCode.FORBIDDEN, "not a member of this channel")
        joined = await schedules.is_current_member(conn, scope_id, service.id)
    if not joined:
        await services.registry.ask(scope_id, RosterCommand("invite", owner, service, _noop))
    return scope_id


def _noop(_: Any) -> None:
    pass


async def create(ctx: Context, request: CreateSchedule) -> dict[str, Any]:
    owner = _owner(ctx)
    now = datetime.now(UTC)
    if (request.at is None) == (request.rule is None):
        raise _invalid("at", "give exactly one of at and rule")
    try:
        zone(request.time_zone)
    except RuleError as exc:
        raise _invalid("timeZone", str(exc)) from None
    at = _at(request.at, now) if request.at is not None else None
    rule = _rule(request.rule) if request.rule is not None else None
    scope_id = await _target(ctx, owner, request.target)
    # The keyword list an owner's own send passes, checked when it is written.
    await check_moderation(ctx.services, owner, f"scope:{scope_id}", request.content)
    draft = Schedule(
        "", owner.workspace_id, owner.id, scope_id, request.content, at, rule,
        request.time_zone, now, None, False, 0, None, now,
    )  # fmt: skip
    async with ctx.services.pool.connection() as conn:
        created = await schedules.create(
            conn,
            owner=owner,
            target_scope_id=scope_id,
            content=request.content,
            at=at,
            rule=rule,
            time_zone=request.time_zone,
            starts_at=now,
            next_at=next_at(draft, now),
        )
    ctx.services.scheduler_wake()
    shown = entry(created)
    return {"scheduleId": created.id, "nextAt": shown["nextAt"], "schedule": shown}


async def _update(ctx: Context, owner: Member, request: UpdateSchedule) -> Schedule:
    now = datetime.now(UTC)
    if request.at is not None and request.rule is not None:
        raise _invalid("at", "give at most one of at and rule")
    if request.time_zone is not None:
        try:
            zone(request.time_zone)
        except RuleError as exc:
            raise _invalid("timeZone", str(exc)) from None
    at = _at(request.at, now) if request.at is not None else None
    rule = _rule(request.rule) if request.rule is not None else None
    scope_id = await _target(ctx, owner, request.target) if request.target is not None else None
    if request.content is not None:
        await check_moderation(ctx.services, owner, request.target or "me", request.content)
    return await _edit(
        ctx,
        owner,
        request.schedule_id,
        lambda s: replace(
            s,
            target_scope_id=scope_id or s.target_scope_id,
            content=request.content or s.content,
            time_zone=request.time_zone or s.time_zone,
            **_timing(s, at, rule, now),
        ),
    )


def _timing(
    schedule: Schedule, at: datetime | None, rule: dict[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """A new one-off time or rule replaces the other and starts the schedule afresh."""
    if at is not None:
        return {"at": at, "rule": None, "fired": 0, "starts_at": now}
    if rule is not None:
        return {"at": None, "rule": rule, "starts_at": now}
    return {}


async def _edit(ctx: Context, owner: Member, schedule_id: str, edit: Any) -> Schedule:
    now = datetime.now(UTC)
    async with ctx.services.pool.connection() as conn, schedules.locked(conn, schedule_id) as found:
        if found is None or found.owner_member_id != owner.id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such schedule", path="$.scheduleId")
        changed = edit(found)
        changed = replace(changed, next_at=next_at(changed, now))
        saved = await schedules.save(conn, changed)
    ctx.services.scheduler_wake()
    return saved


async def change(ctx: Context, request: Change) -> dict[str, Any]:
    owner = _owner(ctx)
    match request:
        case CreateSchedule():
            return await create(ctx, request)
        case UpdateSchedule():
            return {"schedule": entry(await _update(ctx, owner, request))}
        case PauseSchedule():
            paused = request.paused
            saved = await _edit(
                ctx, owner, request.schedule_id, lambda s: replace(s, paused=paused)
            )
            return {"schedule": entry(saved)}
    async with (
        ctx.services.pool.connection() as conn,
        schedules.locked(conn, request.schedule_id) as found,
    ):
        if found is None or found.owner_member_id != owner.id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such schedule", path="$.scheduleId")
        await schedules.delete(conn, found.id)
    return {"deleted": True}


async def list_schedules(ctx: Context) -> dict[str, Any]:
    owner = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        found = await schedules.owned_by(conn, owner.id)
    return {"schedules": [entry(s) for s in found]}
