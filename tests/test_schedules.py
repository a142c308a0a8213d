"""Schedules over the protocol (docs/schedules.md), one node per test.

The message of a run is the schedule service's, caused by a ``schedule_run``
source naming the schedule, the occurrence and the owner; the owner's
mention notifies; an owner who left the channel has the run skipped and is
told in their DM with the service; a one-off due while the node was down
fires once, late, when it starts; an occurrence stored before its claim was
committed is not stored again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from node.client import Client
from node.scheduler import superseded
from storage.pg import connect
from tests.nodes import World, make_channel, running_node

SOON = 1.0  # seconds ahead of now for a one-off the test waits for


def soon(seconds: float = SOON) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def refused(client: Client, op: str, **fields: Any) -> tuple[str, str | None]:
    answer = await client.request_frame({"type": op, "id": f"x-{op}", **fields})
    assert answer["type"] == "error", answer
    return str(answer["code"]), (answer.get("details") or {}).get("path")


async def arrival(client: Client, scope_id: str, timeout: float = 10) -> dict[str, Any]:
    events = await client.events_until(
        lambda e: e.get("type") == "message" and e["message"]["scopeId"] == scope_id, timeout
    )
    return dict(events[-1]["message"])


async def last_run(client: Client, schedule_id: str) -> dict[str, Any]:
    """The schedule's ``lastRun`` once the claim that posted it has committed
    (the message reaches readers a moment before)."""
    while True:
        found = {s["scheduleId"]: s for s in await client.schedules()}
        if found[schedule_id]["lastRun"] is not None:
            return dict(found[schedule_id]["lastRun"])
        await trio.sleep(0.02)


async def test_schedule_runs_as_the_schedule_service(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            ann, bob = await world.members("ann", "bob")
            agent = await world.member("helper", MemberType.AGENT)
            async with (
                world.client(ann) as a,
                world.client(bob) as b,
                world.client(agent) as robot,
            ):
                ops = await make_channel(a, "ops", b)
                await _validation(a, robot)
                made = await a.create_schedule(
                    "#ops", "stand-up time @bob", at=soon(), time_zone="Europe/Berlin"
                )
                message = await arrival(b, ops)
                assert message["author"]["type"] == "service"
                assert message["author"]["handle"] == "schedule"
                run = message["sources"][0]
                assert run == {
                    "kind": "schedule_run",
                    "scheduleId": made["scheduleId"],
                    "occurrenceAt": made["nextAt"],
                    "ownerMemberId": ann.id,
                }
                assert message["mentions"] == ["bob"]  # bob is notified as by any mention
                history = await b.history(f"scope:{ops}")
                assert history["messages"][-1]["sources"][0] == run
                last = await last_run(a, made["scheduleId"])
                (entry,) = await a.schedules()
                assert entry["nextAt"] is None
                assert entry["fired"] == 1
                assert last["outcome"] == "sent"
                assert last["messageId"] == message["id"]
                assert last["explain"]["owner"] == ann.id
                assert last["explain"]["scheduleId"] == made["scheduleId"]
                assert last["explain"]["author"] == message["author"]["memberId"]
                people = {p["id"]: p for p in (await b.request("people"))["people"]}
                assert people[message["author"]["memberId"]]["serviceKind"] == "schedule"
                assert await b.schedules() == []  # a schedule is its owner's alone
                assert (await refused(b, "deleteSchedule", scheduleId=made["scheduleId"]))[
                    0
                ] == "not_found"

                # "Remind me": a one-off into the owner's DM with the schedule service.
                await a.create_schedule("me", "stretch", at=soon())
                reminder = await a.events_until(
                    lambda e: e.get("type") == "message" and e["message"]["content"] == "stretch",
                    10,
                )
                dm = reminder[-1]["message"]["scopeId"]
                assert reminder[-1]["message"]["author"]["handle"] == "schedule"

                # The owner left the channel: the run is skipped and the owner told.
                left = await a.create_schedule("#ops", "nobody hears this", at=soon())
                await a.request("leave", scopeId=ops)
                notice = await arrival(a, dm)
                assert "Skipped a scheduled message to #ops" in notice["content"]
                assert notice["sources"][0]["scheduleId"] == left["scheduleId"]
                assert (await last_run(a, left["scheduleId"]))["outcome"] == "skipped"
                texts = [m["content"] for m in (await b.history(f"scope:{ops}"))["messages"]]
                assert "nobody hears this" not in texts

                # Edit, pause, resume, delete.
                weekly = await a.create_schedule(
                    "me",
                    "retro",
                    rule={"every": "week", "weekday": "friday", "time": "16:00"},
                    time_zone="America/New_York",
                )
                sid = weekly["scheduleId"]
                moved = await a.update_schedule(sid, rule={"every": "weekday", "time": "09:30"})
                assert moved["rule"] == {"every": "weekday", "time": "09:30"}
                assert (await a.pause_schedule(sid))["paused"] is True
                assert (await a.pause_schedule(sid, paused=False))["paused"] is False
                await a.delete_schedule(sid)
                assert sid not in {s["scheduleId"] for s in await a.schedules()}


async def _validation(a: Client, robot: Client) -> None:
    rule = {"every": "day", "time": "09:00"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"target": "#ops", "content": "x"}, "$.at"),
        ({"target": "#ops", "content": "x", "at": soon(), "rule": rule}, "$.at"),
        ({"target": "#ops", "content": "x", "at": "tomorrow"}, "$.at"),
        ({"target": "#ops", "content": "x", "at": "2020-01-01T00:00:00Z"}, "$.at"),
        ({"target": "#ops", "content": "x", "at": "2099-01-01T00:00:00"}, "$.at"),
        ({"target": "#ops", "content": "x", "rule": {"every": "day", "time": "25:00"}}, "$.rule.time"),
        ({"target": "#ops", "content": "x", "rule": {"every": "week", "time": "09:00"}}, "$.rule.weekday"),
        ({"target": "#ops", "content": "x", "rule": {"every": "month", "time": "09:00", "day": 32}}, "$.rule.day"),
        ({"target": "#ops", "content": "x", "rule": rule, "timeZone": "Mars/Base"}, "$.timeZone"),
    ]  # fmt: skip
    for fields, path in cases:
        assert await refused(a, "createSchedule", **fields) == ("validation_failed", path), fields
    assert (await refused(a, "createSchedule", target="#nope", content="x", rule=rule))[
        0
    ] == "not_found"
    assert (await refused(robot, "createSchedule", target="me", content="x", rule=rule))[
        0
    ] == "forbidden"
    assert (await refused(a, "pauseSchedule", scheduleId="sch_nope", paused=True)) == (
        "not_found",
        "$.scheduleId",
    )


async def test_missed_and_replayed_occurrences_are_stored_once(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            (ann,) = await world.members("ann")
            async with world.client(ann) as a:
                made = await a.create_schedule("me", "while you were out", at=soon(60))
        # Every node is down when the occurrence falls due: its time passes.
        async with await connect(database_url, autocommit=True) as conn:
            await conn.execute(
                "UPDATE schedules SET at = at - interval '90 seconds',"
                " next_at = next_at - interval '90 seconds' WHERE id = %s",
                (made["scheduleId"],),
            )
        async with running_node(database_url, tmp_path) as node:
            world = World(node, world.workspace_id)
            async with world.client(ann) as a:
                # The node may send it before this session is open: read it back.
                target = "scope:" + await _target_scope(database_url, made["scheduleId"])
                with trio.fail_after(10):
                    while not (sent := (await a.history(target))["messages"]):
                        await trio.sleep(0.05)
                run = sent[-1]["sources"][0]
                assert run["scheduleId"] == made["scheduleId"]
                assert 29 <= run["delaySeconds"] <= 40
                # A node that died after the message's commit and before the claim's:
                # the row still names the occurrence, and the next claim stores nothing.
                async with await connect(database_url, autocommit=True) as conn:
                    await conn.execute(
                        "UPDATE schedules SET next_at = at, fired = 0 WHERE id = %s",
                        (made["scheduleId"],),
                    )
                # The node's own loop may claim it before this tick does: either is the claim.
                await node.services.scheduler.tick()
                with trio.fail_after(10):
                    while (entry := (await a.schedules())[0])["nextAt"] is not None:
                        await trio.sleep(0.05)
                assert entry["lastRun"]["outcome"] == "sent"
                stored = await _runs(database_url, made["scheduleId"])
                assert stored == 1


async def _runs(database_url: str, schedule_id: str) -> int:
    """Messages stored for a schedule, counted by their source ref."""
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM scope_messages WHERE metadata->'source'->>'scheduleId' = %s"
            " AND NOT (metadata->'source' ? 'skipped')",
            (schedule_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def test_a_long_outage_posts_a_rule_s_latest_missed_occurrence_only() -> None:
    monday = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)
    day = timedelta(days=1)
    now = monday + 2 * day + timedelta(hours=3)  # back on Wednesday at 12:30
    # Monday's and Tuesday's give way to Wednesday's, which is posted late.
    assert superseded(monday, monday + day, now)
    assert superseded(monday + day, monday + 2 * day, now)
    assert not superseded(monday + 2 * day, monday + 3 * day, now)
    # Within the hour every missed occurrence is still posted, in order.
    assert not superseded(now - timedelta(minutes=30), now - timedelta(minutes=29), now)
    # A one-off has no later occurrence to give way to.
    assert not superseded(monday, None, now)


async def _target_scope(database_url: str, schedule_id: str) -> str:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT target_scope_id FROM schedules WHERE id = %s", (schedule_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])
