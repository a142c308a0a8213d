"""The workflow rows of the authorization matrix (docs/workflows.md, docs/authorization.md).

One node, real WebSockets, real PostgreSQL. Every cell gets a plan of its own
(created by the *creator* for the *agent*, shared with the *shared* human, one
request sent), so no answer depends on the order in which cells run. The
rendering is appended to ``docs/authorization.md`` by
``tests/test_authorization_matrix.py``.
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
WORD = "checklist"

WORKFLOW_ACTORS: dict[str, tuple[str, str]] = {
    "creator": ("creator", "the human who created the plan"),
    "shared": ("shared", "a human the creator shared the plan with"),
    "agent": ("plan's agent", "the plan's selected agent (a member of its scope)"),
    "outsider": ("outsider", "a human of the workspace the plan is not shared with"),
    "foreign": ("other workspace", "a member of another workspace"),
    "other_agent": ("other agent", "a public agent of the workspace, not the plan's"),
}
WORKFLOW_OPS: dict[str, str] = {
    "createWorkflowPlan": "`createWorkflowPlan` naming the *plan's agent*",
    "shareWorkflowPlan": "`shareWorkflowPlan` with the *outsider*",
    "updateWorkflowPlan": "`updateWorkflowPlan` with `status: archived`",
    "workflowPlans": "`workflowPlans`: is the plan listed?",
    "workflowTranscript": "`workflowTranscript` of the plan",
    "workflowRequest": "`workflowRequest` to the plan",
    "workflowReply": "`workflowReply` (final) to the creator's request",
    "history": "`history` of `scope:<the plan's scope>`",
    "send": "`send` a text message to `scope:<the plan's scope>`",
    "markRead": "`markRead` of the plan's scope, seq 1",
    "scopes": "`scopes`: is the plan's scope listed?",
    "search": "`search` for a word of the request: is the plan's scope in the hits?",
}
# fmt: off
WORKFLOW_MATRIX: dict[str, tuple[str, ...]] = {
    #                     creator shared agent outsider foreign other_agent
    "createWorkflowPlan": (OK,    OK,    F,    OK,      NF,     F),
    "shareWorkflowPlan":  (OK,    F,     F,    NF,      NF,     NF),
    "updateWorkflowPlan": (OK,    F,     F,    NF,      NF,     NF),
    "workflowPlans":      (L,     L,     U,    U,       U,      U),
    "workflowTranscript": (OK,    OK,    F,    NF,      NF,     NF),
    "workflowRequest":    (OK,    OK,    F,    NF,      NF,     NF),
    "workflowReply":      (NF,    NF,    OK,   NF,      NF,     NF),
    "history":            (NF,    NF,    NF,   NF,      NF,     NF),
    "send":               (NF,    NF,    NF,   NF,      NF,     NF),
    "markRead":           (NF,    NF,    NF,   NF,      NF,     NF),
    "scopes":             (U,     U,     U,    U,       U,      U),
    "search":             (U,     U,     U,    U,       U,      U),
}
# fmt: on

_WORKFLOW_INTRO = """\
A workflow plan's transcript is a scope of type `workflow` that no generic
path reads or writes: `history`, `send`, `markRead`, `search`, `scopes` and
every read check answer it as a scope that does not exist, for everyone, the
plan's agent and its retained membership included. The plan's own ops are its
door: its creator and the humans the creator shares it with read the
transcript and send requests, and the creator alone shares, renames and
archives the plan; the plan's agent, which knows the plan, gets
`forbidden` there and answers only through `workflowReply`; anyone else gets
`not_found`. Only humans create plans."""


def workflow_lines(cell: Any) -> list[str]:
    """The doc section; ``cell`` renders one answer as the main matrix does."""
    return section_lines(
        "Workflow plans", _WORKFLOW_INTRO, WORKFLOW_ACTORS, WORKFLOW_OPS, WORKFLOW_MATRIX, cell
    )


async def _plan(cast: Cast) -> tuple[str, str, str]:
    p = cast.people
    made = await cast.ok("creator", "createWorkflowPlan", title="cell", agentId=p["agent"].id)
    plan_id, scope_id = made["planId"], made["scopeId"]
    await cast.ok("creator", "shareWorkflowPlan", planId=plan_id, memberId=p["shared"].id)
    asked = await cast.ok(
        "creator",
        "workflowRequest",
        planId=plan_id,
        content=f"a {WORD} please",
        clientMessageId=f"r{next(cast.ids)}",
    )
    return plan_id, scope_id, asked["requestId"]


def _fields(cast: Cast, op: str, plan_id: str, scope_id: str, request_id: str) -> dict[str, Any]:
    p, n = cast.people, next(cast.ids)
    by_op: dict[str, dict[str, Any]] = {
        "createWorkflowPlan": {"title": "new", "agentId": p["agent"].id},
        "shareWorkflowPlan": {"planId": plan_id, "memberId": p["outsider"].id},
        "updateWorkflowPlan": {"planId": plan_id, "status": "archived"},
        "workflowPlans": {},
        "workflowTranscript": {"planId": plan_id},
        "workflowRequest": {"planId": plan_id, "content": "more", "clientMessageId": f"q{n}"},
        "workflowReply": {
            "requestId": request_id,
            "content": "done",
            "final": True,
            "clientMessageId": f"a{n}",
        },
        "history": {"target": f"scope:{scope_id}"},
        "send": {"target": f"scope:{scope_id}", "content": "hi", "clientMessageId": f"s{n}"},
        "markRead": {"scopeId": scope_id, "seq": 1},
        "scopes": {},
        "search": {"query": WORD, "limit": 50},
    }
    return by_op[op]


async def _answer(cast: Cast, op: str, actor: str) -> str:
    plan_id, scope_id, request_id = await _plan(cast)
    reply = await cast.ask(actor, op, **_fields(cast, op, plan_id, scope_id, request_id))
    if reply["type"] != "reply":
        return str(reply["code"])
    result = reply["result"]
    if op == "workflowPlans":
        return L if any(p["planId"] == plan_id for p in result["plans"]) else U
    if op == "scopes":
        return L if any(s["id"] == scope_id for s in result["scopes"]) else U
    if op == "search":
        return L if any(h["scopeId"] == scope_id for h in result["hits"]) else U
    return OK


async def test_workflow_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(WORKFLOW_ACTORS)
    with trio.fail_after(TIMEOUT):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "workflow matrix")
            elsewhere = await World.create(node, "elsewhere")
            people = {
                "creator": await world.member("creator"),
                "shared": await world.member("shared"),
                "agent": await world.member("bot", MemberType.AGENT),
                "outsider": await world.member("outsider"),
                "foreign": await elsewhere.member("foreign"),
                "other_agent": await world.member("other", MemberType.AGENT),
            }
            clients = await open_sessions(hold, people, world, elsewhere)
            cast = Cast(people, clients)

            got = await ask_every_cell(
                WORKFLOW_MATRIX, columns, lambda op, actor: _answer(cast, op, actor)
            )

    assert_cells(WORKFLOW_MATRIX, columns, got)
