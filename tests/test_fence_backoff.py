"""A scope actor that keeps losing the send fence retries, backing off, until
the send's deadline (actors/fence_backoff.py).

The fence misses come through the actor's store port: a wrapper around the
real PostgreSQL store either answers the commit with ``FenceLost`` (another
writer that never lets go) or lets a second actor of the same scope commit
first (another node), and every decision is checked against the database.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from actors.fence_backoff import SEND_DEADLINE, FenceBackoff
from actors.model import IdempotencyRecord, Member, MemberType, ScopeSnapshot
from actors.planner import MessagePlan
from actors.ports import CommittedSend, FenceLost, LockedScope
from actors.scope_actor import ScopeActor
from actors.scope_state import SendCommand
from node.database import autocommit
from protocol.errors import ErrorCode, OperationError
from protocol.frames import FreshnessIn, SendResult
from storage import directory, scopes
from storage.pool import Pool, open_pool
from storage.store import PgScopeStore
from tests.publishers import RecordingPublisher

WAIT = 10.0


def test_the_first_retry_is_at_once_and_later_waits_double_up_to_the_cap() -> None:
    backoff = FenceBackoff(base=0.002, cap=0.05)
    assert [backoff.ceiling(n) for n in range(1, 8)] == [
        0.0,
        0.002,
        0.004,
        0.008,
        0.016,
        0.032,
        0.05,
    ]
    assert backoff.ceiling(10_000) == 0.05
    rng = random.Random(7)
    waits = [backoff.wait(6, rng) for _ in range(200)]
    assert all(0.0 <= w <= 0.032 for w in waits)
    assert len(set(waits)) == len(waits)  # jitter: no two losers wait alike
    with pytest.raises(ValueError, match="base"):
        FenceBackoff(base=0.0)


class LosingStore(PgScopeStore):
    """The real store, with a rival and a writer that never lets go.

    ``rival`` runs before each commit made without the lock (another node
    commits first); the next ``losses`` commits, with the lock or without,
    lose the fence without writing; ``before_locked_commit`` runs inside a
    locked attempt before its commit; ``loads_fail`` / ``locks_fail`` make the
    database unreachable.
    """

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.losses = 0
        self.optimistic = 0
        self.locked_commits = 0
        self.rival: Callable[[], Awaitable[None]] | None = None
        self.before_locked_commit: Callable[[], Awaitable[None]] | None = None
        self.loads_fail = False
        self.locks_fail = False

    def lose(self, plans: Sequence[MessagePlan]) -> None:
        if self.losses:
            self.losses -= 1
            raise FenceLost(plans[0].intent.scope_id)

    async def load_scope(self, scope_id: str) -> ScopeSnapshot:
        if self.loads_fail:
            raise OSError("database unreachable")
        return await super().load_scope(scope_id)

    async def apply_sends(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        self.optimistic += 1
        self.lose(plans)
        if self.rival is not None:
            await self.rival()
        return await super().apply_sends(plans)

    @asynccontextmanager
    async def locked(self, scope_id: str) -> AsyncIterator[LockedScope]:
        if self.locks_fail:
            raise OSError("database unreachable")
        async with super().locked(scope_id) as scope:
            yield Locked(self, scope)


class Locked:
    def __init__(self, store: LosingStore, scope: LockedScope) -> None:
        self.store = store
        self.scope = scope

    async def load_scope(self) -> ScopeSnapshot:
        return await self.scope.load_scope()

    async def find_idempotent(
        self, author_id: str, client_message_id: str
    ) -> IdempotencyRecord | None:
        return await self.scope.find_idempotent(author_id, client_message_id)

    async def apply_sends(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        self.store.locked_commits += 1
        self.store.lose(plans)
        hook, self.store.before_locked_commit = self.store.before_locked_commit, None
        if hook is not None:
            await hook()
        return await self.scope.apply_sends(plans)


class Answer:
    """The one reply to a submitted send."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: SendResult | OperationError | None = None

    def __call__(self, result: SendResult | OperationError) -> None:
        self.result = result
        self.done.set()

    async def wait(self) -> SendResult | OperationError:
        with trio.fail_after(WAIT):
            await self.done.wait()
        assert self.result is not None
        return self.result


