"""Group commit across scope actors.

Each actor already commits the sends queued behind its running transaction
together (a chain: consecutive appends to its scope). The committer gathers
the chains actors hand over while its previous statement runs and commits
them as ONE statement (``SEND_GROUP``): one bind, one round trip, one commit,
whatever mix of scopes and chain lengths is queued — the batch adapts to the
load, with no timer: a lone send runs at once in its caller's task, and
whatever queued meanwhile goes next. Each scope's chain stands alone in it — a
fence miss or an idempotency hit writes nothing for that scope and is answered
to that actor only. A lone one-send batch takes the single-send statement; a
second chain for a scope already in the group takes the ordinary one-batch
path.

An actor whose senders wait on each other may queue its next batch while the
previous one is still committing (``submit`` with ``after``): the committer
runs it only after its predecessor, appends it to the predecessor's chain
when both are taken together, and fails it with ``FenceLost`` without
running it when the predecessor failed — it was decided on a state that
never reached the database.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog
import trio

from actors.planner import MessagePlan
from actors.ports import CommittedSend, FenceLost
from storage import applier
from storage.pg import Pool, TrioConnection, reusable

log = structlog.get_logger(__name__)


@dataclass(eq=False, slots=True)
class _Job:
    plans: Sequence[MessagePlan]
    done: trio.Event = field(default_factory=trio.Event)
    result: list[CommittedSend] | None = None
    error: BaseException | None = None
    # The same actor's batch this one was decided after (``submit``).
    after: _Job | None = None
    notify: Callable[[], None] | None = None

    @property
    def scope_id(self) -> str:
        return self.plans[0].intent.scope_id

    @property
    def finished(self) -> bool:
        return self.done.is_set()

    def outcome(self) -> list[CommittedSend]:
        """The committed sends; raises what made the batch write nothing."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def finish(self, result: list[CommittedSend]) -> None:
        self.result = result
        self._done()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done()

    def _done(self) -> None:
        self.done.set()
        if self.notify is not None:
            self.notify()

    @property
    def orphaned(self) -> bool:
        """Its predecessor failed: running it would commit on a state that never was."""
        return self.after is not None and self.after.error is not None


PendingCommit = _Job


