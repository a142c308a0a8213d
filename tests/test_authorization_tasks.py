"""The task rows of the authorization matrix (docs/tasks.md, docs/authorization.md).

One node, real WebSockets, real PostgreSQL. Every cell gets a task of its own
(created by the *creator*, then the *former assignee* unassigned), so no
answer depends on the order in which cells run. The rendering is appended to
``docs/authorization.md`` by ``tests/test_authorization_matrix.py``.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from tests.matrix_section import Cast, ask_every_cell, assert_cells, open_sessions, section_lines
from tests.nodes import World, running_node

TIMEOUT = 60
OK, F, NF = "ok", "forbidden", "not_found"
L, U = "listed", "not listed"

TASK_ACTORS: dict[str, tuple[str, str]] = {
    "creator": ("creator", "the human who created the task"),
    "assignee": ("assignee", "a human assigned to the task"),
    "agent": ("assigned agent", "a public agent assigned to the task"),
    "former": ("former assignee", "a human assigned, then unassigned"),
    "outsider": ("outsider", "a human of the workspace who is not a member"),
    "foreign": ("other workspace", "a member of another workspace"),
    "own_agent": (
        "creator's private agent",
        "a private agent of the creator, assigned by it (a private member)",
    ),
    "other_agent": ("other's private agent", "a private agent of another owner, not a member"),
}
TASK_OPS: dict[str, str] = {
    "createTask": "`createTask` with a title and no assignees",
    "createTask with creator's agent": ("`createTask` assigning the *creator's private agent*"),
    "updateTask status": "`updateTask` with `status: done`",
    "updateTask title": "`updateTask` with a new `title`",
    "updateTask assignees": "`updateTask` with `assignees` adding the *outsider*",
    "tasks": "`tasks` (`filter: mine`): is the task listed?",
    "send": "`send` a text message to `task:<id>`",
    "history": "`history` of `task:<id>`",
    "markRead": "`markRead` of the task, seq 1",
    "leave": "`leave` the task (membership follows assignment: `updateTask` instead)",
}
# fmt: off
TASK_MATRIX: dict[str, tuple[str, ...]] = {
    #                                  creator assignee agent former outsider foreign own_agent other_agent
    "createTask":                      (OK,    OK,      OK,   OK,    OK,      OK,     F,        F),
    "createTask with creator's agent": (OK,    NF,      NF,   NF,    NF,      NF,     F,        F),
    "updateTask status":               (OK,    OK,      OK,   NF,    NF,      NF,     OK,       NF),
    "updateTask title":                (OK,    OK,      OK,   NF,    NF,      NF,     F,        NF),
    "updateTask assignees":            (OK,    OK,      OK,   NF,    NF,      NF,     F,        NF),
    "tasks":                           (L,     L,       L,    U,     U,       U,      L,        U),
    "send":                            (OK,    OK,      OK,   F,     NF,      NF,     OK,       NF),
    "history":                         (OK,    OK,      OK,   F,     NF,      NF,     OK,       NF),
    "markRead":                        (OK,    OK,      OK,   F,     NF,      NF,     OK,       NF),
    "leave":                           (F,     F,       F,    F,     NF,      NF,     F,        NF),
}
# fmt: on

_TASK_INTRO = """\
Tasks (docs/tasks.md) are private scopes: a task exists only for its members
(the creator and the assignees) and those who once were; anyone else gets
`not_found` for it, as for a task that does not exist. A current member
changes the status and the title; the creator and the assignees also change
the assignees; a private agent member changes the status only. A private
agent is assigned only by its owner (anyone else names no such member) and
creates no task. Nobody `leave`s a task: its members follow its assignees.
Discussion (`send`, `history`, `markRead` on `task:<id>`)
needs a current membership, as in a channel."""


def task_lines(cell: Any) -> list[str]:
    """The doc section; ``cell`` renders one answer as the main matrix does."""
    return section_lines("Tasks", _TASK_INTRO, TASK_ACTORS, TASK_OPS, TASK_MATRIX, cell)


async def _task(cast: Cast) -> str:
    p = cast.people
    made = await cast.ok(
        "creator",
        "createTask",
        title="cell",
        assignees=[p["assignee"].id, p["agent"].id, p["former"].id, p["own_agent"].id],
    )
    task_id: str = made["taskId"]
    kept = [p["assignee"].id, p["agent"].id, p["own_agent"].id]
    await cast.ok("creator", "updateTask", taskId=task_id, assignees=kept)
    return task_id


async def _answer(cast: Cast, op: str, actor: str) -> str:
    p = cast.people
    task_id = await _task(cast)
    fields: dict[str, Any]
    wire = op
    if op == "createTask":
        fields = {"title": "new"}
    elif op == "createTask with creator's agent":
        wire, fields = "createTask", {"title": "new", "assignees": [p["own_agent"].id]}
    elif op == "updateTask status":
        wire, fields = "updateTask", {"taskId": task_id, "status": "done"}
    elif op == "updateTask title":
        wire, fields = "updateTask", {"taskId": task_id, "title": "renamed"}
    elif op == "updateTask assignees":
        kept = [p["assignee"].id, p["agent"].id, p["outsider"].id]
        wire, fields = "updateTask", {"taskId": task_id, "assignees": kept}
    elif op == "tasks":
        fields = {"filter": "mine", "limit": 200}  # every cell made one: all on one page
    elif op in ("send", "history"):
        fields = {"target": f"task:{task_id}"}
        if op == "send":
            fields |= {"content": "hi", "clientMessageId": f"c{next(cast.ids)}"}
    elif op == "leave":
        fields = {"scopeId": task_id}
    else:
        fields = {"scopeId": task_id, "seq": 1}
        if op == "markRead":
            await cast.ok(
                "creator",
                "send",
                target=f"task:{task_id}",
                content="x",
                clientMessageId=f"c{next(cast.ids)}",
            )
    reply = await cast.ask(actor, wire, **fields)
    if reply["type"] != "reply":
        return str(reply["code"])
    if op == "tasks":
        listed = any(t["taskId"] == task_id for t in reply["result"]["tasks"])
        return L if listed else U
    return OK


async def test_task_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(TASK_ACTORS)
    with trio.fail_after(TIMEOUT):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "task matrix")
            elsewhere = await World.create(node, "elsewhere")
            creator = await world.member("creator")
            outsider = await world.member("outsider")
            people = {
                "creator": creator,
                "assignee": await world.member("assignee"),
                "agent": await world.member("bot", MemberType.AGENT),
                "former": await world.member("former"),
                "outsider": outsider,
                "foreign": await elsewhere.member("foreign"),
                "own_agent": await world.member(
                    "pa", MemberType.AGENT, owner=creator, private=True
                ),
                "other_agent": await world.member(
                    "pb", MemberType.AGENT, owner=outsider, private=True
                ),
            }
            clients = await open_sessions(hold, people, world, elsewhere)
            cast = Cast(people, clients)

            got = await ask_every_cell(
                TASK_MATRIX, columns, lambda op, actor: _answer(cast, op, actor)
            )

    assert_cells(TASK_MATRIX, columns, got)
