"""Edits and deletes (docs/design.md#edits-and-deletes).

Pure rules first (Policy and Planner, no I/O), then real nodes over real
WebSockets and PostgreSQL: an edit reaches every current reader once as
``messageUpdated`` and wakes only newly mentioned agents; a delete leaves a
tombstone, tells readers with ``messageDeleted`` and withdraws the message's
pending wakes; a node killed between an edit's commit and its projection has
the outbox worker deliver it once after restart.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import Member, Membership, MemberType, NotificationState, StoredMessage
from actors.planner import ScopeContext, plan_delete, plan_edit
from actors.policy import can_delete, can_edit
from actors.visibility import VisibilityContext
from node.client import Client, ClientError
from storage.pg import connect
from tests.nodes import World, make_channel, running_node
from tests.test_crash_recovery import serve_subprocess

WS = "ws_1"
QUIET = 0.5  # how long "no further event" is watched for
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _human(member_id: str) -> Member:
    return Member(member_id, WS, MemberType.HUMAN, member_id, member_id)


def _agent(member_id: str) -> Member:
    return Member(member_id, WS, MemberType.AGENT, member_id, member_id)


ANN, BOB, OWNER, GONE = _human("ann"), _human("bob"), _human("owner"), _human("gone")
BOT, HELPER = _agent("bot"), _agent("helper")


def _ctx() -> VisibilityContext:
    intervals = {
        m.id: (Membership(m.id, "public", None, 1),) for m in (ANN, BOB, OWNER, BOT, HELPER)
    }
    intervals[GONE.id] = (Membership(GONE.id, "public", None, 1, 2),)
    members = {m.id: m for m in (ANN, BOB, OWNER, BOT, HELPER, GONE)}
    return VisibilityContext(intervals, members, ())


def _message(content: str, author: Member = ANN, mentions: tuple[str, ...] = ()) -> StoredMessage:
    metadata: dict[str, Any] = {"mentions": list(mentions)} if mentions else {}
    return StoredMessage(
        "msg_1", "scp_1", 3, 30, author, "text", content, T0, metadata=metadata, mentions=mentions
    )


# ---------------------------------------------------------------- pure rules


def test_only_the_author_edits_and_only_text() -> None:
    ctx = _ctx()
    assert can_edit(ctx, ANN, ANN.id, "text").reason == "author"
    assert can_edit(ctx, BOB, ANN.id, "text").reason == "not_author"
    assert can_edit(ctx, OWNER, ANN.id, "text").reason == "not_author"
    assert can_edit(ctx, ANN, ANN.id, "channel_share_card").reason == "not_text_message"
    assert can_edit(ctx, GONE, GONE.id, "text").reason == "not_member"


def test_author_and_channel_owner_delete() -> None:
    ctx = _ctx()
    assert can_delete(ctx, ANN, ANN.id, OWNER.id).reason == "author"
    assert can_delete(ctx, OWNER, ANN.id, OWNER.id).reason == "channel_owner"
    assert can_delete(ctx, BOB, ANN.id, OWNER.id).reason == "not_author"
    assert can_delete(ctx, BOB, ANN.id, None).reason == "not_author"  # a DM has no owner
    assert can_delete(ctx, GONE, GONE.id, OWNER.id).reason == "not_member"


def test_an_edit_wakes_only_agents_mentioned_for_the_first_time() -> None:
    scope = ScopeContext(_ctx(), {HELPER.id: NotificationState.ACTIVE}, 5)
    stored = _message("hi @helper", mentions=("helper",))
    plan = plan_edit(stored, ANN, "hi @helper and @bot", scope, T0)
    assert plan.message.revision == 1
    assert plan.expected_revision == 0
    assert plan.message.mentions == ("bot", "helper")
    assert plan.wakes == (("bot", "mention"),)
    assert [o.dedupe_key for o in plan.outbox] == ["edit:msg_1:1", "wake:msg_1:bot"]
    assert plan.outbox[0].delivery_policy.value == "worker_first_mutation"
    assert plan.readers == {ANN.id, BOB.id, OWNER.id, BOT.id, HELPER.id}
    # Dropping a mention and editing nothing new wakes nobody.
    assert plan_edit(stored, ANN, "hi", scope, T0).wakes == ()


def test_a_delete_plans_a_tombstone_and_no_wake() -> None:
    scope = ScopeContext(_ctx(), {}, 5)
    plan = plan_delete(_message("hi @bot", mentions=("bot",)), OWNER, scope, T0)
    assert plan.message.content == ""
    assert plan.message.mentions == ()
    assert plan.message.seq == 3
    assert plan.wakes == ()
    assert [o.dedupe_key for o in plan.outbox] == ["delete:msg_1"]


# ---------------------------------------------------------------- a node


async def _quiet_events(client: Client, seconds: float = QUIET) -> list[dict[str, Any]]:
    """Every event that arrives within ``seconds``."""
    events: list[dict[str, Any]] = []
    with trio.move_on_after(seconds):
        while True:
            events.append(await client.next_event())
    return events


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def _wake_rows(database_url: str, message_id: str) -> list[tuple[str, str]]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT target_member_id, status FROM scope_fanout_outbox"
            " WHERE message_id = %s AND fanout_type = 'agent_wake' ORDER BY id",
            (message_id,),
        )
        return [(str(a), str(b)) for a, b in await cur.fetchall()]


async def test_edit_reaches_every_reader_once_and_wakes_the_newly_mentioned(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            ann, bob = await world.member("ann"), await world.member("bob")
            bot = await world.member("bot", MemberType.AGENT)
            async with (
                world.client(ann) as a,
                world.client(ann) as a2,
                world.client(bob) as b,
                world.client(bot, kind="daemon", capabilities=["ack"]) as d,
            ):
                scope_id = await make_channel(a, "edits", b, d)
                sent = await a.send("#edits", "hello all")
                message_id = sent["messageId"]
                for client in (a, a2, b, d):
                    await _quiet_events(client, 0.3)

                edited = await a.edit(message_id, "hello @bot", revision=0)
                assert edited["messageId"] == message_id
                assert edited["revision"] == 1
                assert edited["editedAt"]
                for client in (a, a2, b, d):
                    updates = _of(await _quiet_events(client), "messageUpdated")
                    assert len(updates) == 1, updates
                    assert updates[0]["scopeId"] == scope_id
                    view = updates[0]["message"]
                    assert (view["id"], view["seq"], view["content"]) == (
                        message_id,
                        sent["acceptedSeq"],
                        "hello @bot",
                    )
                    assert view["revision"] == 1
                    assert view["editedAt"] == edited["editedAt"]
                    assert view["mentions"] == ["bot"]

                # The agent named for the first time was woken once, then acks.
                # (Its messageUpdated was read above; the deliver came with it.)
                history = await a.history("#edits")
                assert history["latestSeq"] == sent["acceptedSeq"]
                (shown,) = history["messages"]
                assert shown["content"] == "hello @bot"
                assert shown["revision"] == 1
                assert shown["editedAt"] == edited["editedAt"]
                assert shown["deleted"] is False
                assert await _wake_rows(database_url, message_id) == [(bot.id, "pending")]

                # Mentioning it again wakes nobody: one wake per message.
                again = await a.edit(message_id, "hello @bot, again")
                assert again["revision"] == 2
                assert not _of(await _quiet_events(d), "deliver")
                assert len(_of(await _quiet_events(b, 0.3), "messageUpdated")) == 1
                assert len(await _wake_rows(database_url, message_id)) == 1

                # A stale revision is a conflict; the stored one is named.
                with pytest.raises(ClientError) as stale:
                    await a.edit(message_id, "from an old copy", revision=1)
                assert stale.value.code == "conflict"
                assert stale.value.details["revision"] == 2
                # Retrying an edit that was stored answers the current state.
                assert (await a.edit(message_id, "hello @bot, again", revision=1))["revision"] == 2

                with pytest.raises(ClientError) as forbidden:
                    await b.edit(message_id, "not mine")
                assert forbidden.value.code == "forbidden"
                with pytest.raises(ClientError) as missing:
                    await b.edit("msg_nope", "x")
                assert missing.value.code == "not_found"
                with pytest.raises(ClientError) as empty:
                    await a.edit(message_id, "  ")
                assert empty.value.code == "validation_failed"
                assert not _of(await _quiet_events(b, 0.3), "messageUpdated")


async def test_message_updated_carries_the_reactions_each_reader_is_shown(
    database_url: str, tmp_path: Path
) -> None:
    """``messageUpdated`` shows the message's current ``reactions`` as history
    does for the same viewer: a private agent's reaction only to it and its
    owner, and to the agent only its own and its owner's."""
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            ann, bob = await world.member("ann"), await world.member("bob")
            agent = await world.member("ann-bot", MemberType.AGENT, owner=ann, private=True)
            async with (
                world.client(ann) as a,
                world.client(bob) as b,
                world.client(agent) as p,
            ):
                scope_id = await make_channel(a, "edits", b)
                await a.request("invite", scopeId=scope_id, memberId=agent.id, visibility="private")
                message_id = (await a.send("#edits", "hello all"))["messageId"]
                assert await b.react(message_id, "👍") == {"changed": True}
                assert await p.react(message_id, "👀") == {"changed": True}
                assert await a.react(message_id, "👍") == {"changed": True}
                for client in (a, b, p):
                    await _quiet_events(client, 0.3)

                await a.edit(message_id, "hello everyone")
                thumbs = {"emoji": "👍", "count": 2, "memberIds": [bob.id, ann.id]}
                eyes = {"emoji": "👀", "count": 1, "memberIds": [agent.id]}
                expected = {
                    ann.id: [thumbs, eyes],
                    bob.id: [thumbs],
                    agent.id: [eyes, {"emoji": "👍", "count": 1, "memberIds": [ann.id]}],
                }
                for client, member in ((a, ann), (b, bob), (p, agent)):
                    (update,) = _of(await _quiet_events(client), "messageUpdated")
                    assert update["message"]["content"] == "hello everyone"
                    assert update["message"]["reactions"] == expected[member.id]
                    history = await client.history(f"scope:{scope_id}")
                    (shown,) = [m for m in history["messages"] if m["id"] == message_id]
                    assert shown["reactions"] == expected[member.id]


