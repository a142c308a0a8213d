"""Typing and presence end to end (docs/presence.md): real node, WebSockets, PostgreSQL.

``typing`` reaches the sessions of the scope's other readers and no one
else, a burst is coalesced, a scope the caller cannot read answers as a
missing one, nothing is replayed on resume, and it crosses to a session on
another node over the relay, to readers only. ``presence`` goes online,
away (the client's idle word, or the node's idle timer) and offline with the
last session; a private agent's only to its owner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actors.model import Member, MemberType
from node.client import Client, ClientError, open_client
from node.hub import Hub
from node.presence import PresenceBoard
from tests.nodes import Person, RunningNode, World, make_channel, running_node

TIMEOUT = 5


async def next_of(client: Client, kind: str) -> dict[str, Any]:
    """The session's next event of type ``kind``, skipping the others."""
    events = await client.events_until(lambda e: e["type"] == kind, timeout=TIMEOUT)
    return events[-1]


async def error_code(client: Client, frame: dict[str, Any]) -> tuple[str, str | None]:
    answer = await client.request_frame({"id": "probe", **frame})
    assert answer["type"] == "error", answer
    return answer["code"], answer.get("details", {}).get("path")


async def test_typing_reaches_readers_only_coalesces_and_is_not_replayed(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob, cat = await world.members("ann", "bob", "cat")
        async with world.client(ann) as a, world.client(cat) as c:
            async with world.client(bob) as b:
                general = await make_channel(a, "general", b, c)
                created = await a.request(
                    "createChannel", slug="secret", name="Secret", visibility="private"
                )
                secret = created["scopeId"]
                await a.request("invite", scopeId=secret, memberId=bob.id)

                assert await a.typing(secret) is True
                # A keystroke later: coalesced, answered, told to no one.
                assert await a.typing(secret) is False
                assert await next_of(b, "typing") == {
                    "type": "typing",
                    "scopeId": secret,
                    "memberId": ann.id,
                }
                # Cat cannot read the private channel: answered as a missing scope.
                missing = await error_code(c, {"type": "typing", "scopeId": "scp_missing"})
                assert await error_code(c, {"type": "typing", "scopeId": secret}) == missing
                assert missing == ("not_found", "$.scopeId")
                assert await error_code(c, {"type": "typing", "scopeId": ""}) == (
                    "validation_failed",
                    "$.scopeId",
                )
                # Cat's first typing is general's: the private one never reached it.
                assert await a.typing(general) is True
                assert (await next_of(c, "typing"))["scopeId"] == general
                assert (await next_of(b, "typing"))["scopeId"] == general
                # A thread is read through its parent: bob never posted there.
                root = await a.send("#general", "root")
                reply = await a.send(f"#general:{root['messageId']}", "first reply")
                assert await a.typing(reply["targetKey"]) is True
                assert (await next_of(b, "typing"))["scopeId"] == reply["targetKey"]
                # A reader who left the channel is no longer told, nor may it type there.
                await c.request("leave", scopeId=general)
                assert await error_code(c, {"type": "typing", "scopeId": general}) == missing

            # Bob is away: ann types and sends; his resume brings the message only.
            dm = (await a.send(f"dm:{bob.id}", "hello"))["targetKey"]
            assert await a.typing(dm) is True  # forwarded, to no one
            sent = await a.send(f"scope:{secret}", "after the typing")
            async with world.client(bob, resume={secret: 0, dm: 0}) as b:
                replayed = await b.events_until(lambda e: e["type"] == "resumed", timeout=TIMEOUT)
                assert not [e for e in replayed if e["type"] == "typing"]
                assert sent["messageId"] in [
                    e["message"]["id"] for e in replayed if e["type"] == "message"
                ]
                # Live typing still arrives after the resume.
                later = await make_channel(a, "later", b)
                assert await a.typing(later) is True
                assert (await next_of(b, "typing"))["scopeId"] == later


async def test_presence_online_away_offline_and_private_agents(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob, cat = await world.members("ann", "bob", "cat")
        agent = await world.member("pa", MemberType.AGENT, owner=ann, private=True)
        async with world.client(bob) as b:
            # Following everyone bob may see: he alone is here yet.
            assert await b.presence() == {bob.id: "online"}
            async with world.client(ann) as a1:
                assert await next_of(b, "presence") == {
                    "type": "presence",
                    "memberId": ann.id,
                    "state": "online",
                }
                assert (await b.presence())[ann.id] == "online"
                assert await a1.set_presence(idle=True) == "away"
                assert (await next_of(b, "presence"))["state"] == "away"
                async with world.client(ann) as a2:
                    assert (await next_of(b, "presence"))["state"] == "online"
                    assert await a2.set_presence(idle=True) == "away"
                    assert (await next_of(b, "presence"))["state"] == "away"
                # The second session closed, the first is still idle: away stands.
                assert await a1.set_presence(idle=False) == "online"
                assert (await next_of(b, "presence"))["state"] == "online"
            assert await next_of(b, "presence") == {
                "type": "presence",
                "memberId": ann.id,
                "state": "offline",
            }
            assert ann.id not in await b.presence()

            # A private agent's presence: to its owner only.
            async with world.client(ann) as a:
                assert (await next_of(b, "presence"))["memberId"] == ann.id
                assert await a.presence([agent.id, "mem_nobody"]) == {
                    agent.id: "offline",
                    "mem_nobody": "offline",
                }
                async with world.client(agent, kind="daemon"):
                    assert await next_of(a, "presence") == {
                        "type": "presence",
                        "memberId": agent.id,
                        "state": "online",
                    }
                    assert (await a.presence())[agent.id] == "online"
                    # To bob it is as a member that does not exist.
                    assert await b.presence([agent.id]) == {agent.id: "offline"}
                    assert agent.id not in await b.presence()
                    async with world.client(cat):
                        # Bob's next presence is cat's: the agent's never came.
                        assert (await next_of(b, "presence"))["memberId"] == cat.id
                with pytest.raises(ClientError) as refused:
                    await a.request("setPresence", state="gone")
                assert refused.value.code == "validation_failed"


async def test_typing_crosses_nodes_over_the_relay(database_url: str, tmp_path: Path) -> None:
    async with (
        running_node(database_url, tmp_path / "a", node_id="a") as node_a,
        running_node(database_url, tmp_path / "b", node_id="b") as node_b,
    ):
        world = await World.create(node_a)
        ann, bob, cat = await world.members("ann", "bob", "cat")

        def on(node: RunningNode, person: Person) -> Any:
            return open_client(f"{node.url}?workspace={world.workspace_id}", person.token)

        async with on(node_a, ann) as a, on(node_b, bob) as b, on(node_b, cat) as c:
            general = await make_channel(a, "general", b, c)
            created = await a.request(
                "createChannel", slug="secret", name="Secret", visibility="private"
            )
            secret = created["scopeId"]
            await a.request("invite", scopeId=secret, memberId=bob.id)
            # Node B's events reach node A: the relay is up both ways.
            await a.events_until(
                lambda e: e["type"] == "membership" and e["memberId"] == cat.id, TIMEOUT
            )
            assert await a.typing(secret) is True
            assert await next_of(b, "typing") == {
                "type": "typing",
                "scopeId": secret,
                "memberId": ann.id,
            }
            assert await a.typing(general) is True
            # Cat's first typing is general's: the private channel's never crossed to it.
            assert (await next_of(c, "typing"))["scopeId"] == general


@dataclass(eq=False)
class _Session:
    member: Member
    is_daemon: bool = False
    pushed: list[bytes] = field(default_factory=list)

    @property
    def member_id(self) -> str:
        return self.member.id

    def push(self, payload: bytes) -> None:
        self.pushed.append(payload)


def _member(handle: str) -> Member:
    return Member(f"mem_{handle}", "wsp_1", MemberType.HUMAN, handle, handle.title())


def test_a_silent_session_turns_away_and_back() -> None:
    """The idle timer: no request for ``idle_after`` seconds is away, the next is online."""
    hub = Hub(lambda keys: None)
    board = PresenceBoard(hub, idle_after=60.0)
    ann, bob = _Session(_member("ann")), _Session(_member("bob"))
    for session in (bob, ann):
        hub.add(session)  # type: ignore[arg-type]
        board.opened(session, 0.0)
    assert board.follow(bob, bob.member, None) == [
        {"memberId": "mem_ann", "state": "online"},
        {"memberId": "mem_bob", "state": "online"},
    ]
    board.check(ann, 59.0)
    assert board.state_of(ann.member_id) == "online"
    board.check(ann, 60.0)
    assert board.state_of(ann.member_id) == "away"
    board.touched(ann, 61.0)
    assert board.state_of(ann.member_id) == "online"
    told = [json.loads(payload) for payload in bob.pushed]
    assert [(e["memberId"], e["state"]) for e in told] == [
        ("mem_ann", "away"),
        ("mem_ann", "online"),
    ]
    assert ann.pushed == []  # she follows no one
    hub.discard(ann)  # type: ignore[arg-type]
    board.closed(ann)
    assert json.loads(bob.pushed[-1])["state"] == "offline"
