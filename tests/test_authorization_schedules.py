"""The schedule rows of the authorization matrix (docs/authorization.md).

Kept apart from tests/test_authorization_matrix.py, which renders these rows
into the same document (:func:`schedule_lines`). One node: a schedule of the
owner's into a channel, and every kind of caller asks every schedule op.
"""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from tests.nodes import World, make_channel, running_node

OK, F, NF = "ok", "forbidden", "not_found"

SCHEDULE_ACTORS: dict[str, tuple[str, str]] = {
    "owner": ("owner", "the human who created the schedule (a member of #ops)"),
    "member": ("member", "another human member of #ops"),
    "outsider": ("outsider", "a human of the workspace who is not in #ops (a public channel)"),
    "agent": ("agent", "a public agent, member of #ops"),
    "foreign": ("other workspace", "a human of another workspace"),
}
SCHEDULE_OPS: dict[str, str] = {
    "createSchedule": "`createSchedule` into `#ops`, once, in an hour",
    "createSchedule me": "`createSchedule` into `me` (a reminder)",
    "updateSchedule": "`updateSchedule` of the owner's schedule (its content)",
    "pauseSchedule": "`pauseSchedule` of the owner's schedule",
    "deleteSchedule": "`deleteSchedule` of another schedule of the owner's",
    "schedules": "`schedules` (each caller sees its own only)",
}
# fmt: off
SCHEDULE_MATRIX: dict[str, tuple[str, ...]] = {
    #                    owner member outsider agent foreign
    "createSchedule":    (OK,   OK,    F,       F,    NF),
    "createSchedule me": (OK,   OK,    OK,      F,    OK),
    "updateSchedule":    (OK,   NF,    NF,      F,    NF),
    "pauseSchedule":     (OK,   NF,    NF,      F,    NF),
    "deleteSchedule":    (OK,   NF,    NF,      F,    NF),
    "schedules":         (OK,   OK,    OK,      OK,   OK),
}
# fmt: on

_INTRO = """\
Schedules (docs/schedules.md): only a human owns one, and only a channel it
is a member of (or `me`, its DM with the schedule service) is a target. A
schedule is its owner's alone: another member's schedule answers
`not_found`, as one that does not exist; an agent is `forbidden` before any
lookup. Each run is checked again against the owner's rights (a run into a
channel the owner left is skipped)."""


def _cell(answer: str) -> str:
    return "**ok**" if answer == OK else f"`{answer}`"


def schedule_lines() -> list[str]:
    columns = list(SCHEDULE_ACTORS)
    lines = ["", "## Schedules", "", _INTRO, ""]
    lines += ["| column | who |", "| --- | --- |"]
    lines += [f"| {heading} | {who} |" for heading, who in SCHEDULE_ACTORS.values()]
    lines += ["", "| row | request |", "| --- | --- |"]
    lines += [f"| {op} | {request} |" for op, request in SCHEDULE_OPS.items()]
    lines += ["", "| op | " + " | ".join(SCHEDULE_ACTORS[c][0] for c in columns) + " |"]
    lines.append("| --- |" + " :-: |" * len(columns))
    for op, answers in SCHEDULE_MATRIX.items():
        lines.append(f"| {op} | " + " | ".join(_cell(a) for a in answers) + " |")
    return lines


IN_AN_HOUR = "2099-01-01T09:00:00Z"


def _request(row: str, kept: str, doomed: str) -> dict[str, Any]:
    op = row.split()[0]
    if op == "createSchedule":
        target = "me" if row.endswith("me") else "#ops"
        return {"type": op, "target": target, "content": "hello", "at": IN_AN_HOUR}
    if op == "updateSchedule":
        return {"type": op, "scheduleId": kept, "content": "changed"}
    if op == "pauseSchedule":
        return {"type": op, "scheduleId": kept, "paused": True}
    if op == "deleteSchedule":
        return {"type": op, "scheduleId": doomed}
    return {"type": op}


async def test_schedule_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(SCHEDULE_ACTORS)
    got: dict[tuple[str, str], str] = {}
    fresh = itertools.count(1)
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "schedule matrix")
            elsewhere = await World.create(node, "elsewhere")
            people = {
                "owner": await world.member("owner"),
                "member": await world.member("member"),
                "outsider": await world.member("outsider"),
                "agent": await world.member("bot", MemberType.AGENT),
                "foreign": await elsewhere.member("stranger"),
            }
            clients = {}
            for name, person in people.items():
                home = elsewhere if name == "foreign" else world
                kind = "browser" if person.member.type is MemberType.HUMAN else "daemon"
                clients[name] = await hold.enter_async_context(home.client(person, kind=kind))
            owner = clients["owner"]
            await make_channel(owner, "ops", clients["member"], clients["agent"])
            kept = (await owner.create_schedule("#ops", "kept", at=IN_AN_HOUR))["scheduleId"]
            doomed = (await owner.create_schedule("#ops", "doomed", at=IN_AN_HOUR))["scheduleId"]

            async def run(row: str, actor: str) -> None:
                try:
                    frame = {"id": f"s{next(fresh)}", **_request(row, kept, doomed)}
                    reply = await clients[actor].request_frame(frame)
                    got[(row, actor)] = OK if reply["type"] == "reply" else str(reply["code"])
                except Exception as exc:  # one broken cell must not hide the others
                    got[(row, actor)] = f"crashed: {exc!r}"

            async with trio.open_nursery() as nursery:
                for row in SCHEDULE_MATRIX:
                    for actor in columns:
                        nursery.start_soon(run, row, actor)
            # Nobody but the owner saw the owner's schedules.
            for name in columns[1:]:
                mine = await clients[name].schedules()
                assert {s["scheduleId"] for s in mine}.isdisjoint({kept, doomed})

    expected = {
        (row, actor): want
        for row, answers in SCHEDULE_MATRIX.items()
        for actor, want in zip(columns, answers, strict=True)
    }
    wrong = {cell: (want, got[cell]) for cell, want in expected.items() if got[cell] != want}
    assert not wrong, "\n".join(
        f"  {row} / {actor}: expected {want}, got {have}"
        for (row, actor), (want, have) in sorted(wrong.items())
    )