def submit(actor: ScopeActor, author: Member, cmid: str, seen: int | None = None) -> Answer:
    answer = Answer()
    freshness = (
        None if seen is None else FreshnessIn(target_key=actor.scope_id, seen_up_to_seq=seen)
    )
    actor.submit_nowait(SendCommand(author, cmid, cmid, reply=answer, freshness=freshness))
    return answer


async def send(
    actor: ScopeActor, author: Member, cmid: str, seen: int | None = None
) -> SendResult | OperationError:
    return await submit(actor, author, cmid, seen).wait()


async def channel(pool: Pool, name: str) -> tuple[str, Member]:
    async with pool.connection() as conn:
        workspace_id = await directory.create_workspace(conn, name)
        ann = await directory.create_member(
            conn, workspace_id=workspace_id, type_=MemberType.HUMAN, handle="ann"
        )
        scope_id = await scopes.create_channel(
            conn, creator=ann, slug="c", name="c", visibility="public", description=""
        )
    return scope_id, ann


async def blocked_on_a_lock(pool: Pool) -> None:
    """Until some statement waits for a row lock (the rival is queued behind it)."""
    with trio.fail_after(WAIT):
        while True:
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                row = await cur.fetchone()
            if row is not None and row[0] > 0:
                return
            await trio.sleep(0.01)


