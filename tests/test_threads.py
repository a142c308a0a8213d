"""Reply threads and private-agent thread admission over WebSockets.

Targets ``#slug:<rootMessageId>`` name the reply thread of a root message of
the channel, created on first use. Posting makes the poster a thread member;
current public members of the parent read the thread without a membership row
(docs/design.md#threads). A private agent P of owner O enters a thread only
by admission (docs/design.md#thread-admission): it must already be a private
member of the parent, and then a live mention in the root by someone with authority (parent grants), a live
mention in a thread message by someone with authority (thread ∪ parent grants,
never a sibling thread's), authorship of the root, or an authorised explicit
recipient admits it — and nothing else: no other private peer, no other scope.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.model import MemberType
from node.client import Client, ClientError
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10


def admissions(reply: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    """The plan's admission decisions of a thread send: member id → (admitted, reason)."""
    return {
        a["memberId"]: (a["admitted"], a["reason"])
        for a in reply.get("explain", {}).get("admissions", [])
    }


async def woken(agent: Client, content: str) -> dict[str, Any]:
    """The agent's ``deliver`` frame for the message with ``content`` (acknowledged)."""
    events = await agent.events_until(
        lambda e: e["type"] == "deliver" and e["message"]["content"] == content, timeout=TIMEOUT
    )
    await agent.request("ack", deliveryId=events[-1]["deliveryId"])
    return events[-1]


async def thread_members(client: Client, thread_id: str) -> dict[str, dict[str, Any]]:
    listed = (await client.request("members", scopeId=thread_id))["members"]
    return {m["id"]: m for m in listed}


async def test_thread_creation_posting_and_parent_readers(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        human = await world.member("h")
        reader = await world.member("r")
        outsider = await world.member("x")
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(reader) as r,
            world.client(outsider) as x,
        ):
            channel = await make_channel(o, "c", h, r)
            await o.request("createChannel", slug="other", name="Other")
            root = await o.send("#c", "root message")
            other_root = await o.send("#other", "elsewhere")
            target = f"#c:{root['messageId']}"

            # Unknown roots, roots of another channel, unreadable roots.
            for bad in ("msg_nope", other_root["messageId"]):
                with pytest.raises(ClientError) as missing:
                    await h.send(f"#c:{bad}", "x")
                assert missing.value.code == "not_found"
            with pytest.raises(ClientError) as forbidden:
                await x.send(target, "let me in")
            assert forbidden.value.code == "forbidden"

            # The first send creates the thread; the poster becomes a member, and
            # so does the root's author, with the reply unread.
            first = await h.send(target, "first reply")
            assert first["state"] == "sent"
            thread = first["targetKey"]
            assert thread.startswith("scp_")
            assert thread != channel
            assert first["acceptedSeq"] == 1  # the thread's own seqs
            assert set(await thread_members(o, thread)) == {human.id, owner.id}
            owner_scopes = {s["id"]: s for s in (await o.request("scopes"))["scopes"]}
            assert owner_scopes[thread]["unread"] == 1
            assert owner_scopes[thread]["lastReadSeq"] == 0

            # A public member of the parent reads the thread live and in history,
            # with the root as context; it is not made a member by reading.
            events = await r.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "first reply",
                timeout=TIMEOUT,
            )
            assert events[-1]["scopeId"] == thread
            history = await r.history(target)
            assert history["scopeId"] == thread
            assert [m["content"] for m in history["messages"]] == ["first reply"]
            assert history["root"]["id"] == root["messageId"]
            assert history["root"]["content"] == "root message"
            assert history["root"]["scopeId"] == channel
            assert set(await thread_members(r, thread)) == {human.id, owner.id}

            # It may post there (by target or by scope id), and then is a member.
            second = await r.send(f"scope:{thread}", "second reply")
            assert second["acceptedSeq"] == 2
            assert set(await thread_members(h, thread)) == {human.id, reader.id, owner.id}
            scopes = {s["id"]: s for s in (await r.request("scopes"))["scopes"]}
            assert scopes[thread]["type"] == "thread"
            assert scopes[thread]["latestSeq"] == 2
            assert scopes[thread]["lastReadSeq"] == 2

            # The thread's seqs are its own: the parent did not move, and the
            # root's parent seq is no part of the thread's read state.
            assert (await o.history("#c"))["latestSeq"] == 1  # the root only
            assert (await o.history(target))["latestSeq"] == 2
            assert scopes[channel]["latestSeq"] == 1

            # Leaving the parent ends reading the thread, thread member or not.
            await o.request("leave", scopeId=channel)
            with pytest.raises(ClientError) as gone:
                await o.history(f"scope:{thread}")
            assert gone.value.code == "forbidden"


