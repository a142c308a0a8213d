"""One clock: message time is database time.

The readable predicate compares a message's ``created_at`` with the grant's
``created_at``/``revoked_at``, which the database stamps. Here the node's wall
clock is skewed by an hour either way (``datetime`` as every node module sees
it); no grant decision may change: a grantee's message reaches the owner's
private agent, and stays in its history, exactly when the database says the
grant covered it, and a revoked grant stops at once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.model import MemberType
from node.client import Client
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10

COVERED = """
SELECT m.content,
       EXISTS (SELECT 1 FROM scope_private_grants g
               WHERE g.scope_id = m.scope_id AND g.grantee_member_id = m.author_member_id
                 AND g.created_at <= m.created_at
                 AND (g.revoked_at IS NULL OR m.created_at < g.revoked_at)),
       abs(extract(epoch FROM m.created_at - now()))
FROM scope_messages m WHERE m.scope_id = %s AND m.author_member_id = %s
ORDER BY m.seq
"""


@pytest.fixture(params=[-1, 1], ids=["behind", "ahead"])
def skewed_clock(request: pytest.FixtureRequest) -> Iterator[timedelta]:
    """Every node module's ``datetime.now`` is off by an hour."""
    skew = timedelta(hours=request.param)

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Any:
            return datetime.now(tz) + skew

    with pytest.MonkeyPatch.context() as patch:
        for name, module in list(sys.modules.items()):
            top = name.split(".")[0]
            if top in ("actors", "node", "storage", "protocol") and (
                getattr(module, "datetime", None) is datetime
            ):
                patch.setattr(module, "datetime", Skewed)
        yield skew


async def messages_of(agent: Client, target: str) -> list[str]:
    page = await agent.history(target, limit=100)
    return [m["content"] for m in page["messages"]]


async def test_grant_decisions_follow_the_database_clock(
    skewed_clock: timedelta, database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        human = await world.member("h")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(agent, kind="daemon", capabilities=["freshness", "ack"]) as p,
        ):
            scope_id = await make_channel(o, "c", h)
            await o.request("invite", scopeId=scope_id, memberId=agent.id, visibility="private")
            await o.send("#c", "warm")
            await p.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "warm",
                timeout=TIMEOUT,
            )

            grant = await o.request("grant", scopeId=scope_id, granteeMemberId=human.id)
            await h.send("#c", "covered")
            # The grant covers it: the owner's private agent reads it at once.
            events = await p.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "covered",
                timeout=TIMEOUT,
            )
            assert [e for e in events if e["type"] == "message"] == events[-1:]

            await o.request("revokeGrant", grantId=grant["grantId"])
            await h.send("#c", "after revoke")
            await o.send("#c", "marker")
            events = await p.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "marker",
                timeout=TIMEOUT,
            )
            # The revoke stops the grant at once: nothing of "after revoke".
            assert [e["message"]["content"] for e in events if "message" in e] == ["marker"]

            # History agrees with the database's own verdict, message by message.
            with psycopg.connect(database_url) as conn:
                rows = conn.execute(COVERED, (scope_id, human.id)).fetchall()
            assert [(content, covered) for content, covered, _ in rows] == [
                ("covered", True),
                ("after revoke", False),
            ]
            # Stamped by the database clock, not the skewed node clock.
            assert all(float(off) < 60 for _, _, off in rows), rows
            readable = await messages_of(p, "#c")
            assert "covered" in readable
            assert "after revoke" not in readable