@dataclass
class Scene:
    """ann's channel, actor A on the losing store, and the nursery it runs in."""

    pool: Pool
    scope_id: str
    ann: Member
    store: LosingStore
    published: RecordingPublisher
    a: ScopeActor
    nursery: trio.Nursery

    async def other_node(self) -> ScopeActor:
        """Actor B: the same scope on the plain store, as another node runs it."""
        b = ScopeActor(self.scope_id, PgScopeStore(self.pool), RecordingPublisher())
        await self.nursery.start(b.run)
        return b

    async def stored(self) -> list[tuple[int, str]]:
        """(seq, client message id) of the scope's messages in the database."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT seq, client_message_id FROM scope_messages"
                " WHERE scope_id = %s ORDER BY seq",
                (self.scope_id,),
            )
            return [(int(seq), str(cmid)) for seq, cmid in await cur.fetchall()]


@asynccontextmanager
async def open_scene(
    database_url: str, name: str, send_deadline: float = SEND_DEADLINE
) -> AsyncIterator[Scene]:
    """A fresh channel named ``name`` with actor A running on it."""
    async with (
        open_pool(database_url, size=4, configure=autocommit) as pool,
        trio.open_nursery() as nursery,
    ):
        scope_id, ann = await channel(pool, name)
        store = LosingStore(pool)
        published = RecordingPublisher()
        a = ScopeActor(scope_id, store, published, send_deadline=send_deadline)
        await nursery.start(a.run)
        yield Scene(pool, scope_id, ann, store, published, a, nursery)
        nursery.cancel_scope.cancel()


async def test_a_rival_that_always_commits_first_is_outwaited_under_the_lock(
    database_url: str,
) -> None:
    """Actor B (another node) commits before every one of A's optimistic
    commits: A loses twice, then decides and commits holding the lock."""
    async with open_scene(database_url, "rival") as scene:
        a, ann, store = scene.a, scene.ann, scene.store
        b = await scene.other_node()
        rivals = iter(range(100))

        async def rival() -> None:
            result = await send(b, ann, f"b{next(rivals)}")
            assert isinstance(result, SendResult)
            assert result.state == "sent"

        store.rival = rival
        result = await send(a, ann, "a")
        assert isinstance(result, SendResult), result
        assert (result.state, result.accepted_seq) == ("sent", 3)
        assert (a.fence_losses, store.optimistic, store.locked_commits) == (2, 2, 1)
        assert await scene.stored() == [(1, "b0"), (2, "b1"), (3, "a")]
        assert scene.published.seqs == [3]


async def test_a_writer_waits_for_the_lock_then_loses_the_fence_and_retries(
    database_url: str,
) -> None:
    """While A's locked attempt holds the scope, B's commit waits for it; when
    A commits, B's fence misses and B sends after A's message."""
    async with open_scene(database_url, "waiting") as scene:
        b = await scene.other_node()
        answers: list[Answer] = []

        async def rival_waits() -> None:
            answers.append(submit(b, scene.ann, "b"))
            await blocked_on_a_lock(scene.pool)

        scene.store.losses = 2  # then A's attempt holds the lock
        scene.store.before_locked_commit = rival_waits
        result = await send(scene.a, scene.ann, "a")
        assert isinstance(result, SendResult), result
        assert (result.state, result.accepted_seq) == ("sent", 1)
        after = await answers[0].wait()
        assert isinstance(after, SendResult), after
        assert (after.state, after.accepted_seq) == ("sent", 2)
        assert (scene.a.fence_losses, b.fence_losses) == (2, 1)
        assert await scene.stored() == [(1, "a"), (2, "b")]


async def test_a_send_whose_deadline_passes_is_unavailable_and_the_actor_serves_on(
    database_url: str,
) -> None:
    async with open_scene(database_url, "deadline", send_deadline=0.3) as scene:
        actor, store = scene.a, scene.store
        store.losses = 1_000_000
        started = trio.current_time()
        result = await send(actor, scene.ann, "a")
        took = trio.current_time() - started
        assert isinstance(result, OperationError), result
        assert result.code is ErrorCode.UNAVAILABLE
        assert 0.2 < took < 5.0, took  # the deadline, not the default ten seconds
        assert actor.fence_losses > 3
        assert store.locked_commits > 1
        assert (await scene.stored(), scene.published.seqs) == ([], [])
        # Nothing half-decided is left behind: the next send is seq 1.
        store.losses = 0
        again = await send(actor, scene.ann, "b")
        assert isinstance(again, SendResult), again
        assert (again.state, again.accepted_seq) == ("sent", 1)
        assert (await scene.stored(), scene.published.seqs) == ([(1, "b")], [1])


@pytest.mark.parametrize("losses", [1, 2])
async def test_an_unreachable_database_answers_unavailable_at_once(
    database_url: str, losses: int
) -> None:
    """After one loss the actor reloads, after two it takes the lock: either
    way a database it cannot reach answers at once, not at the deadline."""
    async with open_scene(database_url, f"down{losses}") as scene:
        store = scene.store
        store.losses = losses
        if losses == 1:
            store.loads_fail = True
        else:
            store.locks_fail = True
        with trio.fail_after(1.0):  # far under the send's deadline
            result = await send(scene.a, scene.ann, "a")
        assert isinstance(result, OperationError), result
        assert result.code is ErrorCode.UNAVAILABLE
        assert await scene.stored() == []


async def test_after_losing_to_another_node_freshness_answers_as_on_one_node(
    database_url: str,
) -> None:
    """Actor B (another node) commits between actor A's decision and A's
    commit: A reloads, and its sends are decided on the new history — the one
    that had seen nothing is held at B's seq, the plain one lands after it,
    and a send that had seen B's message is sent right after."""
    async with open_scene(database_url, "fresh") as scene:
        a, ann = scene.a, scene.ann
        b = await scene.other_node()
        other: list[SendResult | OperationError] = []

        async def b_first() -> None:
            scene.store.rival = None
            other.append(await send(b, ann, "b"))

        scene.store.rival = b_first
        # Queued together, in this order: one decision, one commit, one loss.
        fresh_answer = submit(a, ann, "fresh", 0)
        plain_answer = submit(a, ann, "plain")
        fresh, plain = await fresh_answer.wait(), await plain_answer.wait()
        assert isinstance(other[0], SendResult)
        assert (other[0].state, other[0].accepted_seq) == ("sent", 1)
        assert isinstance(fresh, SendResult), fresh
        assert isinstance(plain, SendResult), plain
        assert (fresh.state, fresh.needs_refresh_until_seq) == ("held", 1)
        assert (plain.state, plain.accepted_seq) == ("sent", 2)
        assert a.fence_losses == 1
        after = await send(a, ann, "seen", 2)
        assert isinstance(after, SendResult), after
        assert (after.state, after.accepted_seq) == ("sent", 3)
        assert await scene.stored() == [(1, "b"), (2, "plain"), (3, "seen")]
        assert scene.published.seqs == [2, 3]
