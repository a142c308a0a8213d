"""The rewind rows of the authorization matrix (docs/rewind.md, docs/authorization.md).

One node, real WebSockets, real PostgreSQL. One world: a public channel (its
owner, a public member, a public agent and the owner's private agent), a
reply thread in it, a DM between the two people, the owner's DM with its
private agent, and a task. Every cell asks against the recovery points made
up front; a rewind answered again is still ``ok``, so no answer depends on the
order in which cells run. The rendering is appended to
``docs/authorization.md`` by ``tests/test_authorization_matrix.py``.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from tests.matrix_section import Cast, ask_every_cell, assert_cells, open_sessions, section_lines
from tests.nodes import World, running_node

TIMEOUT = 60
OK, F, NF = "ok", "forbidden", "not_found"

REWIND_ACTORS: dict[str, tuple[str, str]] = {
    "owner": (
        "owner",
        "the channel's owner; in a DM, one of its two people; the private agent's owner",
    ),
    "member": ("public member", "a human public member of the channel; the DM's other person"),
    "agent": ("public agent", "a public agent, a member of the channel"),
    "own_agent": (
        "owner's private agent",
        "the owner's private agent, a private member of the channel, in a DM with its owner",
    ),
    "outsider": ("outsider", "a human of the workspace in none of these conversations"),
    "foreign": ("other workspace", "a member of another workspace"),
}
REWIND_OPS: dict[str, str] = {
    "markRecoveryPoint channel": "`markRecoveryPoint` at the owner's message in the channel",
    "rewind channel": "`rewind` the channel to that point",
    "rewind thread": "`rewind` a reply thread of the channel to a point at its first reply",
    "markRecoveryPoint DM": "`markRecoveryPoint` at a message of the DM of the two people",
    "rewind DM": "`rewind` that DM to that point",
    "rewind agent DM": "`rewind` the owner's DM with its private agent",
    "markRecoveryPoint task": "`markRecoveryPoint` at a message of a task of the owner",
}
# fmt: off
REWIND_MATRIX: dict[str, tuple[str, ...]] = {
    #                            owner member agent own_agent outsider foreign
    "markRecoveryPoint channel": (OK,  OK,    OK,   OK,       NF,      NF),
    "rewind channel":            (OK,  F,     F,    F,        F,       NF),
    "rewind thread":             (OK,  F,     F,    F,        F,       NF),
    "markRecoveryPoint DM":      (OK,  OK,    NF,   NF,       NF,      NF),
    "rewind DM":                 (OK,  OK,    NF,   NF,       NF,      NF),
    "rewind agent DM":           (OK,  NF,    NF,   F,        NF,      NF),
    "markRecoveryPoint task":    (F,   NF,    NF,   NF,       NF,      NF),
}
# fmt: on

_REWIND_INTRO = """\
Rewind (docs/rewind.md). Any reader of a message in a channel, a DM or a
thread may mark a recovery point at it; a message the caller may not read
is `not_found`, as one that does not exist, and a task's or service's
conversation is not rewound (`forbidden`, reason `not_rewindable`). Only the
conversation's owner rewinds: a channel's owner (a thread's: the parent
channel's), in a DM either of its people, and the owner of the private agent
a DM talks to; private agents never rewind. A public channel's outsider (and
a thread's, a private agent not admitted to it) may not read it
(`forbidden`); a private conversation is `not_found` to whoever is not in it."""


def rewind_lines(cell: Any) -> list[str]:
    """The doc section; ``cell`` renders one answer as the main matrix does."""
    return section_lines("Rewind", _REWIND_INTRO, REWIND_ACTORS, REWIND_OPS, REWIND_MATRIX, cell)


@dataclass
class RewindCast(Cast):
    # scope kind → (scope id, message id, recovery point id)
    points: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    async def sent(self, actor: str, target: str, content: str) -> dict[str, Any]:
        return await self.ok(
            actor, "send", target=target, content=content, clientMessageId=f"c{next(self.ids)}"
        )

    async def point(
        self, kind: str, actor: str, target: str, content: str, *, mark: bool = True
    ) -> None:
        message = await self.sent(actor, target, content)
        if not mark:  # where no point can be made: only the message is asked about
            self.points[kind] = ("", message["messageId"], "")
            return
        made = await self.ok("owner", "markRecoveryPoint", messageId=message["messageId"])
        self.points[kind] = (made["scopeId"], message["messageId"], made["recoveryPointId"])


async def _scene(cast: RewindCast) -> None:
    p = cast.people
    channel = (await cast.ok("owner", "createChannel", slug="rw", name="Rw"))["scopeId"]
    await cast.ok("member", "join", scopeId=channel)
    await cast.ok("owner", "invite", scopeId=channel, memberId=p["agent"].id)
    await cast.ok(
        "owner", "invite", scopeId=channel, memberId=p["own_agent"].id, visibility="private"
    )
    await cast.point("channel", "owner", "#rw", "a point")
    root = cast.points["channel"][1]
    await cast.point("thread", "member", f"#rw:{root}", "first reply")
    await cast.point("DM", "owner", f"dm:{p['member'].id}", "hi")
    await cast.point("agent DM", "owner", f"dm:{p['own_agent'].id}", "do it")
    task = (await cast.ok("owner", "createTask", title="t"))["taskId"]
    await cast.point("task", "owner", f"task:{task}", "on it", mark=False)


async def _answer(cast: RewindCast, op: str, actor: str) -> str:
    wire, _, kind = op.partition(" ")
    scope_id, message_id, point_id = cast.points[kind]
    if wire == "markRecoveryPoint":
        fields = {"messageId": message_id}
    else:
        fields = {"scopeId": scope_id, "recoveryPointId": point_id}
    reply = await cast.ask(actor, wire, **fields)
    return OK if reply["type"] == "reply" else str(reply["code"])


async def test_rewind_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(REWIND_ACTORS)
    with trio.fail_after(TIMEOUT):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "rewind matrix")
            elsewhere = await World.create(node, "elsewhere")
            owner = await world.member("owner")
            people = {
                "owner": owner,
                "member": await world.member("member"),
                "agent": await world.member("bot", MemberType.AGENT),
                "own_agent": await world.member("pa", MemberType.AGENT, owner=owner, private=True),
                "outsider": await world.member("outsider"),
                "foreign": await elsewhere.member("foreign"),
            }
            clients = await open_sessions(hold, people, world, elsewhere)
            cast = RewindCast(people, clients)
            await _scene(cast)

            got = await ask_every_cell(
                REWIND_MATRIX, columns, lambda op, actor: _answer(cast, op, actor)
            )

    assert_cells(REWIND_MATRIX, columns, got)
