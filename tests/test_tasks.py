"""Tasks (docs/tasks.md) over real WebSockets and PostgreSQL.

One node for the protocol test: create, list, discuss (``task:<id>`` for
send, history and markRead), status changes reaching every member's sessions
as ``taskUpdated``, an agent's assignment wake produced under
``worker_first_targeted`` and suppressed by an unassignment. The crash test
kills a node that committed a discussion message and pushed nothing: after
restart the outbox replays it to the recipients frozen at send, once, and a
member added afterwards gets neither the message nor an unread for it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from actors.model import MemberType
from node.client import Client, ClientError, open_daemon
from storage.pg import connect
from tests.nodes import World, running_node
from tests.test_crash_recovery import serve_subprocess

QUIET = 0.4
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _quiet_events(client: Client, seconds: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with trio.move_on_after(seconds):
        while True:
            out.append(await client.next_event())
    return out


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def _task_wakes(database_url: str, task_id: str) -> list[tuple[str, str, str, Any]]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT target_member_id, delivery_policy, status, payload FROM scope_fanout_outbox"
            " WHERE scope_id = %s AND event_ref_type = 'activity' ORDER BY id",
            (task_id,),
        )
        return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def _unread(client: Client, scope_id: str) -> int:
    scopes = (await client.request("scopes"))["scopes"]
    return int(next(s["unread"] for s in scopes if s["id"] == scope_id))


async def test_tasks_create_discuss_update_and_assignment_wakes(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob, eve = await world.members("ann", "bob", "eve")
        bot = await world.member("bot", MemberType.AGENT)
        idle = await world.member("idle", MemberType.AGENT)
        pet = await world.member("pet", MemberType.AGENT, owner=ann, private=True)
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(eve) as e,
            world.client(pet, kind="daemon") as p,
            world.client(bot, kind="daemon") as d,
        ):
            channel = (await a.request("createChannel", slug="ops", name="Ops"))["scopeId"]
            made = await a.request(
                "createTask",
                title="Ship it",
                assignees=[bob.id, bot.id],
                channelId=channel,
            )
            task_id = made["taskId"]
            assert made["scopeId"] == task_id
            card = await a.events_until(lambda ev: ev["type"] == "message", 5)
            assert card[-1]["scopeId"] == channel
            assert card[-1]["message"]["messageType"] == "task_card"
            assert card[-1]["message"]["metadata"]["taskId"] == task_id
            created = await b.events_until(lambda ev: ev["type"] == "taskUpdated", 5)
            assert created[-1]["changes"] == ["created"]
            assert created[-1]["assignees"] == [bob.id, bot.id]
            # The assignment wake is written for the outbox worker, which delivers it once.
            assert [(w[0], w[1]) for w in await _task_wakes(database_url, task_id)] == [
                (bot.id, "worker_first_targeted")
            ]
            woke = await d.events_until(lambda ev: ev["type"] == "deliver", 5)
            assert (woke[-1]["reason"], woke[-1]["taskId"]) == ("task_assigned", task_id)
            assert woke[-1]["message"]["content"] == "Ship it"
            await d.request("ack", deliveryId=woke[-1]["deliveryId"])

            listed = await b.request("tasks", filter="assigned")
            assert [t["taskId"] for t in listed["tasks"]] == [task_id]
            assert (await a.request("tasks", filter="assigned"))["tasks"] == []
            by_channel = await a.request("tasks", filter="created", channelId=channel)
            assert by_channel["tasks"][0]["title"] == "Ship it"
            assert by_channel["nextCursor"] is None

            sent = await a.send(f"task:{task_id}", "Starting now")
            got = await b.events_until(lambda ev: ev["type"] == "message", 5)
            assert got[-1]["message"]["messageType"] == "task_discussion"
            history = await b.history(f"task:{task_id}")
            assert [m["content"] for m in history["messages"]] == ["Starting now"]
            assert await _unread(b, task_id) == 1
            await b.request("markRead", scopeId=task_id, seq=sent["acceptedSeq"])
            assert await _unread(b, task_id) == 0

            # Outsiders and private agents under the usual authority rules.
            with pytest.raises(ClientError) as outsider:
                await e.request("updateTask", taskId=task_id, status="done")
            assert outsider.value.code == "not_found"
            with pytest.raises(ClientError) as not_owner:
                await b.request("updateTask", taskId=task_id, assignees=[bob.id, pet.id])
            assert not_owner.value.code == "not_found"
            assert not_owner.value.frame["details"]["path"] == "$.assignees[1]"
            with pytest.raises(ClientError) as private:
                await p.request("createTask", title="mine")
            assert private.value.code == "forbidden"

            # A status change reaches every member's sessions.
            updated = await b.request("updateTask", taskId=task_id, status="in_progress")
            assert updated["task"]["status"] == "in_progress"
            for client in (a, b):
                events = await client.events_until(
                    lambda ev: ev["type"] == "taskUpdated" and "status" in ev["changes"], 5
                )
                assert events[-1]["status"] == "in_progress"
                assert events[-1]["changes"] == ["status"]
            assert not _of(await _quiet_events(e, QUIET), "taskUpdated")

            # Unassigning an agent before the worker delivered suppresses its wake.
            await a.request("updateTask", taskId=task_id, assignees=[bob.id, idle.id])
            await a.request("updateTask", taskId=task_id, assignees=[bob.id])
            wakes = await _task_wakes(database_url, task_id)
            assert [(w[0], w[2]) for w in wakes] == [
                (bot.id, "delivered"),
                (idle.id, "suppressed"),
            ]
            assert wakes[1][3] == {"reason": "task_assigned", "taskId": task_id}
            assert not _of(await _quiet_events(d, QUIET), "deliver")

        # An agent that connects later gets its pending assignment at connect.
        late = await world.member("late", MemberType.AGENT)
        async with world.client(ann) as a:
            later = await a.create_task("Later", assignees=[late.id])
        await _hold_back_worker(database_url, later["taskId"])
        async with world.client(late, kind="daemon") as d:
            woke = await d.events_until(lambda ev: ev["type"] == "deliver", 5)
            assert (woke[-1]["reason"], woke[-1]["taskId"]) == ("task_assigned", later["taskId"])
            await d.request("ack", deliveryId=woke[-1]["deliveryId"])

        # examples/task_agent.py takes a task assigned to it, reports and finishes it.
        worker = await world.member("worker", MemberType.AGENT)
        agent = _example("task_agent")
        async with world.client(ann) as a:
            made = await a.create_task("Write docs", assignees=[worker.id])
            url = f"{node.url}?workspace={world.workspace_id}"
            async with open_daemon(url, worker.token, name="task-agent") as daemon:
                with trio.fail_after(10):
                    await agent.work_on(daemon, await daemon.next_wake())
            done = await a.tasks("created", status="done")
            assert [t["taskId"] for t in done] == [made["taskId"]]
            history = await a.history(f"task:{made['taskId']}")
            assert [m["content"] for m in history["messages"]] == ["On it.", "Done: Write docs"]


async def test_crash_before_delivery_replays_discussion_to_frozen_recipients_once(
    database_url: str, tmp_path: Path
) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "node.log"
    async with serve_subprocess(
        data_dir, database_url, log_path, module="tests.mute_sends_node"
    ) as node:
        world = await World.create(node)  # type: ignore[arg-type]
        ann, bob, cat = await world.members("ann", "bob", "cat")
        async with world.client(ann) as a, world.client(bob) as b:
            task_id = (await a.request("createTask", title="Crash", assignees=[bob.id]))["taskId"]
            sent = await a.send(f"task:{task_id}", "frozen for bob")
            # Committed, nothing pushed: only the outbox row knows.
            assert not _of(await _quiet_events(b, QUIET), "message")
            # Cat joins after the send: not one of its frozen recipients.
            await a.request("updateTask", taskId=task_id, assignees=[bob.id, cat.id])
        os.kill(node.proc.pid, signal.SIGKILL)
        with trio.fail_after(10):
            await node.proc.wait()
    async with serve_subprocess(data_dir, database_url, log_path) as node:
        world = World(node, world.workspace_id)  # type: ignore[arg-type]
        async with world.client(bob) as b, world.client(cat) as c:
            # The row is due now that both are connected (a replay reaches only
            # connected sessions; the unread count is the database's either way).
            policy, status, recipients = await _make_due(database_url, sent["messageId"])
            assert (policy, status) == ("inline_targeted", "pending")
            assert sorted(r[0] for r in recipients) == sorted([ann.id, bob.id])
            with trio.fail_after(10):
                got = await b.events_until(lambda ev: ev["type"] == "message", 10)
            got += await _quiet_events(b, 1.5)  # and no second one
            assert [m["message"]["id"] for m in _of(got, "message")] == [sent["messageId"]]
            assert not _of(await _quiet_events(c, QUIET), "message")
            assert await _unread(b, task_id) == 1
            assert await _unread(c, task_id) == 0


async def _make_due(database_url: str, message_id: str) -> tuple[Any, ...]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "UPDATE scope_fanout_outbox SET next_attempt_at = now()"
            " WHERE message_id = %s AND fanout_type = 'realtime'"
            " RETURNING delivery_policy, status, payload->'recipients'",
            (message_id,),
        )
        return tuple(await cur.fetchone() or (None, None, None))


async def _hold_back_worker(database_url: str, task_id: str) -> None:
    """Keep the outbox worker off a task's wakes: only the connect can deliver them."""
    async with await connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE scope_fanout_outbox SET next_attempt_at = now() + interval '1 hour'"
            " WHERE scope_id = %s",
            (task_id,),
        )
