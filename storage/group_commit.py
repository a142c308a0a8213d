"""Group commit across scope actors.

Each actor already commits the sends queued behind its running transaction
together. With many busy scopes and one send in flight each, that is still
one transaction — and one WAL flush — per send. The committer gathers the
batches that actors hand over while a transaction is running and commits them
in the next one, pipelined in one round trip.

A batch stays atomic: if one of its statements misses the fence or hits an
existing idempotency key, the group transaction is rolled back, that batch
alone is answered with the miss, and the other batches are committed in a new
transaction. Batches of one scope always go through the same lane (one
connection, one transaction at a time), so lanes never wait for each other on
a scope row; within a transaction statements run in scope-id order, so
committers on different nodes lock rows in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
import structlog
import trio

from actors.planner import MessagePlan
from actors.ports import CommittedSend, FenceLost, IdempotencyRace
from storage import applier
from storage.pg import Pool, TrioConnection

log = structlog.get_logger(__name__)


@dataclass(eq=False, slots=True)
class _Job:
    plans: Sequence[MessagePlan]
    done: trio.Event = field(default_factory=trio.Event)
    result: list[CommittedSend] | None = None
    error: BaseException | None = None

    @property
    def scope_id(self) -> str:
        return self.plans[0].intent.scope_id

    def finish(self, result: list[CommittedSend]) -> None:
        self.result = result
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


@dataclass(slots=True)
class _Lane:
    queue: list[_Job] = field(default_factory=list)
    lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    busy: bool = False


class GroupCommitter:
    def __init__(self, pool: Pool, *, lanes: int = 4, max_plans: int = 512) -> None:
        self._pool = pool
        self._lanes = [_Lane() for _ in range(lanes)]
        self._max_plans = max_plans
        self.transactions = 0
        self.plans_committed = 0

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for lane in self._lanes:
                nursery.start_soon(self._serve, lane)

    async def apply(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        """Commit one actor's batch atomically (in some group transaction)."""
        job = _Job(plans)
        lane = self._lanes[hash(job.scope_id) % len(self._lanes)]
        lane.queue.append(job)
        lane.lot.unpark()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    async def _serve(self, lane: _Lane) -> None:
        while True:
            if not lane.queue:
                await lane.lot.park()
                continue
            jobs = self._take(lane)
            try:
                async with self._pool.connection() as conn:
                    # A lone batch is one autocommitted statement (one round trip).
                    assert conn.autocommit, "the committer needs an autocommit pool"
                    await self._commit(conn, jobs)
            except Exception as exc:
                for job in jobs:
                    if not job.done.is_set():
                        job.fail(exc)

    def _take(self, lane: _Lane) -> list[_Job]:
        jobs: list[_Job] = []
        count = 0
        while lane.queue and (not jobs or count + len(lane.queue[0].plans) <= self._max_plans):
            job = lane.queue.pop(0)
            jobs.append(job)
            count += len(job.plans)
        return jobs

    async def _commit(self, conn: TrioConnection, jobs: list[_Job]) -> None:
        pending = sorted(jobs, key=lambda j: j.scope_id)
        while len(pending) > 1:
            try:
                missed = await self._commit_group(conn, pending)
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                # Find the culprit: every batch on its own.
                log.warning("group_commit_failed", batches=len(pending), error=repr(exc))
                break
            if missed is None:
                return
            pending.remove(missed)
        for job in pending:
            await self._commit_alone(conn, job)

    async def _commit_group(self, conn: TrioConnection, jobs: list[_Job]) -> _Job | None:
        """Commit all jobs, or roll back and return the first job that missed."""
        plans = [plan for job in jobs for plan in job.plans]
        async with conn.transaction() as tx:
            results = await applier.apply_group(conn, plans)
            per_job = []
            position = 0
            for job in jobs:
                mine = results[position : position + len(job.plans)]
                position += len(job.plans)
                miss = next((r for r in mine if isinstance(r, FenceLost | IdempotencyRace)), None)
                if miss is not None:
                    job.fail(miss)
                    raise psycopg.Rollback(tx)
                per_job.append([r for r in mine if isinstance(r, CommittedSend)])
        if len(per_job) < len(jobs):
            return next(job for job in jobs if job.done.is_set())
        self.transactions += 1
        self.plans_committed += len(plans)
        for job, result in zip(jobs, per_job, strict=True):
            job.finish(result)
        return None

    async def _commit_alone(self, conn: TrioConnection, job: _Job) -> None:
        try:
            job.finish(await applier.apply_sends(conn, job.plans))
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            job.fail(exc)
        self.transactions += 1
