"""Group commit across actors: one statement for many scopes, a miss fails alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import psycopg
import pytest
import trio

from actors.model import Member, MemberType
from actors.planner import MessagePlan
from actors.ports import FenceLost, IdempotencyRace
from actors.scope_state import Append, ScopeState, SendCommand
from node.database import autocommit
from storage import directory, scopes
from storage.group_commit import GroupCommitter
from storage.pg import connect
from storage.pool import open_pool
from storage.store import PgScopeStore


async def channels(database_url: str, count: int) -> tuple[Member, list[str]]:
    """A workspace with one human and ``count`` channels it created."""
    async with await connect(database_url, autocommit=True) as conn:
        ws = await directory.create_workspace(conn, "gc")
        author = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="ann"
        )
        scope_ids = [
            await scopes.create_channel(
                conn, creator=author, slug=f"c{i}", name="c", visibility="public", description=""
            )
            for i in range(count)
        ]
    return author, scope_ids


@asynccontextmanager
async def running(
    database_url: str, lanes: int, gather: float = 0.0
) -> AsyncIterator[tuple[GroupCommitter, PgScopeStore]]:
    """A committer with ``lanes`` lanes, running until the block ends."""
    async with (
        open_pool(database_url, size=4, configure=autocommit) as pool,
        trio.open_nursery() as nursery,
    ):
        committer = GroupCommitter(pool, lanes=lanes, gather=gather, window=30.0)
        nursery.start_soon(committer.run)
        yield committer, PgScopeStore(pool)
        nursery.cancel_scope.cancel()


async def test_batches_of_many_scopes_commit_together_and_a_miss_fails_alone(
    database_url: str,
) -> None:
    author, scope_ids = await channels(database_url, 8)
    async with running(database_url, lanes=1) as (committer, store):
        now = datetime.now(UTC)
        batches: list[list[MessagePlan]] = []
        for index, scope_id in enumerate(scope_ids):
            state = ScopeState(await store.load_scope(scope_id))
            plans = []
            for n in range(3 if index == 7 else 2):
                cmd = SendCommand(author, f"m{n}", f"c{n}", reply=lambda _: None)
                decision = state.decide(cmd, now)
                assert isinstance(decision, Append)
                plans.append(decision.plan)
            # Scope 2 sends at a seq the database never had (a fence miss); scope 7
            # is a chain of three sends, committed atomically on its own.
            batches.append(plans if index == 7 else plans[1:] if index == 2 else plans[:1])
        outcomes: dict[str, object] = {}

        async def submit(scope_id: str, plans: list[MessagePlan]) -> None:
            try:
                outcomes[scope_id] = await committer.apply(plans)
            except FenceLost as exc:
                outcomes[scope_id] = exc

        async with trio.open_nursery() as senders:
            for scope_id, plans in zip(scope_ids, batches, strict=True):
                senders.start_soon(submit, scope_id, plans)
    assert isinstance(outcomes[scope_ids[2]], FenceLost)
    for scope_id in scope_ids[:2] + scope_ids[3:7]:
        assert [c.seq for c in outcomes[scope_id]] == [1]  # type: ignore[attr-defined]
    assert [c.seq for c in outcomes[scope_ids[7]]] == [1, 2, 3]  # type: ignore[attr-defined]
    assert committer.plans_committed == 9
    # The six one-send batches needed at most two statements (the first may run alone).
    assert committer.transactions <= 3
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT scope_id, count(*), max(seq) FROM scope_messages GROUP BY scope_id"
        ).fetchall()
        outbox = conn.execute("SELECT count(*) FROM scope_fanout_outbox").fetchone()
    expected = dict.fromkeys(scope_ids[:2] + scope_ids[3:7], (1, 1)) | {scope_ids[7]: (3, 3)}
    assert {r[0]: (r[1], r[2]) for r in rows} == expected
    assert outbox == (9,)


async def test_an_existing_key_in_a_group_answers_already_sent_for_that_scope_only(
    database_url: str,
) -> None:
    author, scope_ids = await channels(database_url, 3)
    async with running(database_url, lanes=1) as (committer, store):
        now = datetime.now(UTC)
        first = ScopeState(await store.load_scope(scope_ids[0]))
        decision = first.decide(SendCommand(author, "x", "dup", reply=lambda _: None), now)
        assert isinstance(decision, Append)
        await committer.apply([decision.plan])
        # A fresh cache that does not know the key plans it again at seq 2.
        stale = ScopeState(await store.load_scope(scope_ids[0]))
        stale.idempotency.clear()
        again = stale.decide(SendCommand(author, "x", "dup", reply=lambda _: None), now)
        assert isinstance(again, Append)
        plans = [again.plan]
        for scope_id in scope_ids[1:]:
            state = ScopeState(await store.load_scope(scope_id))
            other = state.decide(SendCommand(author, "y", "c", reply=lambda _: None), now)
            assert isinstance(other, Append)
            plans.append(other.plan)
        outcomes: list[object] = []

        async def submit(plan: MessagePlan) -> None:
            try:
                outcomes.append(await committer.apply([plan]))
            except IdempotencyRace as race:
                outcomes.append(race)

        async with trio.open_nursery() as senders:
            for plan in plans:
                senders.start_soon(submit, plan)
    races = [o for o in outcomes if isinstance(o, IdempotencyRace)]
    assert len(races) == 1
    assert races[0].record.seq == 1
    assert sum(1 for o in outcomes if isinstance(o, list)) == 2


@pytest.mark.parametrize("lanes", [1, 3])
async def test_single_batches_still_commit(database_url: str, lanes: int) -> None:
    author, (scope_id,) = await channels(database_url, 1)
    async with running(database_url, lanes) as (committer, store):
        state = ScopeState(await store.load_scope(scope_id))
        for n in range(3):
            decision = state.decide(
                SendCommand(author, "x", f"k{n}", reply=lambda _: None), datetime.now(UTC)
            )
            assert isinstance(decision, Append)
            (done,) = await committer.apply([decision.plan])
            assert done.seq == n + 1


@asynccontextmanager
async def two_lanes(
    database_url: str, scopes_count: int, gather: float = 0.0
) -> AsyncIterator[tuple[GroupCommitter, list[MessagePlan]]]:
    """A running two-lane committer and one planned send for each of
    ``scopes_count`` fresh channels."""
    author, scope_ids = await channels(database_url, scopes_count)
    async with running(database_url, lanes=2, gather=gather) as (committer, store):
        plans = []
        for scope_id in scope_ids:
            state = ScopeState(await store.load_scope(scope_id))
            cmd = SendCommand(author, "x", "k", reply=lambda _: None)
            decision = state.decide(cmd, datetime.now(UTC))
            assert isinstance(decision, Append)
            plans.append(decision.plan)
        yield committer, plans


async def test_with_a_statement_in_flight_batches_handed_over_together_share_the_other_lane(
    database_url: str,
) -> None:
    seqs: list[int] = []
    async with two_lanes(database_url, 8) as (committer, plans):

        async def submit(plan: MessagePlan) -> None:
            (done,) = await committer.apply([plan])
            seqs.append(done.seq)

        # Eight actors hand over in one scheduler pass: the first commits at
        # once, alone; the other seven find it in flight and go as one
        # statement on the second lane (not one alone there and six after).
        async with trio.open_nursery() as senders:
            for plan in plans:
                senders.start_soon(submit, plan)
    assert seqs == [1] * 8
    assert committer.transactions == 2


@pytest.mark.parametrize("gather", [0.0, 5.0])
async def test_a_lone_sender_commits_each_batch_in_its_own_task_at_once(
    database_url: str, gather: float
) -> None:
    seen: list[int] = []
    async with two_lanes(database_url, 3, gather) as (committer, plans):

        async def bystander() -> None:
            seen.append(committer.in_flight)

        for plan in plans:
            # No scheduler pass before the statement: a task started now
            # first runs when the statement is already in flight.
            async with trio.open_nursery() as watcher:
                watcher.start_soon(bystander)
                await committer.apply([plan])
    assert seen == [1, 1, 1]
    assert committer.transactions == 3


async def test_a_batch_cancelled_before_its_lane_leaves_the_committer_working(
    database_url: str,
) -> None:
    async with two_lanes(database_url, 5) as (committer, plans):
        # Three batches handed over together: the last statement had company,
        # so the next batch waits a scheduler pass before taking a lane.
        async with trio.open_nursery() as senders:
            for plan in plans[:3]:
                senders.start_soon(committer.apply, [plan])
        assert committer.in_flight == 0
        with trio.CancelScope() as gone:
            gone.cancel()
            await committer.apply([plans[3]])
        with trio.fail_after(10):
            (done,) = await committer.apply([plans[4]])
    assert done.seq == 1
    assert committer.plans_committed == 4  # the cancelled batch never ran


async def follow_up(author: Member, store: PgScopeStore, scope_id: str, key: str) -> MessagePlan:
    """The next send to ``scope_id`` (after the ones already committed)."""
    state = ScopeState(await store.load_scope(scope_id))
    decision = state.decide(SendCommand(author, "y", key, reply=lambda _: None), datetime.now(UTC))
    assert isinstance(decision, Append)
    return decision.plan


@asynccontextmanager
async def after_four_at_once(
    database_url: str, gather: float
) -> AsyncIterator[tuple[GroupCommitter, Callable[[int], Awaitable[MessagePlan]]]]:
    """A two-lane committer that just held four batches at once (a share of
    two), and a maker of the next send to the i-th of those four scopes."""
    author, scope_ids = await channels(database_url, 4)
    async with running(database_url, lanes=2, gather=gather) as (committer, store):
        together = [await follow_up(author, store, scope_id, "a") for scope_id in scope_ids]
        async with trio.open_nursery() as senders:
            for plan in together:
                senders.start_soon(committer.apply, [plan])

        sent = 0

        async def next_send(index: int) -> MessagePlan:
            nonlocal sent
            sent += 1
            return await follow_up(author, store, scope_ids[index], f"b{sent}")

        yield committer, next_send


async def test_a_free_lane_waits_for_its_share_of_the_batches_held_at_once_lately(
    database_url: str,
) -> None:
    gather = 5.0
    async with after_four_at_once(database_url, gather) as (committer, next_send):
        before = committer.transactions
        first, second = await next_send(0), await next_send(1)
        waited: list[float] = []

        async def submit(plan: MessagePlan) -> None:
            start = trio.current_time()
            await committer.apply([plan])
            waited.append(trio.current_time() - start)

        # The first batch waits for a second one (0.2 s later) instead of
        # going alone.
        async with trio.open_nursery() as senders:
            senders.start_soon(submit, first)
            await trio.sleep(0.2)
            senders.start_soon(submit, second)
        assert committer.transactions == before + 1
        assert 0.2 <= max(waited) < gather


async def test_a_share_that_does_not_come_waits_no_longer_than_gather(
    database_url: str,
) -> None:
    gather = 0.3
    async with after_four_at_once(database_url, gather) as (committer, next_send):
        plan = await next_send(0)
        start = trio.current_time()
        with trio.fail_after(5):
            (done,) = await committer.apply([plan])
        assert done.seq == 2
        assert gather <= trio.current_time() - start < gather + 2


async def test_senders_that_pause_longer_than_a_moment_are_not_waited_for(
    database_url: str,
) -> None:
    gather = 0.05
    async with after_four_at_once(database_url, gather) as (committer, next_send):
        # Twenty sends, each a quarter of a second after the last answer
        # (well past four gather periods): people typing, not a loop.
        for _ in range(20):
            await trio.sleep(0.25)
            await committer.apply([await next_send(0)])
        plan = await next_send(1)
        start = trio.current_time()
        await committer.apply([plan])
        assert trio.current_time() - start < gather * 0.8
