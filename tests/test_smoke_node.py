from __future__ import annotations

from pathlib import Path

from actors.model import MemberType
from tests.nodes import World, make_channel, running_node


async def test_two_members_exchange_a_message(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        alice = await world.member("alice")
        bot = await world.member("bot", MemberType.AGENT)
        async with (
            world.client(alice) as a,
            world.client(bot, kind="daemon", capabilities=["freshness"]) as b,
        ):
            scope_id = await make_channel(a, "general", b)
            sent = await a.send("#general", "hello @bot")
            assert sent["state"] == "sent"
            assert sent["acceptedSeq"] == 1
            event = await b.events_until(lambda e: e["type"] == "message", timeout=5)
            assert event[-1]["message"]["content"] == "hello @bot"
            reply = await b.send(
                "#general",
                "hi",
                freshness={"targetKey": scope_id, "seenUpToSeq": 1},
            )
            assert reply["state"] == "sent"
            held = await b.send(
                "#general", "stale", freshness={"targetKey": scope_id, "seenUpToSeq": 1}
            )
            assert held["state"] == "held"
            assert held["latestSeq"] == 2
            page = await a.history("#general")
            assert [m["seq"] for m in page["messages"]] == [1, 2]
