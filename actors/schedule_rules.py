"""When a schedule fires next (docs/schedules.md): pure, no clock of its own.

A rule is a local wall time in an IANA zone: ``day`` (every day), ``weekday``
(Monday to Friday), ``week`` (one weekday), ``month`` (one day of the month;
a month without that day fires on its last day), or ``interval`` (every N
seconds, from the schedule's start, which has no wall time). Occurrences are
computed from the rule and the zone, never by adding 24 hours, so a
daylight-saving change keeps the wall time: 09:30 stays 09:30 local on both
sides. A wall time that does not exist that day (the hour skipped in spring)
fires at the same distance past the gap (02:30 → 03:30); one that happens
twice (the hour repeated in autumn) fires once, at the first.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

EVERY = ("day", "weekday", "week", "month", "interval")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
# Far enough for "the last day of next month" and any weekday; a guard, not a limit.
_SEARCH_DAYS = 400


class RuleError(ValueError):
    """A rule or zone that names no time: ``field`` is the request field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Rule:
    every: str
    at: time = time(0, 0)  # the local wall time (not used by ``interval``)
    weekday: int | None = None  # 0 = Monday, for ``week``
    day: int | None = None  # 1..31, for ``month``
    seconds: int | None = None  # for ``interval``

    def view(self) -> dict[str, object]:
        """The rule as the protocol shows it."""
        if self.every == "interval":
            return {"every": "interval", "seconds": self.seconds}
        shown: dict[str, object] = {"every": self.every, "time": self.at.strftime("%H:%M")}
        if self.weekday is not None:
            shown["weekday"] = WEEKDAYS[self.weekday]
        if self.day is not None:
            shown["day"] = self.day
        return shown


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``RuleError`` at ``timeZone`` when there is none)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise RuleError("timeZone", f"unknown time zone {name!r}") from exc


def parse_rule(
    every: str,
    clock: str | None,
    weekday: str | None = None,
    day: int | None = None,
    seconds: int | None = None,
) -> Rule:
    """A rule from its request fields; ``RuleError`` names the field at fault."""
    if every not in EVERY:
        raise RuleError("every", f"every must be one of {', '.join(EVERY)}")
    if every == "interval":
        if seconds is None or seconds < 1:
            raise RuleError("seconds", "an interval rule needs seconds >= 1")
        return Rule("interval", seconds=seconds)
    if clock is None or not _CLOCK.match(clock):
        raise RuleError("time", "time must be HH:MM (24-hour)")
    at = time(int(clock[:2]), int(clock[3:]))
    if every == "week":
        if weekday is None or weekday.lower() not in WEEKDAYS:
            raise RuleError("weekday", "a weekly rule needs weekday (monday … sunday)")
        return Rule("week", at, weekday=WEEKDAYS.index(weekday.lower()))
    if every == "month":
        if day is None or not 1 <= day <= 31:
            raise RuleError("day", "a monthly rule needs day 1 … 31")
        return Rule("month", at, day=day)
    return Rule(every, at)


def local_instant(on: date, at: time, tz: ZoneInfo) -> datetime:
    """The instant the wall clock in ``tz`` shows ``at`` on ``on`` (module docstring
    for the skipped and repeated hours), in UTC."""
    # fold=0 reads a repeated hour as its first and a skipped one with the
    # offset before the gap, which lands past the gap by the same distance.
    return datetime.combine(on, at, tzinfo=tz).astimezone(UTC)


def _matches(rule: Rule, on: date) -> bool:
    if rule.every == "weekday":
        return on.weekday() < 5
    if rule.every == "week":
        return on.weekday() == rule.weekday
    if rule.every == "month":
        assert rule.day is not None
        last = calendar.monthrange(on.year, on.month)[1]
        return on.day == min(rule.day, last)
    return True


def next_occurrence(rule: Rule, tz: ZoneInfo, after: datetime, start: datetime) -> datetime:
    """The first occurrence strictly after ``after`` (UTC-aware).

    ``start`` anchors an ``interval`` rule (its occurrences are start + k·seconds);
    calendar rules ignore it.
    """
    if rule.every == "interval":
        assert rule.seconds is not None
        if after < start:
            return start
        steps = int((after - start).total_seconds() // rule.seconds) + 1
        return start + timedelta(seconds=steps * rule.seconds)
    on = after.astimezone(tz).date()
    for _ in range(_SEARCH_DAYS):
        if _matches(rule, on):
            instant = local_instant(on, rule.at, tz)
            if instant > after:
                return instant
        on += timedelta(days=1)
    raise RuleError("every", "the rule never fires")  # unreachable for a parsed rule
