"""Rewind (docs/rewind.md) over real WebSockets and PostgreSQL.

One node: a channel with its owner, a second person, a public agent and the
owner's private agent. Wakes pending after the recovery point are suppressed
by the rewind (outbox rows ``suppressed``, no push), a wake the outbox worker
leased before the rewind is not pushed after it (the worker re-checks),
``invalidate`` reaches every session, the notice raises no unread and wakes
no one, history after the point stays readable and is marked ``rewound``, and
only the permitted members may rewind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import MemberType
from node.client import Client, ClientError, open_daemon
from node.outbox_worker import OutboxWorker, WorkerSettings
from storage.outbox import LeasedRow
from storage.pg import connect
from tests.nodes import RunningNode, World, running_node

QUIET = 0.4


async def _quiet(client: Client, seconds: float = QUIET) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with trio.move_on_after(seconds):
        while True:
            out.append(await client.next_event())
    return out


async def _outbox(database_url: str, scope_id: str) -> list[tuple[Any, ...]]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT target_seq, fanout_type, target_member_id, status, suppression_reason"
            " FROM scope_fanout_outbox WHERE scope_id = %s ORDER BY id",
            (scope_id,),
        )
        return [tuple(r) for r in await cur.fetchall()]


async def _lease_for_probe(database_url: str, message_id: str, agent_id: str) -> LeasedRow:
    """Lease one wake row as a worker named ``probe`` would (far from expiring)."""
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "UPDATE scope_fanout_outbox SET status = 'leased', lease_owner = 'probe',"
            " lease_expires_at = now() + interval '1 hour', attempts = attempts + 1"
            " WHERE message_id = %s AND target_member_id = %s AND fanout_type = 'agent_wake'"
            " RETURNING id, scope_id, message_id, fanout_type, target_member_id, target_seq,"
            " dedupe_key, payload->>'reason', attempts, max_attempts",
            (message_id, agent_id),
        )
        row = await cur.fetchone()
    assert row is not None
    return LeasedRow(*row)


async def _unread(client: Client, scope_id: str) -> int:
    scopes = (await client.request("scopes"))["scopes"]
    return int(next(s["unread"] for s in scopes if s["id"] == scope_id))


async def test_rewind(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        await _channel_rewind(node, world)
        await _dm_rewind(world)


async def _channel_rewind(node: RunningNode, world: World) -> None:
    """Suppression, the worker's re-check, invalidate, the notice and history."""
    database_url = node.database_url
    ann, bob = await world.members("ann", "bob")
    bot = await world.member("bot", MemberType.AGENT)
    pet = await world.member("pet", MemberType.AGENT, owner=ann, private=True)
    async with (
        world.client(ann) as a,
        world.client(bob) as b,
        world.client(bot, kind="daemon") as d,
        world.client(pet, kind="daemon") as p,
    ):
        scope = (await a.request("createChannel", slug="ops", name="Ops"))["scopeId"]
        await b.request("join", scopeId=scope)
        await a.request("invite", scopeId=scope, memberId=bot.id)
        await a.request("invite", scopeId=scope, memberId=pet.id, visibility="private")
        start = await a.send("#ops", "start here")
        point = await a.mark_recovery_point(start["messageId"])
        assert point["seq"] == start["acceptedSeq"]
        # Any reader may mark; the same message is the same point.
        again = await b.mark_recovery_point(start["messageId"])
        assert again["recoveryPointId"] == point["recoveryPointId"]

        asked = await b.send("#ops", "@bot please look")
        told = await a.send("#ops", "@pet do it")
        leased = await a.send("#ops", "@bot and this")
        for daemon in (d, p):
            await daemon.events_until(lambda ev: ev["type"] == "deliver", 5)
        await d.events_until(
            lambda ev: ev["type"] == "deliver" and ev["message"]["id"] == leased["messageId"], 5
        )
        probe_row = await _lease_for_probe(database_url, leased["messageId"], bot.id)
        unread_before = await _unread(b, scope)

        # Only the channel's owner rewinds; a private agent never does.
        for client in (b, p):
            with pytest.raises(ClientError) as denied:
                await client.rewind(scope, point["recoveryPointId"])
            assert denied.value.code == "forbidden"
        with pytest.raises(ClientError) as missing:
            await a.rewind(scope, "rcp_nope")
        assert missing.value.code == "not_found"

        done = await a.rewind(scope, point["recoveryPointId"])
        assert done["fromSeq"] == start["acceptedSeq"] + 1
        assert done["throughSeq"] == leased["acceptedSeq"]
        rows = await _outbox(database_url, scope)
        # The three wakes nobody acknowledged, and realtime rows not yet marked
        # delivered (marks are batched after the inline push).
        assert done["suppressed"] == len([r for r in rows if r[3] == "suppressed"]) >= 3
        after = [r for r in rows if r[0] is not None and r[0] > start["acceptedSeq"]]
        assert {r[3] for r in after if r[1] == "realtime"} <= {"delivered", "suppressed"}
        wakes = [r for r in after if r[1] == "agent_wake"]
        assert [(r[2], r[3]) for r in wakes] == [
            (bot.id, "suppressed"),
            (pet.id, "suppressed"),
            (bot.id, "suppressed"),
        ]
        assert all(str(r[4]).startswith("rewind:") for r in wakes)
        # The notice has no outbox row at all: nothing to deliver, nothing to wake.
        notice_seq = leased["acceptedSeq"] + 1
        assert not [r for r in rows if r[0] == notice_seq]

        # invalidate reaches every session that reads the scope.
        for client in (a, b, d, p):
            got = await client.events_until(lambda ev: ev["type"] == "invalidate", 5)
            assert (got[-1]["scopeId"], got[-1]["reason"], got[-1]["fromSeq"]) == (
                scope,
                "rewind",
                done["fromSeq"],
            )
        # No wake for the notice, and no wake from the worker's stale lease.
        settings = WorkerSettings()
        worker = OutboxWorker(node.services.pool, node.services.hub, "probe", settings)
        async with node.services.pool.connection() as conn:
            await worker._handle(conn, probe_row)
        assert worker.pushed == 0
        for daemon in (d, p):
            assert not [e for e in await _quiet(daemon) if e["type"] == "deliver"]
        assert await _unread(b, scope) == unread_before

        history = await b.history("#ops")
        shown = {m["seq"]: m for m in history["messages"]}
        assert [s for s, m in shown.items() if m.get("rewound")] == [
            asked["acceptedSeq"],
            told["acceptedSeq"],
            leased["acceptedSeq"],
        ]
        notice = shown[notice_seq]
        assert notice["id"] == done["noticeMessageId"]
        assert notice["messageType"] == "rewind_notice"
        assert "rewound this conversation" in notice["content"]
        assert not notice.get("rewound")
        assert not shown[start["acceptedSeq"]].get("rewound")

        # Nothing new since: the same rewind answers again, idempotently.
        repeat = await a.rewind(scope, point["recoveryPointId"])
        assert repeat["noticeMessageId"] == done["noticeMessageId"]
        assert repeat["suppressed"] == 0
        latest = (await a.history("#ops"))["latestSeq"]
        assert latest == notice_seq


