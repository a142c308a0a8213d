"""Membership rules per scope type, over real nodes, WebSockets and PostgreSQL.

Each ``test_hole_*`` is a regression test of a way into past messages that the
node used to allow; the docstring says what the node did before. The rules
themselves are :mod:`actors.policy` (unit-tested in ``tests/test_policy_membership.py``):

- channel: a current public member invites humans and public agents; a private
  agent is added only by its owner, where the owner is a current public
  member; private agents never invite;
- DM: the two members, fixed; ``dm:<id>`` never names another owner's private
  agent; ``dm:<own private agent>`` is the owner's private DM with it;
- thread: no ``invite``/``join``; read and post through the parent;
- ``remove``: the channel's owner removes members, an owner its own private
  agent, nobody the channel's owner; like ``leave`` it ends the member's thread
  memberships under the channel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.model import MemberType
from node.client import Client, ClientError
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10


async def refused(call: Any, code: str = "forbidden") -> dict[str, Any]:
    """Await ``call`` and expect it to fail with ``code``; returns the error frame."""
    with pytest.raises(ClientError) as failure:
        await call
    assert failure.value.code == code, failure.value
    frame: dict[str, Any] = failure.value.frame
    return frame


async def member_ids(client: Client, scope_id: str) -> set[str]:
    return {m["id"] for m in (await client.request("members", scopeId=scope_id))["members"]}


async def private_channel(owner: Client, slug: str) -> str:
    result = await owner.request("createChannel", slug=slug, name=slug, visibility="private")
    scope_id: str = result["scopeId"]
    return scope_id


async def test_hole_1_dm_member_cannot_add_a_third_person(
    database_url: str, tmp_path: Path
) -> None:
    """Before: ``invite`` checked only that the caller was some member of the
    scope, so a DM member could add anyone, who then read the whole DM."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        eve = await world.member("eve")
        async with world.client(ann) as a, world.client(eve) as e:
            dm = (await a.send(f"dm:{bob.id}", "just between us"))["targetKey"]
            await refused(a.request("invite", scopeId=dm, memberId=eve.id))
            # The DM does not exist for eve.
            await refused(e.request("join", scopeId=dm), "not_found")
            assert await member_ids(a, dm) == {ann.id, bob.id}
            await refused(e.history(f"scope:{dm}"), "not_found")


async def test_hole_1_thread_member_cannot_invite_into_a_private_channels_thread(
    database_url: str, tmp_path: Path
) -> None:
    """Before: a member of a private channel's thread could invite an outsider
    into the thread, who then read the thread (and its root as context)."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        ann = await world.member("ann")
        eve = await world.member("eve")
        async with world.client(owner) as o, world.client(ann) as a, world.client(eve) as e:
            channel = await private_channel(o, "secret")
            await o.request("invite", scopeId=channel, memberId=ann.id)
            root = await o.send("#secret", "root")
            thread = (await a.send(f"#secret:{root['messageId']}", "in the thread"))["targetKey"]
            await refused(a.request("invite", scopeId=thread, memberId=eve.id))
            await refused(o.request("invite", scopeId=thread, memberId=eve.id))
            # The private channel's thread does not exist for eve.
            await refused(e.request("join", scopeId=thread), "not_found")
            await refused(e.history(f"scope:{thread}"), "not_found")


async def test_hole_1_private_agent_never_invites(database_url: str, tmp_path: Path) -> None:
    """Before: a private agent, as a (private) member, could invite any human
    into a private channel, who then read its whole history."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("pa", MemberType.AGENT, owner=owner, private=True)
        eve = await world.member("eve")
        async with (
            world.client(owner) as o,
            world.client(agent) as p,
            world.client(eve) as e,
        ):
            channel = await private_channel(o, "secret")
            await o.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            await o.send("#secret", "history eve must not see")
            error = await refused(p.request("invite", scopeId=channel, memberId=eve.id))
            assert error["details"]["reason"] == "private_agent_never_invites"
            await refused(e.history("#secret"), "not_found")
            assert await member_ids(o, channel) == {owner.id, agent.id}


async def test_hole_1_owner_cannot_put_its_agent_straight_into_a_thread(
    database_url: str, tmp_path: Path
) -> None:
    """Before: an owner holding a thread membership could invite its private
    agent into the thread without the agent being a private member of the
    parent, bypassing thread admission."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("pa", MemberType.AGENT, owner=owner, private=True)
        async with world.client(owner) as o, world.client(agent) as p:
            await make_channel(o, "c")
            root = await o.send("#c", "root")
            thread = (await o.send(f"#c:{root['messageId']}", "reply"))["targetKey"]
            error = await refused(
                o.request("invite", scopeId=thread, memberId=agent.id, visibility="private")
            )
            assert error["details"]["reason"] == "thread_through_parent"
            await refused(p.history(f"scope:{thread}"))
            assert await member_ids(o, thread) == {owner.id}


async def test_hole_4_dm_never_names_another_owners_private_agent(
    database_url: str, tmp_path: Path
) -> None:
    """Before: ``dm:<privateAgentId>`` created a DM in which another owner's
    private agent was a public participant (and its existence public)."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("pa", MemberType.AGENT, owner=owner, private=True)
        eve = await world.member("eve")
        async with (
            world.client(owner) as o,
            world.client(agent) as p,
            world.client(eve) as e,
        ):
            # Another owner's private agent is no member at all for eve.
            error = await refused(e.send(f"dm:{agent.id}", "hello agent"), "not_found")
            assert error["message"] == "no such member"
            # Nor may the private agent open a DM with anyone but its owner.
            await refused(p.send(f"dm:{eve.id}", "hello eve"))

            # Its owner's DM with it is private: the agent is a private member.
            dm = (await o.send(f"dm:{agent.id}", "@pa hello"))["targetKey"]
            members = {m["id"]: m for m in (await o.request("members", scopeId=dm))["members"]}
            assert members[agent.id]["visibility"] == "private"
            assert members[agent.id]["ownerMemberId"] == owner.id
            assert members[owner.id]["visibility"] == "public"
            # The same DM from the agent's side.
            assert (await p.send(f"dm:{owner.id}", "hi"))["targetKey"] == dm
            await refused(e.history(f"scope:{dm}"), "not_found")


