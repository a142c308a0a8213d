"""Sends are fenced on the scope's roster generation.

Two nodes on one database. Node A's actor for #c is warm (it has sent); then
the roster or the grants change through node B, which node A's actor never
hears about. Node A's very next send must be planned on the new roster: the
database fence (``latest_seq`` and ``roster_generation``) turns the stale plan
into a fence miss, and the actor reloads before it commits.

Absence of an event is proven with a later marker in another channel: ann
sends the marker only after the send under test was answered, and an actor
hands its events to sessions before it answers, so anything for the earlier
message would have reached the session before the marker.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from actors.model import MemberType
from actors.ports import FenceLost
from actors.scope_state import Append, ScopeState, SendCommand
from node.client import Client
from node.database import autocommit
from storage import applier, scopes
from storage.pg import connect
from storage.pool import open_pool
from storage.store import PgScopeStore
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10
_markers = itertools.count(1)


def routed(events: list[dict[str, Any]], scope_id: str) -> list[dict[str, Any]]:
    """``message`` and ``deliver`` events of ``scope_id``."""
    return [
        e
        for e in events
        if e["type"] in ("message", "deliver")
        and (e.get("scopeId") == scope_id or e.get("targetKey") == scope_id)
    ]


async def before_marker(observer: Client, sender: Client, target: str) -> list[dict[str, Any]]:
    """Everything ``observer`` received before a fresh marker ``sender`` posts to ``target``."""
    text = f"marker {next(_markers)}"
    await sender.send(target, text)
    events = await observer.events_until(
        lambda e: e["type"] == "message" and e["message"]["content"] == text, timeout=TIMEOUT
    )
    return events[:-1]


async def test_a_leave_on_another_node_is_honoured_by_the_very_next_send(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        running_node(database_url, tmp_path / "a") as node_a,
        running_node(database_url, tmp_path / "b") as node_b,
    ):
        world_a = await World.create(node_a)
        world_b = World(node_b, world_a.workspace_id)
        ann = await world_a.member("ann")
        bob = await world_a.member("bob")
        carol = await world_a.member("carol")
        async with (
            world_a.client(ann) as a,
            world_a.client(bob) as bob_a,
            world_a.client(carol) as carol_a,
            world_b.client(bob) as bob_b,
            world_b.client(carol) as carol_b,
        ):
            scope_id = await make_channel(a, "c", bob_a)
            await make_channel(a, "markers", bob_a, carol_a)
            # Node A's actor for #c is warm and knows bob as a member.
            await a.send("#c", "warm")
            await bob_a.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "warm",
                timeout=TIMEOUT,
            )

            # Bob leaves and carol joins, both through node B.
            await bob_b.request("leave", scopeId=scope_id)
            await carol_b.request("join", scopeId=scope_id)

            sent = await a.send("#c", "after the leave")
            # The leaver's session on node A gets nothing of it ...
            assert routed(await before_marker(bob_a, a, "#markers"), scope_id) == []
            # ... and the joiner's session on node A gets it.
            got = await carol_a.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "after the leave",
                timeout=TIMEOUT,
            )
            assert got[-1]["message"]["seq"] == sent["acceptedSeq"]


async def test_a_revoke_on_another_node_stops_the_very_next_send(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        running_node(database_url, tmp_path / "a") as node_a,
        running_node(database_url, tmp_path / "b") as node_b,
    ):
        world_a = await World.create(node_a)
        world_b = World(node_b, world_a.workspace_id)
        owner = await world_a.member("owner")
        human = await world_a.member("h")
        agent = await world_a.member("p", MemberType.AGENT, owner=owner, private=True)
        async with (
            world_a.client(owner) as o,
            world_a.client(human) as h,
            world_a.client(agent, kind="daemon", capabilities=["freshness", "ack"]) as p,
            world_b.client(owner) as o_b,
        ):
            scope_id = await make_channel(o, "c", h)
            await o.request("invite", scopeId=scope_id, memberId=agent.id, visibility="private")
            grant = await o.request("grant", scopeId=scope_id, granteeMemberId=human.id)
            # Warm: under the grant, h's mention reaches the private agent on node A.
            await h.send("#c", "@p granted")
            events = await p.events_until(
                lambda e: e["type"] == "deliver" and e["message"]["content"] == "@p granted",
                timeout=TIMEOUT,
            )
            await p.request("ack", deliveryId=events[-1]["deliveryId"])

            await o_b.request("revokeGrant", grantId=grant["grantId"])

            await h.send("#c", "@p revoked")
            assert routed(await before_marker(p, o, "#c"), scope_id) == []


async def test_a_revoke_on_this_node_stops_the_very_next_send(
    database_url: str, tmp_path: Path
) -> None:
    """The local path: the op marks the warm actor stale, and it reloads first."""
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
            grant = await o.request("grant", scopeId=scope_id, granteeMemberId=human.id)
            await h.send("#c", "granted")
            await p.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "granted",
                timeout=TIMEOUT,
            )
            await o.request("revokeGrant", grantId=grant["grantId"])
            await h.send("#c", "@p revoked")
            assert routed(await before_marker(p, o, "#c"), scope_id) == []


async def test_every_roster_and_grant_write_bumps_the_generation(database_url: str) -> None:
    """join, leave, setNotification, grant and revoke each move the fence by one,
    and the roster writes report the generation they left behind."""
    from actors.model import NotificationState
    from storage import directory, grants

    async with await connect(database_url, autocommit=True) as conn:
        ws = await directory.create_workspace(conn, "gen")
        ann = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="ann"
        )
        bob = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="bob"
        )
        scope_id = await scopes.create_channel(
            conn, creator=ann, slug="c", name="c", visibility="public", description=""
        )

        async def generation() -> int:
            info = await scopes.get_scope(conn, scope_id)
            assert info is not None
            return info.roster_generation

        start = await generation()
        joined = await scopes.join(
            conn,
            scope_id,
            bob,
            visibility="public",
            owner_member_id=None,
            state=NotificationState.ACTIVE,
        )
        assert joined.generation == start + 1 == await generation()
        muted = await scopes.set_notification(conn, scope_id, bob.id, NotificationState.MUTE)
        assert muted == start + 2 == await generation()
        grant_id = await grants.create(
            conn,
            workspace_id=ws,
            scope_id=scope_id,
            owner_id=ann.id,
            grantee_id=bob.id,
            expires_at=None,
        )
        assert await generation() == start + 3
        assert await grants.revoke(conn, grant_id, owner_id=ann.id) == scope_id
        assert await generation() == start + 4
        left = await scopes.leave(conn, scope_id, bob.id)
        assert left.membership is not None
        assert left.generation == start + 5 == await generation()


async def test_a_stale_generation_misses_the_fence_alone_and_in_a_group(
    database_url: str,
) -> None:
    """The Applier's single statement and the group statement both refuse a plan
    built on an older roster generation, and write nothing for it."""
    async with await connect(database_url, autocommit=True) as conn:
        from storage import directory

        ws = await directory.create_workspace(conn, "gen")
        ann = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="ann"
        )
        scope_ids = [
            await scopes.create_channel(
                conn, creator=ann, slug=f"c{i}", name="c", visibility="public", description=""
            )
            for i in range(2)
        ]
    async with open_pool(database_url, size=2, configure=autocommit) as pool:
        store = PgScopeStore(pool)
        states = [ScopeState(await store.load_scope(s)) for s in scope_ids]
        now = datetime.now(UTC)
        plans = []
        for state in states:
            decision = state.decide(SendCommand(ann, "x", "k", reply=lambda _: None), now)
            assert isinstance(decision, Append)
            plans.append(decision.plan)
        async with pool.connection() as conn:
            # Another writer changed the first scope's roster (nothing else).
            await conn.execute(
                "UPDATE scopes SET roster_generation = roster_generation + 1 WHERE id = %s",
                (scope_ids[0],),
            )
            outcomes = await applier.apply_group(conn, plans)
            assert isinstance(outcomes[0], FenceLost)
            assert not isinstance(outcomes[1], FenceLost)
            try:
                await applier.apply_sends(conn, plans[:1])
            except FenceLost:
                pass
            else:
                raise AssertionError("a stale roster generation must miss the fence")
            cur = await conn.execute(
                "SELECT scope_id, count(*) FROM scope_messages GROUP BY scope_id"
            )
            assert dict(await cur.fetchall()) == {scope_ids[1]: 1}


async def test_a_roster_request_is_decided_on_the_database_roster(
    database_url: str, tmp_path: Path
) -> None:
    """Bob leaves through node B, then joins through node A, whose warm actor
    still lists him: the join must be written, not answered from the cache."""
    async with (
        running_node(database_url, tmp_path / "a") as node_a,
        running_node(database_url, tmp_path / "b") as node_b,
    ):
        world_a = await World.create(node_a)
        world_b = World(node_b, world_a.workspace_id)
        ann = await world_a.member("ann")
        bob = await world_a.member("bob")
        async with (
            world_a.client(ann) as a,
            world_a.client(bob) as bob_a,
            world_b.client(bob) as bob_b,
        ):
            scope_id = await make_channel(a, "c", bob_a)
            await a.send("#c", "warm")
            await bob_b.request("leave", scopeId=scope_id)
            await bob_a.request("join", scopeId=scope_id)
            members = await a.request("members", scopeId=scope_id)
            assert bob.id in {m["id"] for m in members["members"]}
            history = await bob_a.history("#c")
            assert history["scopeId"] == scope_id