async def _dm_rewind(world: World) -> None:
    """In a DM its people rewind, and the owner of the private agent it talks to."""
    ann, bob = await world.members("dan", "eve")
    pet = await world.member("kit", MemberType.AGENT, owner=ann, private=True)
    async with world.client(ann) as a, world.client(bob) as b, world.client(pet) as p:
        with_pet = await a.send(f"dm:{pet.id}", "hello pet")
        # The agent's runtime marks the point (the daemon library's call).
        url = f"{world.node.url}?workspace={world.workspace_id}"
        async with open_daemon(url, pet.token, name="kit-runtime") as daemon:
            point_id = await daemon.mark_recovery_point(with_pet["messageId"])
        point = await p.mark_recovery_point(with_pet["messageId"])
        assert point["recoveryPointId"] == point_id
        with pytest.raises(ClientError) as agent:
            await p.rewind(point["scopeId"], point["recoveryPointId"])
        assert agent.value.code == "forbidden"
        assert (await a.rewind(point["scopeId"], point["recoveryPointId"]))["suppressed"] == 0
        dm = await a.send(f"dm:{bob.id}", "hi bob")
        bob_point = await b.mark_recovery_point(dm["messageId"])
        await a.send(f"dm:{bob.id}", "later")
        assert (await b.rewind(bob_point["scopeId"], bob_point["recoveryPointId"]))[
            "fromSeq"
        ] == dm["acceptedSeq"] + 1
        # Bob may not read ann's conversation with her agent: no such message to him.
        with pytest.raises(ClientError) as hidden:
            await b.mark_recovery_point(with_pet["messageId"])
        assert hidden.value.code == "not_found"
