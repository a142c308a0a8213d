"""Resume after a disconnect.

A reader that was away reconnects with ``hello.resume``: it gets at most 200
missed messages oldest first, then ``resumed`` with ``hasMore``, and pages the
rest with ``history(afterSeq=…)``. Sends racing the resume neither go missing
nor arrive twice on the event stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import trio

from node.client import Client
from protocol.wsframes import frame
from tests.nodes import make_channel, running_world

RESUME_LIMIT = 200
TIMEOUT = 30.0


async def send_many(client: Client, target: str, prefix: str, count: int, window: int = 8) -> None:
    """``count`` sends with up to ``window`` in flight; every one must be ``sent``."""
    numbers = iter(range(count))

    async def worker() -> None:
        for n in numbers:
            reply = await client.send(target, f"{prefix}-{n}")
            assert reply["state"] == "sent", reply

    async with trio.open_nursery() as nursery:
        for _ in range(window):
            nursery.start_soon(worker)


def is_message(event: dict[str, Any]) -> bool:
    return event["type"] == "message"


async def read_resume(client: Client, scope_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``message`` events the resume pushed, and its ``resumed`` event."""
    events = await client.events_until(lambda e: e["type"] == "resumed", timeout=TIMEOUT)
    resumed = events[-1]
    assert all(is_message(e) and e["scopeId"] == scope_id for e in events[:-1]), events[:-1]
    return [e["message"] for e in events[:-1]], resumed


async def page_after(client: Client, target: str, after: int) -> list[dict[str, Any]]:
    """Every readable message above ``after``, paged with ``history(afterSeq=…)``."""
    collected: list[dict[str, Any]] = []
    for _ in range(100):  # bounded: 100 pages of 200 is far more than any test sends
        page = await client.history(target, afterSeq=after, limit=RESUME_LIMIT)
        collected += page["messages"]
        if not page["hasMore"]:
            return collected
        assert page["messages"], page
        after = page["messages"][-1]["seq"]
    raise AssertionError("history kept answering hasMore")


async def test_resume_after_500_missed_messages_then_history_pages(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path) as world:
        alice, bob = await world.members("alice", "bob")
        async with world.client(alice) as a:
            async with world.client(bob) as b:
                scope_id = await make_channel(a, "away", b)
                await a.send("#away", "before")
                seen = await b.events_until(is_message, timeout=TIMEOUT)
                last_seen = seen[-1]["message"]["seq"]
                assert last_seen == 1
            # bob is away while 500 messages are sent
            await send_many(a, "#away", "missed", 500)

        async with world.client(bob, resume={scope_id: last_seen}) as b:
            resumed_messages, resumed = await read_resume(b, scope_id)
            seqs = [m["seq"] for m in resumed_messages]
            assert seqs == list(range(2, 2 + RESUME_LIMIT))
            # coversThroughSeq (additive) is where history(afterSeq=…) continues.
            assert resumed["scopes"] == {
                scope_id: {"latestSeq": 501, "hasMore": True, "coversThroughSeq": 201}
            }
            rest = await page_after(b, "#away", seqs[-1])
            everything = resumed_messages + rest
            assert [m["seq"] for m in everything] == list(range(2, 502))
            assert len({m["id"] for m in everything}) == 500
            # send order per worker is kept, and every missed message is there once
            assert sorted(m["content"] for m in everything) == sorted(
                f"missed-{n}" for n in range(500)
            )
            assert b.pending_events() == 0


