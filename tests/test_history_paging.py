"""History paging through many unreadable rows: budget, continuation, coverage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.model import MemberType
from tests.nodes import World, make_channel, running_node


async def test_private_agent_pages_through_a_spent_candidate_budget(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, history_candidate_budget=5) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        human = await world.member("human")
        agent = await world.member("pa", MemberType.AGENT, owner=owner, private=True)
        async with world.client(owner) as o, world.client(human) as h, world.client(agent) as p:
            scope_id = await make_channel(o, "busy", h)
            await o.request("invite", scopeId=scope_id, memberId=agent.id, visibility="private")
            await o.send("#busy", "first for the agent")  # seq 1
            for i in range(12):
                await h.send("#busy", f"noise {i}")  # seqs 2..13, unreadable for the agent
            await o.send("#busy", "second for the agent")  # seq 14

            newest = await p.history("#busy", limit=10)
            assert [m["seq"] for m in newest["messages"]] == [14]
            assert newest["hasMore"]
            assert newest["candidateBudgetExhausted"]
            assert newest["coversThroughSeq"] == 14
            # Keep paging backwards from the continuation until the start.
            seen: list[int] = []
            page: dict[str, Any] = newest
            for _ in range(10):
                if not page["hasMore"]:
                    break
                page = await p.history("#busy", beforeSeq=page["continueBeforeSeq"], limit=10)
                seen += [m["seq"] for m in page["messages"]]
            assert seen == [1]
            assert not page["hasMore"]

            # Forward paging: coversThroughSeq is the cursor, even for empty pages.
            forward: list[int] = []
            after = 1
            for _ in range(10):
                page = await p.history("#busy", afterSeq=after, limit=10)
                forward += [m["seq"] for m in page["messages"]]
                if not page["hasMore"]:
                    break
                assert page["coversThroughSeq"] > after
                after = page["coversThroughSeq"]
            assert forward == [14]
            # The human reads everything, newest first page of 10.
            everything = await h.history("#busy", limit=10)
            assert [m["seq"] for m in everything["messages"]] == list(range(5, 15))
