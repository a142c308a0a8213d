"""Group commit across scope actors.

Each actor already commits the sends queued behind its running transaction
together (a chain: consecutive appends to its scope). The committer gathers
the chains actors hand over while its previous statement runs and commits
them as ONE statement (``SEND_GROUP``): one bind, one round trip, one commit,
whatever mix of scopes and chain lengths is queued — the batch adapts to the
load, with no timer: a lone send runs at once in its caller's task, and
whatever queued meanwhile goes next. While many actors send steadily, a free
lane waits a moment (at most ``gather`` seconds) for its share of them — the
most batches seen here at once lately, over the lanes — so that their batches
go as one statement instead of trickling out one or two at a time. Each
scope's chain stands alone in it — a fence miss or an idempotency hit writes
nothing for that scope and is answered to that actor only. A lone one-send
batch takes the single-send statement; a second chain for a scope already in
the group takes the ordinary one-batch path.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
import trio

from actors.planner import MessagePlan
from actors.ports import CommittedSend
from storage import applier
from storage.pg import TrioConnection
from storage.pool import Pool, reusable, worth_keeping

log = structlog.get_logger(__name__)

# Share gathering. A scope that sends again within _BACK_SOON ``gather``
# periods of its answer is a sender in a loop (a tool, an agent, a burst), not
# a person typing; _QUICK_WEIGHT is one comeback's weight in the moving
# average of such comebacks; _ANSWERED_KEPT scopes' answer times are kept
# (the oldest go first).
_BACK_SOON = 4
_QUICK_WEIGHT = 0.05
_ANSWERED_KEPT = 4096


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


class GroupCommitter:
    """Commits actors' batches with at most ``lanes`` statements in flight.

    A batch that finds every lane free, nothing queued and no sign of other
    senders commits at once in its caller's task (a lone sender pays no
    hand-over and no wait). One that finds a lane free while others send
    waits one scheduler pass in the queue and then takes the lane with
    everything queued meanwhile. Otherwise it queues, and the next lane to
    come free takes everything queued as one statement: the batch size follows
    the load. With ``gather`` set, a free lane that finds fewer batches queued
    than its share — the most batches in flight and queued at once within the
    last ``window`` seconds, over the lanes — waits for that share, at most
    ``gather`` seconds: under a steady load the actors of one statement come
    back together, and each statement carries more sends. Only while scopes
    come back soon after their answers (within four ``gather`` periods, most
    of the time lately): senders that pause between sends would only be
    kept waiting. A lone sender (also one writing to many scopes in turn)
    has a share of one and never waits. An actor has at most one batch here
    at a time, so two lanes never hold the same scope.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        lanes: int = 1,
        max_plans: int = 512,
        gather: float = 0.0,
        window: float = 0.02,
    ) -> None:
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
        # Whether the last statement to end had company: other batches in it,
        # in flight next to it or queued behind it.
        self._company = False
        # Share gathering: the most batches here at once (in flight and
        # queued) lately, and when that was seen; a free lane waits up to
        # ``gather`` for its share of them.
        self._gather = gather
        self._window = window
        self._held = 0
        self._peak = 1
        self._peak_at = -math.inf
        self._filled = trio.lowlevel.ParkingLot()
        # When each scope's last batch was answered, and how often lately a
        # scope came back soon after its answer (a moving average): senders
        # that pause between sends never fill a share in time, and then no
        # lane waits for one.
        self._answered: OrderedDict[str, float] = OrderedDict()
        self._quick = 1.0
        self.transactions = 0
        self.plans_committed = 0

    @property
    def in_flight(self) -> int:
        """Statements running now."""
        return self._running

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
        share = self._note(job.scope_id)
        if share > 1:
            self._queue.append(job)
            if len(self._queue) >= share:
                self._filled.unpark_all()
            if self._running < self._lanes:
                self._lot.unpark()
        elif self._running == 0 and not self._queue and not self._company:
            await self._run_lane([job])
        elif self._running < self._lanes and not self._queue:
            # Others are sending (a statement is in flight, or the last one
            # had company): one pass of the scheduler first, and the batches
            # other actors hand over in that pass (their commands came in with
            # this one) join this statement instead of each taking a lane
            # alone. A lone sender never waits for it.
            self._queue.append(job)
            try:
                await trio.lowlevel.checkpoint()
            except BaseException:
                self._withdraw(job)
                raise
            if self._queue and self._queue[0] is job and self._running < self._lanes:
                await self._run_lane(self._take())
        else:
            self._queue.append(job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _note(self, scope_id: str) -> int:
        """Count a batch arriving; return a lane's share (1 when gathering is off)."""
        if not self._gather:
            return 1
        now = trio.current_time()
        answered = self._answered.pop(scope_id, None)
        if answered is not None:
            back_soon = now - answered <= _BACK_SOON * self._gather
            self._quick += (back_soon - self._quick) * _QUICK_WEIGHT
        load = self._held + len(self._queue) + 1
        if load >= self._peak or now - self._peak_at > self._window:
            self._peak, self._peak_at = load, now
        return self._share(now)

    def _share(self, now: float) -> int:
        if not self._gather or self._quick < 0.5 or now - self._peak_at > self._window:
            return 1
        return math.ceil(self._peak / self._lanes)

    def _note_answered(self, jobs: list[_Job]) -> None:
        now = trio.current_time()
        answered = self._answered
        for job in jobs:
            answered[job.scope_id] = now
            answered.move_to_end(job.scope_id)
        while len(answered) > _ANSWERED_KEPT:
            answered.popitem(last=False)

    def _withdraw(self, job: _Job) -> None:
        """Take back a batch cancelled before any lane took it; whatever others
        queued behind it meanwhile goes to a lane server (with no statement in
        flight, no lane would come free to take it)."""
        if job in self._queue:
            self._queue.remove(job)
        if self._queue:
            self._lot.unpark()

    async def _run_lane(self, jobs: list[_Job]) -> None:
        self._running += 1
        self._held += len(jobs)
        try:
            await self._run_jobs(jobs)
        finally:
            self._held -= len(jobs)
            if self._gather:
                self._note_answered(jobs)
            self._company = len(jobs) > 1 or self._running > 1 or bool(self._queue)
            self._lane_done()

    def _lane_done(self) -> None:
        self._running -= 1
        if self._queue:
            self._lot.unpark()

    async def _serve(self) -> None:
        while True:
            if not self._queue or self._running >= self._lanes:
                await self._lot.park()
                continue
            if len(self._queue) < self._share(trio.current_time()):
                # The actors of the last statement are turning round (reply
                # out, next request in): a moment's wait lets them go together.
                with trio.move_on_after(self._gather):
                    await self._filled.park()
                if not self._queue or self._running >= self._lanes:
                    continue
            await self._run_lane(self._take())

    async def _run_jobs(self, jobs: list[_Job]) -> None:
        try:
            conn = await self._connection()
            try:
                # A lone batch is one autocommitted statement (one round trip).
                assert conn.autocommit, "the committer needs an autocommit pool"
                await self._commit(conn, jobs)
            finally:
                if worth_keeping(conn) and not self._stopped:
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
        count = 0
        queue = self._queue
        while queue and (not jobs or count + len(queue[0].plans) <= self._max_plans):
            job = queue.popleft()
            jobs.append(job)
            count += len(job.plans)
        return jobs

    async def _commit(self, conn: TrioConnection, jobs: list[_Job]) -> None:
        grouped: dict[str, _Job] = {}
        alone: list[_Job] = []
        for job in jobs:
            if job.scope_id not in grouped:
                grouped[job.scope_id] = job
            else:
                alone.append(job)
        if len(grouped) == 1 and len(jobs[0].plans) == 1:
            # One send: the single-send statement is the cheaper plan.
            alone[:0] = grouped.values()
        elif grouped:
            await self._commit_group(conn, list(grouped.values()))
        for job in alone:
            await self._commit_alone(conn, job)

    async def _commit_group(self, conn: TrioConnection, jobs: list[_Job]) -> None:
        """One statement for many scopes; each job gets its own outcome."""
        try:
            results = await applier.apply_chains(conn, [job.plans for job in jobs])
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            # A failing row must not fail its neighbours: retry each on its own.
            log.warning("group_commit_failed", batches=len(jobs), error=repr(exc))
            for job in jobs:
                await self._commit_alone(conn, job)
            return
        self.transactions += 1
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, list):
                self.plans_committed += len(result)
                job.finish(result)
            else:
                job.fail(result)

    async def _commit_alone(self, conn: TrioConnection, job: _Job) -> None:
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
