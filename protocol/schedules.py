"""Schedule frames (docs/schedules.md): messages that post themselves on time.

Kept apart from :mod:`protocol.frames`, whose unions name them; the shapes
follow the same rules (camelCase on the wire, tag field ``type``). No I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

RequestId = int | str
Identifier = Annotated[str, Meta(min_length=1, max_length=128)]
ShortText = Annotated[str, Meta(min_length=1, max_length=256)]
Content = Annotated[str, Meta(min_length=1, max_length=16_000, extra={"text": "content"})]
Every = Literal["day", "weekday", "week", "month", "interval"]
ZoneName = Annotated[str, Meta(min_length=1, max_length=64)]


class _Frame(Struct, tag_field="type", rename="camel", kw_only=True):
    pass


class RuleIn(Struct, rename="camel", kw_only=True, omit_defaults=True):
    """A recurrence: ``every`` ``day``, ``weekday`` (Monday–Friday), ``week`` (with
    ``weekday``: ``monday`` … ``sunday``) or ``month`` (with ``day`` 1–31; a
    shorter month fires on its last day) at the local wall ``time`` (``HH:MM``) of
    the schedule's ``timeZone``; or ``interval``: every ``seconds`` from creation."""

    every: Every
    time: Annotated[str, Meta(max_length=5)] | None = None
    weekday: Annotated[str, Meta(max_length=9)] | None = None
    day: int | None = None
    seconds: Annotated[int, Meta(ge=1, le=31_622_400)] | None = None


class CreateSchedule(_Frame, tag="createSchedule"):
    """Post ``content`` into ``target`` at ``at`` (an RFC 3339 time, once) or at each
    occurrence of ``rule``: exactly one of the two. ``target`` is a channel
    (``#slug`` or ``scope:<id>``) the caller may post in, or ``me``: the caller's
    DM with the workspace's schedule service (a reminder). The messages are
    authored by the schedule service with the caller as the owner."""

    id: RequestId
    target: ShortText
    content: Content
    at: Annotated[str, Meta(max_length=64)] | None = None
    rule: RuleIn | None = None
    time_zone: ZoneName = "UTC"


class UpdateSchedule(_Frame, tag="updateSchedule"):
    """Change a schedule of the caller's: any field given replaces the stored one
    (``at`` and ``rule`` replace each other); the next occurrence is computed again."""

    id: RequestId
    schedule_id: Identifier
    target: ShortText | None = None
    content: Content | None = None
    at: Annotated[str, Meta(max_length=64)] | None = None
    rule: RuleIn | None = None
    time_zone: ZoneName | None = None


class PauseSchedule(_Frame, tag="pauseSchedule"):
    """Pause (``paused: true``) or resume a schedule of the caller's. A resumed
    rule fires from its next occurrence after now (what fell due while it was
    paused is not sent); a resumed one-off not sent yet is sent at its time, or
    at once if that has passed."""

    id: RequestId
    schedule_id: Identifier
    paused: bool


class DeleteSchedule(_Frame, tag="deleteSchedule"):
    """Delete a schedule of the caller's; messages it already posted stay."""

    id: RequestId
    schedule_id: Identifier


class Schedules(_Frame, tag="schedules"):
    """The caller's schedules, oldest first."""

    id: RequestId


class ScheduleEntry(Struct, rename="camel", kw_only=True):
    """One schedule: ``nextAt`` is null once a one-off has fired. ``lastRun``
    is ``{occurrenceAt, outcome: sent|skipped, messageId?, scopeId?, reason?}``."""

    schedule_id: str
    target_scope_id: str
    content: str
    time_zone: str
    paused: bool
    fired: int
    created_at: str
    next_at: str | None = None
    at: str | None = None
    rule: dict[str, Any] | None = None
    last_run: dict[str, Any] | None = None


RESULTS: dict[str, str] = {
    "createSchedule": (
        "`{scheduleId, nextAt, schedule: ScheduleEntry}`. `validation_failed` at the field"
        " at fault: neither or both of `at` and `rule`, an `at` that is not an RFC 3339"
        " time with an offset or is in the past, a rule field missing or out of range,"
        " an unknown `timeZone`, a target that is not a channel or `me`. A channel the"
        " caller cannot post in is `forbidden` (one it may not know of, `not_found`)."
        " Humans only: an agent or a service gets `forbidden`. See"
        " [schedules.md](schedules.md)."
    ),
    "updateSchedule": (
        "`{schedule: ScheduleEntry}`; the fields as for `createSchedule`. Another"
        " member's schedule is `not_found`."
    ),
    "pauseSchedule": "`{schedule: ScheduleEntry}`. Another member's schedule is `not_found`.",
    "deleteSchedule": "`{deleted: true}`. Another member's schedule is `not_found`.",
    "schedules": "`{schedules: [ScheduleEntry]}`: the caller's own, oldest first.",
}
