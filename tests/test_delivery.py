"""Agent deliveries: ack, redelivery on reconnect, the outbox worker."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import psycopg
import trio

from actors.model import MemberType
from node.client import Client
from node.outbox_worker import WorkerSettings
from tests.nodes import World, make_channel, running_node

DAEMON = {"kind": "daemon", "capabilities": ["freshness", "ack"]}
FAST_WORKER = WorkerSettings(poll_interval=0.05, backoff_base=0.1, prune_every=3600)


def outbox_rows(database_url: str, agent_id: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT status, attempts, last_error, suppression_reason FROM scope_fanout_outbox"
            " WHERE fanout_type = 'agent_wake' AND target_member_id = %s ORDER BY id",
            (agent_id,),
        ).fetchall()


def make_wakes_due(database_url: str, agent_id: str, max_attempts: int | None = None) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE scope_fanout_outbox SET next_attempt_at = now(),"
            " max_attempts = coalesce(%s, max_attempts)"
            " WHERE target_member_id = %s AND status = 'pending'",
            (max_attempts, agent_id),
        )


async def delivers_until(client: Client, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    with trio.fail_after(timeout):
        while len(got) < count:
            event = await client.next_event()
            if event["type"] == "deliver":
                got.append(event)
    return got


async def test_unacked_deliveries_come_back_in_order_acked_ones_never(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        async with world.client(human) as h:
            async with world.client(agent, **DAEMON) as a:
                await make_channel(h, "work", a)
                for i in range(3):
                    await h.send("#work", f"@helper task {i}")
                first = await delivers_until(a, 3)
                assert [d["targetSeq"] for d in first] == [1, 2, 3]
                assert {d["reason"] for d in first} == {"mention"}
                assert await a.request("ack", deliveryId=first[0]["deliveryId"]) == {}
            # Offline: two more wakes queue up.
            await h.send("#work", "@helper task 3")
            await h.send("#work", "no mention here")
            await h.send("#work", "@helper task 4")
            async with world.client(agent, **DAEMON) as again:
                redelivered = await delivers_until(again, 4)
                assert [d["targetSeq"] for d in redelivered] == [2, 3, 4, 6]
                assert [d["message"]["content"] for d in redelivered] == [
                    "@helper task 1",
                    "@helper task 2",
                    "@helper task 3",
                    "@helper task 4",
                ]
                for delivery in redelivered:
                    await again.request("ack", deliveryId=delivery["deliveryId"])
            async with world.client(agent, **DAEMON) as third:
                await h.send("#work", "@helper marker")
                (only,) = await delivers_until(third, 1)
                assert only["message"]["content"] == "@helper marker"
        assert [r[0] for r in outbox_rows(database_url, agent.id)] == ["delivered"] * 5 + [
            "pending"
        ]


async def test_unacknowledged_push_retries_with_backoff_then_fails(
    database_url: str, tmp_path: Path
) -> None:
    backoff = WorkerSettings(poll_interval=0.02, backoff_base=0.3, prune_every=3600)
    async with running_node(database_url, tmp_path, outbox=backoff) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("deaf", MemberType.AGENT)
        async with world.client(human) as h, world.client(agent, **DAEMON) as a:
            await make_channel(h, "retry", a)
            await h.send("#retry", "@deaf please")
            (inline,) = await delivers_until(a, 1)
            make_wakes_due(database_url, agent.id, max_attempts=3)
            arrivals = []
            for _ in range(3):
                (retry,) = await delivers_until(a, 1)
                assert retry["deliveryId"] == inline["deliveryId"]
                arrivals.append(trio.current_time())
            gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
            # Exponential backoff: at least 0.3 s, then at least 0.6 s (each with
            # ≤ 25 % jitter and a poll on top). Lower bounds only: a busy host
            # can delay a push, never hurry it.
            assert gaps[0] >= 0.3
            assert gaps[1] >= 0.6
            with trio.fail_after(5):
                while outbox_rows(database_url, agent.id)[0][0] != "failed":
                    await trio.sleep(0.05)
            status, attempts, last_error, _ = outbox_rows(database_url, agent.id)[0]
            assert (status, attempts, last_error) == ("failed", 3, "not acknowledged")
        # The worker gave up pushing, but the daemon still gets it when it connects.
        async with world.client(agent, **DAEMON) as again:
            (late,) = await delivers_until(again, 1)
            assert late["deliveryId"] == inline["deliveryId"]
            assert await again.request("ack", deliveryId=late["deliveryId"]) == {}
        assert outbox_rows(database_url, agent.id)[0][0] == "delivered"


async def test_suppressed_target_is_never_pushed(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path, outbox=FAST_WORKER) as node:
        world = await World.create(node)
        human = await world.member("human")
        worker_agent = await world.member("gone", MemberType.AGENT)
        reconnecting = await world.member("later", MemberType.AGENT)
        async with world.client(human) as h:
            async with (
                world.client(worker_agent, **DAEMON) as g,
                world.client(reconnecting, **DAEMON) as r,
            ):
                scope_id = await make_channel(h, "sup", g, r)
            # Both agents are offline when they are mentioned, then leave the channel.
            await h.send("#sup", "@gone @later do it")
            async with world.client(worker_agent) as g2, world.client(reconnecting) as r2:
                await g2.request("leave", scopeId=scope_id)
                await r2.request("leave", scopeId=scope_id)
            # The worker re-checks before pushing: the row is suppressed, not pushed.
            make_wakes_due(database_url, worker_agent.id)
            with trio.fail_after(5):
                while outbox_rows(database_url, worker_agent.id)[0][0] != "suppressed":
                    await trio.sleep(0.05)
            assert outbox_rows(database_url, worker_agent.id)[0][3] == "not_member"
            # Redelivery on connect re-checks too.
            async with world.client(reconnecting, **DAEMON) as r3:
                # Redelivery runs before later requests complete; a pong after it proves
                # nothing was pushed.
                await r3.request("scopes")
                await r3.send_raw('{"type":"ping","id":"after-redelivery"}')
                events = await r3.events_until(lambda e: e["type"] == "pong", timeout=5)
                assert [e["type"] for e in events if e["type"] == "deliver"] == []
            assert outbox_rows(database_url, reconnecting.id)[0][3] == "not_member"