async def _race_resume(
    database_url: str, tmp_path: Path, missed_before: int, sent_during: int
) -> tuple[list[int], list[int], dict[str, Any]]:
    """bob reconnects with resume while alice keeps sending.

    Returns the seqs of the ``message`` events bob received (resume and live,
    in arrival order), the seqs history pages after the resume filled in, and
    the ``resumed`` event. Live sends go on after ``resumed`` (checked), so
    the resume really was served while messages were being committed.
    """
    async with running_world(database_url, tmp_path) as world:
        alice, bob = await world.members("alice", "bob")
        async with world.client(alice) as a:
            async with world.client(bob) as b:
                scope_id = await make_channel(a, "race", b)
            await send_many(a, "#race", "missed", missed_before)
            total = missed_before + sent_during
            halfway = trio.Event()

            async def live_sender() -> None:
                for n in range(sent_during):
                    reply = await a.send("#race", f"live-{n}")
                    assert reply["state"] == "sent", reply
                    if n == 10:
                        halfway.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(live_sender)
                await halfway.wait()
                async with world.client(bob, resume={scope_id: 0}) as b:
                    events = await b.events_until(
                        lambda e: is_message(e) and e["message"]["seq"] == total, timeout=TIMEOUT
                    )
                    resumed = [e for e in events if e["type"] == "resumed"]
                    assert len(resumed) == 1, [e["type"] for e in events]
                    assert all(is_message(e) or e["type"] == "resumed" for e in events)
                    received = [e["message"]["seq"] for e in events if is_message(e)]
                    resumed_at = events.index(resumed[0])
                    last_resumed_seq = events[resumed_at - 1]["message"]["seq"]
                    assert last_resumed_seq < total, "the sends ended before the resume"
                    filled = []
                    if resumed[0]["scopes"][scope_id]["hasMore"]:
                        filled = [m["seq"] for m in await page_after(b, "#race", last_resumed_seq)]
                    assert b.pending_events() == 0
    return received, filled, resumed[0]


async def test_resume_racing_live_sends_has_no_gap_and_no_duplicate(
    database_url: str, tmp_path: Path
) -> None:
    """Fewer than 200 missed: the event stream alone is exactly 1..n, once each."""
    received, filled, resumed = await _race_resume(
        database_url, tmp_path, missed_before=50, sent_during=150
    )
    assert received == list(range(1, 201)), received
    assert not filled
    (state,) = resumed["scopes"].values()
    assert state["hasMore"] is False
    assert 60 <= state["latestSeq"] < 200


async def test_resume_with_more_than_a_page_racing_live_sends(
    database_url: str, tmp_path: Path
) -> None:
    """More than 200 missed: events never repeat or go backwards, history fills the gap."""
    received, filled, resumed = await _race_resume(
        database_url, tmp_path, missed_before=300, sent_during=100
    )
    (state,) = resumed["scopes"].values()
    assert state["hasMore"] is True
    assert received[:RESUME_LIMIT] == list(range(1, RESUME_LIMIT + 1))
    assert received == sorted(set(received)), "the event stream repeated or reordered a seq"
    assert sorted(set(received) | set(filled)) == list(range(1, 401))


async def test_a_late_live_event_at_or_below_the_resume_point_is_not_pushed_again(
    database_url: str, tmp_path: Path
) -> None:
    """Nothing newer to replay: a live event the relay brings late (another
    node's commit caught up after a failover) at or below the seq the client
    resumed from is one it has, and the next message arrives once."""
    async with running_world(database_url, tmp_path) as world:
        alice, bob = await world.members("alice", "bob")
        async with world.client(alice) as a:
            async with world.client(bob) as b:
                scope_id = await make_channel(a, "late", b)
            await send_many(a, "#late", "seen", 3, window=1)
            [third] = (await a.history("#late", limit=1))["messages"]
            assert third["seq"] == 3
            async with world.client(bob, resume={scope_id: 3}) as b:
                replayed, _ = await read_resume(b, scope_id)
                assert replayed == []
                [session] = [
                    s
                    for s in world.node.services.sessions
                    if s.member_id == bob.id and s.close_code is None
                ]
                late = {"type": "message", "scopeId": scope_id, "message": third}
                session.deliver_events(scope_id, [(3, frame(msgspec.json.encode(late)))])
                assert (await a.send("#late", "next"))["state"] == "sent"
                events = await b.events_until(
                    lambda e: is_message(e) and e["message"]["seq"] == 4, timeout=TIMEOUT
                )
                assert [e["message"]["seq"] for e in events if is_message(e)] == [4]
