"""Private agents end to end over WebSockets.

Owner O (human), O's private agents P and Q, human H and O's public agent A in
#c. Private authority (docs/design.md#private-agents): only O, O's grantees within the
grant interval and O's other private agents reach P; a public agent of the same
owner needs a grant. What P may read (docs/design.md#visibility): its own messages, O's, grantees'
within the grant interval, same-owner private agents'. The private-gap
freshness rule (docs/design.md#freshness): messages P cannot see never hold it.

Absence is proven with a later marker message by O, which P does receive:
events are pushed in commit order, so anything for an earlier message would
have arrived before the marker.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from actors.model import MemberType
from node.client import Client
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10
_markers = itertools.count(1)


def routed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events that carry a message to the session: ``message`` and ``deliver``."""
    return [e for e in events if e["type"] in ("message", "deliver")]


async def until_marker(
    observer: Client, owner: Client, target: str
) -> tuple[list[dict[str, Any]], int]:
    """Everything ``observer`` received before a fresh marker message by ``owner``,
    and the marker's seq."""
    text = f"marker {next(_markers)}"
    sent = await owner.send(target, text)
    events = await observer.events_until(
        lambda e: e["type"] == "message" and e["message"]["content"] == text, timeout=TIMEOUT
    )
    assert events[-1]["message"]["seq"] == sent["acceptedSeq"]
    return events[:-1], sent["acceptedSeq"]


def explained(reply: dict[str, Any]) -> dict[str, tuple[bool, bool, str]]:
    """The planner's Explain of a send: member id → (reader, wake, reason)."""
    return {
        r["memberId"]: (r["reader"], r["wake"], r["reason"]) for r in reply["explain"]["recipients"]
    }


async def reaches(agent: Client, content: str) -> dict[str, Any]:
    """The agent gets the message event and a ``deliver`` frame for it; returns the frame."""
    message: dict[str, Any] | None = None
    deliver: dict[str, Any] | None = None

    def both(event: dict[str, Any]) -> bool:
        nonlocal message, deliver
        if event["type"] == "message" and event["message"]["content"] == content:
            message = event
        if event["type"] == "deliver" and event["message"]["content"] == content:
            deliver = event
        return message is not None and deliver is not None

    events = await agent.events_until(both, timeout=TIMEOUT)
    assert routed(events) in ([message, deliver], [deliver, message]), routed(events)
    assert deliver is not None
    await agent.request("ack", deliveryId=deliver["deliveryId"])
    return deliver


