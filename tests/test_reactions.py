"""Reactions end to end (docs/design.md#reactions): real node, real WebSockets, real PostgreSQL.

Two members react with the same emoji and both sessions see both events and
history counts 2; a second add changes nothing; a remove deletes the row and
suppresses its activity row; outsiders, other workspaces and private agents
that cannot read the message are refused; a message takes at most 20
distinct emoji; a reaction never moves the scope's seqs; an agent is woken
only on its own message under ``auto-wake``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import MemberType
from actors.policy import reaction_emoji_error
from node.client import Client, ClientError
from storage.pg import connect
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10
TWENTY = [chr(0x1F600 + i) for i in range(21)]  # 😀 … 21 distinct emoji


def reaction_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "reaction"]


async def reactions_until(client: Client, count: int) -> list[dict[str, Any]]:
    """The next ``count`` reaction events of a session."""
    seen: list[dict[str, Any]] = []

    def enough(event: dict[str, Any]) -> bool:
        if event["type"] == "reaction":
            seen.append(event)
        return len(seen) == count

    await client.events_until(enough, timeout=TIMEOUT)
    return seen


async def code_of(client: Client, message_id: str, emoji: str, op: str = "add") -> str:
    with pytest.raises(ClientError) as failed:
        await client.react(message_id, emoji, op)
    return str(failed.value.code)


async def history_message(client: Client, target: str, message_id: str) -> dict[str, Any]:
    history = await client.history(target)
    return next(m for m in history["messages"] if m["id"] == message_id)


async def activity_rows(database_url: str, message_id: str) -> list[tuple[Any, ...]]:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT actor_member_id, activity_type, reason, payload->>'emoji',"
            " suppressed_at IS NOT NULL FROM scope_activity_events"
            " WHERE source_message_id = %s ORDER BY activity_global_seq",
            (message_id,),
        )
        return list(await cur.fetchall())


async def test_reactions_counts_events_and_activity(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            scope = await make_channel(a, "c", b)
            sent = await a.send("#c", "ship it")
            message_id = sent["messageId"]

            assert await a.react(message_id, "👍") == {"changed": True}
            assert await b.react(message_id, "👍") == {"changed": True}
            for session in (a, b):
                events = await reactions_until(session, 2)
                assert [(e["memberId"], e["emoji"], e["op"]) for e in events] == [
                    (ann.id, "👍", "add"),
                    (bob.id, "👍", "add"),
                ]
                assert {e["scopeId"] for e in events} == {scope}
                assert {e["messageId"] for e in events} == {message_id}

            shown = await history_message(b, "#c", message_id)
            assert shown["reactions"] == [
                {"emoji": "👍", "count": 2, "memberIds": [ann.id, bob.id]}
            ]
            # Adding what is there changes nothing and pushes nothing.
            assert await b.react(message_id, "👍") == {"changed": False}
            # Ordered by first reaction; short names are reactions too.
            assert await b.react(message_id, ":tada:") == {"changed": True}
            for session in (a, b):
                (event,) = await reactions_until(session, 1)
                assert event["emoji"] == ":tada:"
            shown = await history_message(a, "#c", message_id)
            assert [(r["emoji"], r["count"]) for r in shown["reactions"]] == [
                ("👍", 2),
                (":tada:", 1),
            ]

            # A reaction is not a message: the scope's seqs stay where they were.
            history = await a.history("#c")
            assert history["latestSeq"] == sent["acceptedSeq"]

            rows = await activity_rows(database_url, message_id)
            assert rows == [
                (ann.id, "reaction_add", "reaction", "👍", False),
                (bob.id, "reaction_add", "reaction", "👍", False),
                (bob.id, "reaction_add", "reaction", ":tada:", False),
            ]

            # Remove deletes the reaction and suppresses its activity row.
            assert await b.react(message_id, "👍", "remove") == {"changed": True}
            for session in (a, b):
                (event,) = await reactions_until(session, 1)
                assert (event["memberId"], event["emoji"], event["op"]) == (
                    bob.id,
                    "👍",
                    "remove",
                )
            assert await b.react(message_id, "👍", "remove") == {"changed": False}
            rows = await activity_rows(database_url, message_id)
            assert [row[4] for row in rows] == [False, True, False]
            shown = await history_message(a, "#c", message_id)
            assert shown["reactions"][0] == {"emoji": "👍", "count": 1, "memberIds": [ann.id]}

            # Resume carries the summary too.
        async with world.client(ann, resume={scope: 0}) as again:
            events = await again.events_until(lambda e: e["type"] == "resumed", timeout=TIMEOUT)
            resumed = next(
                e["message"]
                for e in events
                if e["type"] == "message" and e["message"]["id"] == message_id
            )
            assert [(r["emoji"], r["count"]) for r in resumed["reactions"]] == [
                ("👍", 1),
                (":tada:", 1),
            ]


async def test_queued_reactions_answer_as_one_by_one(database_url: str, tmp_path: Path) -> None:
    """Reactions queued together on the actor are written in group statements:
    the cap and every ``changed`` are still those of one statement per reaction."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            await make_channel(a, "c", b)
            crowded = (await a.send("#c", "crowded"))["messageId"]
            shared = (await a.send("#c", "shared"))["messageId"]
            other = (await a.send("#c", "other"))["messageId"]
            answers: list[tuple[str, str, str]] = []

            async def react(client: Client, name: str, message_id: str, emoji: str) -> None:
                try:
                    result = await client.react(message_id, emoji)
                    answers.append((name, message_id, str(result["changed"])))
                except ClientError as error:
                    answers.append((name, message_id, str(error.code)))

            async with trio.open_nursery() as nursery:
                for emoji in TWENTY:
                    nursery.start_soon(react, a, "ann", crowded, emoji)
                for client, name in ((a, "ann"), (b, "bob")):
                    for message_id in (shared, shared, other):
                        nursery.start_soon(react, client, name, message_id, "👍")
            assert sorted(r for _, m, r in answers if m == crowded) == [
                *["True"] * 20,
                "validation_failed",
            ]
            for name in ("ann", "bob"):
                assert sorted(r for n, m, r in answers if n == name and m == shared) == [
                    "False",
                    "True",
                ]
                assert [r for n, m, r in answers if n == name and m == other] == ["True"]
            assert len(await activity_rows(database_url, crowded)) == 20
            assert sorted(row[0] for row in await activity_rows(database_url, shared)) == sorted(
                [ann.id, bob.id]
            )
            shown = await history_message(a, "#c", crowded)
            assert len(shown["reactions"]) == 20