async def test_private_agent_thread_admission(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        peer = await world.member("q", MemberType.AGENT, owner=owner, private=True)
        outside = await world.member("z", MemberType.AGENT, owner=owner, private=True)
        human = await world.member("h")
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(agent, kind="daemon") as p,
            world.client(outside, kind="daemon") as z,
        ):
            channel = await make_channel(o, "c", h)
            for private_agent in (agent, peer):
                await o.request(
                    "invite", scopeId=channel, memberId=private_agent.id, visibility="private"
                )

            # 1. A live mention in the root by the owner admits P when the
            #    thread gets a message; Q (another private agent of O) is not
            #    pulled in, and Z (not in the parent) cannot be admitted.
            root = await o.send("#c", "@p and @z please look")
            reply = await h.send(f"#c:{root['messageId']}", "a reply", explain=True)
            thread1 = reply["targetKey"]
            # H may not see O's private agent: its Explain only counts P.
            assert agent.id not in admissions(reply)
            assert reply["explain"]["hiddenPrivate"] == 1
            assert outside.id not in admissions(reply)  # unknown to the thread: never a candidate
            assert peer.id not in admissions(reply)
            listed = await thread_members(o, thread1)
            assert set(listed) == {human.id, agent.id, owner.id}  # O wrote the root
            assert listed[agent.id]["visibility"] == "private"
            assert listed[agent.id]["ownerMemberId"] == owner.id
            assert set(await thread_members(h, thread1)) == {human.id, owner.id}  # P is private
            again = await o.send(f"scope:{thread1}", "@z you too", explain=True)
            assert admissions(again).get(outside.id, (False, ""))[0] is False
            assert outside.id not in await thread_members(o, thread1)
            with pytest.raises(ClientError) as refused:
                await z.send(f"scope:{thread1}", "can I?")
            assert refused.value.code == "forbidden"

            # 2. A thread mention by someone without authority does not admit;
            #    by the owner it does, and P is woken by it.
            question = await h.send("#c", "a question")
            target2 = f"#c:{question['messageId']}"
            denied = await h.send(target2, "@p help", explain=True)
            thread2 = denied["targetKey"]
            assert agent.id not in admissions(denied)
            assert denied["explain"]["hiddenPrivate"] == 1
            assert agent.id not in await thread_members(o, thread2)
            admitted = await o.send(target2, "@p help", explain=True)
            assert admissions(admitted)[agent.id] == (True, "thread_mention")
            assert (await woken(p, "@p help"))["targetKey"] == thread2
            # P reads the thread from its admission on; the root by H is no
            # context for P (not readable to it), but it is for O.
            # (The root is unreadable to P, so P names the thread by its scope id.)
            with pytest.raises(ClientError) as unreadable:
                await p.history(target2)
            assert unreadable.value.code == "forbidden"
            p_history = await p.history(f"scope:{thread2}")
            assert [m["content"] for m in p_history["messages"]] == ["@p help"]
            assert p_history["root"] is None
            assert (await o.history(target2))["root"]["id"] == question["messageId"]

            # 3. The root's author is admitted: P posts a root, then its thread.
            own_root = await p.send("#c", "my own root")
            own_reply = await p.send(f"#c:{own_root['messageId']}", "following up")
            thread3 = own_reply["targetKey"]
            assert own_reply["state"] == "sent"
            assert set(await thread_members(o, thread3)) == {agent.id}

            # 4. An authorised explicit recipient is admitted; an unauthorised
            #    one is refused outright (a sender may not address it at all).
            other = await h.send("#c", "another question")
            target4 = f"#c:{other['messageId']}"
            with pytest.raises(ClientError) as unauthorised:
                await h.send(target4, "for p", recipients=[agent.id], explain=True)
            assert unauthorised.value.code == "forbidden"
            authorised = await o.send(target4, "for p", recipients=[agent.id], explain=True)
            thread4 = authorised["targetKey"]
            assert admissions(authorised)[agent.id] == (True, "explicit_recipient")
            assert agent.id in await thread_members(o, thread4)

            # P's admissions made it a member of those threads and nothing else;
            # Q is in no thread at all.
            p_scopes = {s["id"] for s in (await p.request("scopes"))["scopes"]}
            assert p_scopes == {channel, thread1, thread2, thread3, thread4}
            for thread in (thread1, thread2, thread3, thread4):
                assert peer.id not in await thread_members(o, thread)
            z_scopes = (await z.request("scopes"))["scopes"]
            assert z_scopes == []


