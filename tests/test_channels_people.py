"""The channel browser (``channels``), the people list (``people``), and thread
summaries on root messages (``thread`` in history, ``threadUpdated`` live)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.model import MemberType
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10


def by_slug(reply: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["slug"]: c for c in reply["channels"]}


async def test_channels_lists_public_and_own_private(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        other_world = await World.create(node, "elsewhere")
        ann = await world.member("ann")
        bob = await world.member("bob")
        agent = await world.member("ann-bot", MemberType.AGENT, owner=ann, private=True)
        stranger = await other_world.member("zed")
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(agent, kind="daemon") as p,
            other_world.client(stranger) as z,
        ):
            open_channel = await make_channel(a, "open", b)
            await a.request("createChannel", slug="secret", name="Secret", visibility="private")
            await a.request("invite", scopeId=open_channel, memberId=agent.id, visibility="private")
            await z.request("createChannel", slug="theirs", name="Theirs")

            seen_by_ann = by_slug(await a.request("channels"))
            assert set(seen_by_ann) == {"open", "secret"}
            assert seen_by_ann["open"] == {
                "id": open_channel,
                "slug": "open",
                "name": "Open",
                "description": "",
                "visibility": "public",
                "memberCount": 2,  # the private agent is not counted
                "joined": True,
            }
            assert seen_by_ann["secret"]["visibility"] == "private"
            assert seen_by_ann["secret"]["joined"] is True

            # A private channel is listed only to its current members.
            seen_by_bob = by_slug(await b.request("channels"))
            assert set(seen_by_bob) == {"open"}
            await b.request("leave", scopeId=open_channel)
            after_leave = by_slug(await b.request("channels"))["open"]
            assert after_leave["joined"] is False
            assert after_leave["memberCount"] == 1

            # The private agent sees its private membership as joined.
            assert by_slug(await p.request("channels"))["open"]["joined"] is True
            # Another workspace's channels do not exist here.
            assert set(by_slug(await z.request("channels"))) == {"theirs"}


async def test_people_shows_private_agents_to_their_owner_only(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        other_world = await World.create(node, "elsewhere")
        ann = await world.member("ann")
        bob = await world.member("bob")
        helper = await world.member("helper", MemberType.AGENT)
        agent = await world.member("ann-bot", MemberType.AGENT, owner=ann, private=True)
        await other_world.member("zed")
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(agent, kind="daemon") as p,
        ):
            ann_sees = {m["handle"]: m for m in (await a.request("people"))["people"]}
            assert set(ann_sees) == {"ann", "bob", "helper", "ann-bot"}
            assert ann_sees["ann-bot"] == {
                "id": agent.id,
                "handle": "ann-bot",
                "displayName": agent.member.display_name,
                "type": "agent",
                "ownerMemberId": ann.id,
            }
            assert "ownerMemberId" not in ann_sees["helper"]
            assert ann_sees["helper"]["type"] == "agent"
            bob_sees = {m["handle"] for m in (await b.request("people"))["people"]}
            assert bob_sees == {"ann", "bob", "helper"}
            assert helper.id  # a public agent is listed to everyone
            agent_sees = {m["handle"] for m in (await p.request("people"))["people"]}
            assert agent_sees == {"ann", "bob", "helper", "ann-bot"}


async def test_thread_summary_in_history_and_live(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        cat = await world.member("cat")
        agent = await world.member("ann-bot", MemberType.AGENT, owner=ann, private=True)
        async with (
            world.client(ann) as a,
            world.client(bob) as b,
            world.client(cat) as c,
            world.client(agent, kind="daemon") as p,
        ):
            channel = await make_channel(a, "c", b, c)
            await a.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            root = await a.send("#c", "a root @ann-bot")
            plain = await a.send("#c", "no replies")
            target = f"#c:{root['messageId']}"
            first = await b.send(target, "one")
            thread = first["targetKey"]
            await c.send(target, "two")
            await b.send(target, "three")

            # Live: every reader of the replies hears the new summary.
            events = await a.events_until(
                lambda e: e["type"] == "threadUpdated" and e["thread"]["replyCount"] == 3,
                timeout=TIMEOUT,
            )
            live = events[-1]
            assert live["scopeId"] == channel
            assert live["rootMessageId"] == root["messageId"]
            assert live["thread"]["scopeId"] == thread
            assert live["thread"]["participants"] == [bob.id, cat.id]

            page = {m["id"]: m for m in (await c.history("#c"))["messages"]}
            assert "thread" not in page[plain["messageId"]]
            summary = page[root["messageId"]]["thread"]
            assert summary["scopeId"] == thread
            assert summary["replyCount"] == 3
            assert summary["participants"] == [bob.id, cat.id]
            assert summary["lastReplyAt"] == live["thread"]["lastReplyAt"]
            assert summary["lastReplyAt"].endswith("Z")

            # A private agent gets no summaries: it may not read every reply.
            agent_page = {m["id"]: m for m in (await p.history("#c"))["messages"]}
            assert "thread" not in agent_page[root["messageId"]]
            await a.send("#c", "a marker")
            seen = await p.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "a marker",
                timeout=TIMEOUT,
            )
            assert not any(e["type"] == "threadUpdated" for e in seen)

            # The root's author learned of the replies: the thread is in its list.
            ann_scopes = {s["id"]: s for s in (await a.request("scopes"))["scopes"]}
            assert ann_scopes[thread]["unread"] == 3
