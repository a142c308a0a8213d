"""Workflow plans (docs/workflows.md) over real WebSockets and PostgreSQL.

One node, one test: a plan and its product-gated transcript (no generic
``history``, ``search``, read check, ``scopes`` or unread for anyone, the
agent's retained membership included; ``workflowTranscript`` for the creator
and the humans it shares the plan with), a request routed to the plan's agent
alone (its ``deliver`` names the plan and the request), two final replies
racing from two sessions of the agent (one stored, one ``conflict``), a reply
to a superseded request refused, and the trusted fields out of ``send``'s reach.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import MemberType
from node.client import Client, ClientError
from node.client.frontier import Delivery
from storage.pg import connect
from tests.nodes import World, running_node

WORD = "zebrafinch"


async def _code(call: Any) -> str:
    with pytest.raises(ClientError) as refused:
        await call
    return refused.value.code


async def _final_replies(database_url: str, request_id: str) -> int:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM scope_messages WHERE message_type = 'workflow_reply'"
            " AND metadata->'source'->>'requestId' = %s"
            " AND (metadata->'source'->>'final')::boolean",
            (request_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _wake_status(database_url: str, message_id: str) -> list[str]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT status FROM scope_fanout_outbox"
            " WHERE message_id = %s AND fanout_type = 'agent_wake'",
            (message_id,),
        )
        return [str(r[0]) for r in await cur.fetchall()]


async def _race(d1: Client, d2: Client, request_id: str) -> list[str]:
    outcomes: list[str] = []

    async def answer(client: Client, n: int) -> None:
        try:
            await client.workflow_reply(request_id, f"plan v{n}", final=True)
            outcomes.append("ok")
        except ClientError as exc:
            outcomes.append(exc.code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer, d1, 1)
        nursery.start_soon(answer, d2, 2)
    return sorted(outcomes)


async def test_workflow_plan_gate_request_reply(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            ann, bob, cat = await world.members("ann", "bob", "cat")
            bot = await world.member("bot", MemberType.AGENT)
            async with (
                world.client(ann) as a,
                world.client(bob) as b,
                world.client(cat) as c,
                world.client(bot, kind="daemon") as d1,
                world.client(bot, kind="daemon") as d2,
            ):
                scope_id = await _scenario(database_url, a, b, c, d1, d2, bob.id, cat.id, bot.id)
            # Resuming from the transcript's start replays nothing of it.
            for person, kind in ((ann, "browser"), (bot, "daemon")):
                async with world.client(person, kind=kind, resume={scope_id: 0}) as again:
                    seen = await again.events_until(lambda ev: ev["type"] == "resumed", 5)
                    assert scope_id not in seen[-1]["scopes"]
                    assert not [e for e in seen if e.get("scopeId") == scope_id]


async def _scenario(
    database_url: str,
    a: Client,
    b: Client,
    c: Client,
    d1: Client,
    d2: Client,
    bob_id: str,
    cat_id: str,
    bot_id: str,
) -> str:
    assert await _code(b.create_workflow_plan("x", "mem_nobody")) == "not_found"
    assert await _code(d1.create_workflow_plan("x", bot_id)) == "forbidden"
    assert await _code(a.create_workflow_plan("x", bob_id)) == "not_found"  # not an agent
    made = await a.create_workflow_plan("Release checklist", bot_id)
    plan_id, scope_id = made["planId"], made["scopeId"]
    created = await a.events_until(lambda ev: ev["type"] == "workflowUpdated", 5)
    assert (created[-1]["planId"], created[-1]["revision"]) == (plan_id, 0)
    assert await _code(a.share_workflow_plan(plan_id, bot_id)) == "not_found"
    assert await _code(b.share_workflow_plan(plan_id, cat_id)) == "not_found"
    shared = await a.share_workflow_plan(plan_id, cat_id)
    assert shared["plan"]["sharedWith"] == [cat_id]
    assert [p["planId"] for p in await c.workflow_plans()] == [plan_id]
    assert await b.workflow_plans() == []

    asked = await a.workflow_request(plan_id, f"weekly {WORD} checklist please")
    request_id = asked["requestId"]
    woke = await d1.events_until(lambda ev: ev["type"] == "deliver", 5)
    assert (woke[-1]["planId"], woke[-1]["requestId"]) == (plan_id, request_id)
    assert woke[-1]["message"]["messageType"] == "workflow_request"
    assert woke[-1]["message"]["metadata"]["source"]["kind"] == "workflow_request"
    delivery = Delivery.from_event(woke[-1])
    assert (delivery.plan_id, delivery.request_id) == (plan_id, request_id)
    await a.request("createChannel", slug="ops", name="Ops")
    await a.send("#ops", f"a {WORD} in the open", clientMessageId="open-1")

    # The generic read paths know the scope to no one, its agent included.
    for client in (a, c, d1, b):
        for call in (
            client.history(f"scope:{scope_id}"),
            client.request("markRead", scopeId=scope_id, seq=1),
            client.send(f"scope:{scope_id}", "sneaky"),
        ):
            assert await _code(call) == "not_found"
        listed = (await client.request("scopes"))["scopes"]
        assert scope_id not in [s["id"] for s in listed]
        hits = (await client.search(WORD))["hits"]
        assert scope_id not in [h["scopeId"] for h in hits]
    assert [h["scopeId"] for h in (await a.search(WORD))["hits"]] != []
    # The trusted fields are the adapter's: a client may not set them on a send.
    typed = a.send("#ops", "fake", messageType="workflow_request")
    assert await _code(typed) == "validation_failed"

    # The product gate: creator and shared humans read; the agent and others do not.
    page = await c.workflow_transcript(plan_id)
    assert [m["id"] for m in page["messages"]] == [asked["messageId"]]
    assert page["latestSeq"] == 1
    assert await _code(d1.workflow_transcript(plan_id)) == "forbidden"
    assert await _code(b.workflow_transcript(plan_id)) == "not_found"
    assert await _code(b.workflow_request(plan_id, "me too")) == "not_found"
    assert await _code(d1.workflow_request(plan_id, "self")) == "forbidden"
    # Only the plan's agent answers, and only the request it holds.
    assert await _code(a.workflow_reply(request_id, "from ann")) == "not_found"
    partial = await d2.workflow_reply(request_id, "drafting…")
    assert partial["final"] is False
    # Nor is a transcript message reachable by id: no edit, reaction or quote.
    assert await _code(d2.edit(partial["messageId"], "rewritten")) == "not_found"
    assert await _code(a.react(asked["messageId"], "👍")) == "not_found"
    quote = {"mode": "quote", "sources": [{"messageId": asked["messageId"]}]}
    assert await _code(a.send("#ops", "see this", forward=quote)) == "not_found"

    assert await _race(d1, d2, request_id) == ["conflict", "ok"]
    assert await _final_replies(database_url, request_id) == 1
    assert await _code(d1.workflow_reply(request_id, "late", final=True)) == "conflict"
    assert await _code(d1.workflow_reply(request_id, "late note")) == "conflict"
    final = await a.events_until(
        lambda ev: ev["type"] == "workflowUpdated" and ev.get("change") == "final", 5
    )
    assert final[-1]["revision"] == 1
    (entry,) = await a.workflow_plans()
    assert entry["revision"] == 1
    assert entry["draft"].startswith("plan v")

    # An archived plan keeps its transcript and takes no request until restored.
    await a.update_workflow_plan(plan_id, status="archived")
    assert await _code(c.workflow_request(plan_id, "while archived")) == "conflict"
    assert len((await c.workflow_transcript(plan_id))["messages"]) == 3
    assert await _code(c.request("updateWorkflowPlan", planId=plan_id, status="draft")) == (
        "forbidden"
    )
    restored = await a.update_workflow_plan(plan_id, status="active")
    assert restored["plan"]["status"] == "active"

    # A later request supersedes one still open: a reply to the older one is refused.
    first = await c.workflow_request(plan_id, "add a rollback step", "cat-1")
    assert await c.workflow_request(plan_id, "add a rollback step", "cat-1") == first
    assert await _wake_status(database_url, first["messageId"]) in (["pending"], ["leased"])
    second = await a.workflow_request(plan_id, "and a smoke test")
    # The agent holds one wake: the superseded request's is withdrawn.
    assert await _wake_status(database_url, first["messageId"]) == ["suppressed"]
    assert await _wake_status(database_url, second["messageId"]) in (["pending"], ["leased"])
    assert await _code(d1.workflow_reply(first["requestId"], "ok", final=True)) == "conflict"
    await d1.workflow_reply(second["requestId"], "plan v3", final=True)
    transcript = await a.workflow_transcript(plan_id)
    kinds = [m["messageType"] for m in transcript["messages"]]
    assert kinds.count("workflow_reply") == 3
    assert kinds.count("workflow_request") == 3
    replies = [m for m in transcript["messages"] if m["messageType"] == "workflow_reply"]
    # The agent is the author; the workflow run is only the source.
    assert {m["author"]["memberId"] for m in replies} == {bot_id}
    assert {m["metadata"]["source"]["kind"] for m in replies} == {"workflow_run"}
    return str(scope_id)