async def test_hole_5_leaving_a_private_channel_ends_reading_its_threads(
    database_url: str, tmp_path: Path
) -> None:
    """Before: leaving closed only the channel membership; the thread membership
    made by posting stayed current, so the former member kept reading the
    thread in history and live."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        ann = await world.member("ann")
        async with world.client(owner) as o, world.client(ann) as a:
            channel = await private_channel(o, "secret")
            await o.request("invite", scopeId=channel, memberId=ann.id)
            root = await o.send("#secret", "root")
            thread = (await a.send(f"#secret:{root['messageId']}", "ann was here"))["targetKey"]
            assert ann.id in await member_ids(o, thread)

            await a.request("leave", scopeId=channel)
            await refused(a.history(f"scope:{thread}"))
            await refused(a.send(f"scope:{thread}", "still here?"))
            await refused(a.request("setNotification", scopeId=thread, state="mute"))
            assert ann.id not in await member_ids(o, thread)

            # No live event of the thread either: a later DM is the marker.
            await o.send(f"scope:{thread}", "after ann left")
            await o.send(f"dm:{ann.id}", "marker")
            events = await a.events_until(
                lambda ev: ev["type"] == "message" and ev["message"]["content"] == "marker",
                timeout=TIMEOUT,
            )
            assert not [
                ev
                for ev in events
                if ev["type"] == "message" and ev["message"]["content"] == "after ann left"
            ]


async def test_rejoining_the_parent_reads_its_threads_through_it(
    database_url: str, tmp_path: Path
) -> None:
    """The closed thread membership is not restored: the member reads the
    thread again as a reader of the parent (``parent_member``)."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        ann = await world.member("ann")
        async with world.client(owner) as o, world.client(ann) as a:
            channel = await make_channel(o, "c", a)
            root = await o.send("#c", "root")
            thread = (await a.send(f"#c:{root['messageId']}", "reply"))["targetKey"]
            await a.request("leave", scopeId=channel)
            await refused(a.history(f"scope:{thread}"))
            await a.request("join", scopeId=channel)
            history = await a.history(f"scope:{thread}")
            assert [m["content"] for m in history["messages"]] == ["reply"]
            assert ann.id not in await member_ids(o, thread)
            scopes = {s["id"] for s in (await a.request("scopes"))["scopes"]}
            assert thread not in scopes
            assert channel in scopes


async def test_remove(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        ann = await world.member("ann")
        kim = await world.member("kim")
        agent = await world.member("ka", MemberType.AGENT, owner=kim, private=True)
        elsewhere = await World.create(node, "elsewhere")
        stranger = await elsewhere.member("stranger")
        async with (
            world.client(owner) as o,
            world.client(ann) as a,
            world.client(kim) as k,
            elsewhere.client(stranger) as s,
        ):
            channel = await make_channel(o, "c", a, k)
            await k.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            root = await o.send("#c", "root")
            thread = (await a.send(f"#c:{root['messageId']}", "reply"))["targetKey"]
            dm = (await o.send(f"dm:{ann.id}", "hi"))["targetKey"]
            foreign = (await s.request("createChannel", slug="c", name="C"))["scopeId"]

            listed = await o.request("members", scopeId=channel)
            assert listed["channelOwnerId"] == owner.id

            # Only the channel's owner removes others; nobody removes the owner.
            await refused(k.remove(channel, ann.id))
            await refused(a.remove(channel, owner.id))
            error = await refused(o.remove(channel, owner.id))
            assert error["details"]["reason"] == "channel_owner_stays"
            # Not in DMs or threads; unknown members and other workspaces: not_found.
            await refused(o.remove(dm, ann.id))
            await refused(o.remove(thread, ann.id))
            await refused(o.remove(channel, "mem_nope"), "not_found")
            await refused(o.remove(channel, stranger.id), "not_found")
            await refused(o.remove(foreign, ann.id), "not_found")

            # An owner removes its own private agent.
            assert await k.remove(channel, agent.id) == {}
            assert agent.id not in await member_ids(k, channel)

            # The channel's owner removes ann: she hears it, and her thread
            # membership ends with the channel's.
            assert await o.remove(channel, ann.id) == {}
            await a.events_until(
                lambda ev: (
                    ev["type"] == "membership"
                    and ev["op"] == "left"
                    and ev["memberId"] == ann.id
                    and ev["scopeId"] == channel
                ),
                timeout=TIMEOUT,
            )
            assert ann.id not in await member_ids(o, channel)
            assert ann.id not in await member_ids(o, thread)
            await refused(a.history("#c"))
            await refused(a.history(f"scope:{thread}"))
            await refused(a.send("#c", "let me back"))
            # Removing again (or a non-member) is not an error.
            assert await o.remove(channel, ann.id) == {}
