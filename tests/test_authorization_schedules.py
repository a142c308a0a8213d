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
from tests.matrix_section import ask_every_cell, assert_cells, open_sessions, section_lines
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
    return section_lines("Schedules", _INTRO, SCHEDULE_ACTORS, SCHEDULE_OPS, SCHEDULE_MATRIX, _cell)


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
            clients = await open_sessions(hold, people, world, elsewhere)
            owner = clients["owner"]
            await make_channel(owner, "ops", clients["member"], clients["agent"])
            kept = (await owner.create_schedule("#ops", "kept", at=IN_AN_HOUR))["scheduleId"]
            doomed = (await owner.create_schedule("#ops", "doomed", at=IN_AN_HOUR))["scheduleId"]

            async def answer(row: str, actor: str) -> str:
                frame = {"id": f"s{next(fresh)}", **_request(row, kept, doomed)}
                reply = await clients[actor].request_frame(frame)
                return OK if reply["type"] == "reply" else str(reply["code"])

            got = await ask_every_cell(SCHEDULE_MATRIX, columns, answer)
            # Nobody but the owner saw the owner's schedules.
            for name in columns[1:]:
                mine = await clients[name].schedules()
                assert {s["scheduleId"] for s in mine}.isdisjoint({kept, doomed})

    assert_cells(SCHEDULE_MATRIX, columns, got)
