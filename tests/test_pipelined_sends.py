"""A scope actor deciding its next sends while the previous ones commit."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import trio
import trio.testing

from actors.planner import MessagePlan
from actors.ports import CommittedSend, FenceLost, PendingSends
from actors.scope_actor import ScopeActor
from actors.scope_state import SendCommand
from node.database import autocommit
from protocol.errors import OperationError
from protocol.frames import SendResult
from storage.group_commit import GroupCommitter, PendingCommit
from storage.pg import open_pool
from storage.store import PgScopeStore
from tests.test_group_commit import channels


class Recorder:
    """Replies and published messages, in the order the actor gave them."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, int]] = []

    def reply_to(self, content: str) -> Callable[[SendResult | OperationError], None]:
        def reply(result: SendResult | OperationError) -> None:
            assert isinstance(result, SendResult), result
            assert result.accepted_seq is not None
            self.log.append(("reply", content, result.accepted_seq))

        return reply

    @contextmanager
    def batch(self) -> Iterator[None]:
        yield

    def publish_messages(
        self, scope_id: str, sends: Sequence[tuple[MessagePlan, CommittedSend]]
    ) -> None:
        for plan, commit in sends:
            self.log.append(("event", plan.intent.content, commit.seq))

    def publish_membership(self, *args: Any) -> None:
        pass

    def publish_thread(self, *args: Any) -> None:
        pass

    def publish_mutation(self, *args: Any) -> None:
        pass

    def publish_reaction(self, *args: Any) -> None:
        pass


class FenceMovesUnderFirstBatch(PgScopeStore):
    """The first pipelined batch misses its fence (as when another node wrote)
    once a second batch is queued behind it."""

    def __init__(self, pool: Any, committer: GroupCommitter) -> None:
        super().__init__(pool, committer)
        self.held: PendingCommit | None = None

    def submit_sends(
        self,
        plans: Sequence[MessagePlan],
        *,
        after: PendingSends | None,
        notify: Callable[[], None],
    ) -> PendingCommit:
        if self.held is None:
            self.held = PendingCommit(plans, notify=notify)
            return self.held
        pending = super().submit_sends(plans, after=after, notify=notify)
        if not self.held.finished:
            self.held.fail(FenceLost(plans[0].intent.scope_id))
        return pending


async def test_batches_behind_a_missed_fence_are_decided_again_in_order(
    database_url: str,
) -> None:
    author, (scope_id,) = await channels(database_url, 1)
    recorder = Recorder()
    async with (
        open_pool(database_url, size=4, configure=autocommit) as pool,
        trio.open_nursery() as nursery,
    ):
        committer = GroupCommitter(pool, lanes=1)
        nursery.start_soon(committer.run)
        store = FenceMovesUnderFirstBatch(pool, committer)
        actor = ScopeActor(scope_id, store, recorder)
        await nursery.start(actor.run)

        def send(content: str) -> None:
            actor.submit_nowait(SendCommand(author, content, content, recorder.reply_to(content)))

        with trio.fail_after(10):
            send("a1")
            await trio.testing.wait_all_tasks_blocked()  # a1 commits in the actor's task
            send("a2")  # waiting when a1's commit returns: the scope is contended
            while len(recorder.log) < 2:
                await trio.sleep(0.005)
            await trio.testing.wait_all_tasks_blocked()  # a2 pipelined, held
            assert store.held is not None
            assert not store.held.finished
            send("a3")  # decided behind a2; then a2's fence is lost
            while len(recorder.log) < 6:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    # a2 and a3 are committed again as one batch: its replies, then its events.
    assert recorder.log == [
        ("reply", "a1", 1),
        ("event", "a1", 1),
        ("reply", "a2", 2),
        ("reply", "a3", 3),
        ("event", "a2", 2),
        ("event", "a3", 3),
    ]
    # a3 went to the committer behind the failed a2 and was not run there.
    assert committer.submitted == 1
    assert committer.plans_committed == 3
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT seq, content FROM scope_messages WHERE scope_id = %s ORDER BY seq", (scope_id,)
        ).fetchall()
    assert rows == [(1, "a1"), (2, "a2"), (3, "a3")]