async def test_thread_grants_parent_yes_sibling_no(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        parent_grantee = await world.member("g")
        thread_grantee = await world.member("t")
        async with (
            world.client(owner) as o,
            world.client(parent_grantee) as g,
            world.client(thread_grantee) as t,
            world.client(agent, kind="daemon") as p,
        ):
            channel = await make_channel(o, "c", g, t)
            await o.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            first = await g.send("#c", "first topic")
            second = await g.send("#c", "second topic")
            target1, target2 = (f"#c:{m['messageId']}" for m in (first, second))

            # A grant on thread T1 gives authority in T1 only, never in sibling T2.
            opened = await o.send(target1, "opening T1")
            thread1 = opened["targetKey"]
            await o.request("grant", scopeId=thread1, granteeMemberId=thread_grantee.id)
            sibling = await t.send(target2, "@p in T2", explain=True)
            thread2 = sibling["targetKey"]
            assert agent.id not in await thread_members(o, thread2)
            in_t1 = await t.send(target1, "@p in T1", explain=True)
            # A grantee sees the agent it reached only as a count (as in ``members``).
            assert agent.id not in admissions(in_t1)
            assert in_t1["explain"]["hiddenPrivate"] == 1
            assert agent.id in await thread_members(o, thread1)
            assert (await woken(p, "@p in T1"))["targetKey"] == thread1

            # A grant on the parent applies in its threads (here: T2), and the
            # thread actor notices the parent's roster change without a restart.
            await o.request("grant", scopeId=channel, granteeMemberId=parent_grantee.id)
            via_parent = await g.send(target2, "@p in T2 by g", explain=True)
            assert agent.id in await thread_members(o, thread2)
            assert via_parent["explain"]["hiddenPrivate"] == 1
            assert (await woken(p, "@p in T2 by g"))["targetKey"] == thread2

            # The thread grant was never written upwards: no authority in the parent.
            await t.send("#c", "@p in the parent")
            marker = await o.send("#c", "@p marker")
            events = await p.events_until(
                lambda e: e["type"] == "deliver" and e["message"]["seq"] == marker["acceptedSeq"],
                timeout=TIMEOUT,
            )
            assert [e for e in events if e["type"] == "deliver"] == events[-1:]


async def test_thread_root_in_thread_history_carries_its_reactions(
    database_url: str, tmp_path: Path
) -> None:
    """The root shown with a thread's history carries ``reactions`` as in the
    parent's history, with the viewer's view of private agents' reactions."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        human = await world.member("h")
        agent = await world.member("owner-bot", MemberType.AGENT, owner=owner, private=True)
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(agent) as p,
        ):
            channel = await make_channel(o, "c", h)
            await o.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            root = await o.send("#c", "root message")
            root_id = root["messageId"]
            assert await o.react(root_id, "👍") == {"changed": True}
            assert await h.react(root_id, "👍") == {"changed": True}
            assert await p.react(root_id, "👀") == {"changed": True}
            await h.send(f"#c:{root_id}", "a reply")

            for client, expected in (
                (
                    o,
                    [
                        {"emoji": "👍", "count": 2, "memberIds": [owner.id, human.id]},
                        {"emoji": "👀", "count": 1, "memberIds": [agent.id]},
                    ],
                ),
                # The private agent's reaction is shown to it and its owner only.
                (h, [{"emoji": "👍", "count": 2, "memberIds": [owner.id, human.id]}]),
            ):
                parent = await client.history("#c")
                in_parent = next(m for m in parent["messages"] if m["id"] == root_id)
                assert in_parent["reactions"] == expected
                thread = await client.history(f"#c:{root_id}")
                assert thread["root"]["id"] == root_id
                assert thread["root"]["reactions"] == expected
