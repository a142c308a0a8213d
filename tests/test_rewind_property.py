"""Property: a rewind changes what nobody may read (docs/rewind.md).

Seeded random conversations in a channel with two people and a private agent
of each (private agents post, and are addressed by their owners and by the
other person): before a rewind, each viewer's history is what the one
visibility predicate lets it read; after a rewind to a random point, each
viewer reads exactly the same messages plus the notice, the messages after
the point are marked ``rewound`` and no others are, and no delivery of the
set-aside range is still pending. One node; every scenario is a few round
trips.
"""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from actors.model import MemberType
from node.client import Client, ClientError
from storage.pg import connect
from tests.nodes import World, running_node

SEEDS = (3, 11, 29, 47)
STEPS = 8
VIEWERS = ("ann", "bob", "pa", "pb")


async def _read(client: Client, target: str) -> dict[int, dict[str, Any]]:
    history = await client.history(target, limit=200)
    return {m["seq"]: m for m in history["messages"]}


async def _pending_in(database_url: str, scope_id: str, low: int, high: int) -> int:
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM scope_fanout_outbox WHERE scope_id = %s"
            " AND target_seq BETWEEN %s AND %s AND status IN ('pending', 'leased')",
            (scope_id, low, high),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _conversation(
    rng: random.Random, clients: dict[str, Client], slug: str, ids: dict[str, str]
) -> tuple[str, list[dict[str, Any]]]:
    a, b = clients["ann"], clients["bob"]
    scope = (await a.request("createChannel", slug=slug, name=slug))["scopeId"]
    await b.request("join", scopeId=scope)
    await a.request("invite", scopeId=scope, memberId=ids["pa"], visibility="private")
    await b.request("invite", scopeId=scope, memberId=ids["pb"], visibility="private")
    sent: list[dict[str, Any]] = []
    latest = 0
    for step in range(STEPS):
        author = rng.choice(VIEWERS)
        words = f"{slug} step {step}"
        if author in ("ann", "bob") and rng.random() < 0.5:
            words = f"@{rng.choice(['pa', 'pb'])} {words}"
        fields: dict[str, Any] = {}
        if author in ("pa", "pb"):
            fields["freshness"] = {"targetKey": scope, "seenUpToSeq": latest}
        try:
            result = await clients[author].send(f"#{slug}", words, **fields)
        except ClientError:
            continue  # e.g. addressing another owner's agent without a grant
        if result.get("acceptedSeq"):
            latest = max(latest, result["acceptedSeq"])
            sent.append({**result, "author": author})
    return scope, sent


async def test_rewind_keeps_every_viewer_reading_what_the_predicate_allows(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
        world = await World.create(node)
        ann, bob = await world.members("ann", "bob")
        people = {
            "ann": ann,
            "bob": bob,
            "pa": await world.member("pa", MemberType.AGENT, owner=ann, private=True),
            "pb": await world.member("pb", MemberType.AGENT, owner=bob, private=True),
        }
        clients = {
            name: await hold.enter_async_context(world.client(person))
            for name, person in people.items()
        }
        ids = {name: person.id for name, person in people.items()}
        for seed in SEEDS:
            rng = random.Random(seed)
            slug = f"prop{seed}"
            scope, sent = await _conversation(rng, clients, slug, ids)
            assert sent, seed
            before = {v: await _read(clients[v], f"#{slug}") for v in VIEWERS}
            at = rng.choice(sent)
            marker = "ann" if at["acceptedSeq"] in before["ann"] else at["author"]
            point = await clients[marker].mark_recovery_point(at["messageId"])
            done = await clients["ann"].rewind(scope, point["recoveryPointId"])
            low, high = done["fromSeq"], done["throughSeq"]
            assert (low, high) == (at["acceptedSeq"] + 1, max(s["acceptedSeq"] for s in sent))
            for viewer in VIEWERS:
                after = await _read(clients[viewer], f"#{slug}")
                notice = {s for s, m in after.items() if m["id"] == done["noticeMessageId"]}
                assert set(after) - notice == set(before[viewer]), (seed, viewer)
                assert [m["id"] for s, m in sorted(after.items()) if s not in notice] == [
                    m["id"] for _, m in sorted(before[viewer].items())
                ], (seed, viewer)
                rewound = {s for s, m in after.items() if m.get("rewound")}
                assert rewound == {s for s in before[viewer] if low <= s <= high}, (seed, viewer)
                # The notice is ann's message, read by the same predicate: bob's
                # private agent reads only what its owner (or a grant) lets it.
                assert len(notice) == (0 if viewer == "pb" else 1), (seed, viewer)
            assert await _pending_in(node.database_url, scope, low, high) == 0, seed