class GroupCommitter:
    """Commits actors' batches with at most ``lanes`` statements in flight.

    A batch that finds a free lane and nothing queued commits at once in its
    caller's task (a lone sender pays no hand-over and no wait). Otherwise it
    queues, and the next lane to come free takes everything queued as one
    statement: the batch size follows the load, with no timer. An actor has
    at most one batch here at a time, so two lanes never hold the same scope.
    """

    def __init__(self, pool: Pool, *, lanes: int = 1, max_plans: int = 512) -> None:
        if lanes < 1:
            raise ValueError("a committer needs at least one lane")
        self._pool = pool
        self._lanes = lanes
        self._running = 0
        self._queue: deque[_Job] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._max_plans = max_plans
        # Each lane keeps its connection between statements: a pool checkout
        # per send (a semaphore, a cancel scope, a context manager) was a
        # measurable part of a lone sender's latency.
        self._kept: list[TrioConnection] = []
        self._stopped = False
        self.transactions = 0
        self.plans_committed = 0
        self.submitted = 0

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self._lanes):
                    nursery.start_soon(self._serve)
        finally:
            self._stopped = True
            with trio.CancelScope(shield=True):
                while self._kept:
                    await self._pool.give_back(self._kept.pop())

    async def apply(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        """Commit one actor's batch atomically (alone, or in a group statement)."""
        job = _Job(plans)
        if self._running < self._lanes and not self._queue:
            self._running += 1
            try:
                await self._run_jobs([job])
            finally:
                self._lane_done()
        else:
            self._queue.append(job)
        await job.done.wait()
        return job.outcome()

    def submit(
        self,
        plans: Sequence[MessagePlan],
        *,
        after: PendingCommit | None = None,
        notify: Callable[[], None] | None = None,
    ) -> PendingCommit:
        """Queue a batch without waiting for it; ``notify`` runs when it is answered.

        ``after`` is the same actor's previous batch, still committing or
        queued: this one runs after it, and only if it committed.
        """
        job = _Job(plans, after=after, notify=notify)
        self.submitted += 1
        self._queue.append(job)
        if self._running < self._lanes:
            self._lot.unpark()
        return job

    def _lane_done(self) -> None:
        self._running -= 1
        if self._queue:
            self._lot.unpark()

    async def _serve(self) -> None:
        while True:
            if not self._queue or self._running >= self._lanes:
                await self._lot.park()
                continue
            jobs = self._take()
            if not jobs:
                # All queued wait for a predecessor on another lane, whose end unparks.
                await self._lot.park()
                continue
            self._running += 1
            try:
                await self._run_jobs(jobs)
            finally:
                self._lane_done()

    async def _run_jobs(self, jobs: list[_Job]) -> None:
        try:
            conn = await self._connection()
            try:
                # A lone batch is one autocommitted statement (one round trip).
                assert conn.autocommit, "the committer needs an autocommit pool"
                await self._commit(conn, jobs)
            finally:
                if reusable(conn) and not self._stopped:
                    self._kept.append(conn)
                else:
                    await self._pool.give_back(conn)
        except Exception as exc:
            for job in jobs:
                if not job.done.is_set():
                    job.fail(exc)

    async def _connection(self) -> TrioConnection:
        while self._kept:
            conn = self._kept.pop()
            if reusable(conn):
                return conn
            # Dropped by the server while idle: the pool closes it.
            await self._pool.give_back(conn)
        return await self._pool.keep()

    def _take(self) -> list[_Job]:
        jobs: list[_Job] = []
        taken: set[int] = set()
        waiting: list[_Job] = []
        count = 0
        queue = self._queue
        while queue and (not jobs or count + len(queue[0].plans) <= self._max_plans):
            job = queue.popleft()
            after = job.after
            if after is not None and not after.finished and id(after) not in taken:
                # Its predecessor is committing on another lane.
                waiting.append(job)
                continue
            jobs.append(job)
            taken.add(id(job))
            count += len(job.plans)
        queue.extendleft(reversed(waiting))
        return jobs

    async def _commit(self, conn: TrioConnection, jobs: list[_Job]) -> None:
        chains: dict[str, list[_Job]] = {}
        alone: list[_Job] = []
        for job in jobs:
            if job.orphaned:
                job.fail(FenceLost(job.scope_id))
                continue
            chain = chains.get(job.scope_id)
            if chain is None:
                chains[job.scope_id] = [job]
            elif job.after is chain[-1]:
                chain.append(job)
            else:
                alone.append(job)
        if len(chains) == 1 and not alone:
            (chain,) = chains.values()
            if len(chain) == 1:
                # One batch: the ordinary statement (the single-send one for one send).
                alone[:0] = chain
                chains.clear()
        if chains:
            await self._commit_group(conn, list(chains.values()))
        for job in alone:
            await self._commit_alone(conn, job)

    async def _commit_group(self, conn: TrioConnection, chains: list[list[_Job]]) -> None:
        """One statement for many scopes; each scope's chain gets its own outcome."""
        try:
            results = await applier.apply_chains(
                conn, [[plan for job in chain for plan in job.plans] for chain in chains]
            )
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            # A failing row must not fail its neighbours: retry each on its own.
            log.warning("group_commit_failed", batches=len(chains), error=repr(exc))
            for chain in chains:
                for job in chain:
                    await self._commit_alone(conn, job)
            return
        self.transactions += 1
        for chain, result in zip(chains, results, strict=True):
            if not isinstance(result, list):
                for job in chain:
                    job.fail(result)
                continue
            self.plans_committed += len(result)
            start = 0
            for job in chain:
                job.finish(result[start : start + len(job.plans)])
                start += len(job.plans)

    async def _commit_alone(self, conn: TrioConnection, job: _Job) -> None:
        if job.orphaned:
            job.fail(FenceLost(job.scope_id))
            return
        try:
            result = await applier.apply_sends(conn, job.plans)
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            job.fail(exc)
        else:
            self.plans_committed += len(result)
            job.finish(result)
        self.transactions += 1
