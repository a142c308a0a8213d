"""Read state (docs/design.md#read-state): monotonic markRead, unread honouring visibility, readState events."""

from __future__ import annotations

from pathlib import Path

from actors.model import MemberType
from tests.nodes import World, make_channel, running_node


def unread_of(scopes: dict[str, object], scope_id: str) -> int:
    (entry,) = [s for s in scopes["scopes"] if s["id"] == scope_id]  # type: ignore[attr-defined]
    return int(entry["unread"])


async def test_mark_read_is_monotonic_and_reaches_other_sessions(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b1, world.client(bob) as b2:
            scope_id = await make_channel(a, "reads", b1)
            for i in range(5):
                await a.send("#reads", f"m{i}")
            await b1.send("#reads", "mine")
            # Own messages are never unread.
            assert unread_of(await b1.request("scopes"), scope_id) == 5
            assert await b1.request("markRead", scopeId=scope_id, seq=3) == {"lastReadSeq": 3}
            event = (await b2.events_until(lambda e: e["type"] == "readState", timeout=5))[-1]
            assert event == {"type": "readState", "scopeId": scope_id, "lastReadSeq": 3}
            assert await b1.request("markRead", scopeId=scope_id, seq=1) == {"lastReadSeq": 3}
            assert unread_of(await b2.request("scopes"), scope_id) == 2
            # Beyond the latest seq is clamped.
            assert await b1.request("markRead", scopeId=scope_id, seq=99) == {"lastReadSeq": 6}
            assert unread_of(await b1.request("scopes"), scope_id) == 0


async def test_private_agent_unread_counts_only_what_it_may_read(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        human = await world.member("human")
        agent = await world.member("pa", MemberType.AGENT, owner=owner, private=True)
        async with world.client(owner) as o, world.client(human) as h, world.client(agent) as p:
            scope_id = await make_channel(o, "mixed", h)
            await o.request("invite", scopeId=scope_id, memberId=agent.id, visibility="private")
            await h.send("#mixed", "not for the agent")
            await o.send("#mixed", "for the agent")
            await h.send("#mixed", "again not")
            assert unread_of(await p.request("scopes"), scope_id) == 1
            assert unread_of(await h.request("scopes"), scope_id) == 1
