"""The service account rows of the authorization matrix (docs/authorization.md).

Kept apart from tests/test_authorization_matrix.py, which renders these rows
into the same document (:func:`service_lines`). One node: a service account
with a manager, and every kind of caller asks every op of its conversation.
"""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from storage import directory, services
from storage.pg import connect
from tests.matrix_section import ask_every_cell, assert_cells, open_sessions, section_lines
from tests.nodes import Person, World, running_node

OK, F, NF = "ok", "forbidden", "not_found"

SERVICE_ACTORS: dict[str, tuple[str, str]] = {
    "manager": ("manager", "a human the admins made a manager of the service"),
    "member": ("human", "a human of the workspace who is not a manager (in the audience)"),
    "agent": ("agent", "a public agent of the workspace (never in the audience)"),
    "service": ("the service", "a session of the service itself (its token)"),
    "other_service": ("other service", "a session of another service of the workspace"),
    "foreign": ("other workspace", "a human of another workspace"),
}
SERVICE_OPS: dict[str, str] = {
    # row heading → the request each cell sends
    "servicePost": "`servicePost` to the service (its conversation)",
    "send": "`send` to `scope:<the service's conversation>`",
    "history": "`history` of the service's conversation",
    "markRead": "`markRead` seq 1",
    "setNotification": "`setNotification` to `mute`",
    "leave": "`leave` the service's conversation",
    "join": "`join` the service's conversation",
}
# fmt: off
SERVICE_MATRIX: dict[str, tuple[str, ...]] = {
    #                  manager member agent service other_service foreign
    "servicePost":     (OK,     F,     F,    F,      F,            NF),
    "send":            (F,      F,     NF,   OK,     NF,           NF),
    "history":         (OK,     OK,    NF,   OK,     NF,           NF),
    "markRead":        (OK,     OK,    NF,   OK,     NF,           NF),
    "setNotification": (OK,     OK,    NF,   OK,     NF,           NF),
    "leave":           (F,      F,     NF,   F,      NF,           NF),
    "join":            (F,      F,     NF,   F,      NF,           NF),
}
# fmt: on

_INTRO = """\
A service account's conversation (docs/services.md): its audience is every
active human of the workspace, kept by the node (nobody joins or leaves it;
a human may mute it), and only the service writes there. A manager posts as
the service with `servicePost`; an agent, a human who is not a manager and
any service (itself included: it posts with `send` or its webhook) get
`forbidden`. The conversation does not exist for an agent or another
service, which never belonged to it, nor for another workspace."""


def _cell(answer: str) -> str:
    return "**ok**" if answer == OK else f"`{answer}`"


def service_lines() -> list[str]:
    return section_lines(
        "Service accounts", _INTRO, SERVICE_ACTORS, SERVICE_OPS, SERVICE_MATRIX, _cell
    )


def _fields(op: str, scope_id: str, n: int) -> dict[str, Any]:
    if op == "servicePost":
        return {"service": "deploys", "content": f"post {n}", "clientMessageId": f"c{n}"}
    if op == "send":
        return {"target": f"scope:{scope_id}", "content": f"send {n}", "clientMessageId": f"s{n}"}
    if op == "history":
        return {"target": f"scope:{scope_id}"}
    if op == "markRead":
        return {"scopeId": scope_id, "seq": 1}
    if op == "setNotification":
        return {"scopeId": scope_id, "state": "mute"}
    return {"scopeId": scope_id}


async def _service(world: World, handle: str, managers: list[Person]) -> tuple[Person, str]:
    async with await connect(world.node.database_url, autocommit=True) as conn:
        made = await services.create_service(
            conn,
            workspace_id=world.workspace_id,
            handle=handle,
            display_name=None,
            managers=[m.member for m in managers],
        )
        token = await directory.issue_token(conn, made.member.id)
    return Person(made.member, token), made.scope_id


async def test_service_account_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(SERVICE_ACTORS)
    fresh = itertools.count(1)
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "service matrix")
            elsewhere = await World.create(node, "elsewhere")
            manager = await world.member("manager")
            people = {
                "manager": manager,
                "member": await world.member("member"),
                "agent": await world.member("bot", MemberType.AGENT),
                "foreign": await elsewhere.member("outsider"),
            }
            people["service"], scope_id = await _service(world, "deploys", [manager])
            people["other_service"], _ = await _service(world, "alerts", [manager])
            clients = await open_sessions(hold, people, world, elsewhere)
            # The service's first message, so markRead has a seq to read up to.
            await clients["manager"].request(
                "servicePost", service="deploys", content="first", clientMessageId="first"
            )

            async def answer(op: str, actor: str) -> str:
                n = next(fresh)
                frame = {"type": op, "id": f"s{n}", **_fields(op, scope_id, n)}
                reply = await clients[actor].request_frame(frame)
                return OK if reply["type"] == "reply" else str(reply["code"])

            got = await ask_every_cell(SERVICE_MATRIX, columns, answer)

    assert_cells(SERVICE_MATRIX, columns, got)