async def test_private_authority_and_visibility(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        sibling = await world.member("q", MemberType.AGENT, owner=owner, private=True)
        human = await world.member("h")
        public = await world.member("a", MemberType.AGENT, owner=owner)
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(public, kind="daemon") as a,
            world.client(sibling, kind="daemon") as q,
            world.client(agent, kind="daemon", capabilities=["freshness", "ack"]) as p,
        ):
            scope = await make_channel(o, "c", h, a)
            for private_agent in (agent, sibling):
                await o.request(
                    "invite", scopeId=scope, memberId=private_agent.id, visibility="private"
                )
            visible: list[int] = []  # seqs P may read, in order

            # H has no authority: no wake, and the message is not readable either.
            # Its Explain names neither P nor Q to H: they are O's private agents.
            denied = await h.send("#c", "@p do x", explain=True)
            assert agent.id not in explained(denied)
            assert denied["explain"]["hiddenPrivate"] == 2
            before, marker = await until_marker(p, o, "#c")
            assert routed(before) == []
            visible.append(marker)

            # O has authority: P gets the message event and a mention wake.
            sent = await o.send("#c", "@p do x", explain=True)
            assert explained(sent)[agent.id] == (True, True, "mention")
            assert explained(sent)[public.id] == (True, False, "not_addressed")
            frame = await reaches(p, "@p do x")
            assert frame["reason"] == "mention"
            assert frame["agentId"] == agent.id
            assert frame["targetKey"] == scope
            assert frame["targetSeq"] == sent["acceptedSeq"]
            visible.append(sent["acceptedSeq"])

            # A public agent of the same owner has no authority without a grant.
            ungranted = await a.send("#c", "@p from a, ungranted", explain=True)
            assert agent.id not in explained(ungranted)
            assert ungranted["explain"]["hiddenPrivate"] == 2
            before, marker = await until_marker(p, o, "#c")
            assert routed(before) == []
            visible.append(marker)

            # O grants H: H's mention reaches P and H's messages become readable.
            grant = await o.request("grant", scopeId=scope, granteeMemberId=human.id)
            assert grant["grantId"].startswith("grt_")
            granted = await h.send("#c", "@p do y")
            frame = await reaches(p, "@p do y")
            assert frame["reason"] == "mention"
            visible.append(granted["acceptedSeq"])
            plain = await h.send("#c", "plain, granted")
            events = await p.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "plain, granted",
                timeout=TIMEOUT,
            )
            assert routed(events) == events[-1:]  # readable, but no wake without a mention
            visible.append(plain["acceptedSeq"])

            # After revoke, new H messages do not reach P; older ones stay readable.
            await o.request("revokeGrant", grantId=grant["grantId"])
            await h.send("#c", "@p do z")
            before, marker = await until_marker(p, o, "#c")
            assert routed(before) == []
            visible.append(marker)

            # A's mention reaches P once O grants A.
            await o.request("grant", scopeId=scope, granteeMemberId=public.id)
            later = await a.send("#c", "@p from a, granted")
            assert (await reaches(p, "@p from a, granted"))["reason"] == "mention"
            visible.append(later["acceptedSeq"])

            # A same-owner private agent has authority and is readable.
            from_q = await q.send("#c", "@p from q")
            assert (await reaches(p, "@p from q"))["reason"] == "mention"
            visible.append(from_q["acceptedSeq"])

            # P's own output is readable to it.
            own = await p.send(
                "#c", "done", freshness={"targetKey": scope, "seenUpToSeq": from_q["acceptedSeq"]}
            )
            assert own["state"] == "sent"
            visible.append(own["acceptedSeq"])

            # History: exactly the owner-private visible set, with nothing else.
            history = await p.history("#c")
            assert [m["seq"] for m in history["messages"]] == visible
            authors = {m["author"]["memberId"] for m in history["messages"]}
            assert authors == {owner.id, human.id, public.id, sibling.id, agent.id}
            assert not history["hasMore"]
            everything = await o.history("#c")
            assert len(everything["messages"]) == history["latestSeq"] > len(visible)
            assert [m["seq"] for m in everything["messages"]] == list(
                range(1, history["latestSeq"] + 1)
            )

            # Members: the public list never shows P; O's private panel does.
            listed_by_h = (await h.request("members", scopeId=scope))["members"]
            assert {m["id"] for m in listed_by_h} == {owner.id, human.id, public.id}
            assert all(m["visibility"] == "public" for m in listed_by_h)
            listed_by_o = {
                m["id"]: m for m in (await o.request("members", scopeId=scope))["members"]
            }
            assert set(listed_by_o) == {owner.id, human.id, public.id, agent.id, sibling.id}
            for private_agent in (agent, sibling):
                entry = listed_by_o[private_agent.id]
                assert entry["visibility"] == "private"
                assert entry["ownerMemberId"] == owner.id
            assert all("ownerMemberId" not in listed_by_o[m] for m in (human.id, public.id))


async def test_invisible_messages_never_hold_a_private_agent(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        human = await world.member("h")
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(agent, kind="daemon", capabilities=["freshness", "ack"]) as p,
        ):
            scope = await make_channel(o, "c", h)
            await o.request("invite", scopeId=scope, memberId=agent.id, visibility="private")
            await o.send("#c", "@p start")
            seen = (await reaches(p, "@p start"))["targetSeq"]

            def fresh(seen_up_to: int) -> dict[str, Any]:
                return {"targetKey": scope, "seenUpToSeq": seen_up_to}

            # Messages P cannot see since its frontier never hold it.
            hidden = [await h.send("#c", f"hidden {i}") for i in range(3)]
            sent = await p.send("#c", "reply", freshness=fresh(seen))
            assert sent["state"] == "sent", sent
            assert sent["acceptedSeq"] == hidden[-1]["acceptedSeq"] + 1
            seen = sent["acceptedSeq"]

            # A visible message (by O) between invisible ones holds P at that seq only.
            await h.send("#c", "hidden before")
            shown = await o.send("#c", "visible")
            await h.send("#c", "hidden after")
            held = await p.send("#c", "stale reply", freshness=fresh(seen))
            assert held["state"] == "held", held
            assert held["latestSeq"] == shown["acceptedSeq"]
            assert held["needsRefreshUntilSeq"] == shown["acceptedSeq"]
            assert held["seenUpToSeq"] == seen
            assert "messageId" not in held

            # Having seen the visible message, P sends despite the later hidden one.
            after = await p.send("#c", "fresh reply", freshness=fresh(shown["acceptedSeq"]))
            assert after["state"] == "sent", after
            assert after["acceptedSeq"] == shown["acceptedSeq"] + 2

            # The held send wrote nothing; P's history holds only what it may read.
            history = await p.history("#c")
            assert [m["content"] for m in history["messages"]] == [
                "@p start",
                "reply",
                "visible",
                "fresh reply",
            ]
