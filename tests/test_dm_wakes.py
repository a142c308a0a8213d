"""A DM wakes the agent in it; a mention of a non-member hints the sender."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from node.client import Client
from tests.nodes import World, make_channel, running_world

DAEMON = {"kind": "daemon", "capabilities": ["freshness", "ack"]}


async def next_deliver(client: Client, timeout: float = 5) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while True:
            event = await client.next_event()
            if event["type"] == "deliver":
                return event


async def no_deliver(client: Client, wait: float = 0.3) -> None:
    with trio.move_on_after(wait):
        while True:
            event = await client.next_event()
            assert event["type"] != "deliver", event


async def test_dms_wake_and_mentions_of_non_members_hint(database_url: str, tmp_path: Path) -> None:
    async with running_world(database_url, tmp_path) as world:
        human = await world.member("human")
        other = await world.member("other")
        echo = await world.member("echo", MemberType.AGENT)
        secret = await world.member("secret", MemberType.AGENT, owner=human, private=True)
        elsewhere = await World.create(world.node, "elsewhere")
        await elsewhere.member("stranger")
        async with (
            world.client(human) as h,
            world.client(other) as o,
            world.client(echo, **DAEMON) as a,
        ):
            # A plain DM wakes the agent.
            dm = await h.send(f"dm:{echo.id}", "hello there")
            assert "hints" not in dm
            delivery = await next_deliver(a)
            assert delivery["reason"] == "dm"
            assert delivery["message"]["content"] == "hello there"
            await a.request("ack", deliveryId=delivery["deliveryId"])

            general = await make_channel(h, "general", o)
            plain = await h.send("#general", "no mentions here")
            assert "hints" not in plain
            hinted = await h.send("#general", "@echo @other @secret @stranger @nobody hi")
            assert hinted["state"] == "sent"
            assert hinted["hints"] == [
                {"kind": "not_in_scope", "memberId": echo.id, "handle": "echo"},
                {"kind": "not_in_scope", "memberId": secret.id, "handle": "secret"},
            ]
            # Someone else's private agent is not theirs to learn about.
            theirs = await o.send("#general", "@secret @echo hi")
            assert theirs["hints"] == [
                {"kind": "not_in_scope", "memberId": echo.id, "handle": "echo"}
            ]
            await no_deliver(a)

            await h.request("invite", scopeId=general, memberId=echo.id)
            invited = await h.send("#general", "@echo now you are here")
            assert "hints" not in invited
            delivery = await next_deliver(a)
            assert (delivery["reason"], delivery["targetKey"]) == ("mention", general)
            # In a channel, a plain message still wakes no agent.
            await h.send("#general", "just chatting")
            await a.request("ack", deliveryId=delivery["deliveryId"])
            await no_deliver(a)
