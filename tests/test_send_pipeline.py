"""The send pipeline end to end."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from actors.model import MemberType
from node.client import Client, ClientError
from tests.nodes import Person, World, make_channel, running_node

FRESH = {"kind": "daemon", "capabilities": ["freshness", "ack"]}


def fresh(scope_id: str, seen: int) -> dict[str, Any]:
    return {"targetKey": scope_id, "seenUpToSeq": seen}


async def race(
    clients: tuple[Client, Client], target: str, scope_id: str, seen: int, tag: str
) -> list[dict[str, Any]]:
    """Both clients send with the same frontier at the same time."""
    results: list[dict[str, Any]] = []

    async def send(client: Client, name: str) -> None:
        reply = await client.send(target, f"{name}-{tag}", freshness=fresh(scope_id, seen))
        results.append(reply)

    async with trio.open_nursery() as nursery:
        for name, client in zip("ab", clients, strict=True):
            nursery.start_soon(send, client, name)
    return results


async def messages_until_marker(client: Client, marker: str) -> list[dict[str, Any]]:
    """Every ``message`` event up to and including the one whose content is ``marker``."""
    events = await client.events_until(
        lambda e: e["type"] == "message" and e["message"]["content"] == marker, timeout=10
    )
    return [e for e in events if e["type"] == "message"]


async def test_concurrent_fresh_sends_one_wins_each_round(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agents = [await world.member(f"agent{i}", MemberType.AGENT) for i in range(2)]
        async with (
            world.client(owner) as o,
            world.client(agents[0], **FRESH) as a,
            world.client(agents[1], **FRESH) as b,
        ):
            scope_id = await make_channel(o, "race", a, b)
            for latest in range(40):
                results = await race((a, b), "#race", scope_id, latest, str(latest))
                states = sorted(r["state"] for r in results)
                assert states == ["held", "sent"], results
                winner = next(r for r in results if r["state"] == "sent")
                loser = next(r for r in results if r["state"] == "held")
                assert winner["acceptedSeq"] == latest + 1
                assert loser["latestSeq"] == latest + 1
                assert loser["needsRefreshUntilSeq"] == latest + 1
                assert loser["seenUpToSeq"] == latest
            page = await o.history("#race", limit=200)
            assert [m["seq"] for m in page["messages"]] == list(range(1, 41))


async def test_two_nodes_on_one_database_are_fenced(database_url: str, tmp_path: Path) -> None:
    """Two actors for one scope (two nodes): the database fence keeps seqs unique."""
    async with (
        running_node(database_url, tmp_path / "a") as node_a,
        running_node(database_url, tmp_path / "b") as node_b,
    ):
        world = await World.create(node_a)
        owner = await world.member("owner")
        agents = [await world.member(f"agent{i}", MemberType.AGENT) for i in range(2)]
        world_b = World(node_b, world.workspace_id)
        async with (
            world.client(owner) as o,
            world.client(agents[0], **FRESH) as a,
            world_b.client(agents[1], **FRESH) as b,
        ):
            scope_id = await make_channel(o, "fence", a, b)
            for latest in range(15):
                results = await race((a, b), "#fence", scope_id, latest, str(latest))
                assert sorted(r["state"] for r in results) == ["held", "sent"], results
            page = await o.history("#fence", limit=200)
            assert [m["seq"] for m in page["messages"]] == list(range(1, 16))


async def test_idempotent_retry_and_conflict(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("agent", MemberType.AGENT)
        async with world.client(human) as h, world.client(agent, **FRESH) as a:
            scope_id = await make_channel(h, "idem", a)
            first = await a.send(
                "#idem", "once", clientMessageId="c-1", freshness=fresh(scope_id, 0)
            )
            assert first["state"] == "sent"
            retry = await a.send(
                "#idem", "once", clientMessageId="c-1", freshness=fresh(scope_id, 0)
            )
            assert retry["state"] == "already_sent"
            assert (retry["messageId"], retry["acceptedSeq"]) == (
                first["messageId"],
                first["acceptedSeq"],
            )
            with pytest.raises(ClientError) as conflict:
                await a.send("#idem", "twice", clientMessageId="c-1", freshness=fresh(scope_id, 1))
            assert conflict.value.code == "idempotency_conflict"
            # The database answers once the cache is gone (actor reloaded).
            node.services.registry.invalidate(scope_id)
            again = await a.send(
                "#idem", "once", clientMessageId="c-1", freshness=fresh(scope_id, 0)
            )
            assert again["state"] == "already_sent"
            assert again["messageId"] == first["messageId"]
            await h.send("#idem", "marker")
            seen = await messages_until_marker(h, "marker")
            assert [m["message"]["content"] for m in seen] == ["once", "marker"]


async def test_failed_commit_answers_retryable_and_pushes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    # The send transaction's own backend is terminated mid-statement.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """
            CREATE FUNCTION kill_own_backend() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$;
            CREATE TRIGGER kill_on_die BEFORE INSERT ON scope_messages
            FOR EACH ROW WHEN (NEW.content = 'die') EXECUTE FUNCTION kill_own_backend();
            """
        )
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        human = await world.member("human")
        reader = await world.member("reader")
        async with world.client(human) as h, world.client(reader) as r:
            await make_channel(h, "crash", r)
            assert (await h.send("#crash", "before"))["acceptedSeq"] == 1
            with pytest.raises(ClientError) as failed:
                await h.send("#crash", "die")
            assert failed.value.retryable
            assert failed.value.code == "unavailable"
            after = await h.send("#crash", "after")
            assert after["state"] == "sent"
            assert after["acceptedSeq"] == 2
            seen = await messages_until_marker(r, "after")
            assert [m["message"]["content"] for m in seen] == ["before", "after"]
            page = await h.history("#crash")
            assert [(m["seq"], m["content"]) for m in page["messages"]] == [
                (1, "before"),
                (2, "after"),
            ]


async def test_load_every_member_gets_every_message_once_in_order(
    database_url: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    scopes_count, senders, sends_per_sender = 50, 20, 50
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        people: list[Person] = [await world.member(f"user{i}") for i in range(senders)]
        async with opened([(world, person) for person in people]) as clients:
            membership: dict[int, list[int]] = defaultdict(list)  # member -> scope indexes
            slugs = []
            for s in range(scopes_count):
                creator = s % senders
                slug = f"load{s}"
                others = [m for m in range(senders) if m != creator and rng.random() < 0.3]
                await make_channel(clients[creator], slug, *[clients[m] for m in others])
                slugs.append(slug)
                for m in [creator, *others]:
                    membership[m].append(s)
            expected: dict[int, int] = defaultdict(int)  # scope -> sends

            plans = {
                m: [rng.choice(membership[m]) for _ in range(sends_per_sender)]
                for m in range(senders)
            }
            for targets in plans.values():
                for s in targets:
                    expected[s] += 1
            replies: list[dict[str, Any]] = []

            async def run_sender(m: int) -> None:
                for i, s in enumerate(plans[m]):
                    replies.append(await clients[m].send(f"#{slugs[s]}", f"m{m}-{i}"))

            with trio.fail_after(120):
                async with trio.open_nursery() as load:
                    for m in range(senders):
                        load.start_soon(run_sender, m)
            assert len(replies) == senders * sends_per_sender
            assert all(r["state"] == "sent" for r in replies)

            async def collect(m: int) -> None:
                want = sum(expected[s] for s in membership[m])
                got: dict[str, list[int]] = defaultdict(list)
                count = 0
                while count < want:
                    event = await clients[m].next_event(timeout=20)
                    if event["type"] == "message":
                        got[event["scopeId"]].append(event["message"]["seq"])
                        count += 1
                for seqs in got.values():
                    assert seqs == list(range(1, len(seqs) + 1))
                assert sorted(len(v) for v in got.values()) == sorted(
                    expected[s] for s in membership[m] if expected[s]
                )

            async with trio.open_nursery() as check:
                for m in range(senders):
                    check.start_soon(collect, m)


@asynccontextmanager
async def opened(homes: list[tuple[World, Person]]) -> AsyncIterator[list[Client]]:
    """A client per (node's world, person), all open for the block."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(w.client(p)) for w, p in homes]


async def send_all(
    clients: list[Client], target: str, count: int
) -> dict[int, list[tuple[str, dict[str, Any] | ClientError]]]:
    """Every client sends ``count`` messages one after the other, all clients at once."""
    answers: dict[int, list[tuple[str, dict[str, Any] | ClientError]]] = defaultdict(list)

    async def run(index: int) -> None:
        for n in range(count):
            content = f"s{index}-{n}"
            try:
                answers[index].append((content, await clients[index].send(target, content)))
            except ClientError as error:
                answers[index].append((content, error))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for index in range(len(clients)):
                nursery.start_soon(run, index)
    return answers


def accepted_in_order(
    answers: dict[int, list[tuple[str, dict[str, Any] | ClientError]]],
) -> dict[str, int]:
    """content -> seq of every send answered ``sent``; each sender's seqs ascend."""
    stored: dict[str, int] = {}
    for replies in answers.values():
        seqs = []
        for content, reply in replies:
            if isinstance(reply, ClientError):
                assert reply.code == "unavailable", reply.frame
                assert reply.retryable
                continue
            assert reply["state"] == "sent", reply
            seqs.append(reply["acceptedSeq"])
            stored[content] = reply["acceptedSeq"]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == len(seqs)
    return stored


async def test_senders_of_one_scope_are_answered_in_order(
    database_url: str, tmp_path: Path
) -> None:
    """Four senders on one scope: every reply, event and row keeps the scope's
    order, whatever batches the actor and the group committer form."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        people = [await world.member(f"user{i}") for i in range(5)]
        async with opened([(world, person) for person in people]) as clients:
            watcher, c1, c2, c3, c4 = clients
            await make_channel(watcher, "busy", c1, c2, c3, c4)
            answers = await send_all([c1, c2, c3, c4], "#busy", 40)
            stored = accepted_in_order(answers)
            assert sorted(stored.values()) == list(range(1, 161))
            events = await watcher.events_until(
                lambda e: e["type"] == "message" and e["message"]["seq"] == 160, timeout=10
            )
            seen = [e["message"] for e in events if e["type"] == "message"]
            assert [m["seq"] for m in seen] == list(range(1, 161))
            assert {m["content"]: m["seq"] for m in seen} == stored
            page = await watcher.history("#busy", limit=200)
            assert {m["content"]: m["seq"] for m in page["messages"]} == stored


async def test_senders_on_two_nodes_of_one_scope_lose_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """A second node writes to the scope while three senders on the first keep
    it busy: batches that miss the fence are decided again after a reload;
    nothing is lost, doubled or acknowledged without its row."""
    async with (
        running_node(database_url, tmp_path / "a") as node_a,
        running_node(database_url, tmp_path / "b") as node_b,
    ):
        world = await World.create(node_a)
        people = [await world.member(f"user{i}") for i in range(5)]
        world_b = World(node_b, world.workspace_id)
        homes = [world] * 4 + [world_b]
        async with opened(list(zip(homes, people, strict=True))) as clients:
            owner, c1, c2, c3, other = clients
            await make_channel(owner, "shared", c1, c2, c3, other)
            answers = await send_all([c1, c2, c3, other], "#shared", 30)
            stored = accepted_in_order(answers)
            assert sorted(stored.values()) == list(range(1, len(stored) + 1))
            assert len(stored) > 60
            page = await owner.history("#shared", limit=200)
            assert {m["content"]: m["seq"] for m in page["messages"]} == stored
