"""An agent's wake written on one node reaches its daemon on another at once.

The node that commits a mention pushes ``deliver`` to the daemon sessions it
holds; a daemon connected to another node gets it from that node's relay,
which reads the message's unacknowledged wakes with the message itself — not
from the outbox worker's retry half a minute later.
"""

from __future__ import annotations

from pathlib import Path

import trio

from actors.model import MemberType
from node.client import open_daemon
from tests.nodes import World
from tests.test_cluster import connect_to, make_channel, nodes

WAIT = 3.0  # far below the outbox's first retry of a wake (30 s)


async def test_a_mention_on_node_a_wakes_the_agents_daemon_on_node_b_once(
    database_url: str, tmp_path: Path
) -> None:
    async with nodes(database_url, tmp_path, 2) as (a, b):
        world = await World.create(a)
        ann = await world.member("ann")
        bot = await world.member("bot", MemberType.AGENT)
        url_b = f"{b.url}?workspace={world.workspace_id}"
        async with connect_to(a, world, ann) as ann_a, open_daemon(url_b, bot.token) as daemon:
            assert daemon.client.welcome["nodeId"] == "n1"
            scope = await make_channel(ann_a, "ops", daemon.client)
            sent = await ann_a.send("#ops", "@bot please look")
            with trio.fail_after(WAIT):
                delivery = await daemon.next_wake()
            assert delivery.target_key == scope
            assert delivery.target_seq == sent["acceptedSeq"]
            assert delivery.message["content"] == "@bot please look"
            await daemon.ack(delivery)
            # A message without a mention wakes nobody; the acknowledged one
            # is not pushed again when the next message is relayed.
            quiet = await ann_a.send("#ops", "thanks")
            mention = await ann_a.send("#ops", "@bot one more")
            with trio.fail_after(WAIT):
                second = await daemon.next_wake()
            assert second.target_seq == mention["acceptedSeq"] > quiet["acceptedSeq"]
            with trio.move_on_after(0.5):
                extra = await daemon.next_wake()
                raise AssertionError(f"woken again: {extra}")