async def test_who_may_react(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        other = await World.create(node, "other")
        ann = await world.member("ann")
        bob = await world.member("bob")
        out = await world.member("out")
        foreign = await other.member("zed")
        agent = await world.member("ann-bot", MemberType.AGENT, owner=ann, private=True)
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(out) as o,
            other.client(foreign) as f,
            world.client(agent) as p,
        ):
            scope = await make_channel(a, "c", b)
            await a.request("invite", scopeId=scope, memberId=agent.id, visibility="private")
            by_bob = (await b.send("#c", "from bob"))["messageId"]
            by_ann = (await a.send("#c", "from ann"))["messageId"]

            assert await code_of(o, by_bob, "👍") == "forbidden"
            assert await code_of(f, by_bob, "👍") == "not_found"
            assert await code_of(a, "msg_0000000000000000000000000000", "👍") == "not_found"
            assert await code_of(a, by_bob, "ok") == "validation_failed"
            assert await code_of(a, by_bob, "👍 👍") == "validation_failed"

            # The private agent reads its owner's message, not bob's (no grant).
            assert await code_of(p, by_bob, "👍") == "forbidden"
            assert await p.react(by_ann, "👀") == {"changed": True}
            # Its reaction reveals a private membership: only it and its owner see it.
            (event,) = await reactions_until(a, 1)
            assert event["memberId"] == agent.id
            assert (await history_message(a, "#c", by_ann))["reactions"] == [
                {"emoji": "👀", "count": 1, "memberIds": [agent.id]}
            ]
            assert (await history_message(b, "#c", by_ann))["reactions"] == []

            # 20 distinct emoji per message; an emoji already there is always room.
            for emoji in TWENTY[:20]:
                assert await a.react(by_bob, emoji) == {"changed": True}
            assert await code_of(b, by_bob, TWENTY[20]) == "validation_failed"
            assert await b.react(by_bob, TWENTY[0]) == {"changed": True}

            # A member who left reads nothing and reacts to nothing.
            await b.request("leave", scopeId=scope)
            assert await code_of(b, by_ann, "👍") == "forbidden"


async def test_reactions_on_a_known_message_answer_once_and_free_their_slot(
    database_url: str, tmp_path: Path
) -> None:
    """Once a message's scope is known, a session queues reactions on the actor
    without a task per request: each is still answered once, refusals
    included, and each frees its in-flight slot (two slots here: a leak would
    stall the session within three requests)."""
    async with running_node(database_url, tmp_path, max_inflight_requests=2) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        out = await world.member("out")
        async with world.client(ann) as a, world.client(out) as o:
            await make_channel(a, "c")
            message_id = (await a.send("#c", "react here"))["messageId"]
            answers = [await a.react(message_id, "👍", ("add", "remove")[i % 2]) for i in range(6)]
            assert answers == [{"changed": True}, {"changed": True}] * 3
            for _ in range(3):
                assert await code_of(o, message_id, "👍") == "forbidden"
                assert await code_of(a, message_id, "no") == "validation_failed"
            async with trio.open_nursery() as nursery:
                for emoji in TWENTY[:8]:
                    nursery.start_soon(a.react, message_id, emoji)
            shown = await history_message(a, "#c", message_id)
            assert sorted(r["emoji"] for r in shown["reactions"]) == sorted(TWENTY[:8])


async def test_reaction_wakes_only_an_auto_wake_author(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bot = await world.member("bot", MemberType.AGENT)
        async with (
            world.client(ann) as a,
            world.client(bot, kind="daemon") as d,
        ):
            scope = await make_channel(a, "c", d)
            mine = (await d.send("#c", "bot says"))["messageId"]
            theirs = (await a.send("#c", "ann says"))["messageId"]
            # Default setting: the daemon is not woken, even on its own message.
            await a.react(mine, "👍")
            await d.request("setNotification", scopeId=scope, state="auto-wake")
            await a.react(theirs, "👍")  # not its message: no wake
            await a.react(mine, "🎉")  # its message under auto-wake: woken
            (event,) = await reactions_until(d, 1)
            assert (event["messageId"], event["emoji"]) == (mine, "🎉")
            rows = await activity_rows(database_url, mine)
            assert [(r[2], r[3]) for r in rows] == [("reaction", "👍"), ("author_auto_wake", "🎉")]


def test_emoji_form() -> None:
    for good in ("👍", "👨\u200d👩\u200d👧", "🇫🇷", "1️⃣", "👍🏽", ":+1:", ":thumbs_up:"):
        assert reaction_emoji_error(good) is None, good
    for bad in ("", "ok", "a", " 👍", "👍\n", "\x00", ":Bad:", "::", ":" + "a" * 31 + ":"):
        assert reaction_emoji_error(bad) is not None, bad
    assert reaction_emoji_error("🏳️" * 9) is not None  # over 16 code points
