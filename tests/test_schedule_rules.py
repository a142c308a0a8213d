"""Next occurrences of schedule rules (actors/schedule_rules.py) with fixed clocks:
wall times hold across daylight-saving changes, a skipped hour fires past the
gap, a repeated one fires once, short months fire on their last day."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from actors.schedule_rules import RuleError, next_occurrence, parse_rule, zone

NEW_YORK = zone("America/New_York")
BERLIN = zone("Europe/Berlin")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def occurrences(rule: str, count: int, after: datetime, tz: str, **fields: object) -> list[str]:
    parsed = parse_rule(rule, **fields)  # type: ignore[arg-type]
    out: list[str] = []
    for _ in range(count):
        after = next_occurrence(parsed, zone(tz), after, after)
        out.append(after.astimezone(zone(tz)).isoformat())
    return out


def test_weekly_keeps_the_wall_time_across_spring_and_autumn() -> None:
    # New York moves its clocks on Sunday 2026-03-08 and Sunday 2026-11-01.
    spring = occurrences(
        "week", 2, utc(2026, 3, 1), "America/New_York", clock="09:30", weekday="monday"
    )
    assert spring == ["2026-03-02T09:30:00-05:00", "2026-03-09T09:30:00-04:00"]
    autumn = occurrences(
        "week", 2, utc(2026, 10, 20), "America/New_York", clock="09:30", weekday="monday"
    )
    assert autumn == ["2026-10-26T09:30:00-04:00", "2026-11-02T09:30:00-05:00"]
    # The same local time is a different UTC hour on each side.
    assert next_occurrence(
        parse_rule("week", "09:30", "monday"), NEW_YORK, utc(2026, 3, 3), utc(2026, 3, 3)
    ) == utc(2026, 3, 9, 13, 30)


def test_a_skipped_wall_time_fires_past_the_gap_and_a_repeated_one_once() -> None:
    # Berlin skips 02:00-03:00 on 2026-03-29 and repeats 02:00-03:00 on 2026-10-25.
    skipped = occurrences("day", 3, utc(2026, 3, 27, 12), "Europe/Berlin", clock="02:30")
    assert skipped == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:30:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    repeated = occurrences("day", 3, utc(2026, 10, 23, 12), "Europe/Berlin", clock="02:30")
    assert repeated == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_weekdays_months_and_intervals() -> None:
    friday = utc(2026, 12, 4, 20)  # a Friday evening in UTC
    assert occurrences("weekday", 2, friday, "UTC", clock="09:00") == [
        "2026-12-07T09:00:00+00:00",
        "2026-12-08T09:00:00+00:00",
    ]
    assert occurrences("month", 3, utc(2027, 1, 1), "UTC", clock="08:00", day=31) == [
        "2027-01-31T08:00:00+00:00",
        "2027-02-28T08:00:00+00:00",
        "2027-03-31T08:00:00+00:00",
    ]
    start = utc(2026, 1, 1)
    every = parse_rule("interval", None, seconds=90)
    assert next_occurrence(every, BERLIN, start, start) == utc(2026, 1, 1, 0, 1, 30)
    # A late claimer gets the first occurrence after what it asks about, on the grid.
    assert next_occurrence(every, BERLIN, utc(2026, 1, 1, 0, 4), start) == utc(2026, 1, 1, 0, 4, 30)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"every": "hourly", "clock": "09:00"}, "every"),
        ({"every": "day", "clock": "9:00"}, "time"),
        ({"every": "day", "clock": None}, "time"),
        ({"every": "week", "clock": "09:00", "weekday": "someday"}, "weekday"),
        ({"every": "month", "clock": "09:00", "day": 0}, "day"),
        ({"every": "interval", "clock": None, "seconds": 0}, "seconds"),
    ],
)
def test_bad_rules_name_their_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_rule(**fields)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_unknown_zone() -> None:
    with pytest.raises(RuleError) as caught:
        zone("Atlantis/Capital")
    assert caught.value.field == "timeZone"


def test_the_scheduler_advances_a_weekly_schedule_across_the_change() -> None:
    """What the scheduler stores as ``next_at`` after posting an occurrence."""
    from node.ops.schedules import next_at
    from storage.schedules import Schedule

    created = utc(2026, 2, 20)
    weekly = Schedule(
        "sch_x", "ws_x", "mem_x", "scp_x", "stand-up", None,
        {"every": "week", "weekday": "monday", "time": "09:30"},
        "America/New_York", created, utc(2026, 3, 2, 14, 30), False, 2, None, created,
    )  # fmt: skip
    assert next_at(weekly, utc(2026, 3, 2, 14, 30)) == utc(2026, 3, 9, 13, 30)
    assert next_at(weekly, utc(2026, 10, 26, 13, 30)) == utc(2026, 11, 2, 14, 30)
    once = Schedule(
        "sch_y", "ws_x", "mem_x", "scp_x", "once", utc(2026, 3, 2), None,
        "UTC", created, utc(2026, 3, 2), False, 1, None, created,
    )  # fmt: skip
    assert next_at(once, utc(2026, 3, 2)) is None  # a one-off that fired is done