async def test_newly_mentioned_agent_gets_exactly_one_deliver(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            ann = await world.member("ann")
            bot = await world.member("bot", MemberType.AGENT)
            async with (
                world.client(ann) as a,
                world.client(bot, kind="daemon", capabilities=["ack"]) as d,
            ):
                await make_channel(a, "wakes", d)
                sent = await a.send("#wakes", "no mention yet")
                await _quiet_events(d, 0.3)
                await a.edit(sent["messageId"], "now @bot please")
                await a.edit(sent["messageId"], "now @bot please, really")
                events = await _quiet_events(d, 1.0)
                delivers = _of(events, "deliver")
                assert len(delivers) == 1, events
                assert delivers[0]["message"]["id"] == sent["messageId"]
                assert delivers[0]["targetSeq"] == sent["acceptedSeq"]
                await d.request("ack", deliveryId=delivers[0]["deliveryId"])
                assert await _wake_rows(database_url, sent["messageId"]) == [(bot.id, "delivered")]


async def test_delete_leaves_a_tombstone_and_withdraws_pending_wakes(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            owner, ann, bob = [await world.member(h) for h in ("owner", "ann", "bob")]
            bot = await world.member("bot", MemberType.AGENT)
            async with world.client(owner) as o, world.client(ann) as a, world.client(bob) as b:
                async with world.client(bot) as joiner:
                    scope_id = await make_channel(o, "recall", a, b, joiner)
                first = await a.send("#recall", "first")
                doomed = await a.send("#recall", "wake up @bot")  # the bot is offline
                kept = await a.send("#recall", "and you too @bot")
                by_bob = await b.send("#recall", "bob's words")
                before = await o.history("#recall")
                for client in (o, a, b):
                    await _quiet_events(client, 0.3)

                with pytest.raises(ClientError) as forbidden:
                    await b.delete(doomed["messageId"])
                assert forbidden.value.code == "forbidden"
                assert await a.delete(doomed["messageId"]) == {}
                assert await a.delete(doomed["messageId"]) == {}  # idempotent
                for client in (o, a, b):
                    deleted = _of(await _quiet_events(client), "messageDeleted")
                    assert deleted == [
                        {
                            "type": "messageDeleted",
                            "scopeId": scope_id,
                            "messageId": doomed["messageId"],
                            "seq": doomed["acceptedSeq"],
                        }
                    ]
                # The channel's owner recalls anyone's message.
                assert await o.delete(by_bob["messageId"]) == {}
                with pytest.raises(ClientError) as tombstone:
                    await a.edit(doomed["messageId"], "too late")
                assert tombstone.value.code == "conflict"

                after = await o.history("#recall")
                assert after["latestSeq"] == before["latestSeq"]
                assert [m["seq"] for m in after["messages"]] == [
                    m["seq"] for m in before["messages"]
                ]
                shown = {m["id"]: m for m in after["messages"]}
                for gone in (doomed, by_bob):
                    tomb = shown[gone["messageId"]]
                    assert tomb["deleted"] is True
                    assert tomb["content"] == ""
                    assert tomb["mentions"] == []
                    assert tomb["attachments"] == []
                    assert tomb["sources"] == []
                assert shown[first["messageId"]]["content"] == "first"
                assert shown[first["messageId"]]["deleted"] is False

            # The bot connects later: the kept wake comes, the recalled one never.
            assert await _wake_rows(database_url, doomed["messageId"]) == [(bot.id, "suppressed")]
            async with world.client(bot, kind="daemon", capabilities=["ack"]) as d:
                events = await _quiet_events(d, 1.5)
            delivered = [e["message"]["id"] for e in _of(events, "deliver")]
            assert kept["messageId"] in delivered
            assert doomed["messageId"] not in delivered
            async with await connect(database_url, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM scope_message_search_docs WHERE message_id = %s",
                    (doomed["messageId"],),
                )
                assert await cur.fetchone() == (0,)


@pytest.mark.runs_for(16)
async def test_crash_between_commit_and_projection_replays_it_once(
    database_url: str, tmp_path: Path
) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "node.log"
    muted = "tests.mute_mutations_node"
    async with serve_subprocess(data_dir, database_url, log_path, module=muted) as node:
        world = await World.create(node)  # type: ignore[arg-type]
        ann, bob = await world.member("ann"), await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            scope_id = await make_channel(a, "crash", b)
            sent = await a.send("#crash", "before")
            await b.react(sent["messageId"], "👍")
            await _quiet_events(b, 0.3)
            edited = await a.edit(sent["messageId"], "after")
            # Committed, nothing pushed: only the outbox row knows.
            assert not _of(await _quiet_events(b, 0.3), "messageUpdated")
        os.kill(node.proc.pid, signal.SIGKILL)
        with trio.fail_after(10):
            await node.proc.wait()
    assert await _projection_status(database_url, sent["messageId"]) == "pending"

    async with serve_subprocess(data_dir, database_url, log_path) as node:
        world = World(node, world.workspace_id)  # type: ignore[arg-type]
        resume = {scope_id: sent["acceptedSeq"]}
        async with world.client(bob, resume=resume) as again:
            with trio.fail_after(30):
                events = await again.events_until(lambda e: e["type"] == "messageUpdated", 30)
            events += await _quiet_events(again, 2.5)  # and no second one
            updates = _of(events, "messageUpdated")
            assert len(updates) == 1, events
            view = updates[0]["message"]
            assert (view["id"], view["content"], view["revision"]) == (
                sent["messageId"],
                "after",
                1,
            )
            assert view["editedAt"] == edited["editedAt"]
            assert view["reactions"] == [{"emoji": "👍", "count": 1, "memberIds": [bob.id]}]
            assert not _of(events, "message")  # nothing new: no unread, no replay
        assert await _projection_status(database_url, sent["messageId"]) == "delivered"


async def _projection_status(database_url: str, message_id: str) -> str:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT status FROM scope_fanout_outbox"
            " WHERE message_id = %s AND fanout_type = 'mutation'",
            (message_id,),
        )
        (status,) = await cur.fetchone() or ("missing",)
        return str(status)
