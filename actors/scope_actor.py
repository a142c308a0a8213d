"""The scope actor: one task, one bounded mailbox, a ScopeState inside.

Sends queued while a transaction is in flight are drained and committed
together in the next transaction (group commit); each is still decided in
order, and each is answered only after its transaction committed (persist before reply).
Replies and events leave through synchronous callbacks, so the sender's
``reply`` is queued before any ``message`` event of the same send.

A send longer than the row limit is one logical send of several rows
(docs/design.md#chunked-sends): one row is committed per turn and the rest goes back to the
end of the queue, so a huge send cannot starve the scope — other senders
interleave, and a row that finds the scope moved on is ``held``
(``partial_held`` once earlier rows were accepted).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
import trio

from actors.clock import DbClock
from actors.fence_backoff import SEND_DEADLINE, FenceBackoff
from actors.mentions import live_handles
from actors.model import IdempotencyRecord, Member, NotificationState, ScopeSnapshot
from actors.planner import MessagePlan, MutationPlan, plan_delete, plan_edit
from actors.policy import (
    Decision,
    can_delete,
    can_edit,
    can_invite,
    can_join,
    can_leave,
    can_react,
    can_remove,
    reaction_wakes,
    sees_reaction,
)
from actors.ports import (
    CommittedSend,
    FenceLost,
    IdempotencyRace,
    MutationConflict,
    MutationTarget,
    Publisher,
    ReactionActivity,
    ReactionOutcome,
    ReactionWrite,
    ScopeStore,
)
from actors.reactions import summaries_by_reader
from actors.scope_state import (
    ROW_LIMIT,
    Append,
    Immediate,
    NeedsLookup,
    NeedsReload,
    ScopeState,
    SendCommand,
    chunk_client_message_id,
    split_content,
)
from actors.visibility import readers
from protocol.errors import ErrorCode, OperationError
from protocol.frames import FreshnessIn, SendResult

log = structlog.get_logger(__name__)

MAX_BATCH = 64
COMMIT_ATTEMPTS = 3

RosterReply = Callable[[dict[str, object] | OperationError], None]
# (author id, clientMessageId) -> the stored send, if any.
Lookup = Callable[[str, str], Awaitable[IdempotencyRecord | None]]
ReactReply = Callable[[dict[str, object] | OperationError], None]


@dataclass(slots=True)
class RosterCommand:
    """join / leave / invite / remove / setNotification, serialised with the scope's sends.

    ``actor`` asks; ``member`` is the one whose membership changes. Who may do
    what is :mod:`actors.policy`'s, decided on the actor's own roster.
    """

    op: str
    actor: Member
    member: Member
    reply: RosterReply
    visibility: str = "public"
    state: NotificationState = NotificationState.ACTIVE


@dataclass(slots=True)
class ReactCommand:
    """``react`` add/remove on a message of this scope (docs/design.md#reactions).

    Serialised with the scope's other commands but never part of a send
    group: a reaction takes no send fence and moves no seq. The node has
    checked the message is in this scope's workspace and the emoji's form.
    """

    reactor: Member
    message_id: str
    emoji: str
    op: str
    reply: ReactReply


@dataclass(slots=True)
class EditCommand:
    """``edit`` of a message of this scope (docs/design.md#edits-and-deletes).

    Ordered with the scope's sends but never takes the send fence: an edit
    keeps the message's seq and moves no ``latest_seq``. ``revision`` is the
    one the client edited (None: whatever is stored).
    """

    actor: Member
    message_id: str
    content: str
    reply: RosterReply
    revision: int | None = None


@dataclass(slots=True)
class DeleteCommand:
    """``delete`` of a message of this scope: a tombstone in its place."""

    actor: Member
    message_id: str
    reply: RosterReply


MutationCommand = EditCommand | DeleteCommand


@dataclass(slots=True)
class ChunkedSend:
    """A logical send split into rows; row ``index`` is the next to commit.

    Row i is stored under ``<clientMessageId>#<i>`` and fenced on
    ``max(freshness.seenUpToSeq, last accepted row's seq)``: on the first
    attempt that is the previous row's ``acceptedSeq``; on a retry after a
    refresh, accepted rows replay as ``already_sent`` and the first unaccepted
    row continues from ``max(refreshedSeen, lastAcceptedSeq)``.
    """

    cmd: SendCommand
    rows: list[str]
    live: frozenset[str]
    index: int = 0
    accepted: list[dict[str, Any]] = field(default_factory=list)
    last_accepted_seq: int = 0
    any_sent: bool = False

    def reply(self, result: SendResult | OperationError) -> None:
        self.cmd.reply(result)

    def row_command(
        self, reply: Callable[[SendResult | OperationError], None], deadline: float
    ) -> SendCommand:
        cmd, i = self.cmd, self.index
        freshness = cmd.freshness
        if freshness is not None and self.last_accepted_seq > freshness.seen_up_to_seq:
            freshness = FreshnessIn(
                target_key=freshness.target_key,
                seen_up_to_seq=self.last_accepted_seq,
                source_message_ids=freshness.source_message_ids,
            )
        first = i == 0
        content = self.rows[i]
        return SendCommand(
            author=cmd.author,
            content=content,
            client_message_id=chunk_client_message_id(cmd.client_message_id, i),
            reply=reply,
            message_type=cmd.message_type,
            # Attachments, recipients and the forward shape ride on the first row.
            attachment_ids=cmd.attachment_ids if first else (),
            recipients=cmd.recipients if first else (),
            recipient_members=cmd.recipient_members if first else (),
            mention_mode=cmd.mention_mode,
            forward=cmd.forward if first else None,
            freshness=freshness,
            freshness_declared=cmd.freshness_declared,
            explain=cmd.explain,
            metadata={
                **cmd.metadata,
                "chunk": {
                    "index": i,
                    "count": len(self.rows),
                    "clientMessageId": cmd.client_message_id,
                },
            },
            live_mentions=live_handles(content, cmd.mention_mode) & self.live,
            deadline=deadline,
        )


Command = SendCommand | RosterCommand | ChunkedSend | ReactCommand | EditCommand | DeleteCommand
SendObserver = Callable[[str, bool], None]


def _unavailable(message: str) -> OperationError:
    return OperationError(ErrorCode.UNAVAILABLE, message)


_rng = random.Random()


class ScopeActor:
    def __init__(
        self,
        scope_id: str,
        store: ScopeStore,
        publisher: Publisher,
        *,
        mailbox_size: int = 1024,
        idle_timeout: float | None = 120.0,
        on_send: SendObserver | None = None,
        row_limit: int = ROW_LIMIT,
        send_deadline: float = SEND_DEADLINE,
        backoff: FenceBackoff | None = None,
        on_fence_lost: Callable[[], None] | None = None,
    ) -> None:
        self.scope_id = scope_id
        self.row_limit = row_limit
        self._send_deadline = send_deadline
        self._backoff = backoff or FenceBackoff()
        # Send batches decided again because the cache was behind the database.
        self.fence_losses = 0
        self._on_fence_lost = on_fence_lost or (lambda: None)
        # Rows of logical sends waiting for their next turn (behind the mailbox).
        self._continuations: deque[ChunkedSend] = deque()
        # Test seam: called just before a logical send's remainder is queued again.
        self.before_requeue: Callable[[ChunkedSend], None] | None = None
        self._store = store
        self._publisher = publisher
        self._send, self._receive = trio.open_memory_channel[Command](mailbox_size)
        self._idle_timeout = idle_timeout
        self._on_send = on_send or (lambda state, compat: None)
        self.accepting = True
        self.state: ScopeState | None = None
        self._clock: DbClock | None = None
        # Set when a grant change was written outside this actor on this node:
        # reload before the next send rather than spend a round trip on a fence
        # miss. Only a shortcut; the generation fence is what guarantees it.
        self.stale = False
        self.commits = 0
        self._processing = 0
        # Batches taken so far (and at the last idle look), and whether the
        # actor waits for a command now: what passivate_if_unused reads.
        self._batches = 0
        self._seen_batches = -1
        self._waiting = False
        # When the last batch was taken (trio's clock): the registry passivates
        # the least recently used actors first when the node is over its
        # memory ceiling.
        self.last_batch_at = 0.0
        # What the cached roster says about each reactor, for the state and
        # roster generation it was read from (see _reactor).
        self._reactors: dict[str, _Reactor] = {}
        self._reactors_of: tuple[int, int] = (0, -1)

    # ------------------------------------------------------------ outside API

    def submit_nowait(self, cmd: Command) -> None:
        """Queue a command; raises ``overloaded``/``unavailable`` instead of waiting."""
        if not self.accepting:
            raise _unavailable("scope actor is stopping; retry")
        if isinstance(cmd, SendCommand) and cmd.deadline is None:
            cmd.deadline = trio.current_time() + self._send_deadline
        try:
            self._send.send_nowait(cmd)
        except trio.WouldBlock:
            raise OperationError(ErrorCode.OVERLOADED, "scope mailbox is full; retry") from None

    def statistics(self) -> dict[str, int]:
        return {
            "queued": self._receive.statistics().current_buffer_used
            + self._processing
            + len(self._continuations),
            "latest_seq": self.state.latest_seq if self.state else -1,
            "commits": self.commits,
        }

    # ------------------------------------------------------------ the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, report started, serve until idle or broken, then fail what is queued."""
        with structlog.contextvars.bound_contextvars(scope_id=self.scope_id):
            try:
                self._adopt(await self._store.load_scope(self.scope_id))
                task_status.started()
                if self._idle_timeout is None:
                    await self._serve()  # whoever runs it passivates it
                else:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._passivate_when_idle, self._idle_timeout)
                        await self._serve()
                        nursery.cancel_scope.cancel()
            finally:
                self.accepting = False
                self._fail_queued()

    async def _passivate_when_idle(self, period: float) -> None:
        """Close the mailbox once a whole idle period passed without a batch.

        One timer per period instead of a deadline registered and removed at
        every wait for a command (about 11 µs each, next to 13 µs for a whole
        hand-over to a waiting task and back). The actor stops between one
        and two periods after its last command.
        """
        while True:
            await trio.sleep(period)
            if self.passivate_if_unused():
                return

    def passivate_if_unused(self) -> bool:
        """One look per idle period (the actor's own timer, or the registry's
        one sweep over all its actors): stop when no batch was taken since
        the previous look and nothing waits."""
        seen, self._seen_batches = self._seen_batches, self._batches
        return self._batches == seen and self.passivate_if_idle()

    def passivate_if_idle(self) -> bool:
        """Stop now if nothing is queued or being processed (the memory
        ceiling's passivation); the next command starts a fresh actor."""
        if not (self.accepting and self._waiting and not self._receive_pending()):
            return False
        # No await between the check and the close: nothing can be queued in
        # between, and later commands find it not accepting.
        self.accepting = False
        self._send.close()
        return True

    def _receive_pending(self) -> int:
        return self._receive.statistics().current_buffer_used

    async def _serve(self) -> None:
        while True:
            batch: list[Command] = []
            if not self._continuations:
                self._waiting = True
                try:
                    first = await self._receive.receive()
                except trio.EndOfChannel:
                    return  # idle: passivated
                finally:
                    self._waiting = False
                batch.append(first)
            self._batches += 1
            self.last_batch_at = trio.current_time()
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            # Remainders of logical sends go after everything queued before them.
            batch.extend(self._continuations)
            self._continuations.clear()
            self._processing = len(batch)
            try:
                if not await self._process(batch):
                    return
            finally:
                self._processing = 0

    def _fail_queued(self) -> None:
        while self._continuations:
            self._continuations.popleft().reply(_unavailable("scope actor stopped; retry"))
        while True:
            try:
                cmd = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            cmd.reply(_unavailable("scope actor stopped; retry"))

    async def _process(self, batch: list[Command]) -> bool:
        """Run a batch; False when the actor must stop and reload.

        Reactions run after the batch's sends and roster changes, in their own
        order: they never split a send group (no send-path slowdown), and a
        reaction cannot depend on a send of the same batch (its message was
        committed before the reactor learnt its id).
        """
        reacts = [cmd for cmd in batch if isinstance(cmd, ReactCommand)]
        if reacts:
            batch = [cmd for cmd in batch if not isinstance(cmd, ReactCommand)]
        if not await self._process_ordered(batch):
            for cmd in reacts:
                cmd.reply(_unavailable("scope actor is reloading; retry"))
            return False
        return not reacts or await self._process_reacts(reacts)

    async def _process_ordered(self, batch: list[Command]) -> bool:
        """Run sends and roster changes in arrival order."""
        group: list[SendCommand] = []
        for cmd in batch:
            if isinstance(cmd, SendCommand) and len(cmd.content) > self.row_limit:
                cmd = ChunkedSend(
                    cmd,
                    split_content(cmd.content, self.row_limit),
                    live_handles(cmd.content, cmd.mention_mode),
                )
            if isinstance(cmd, ChunkedSend):
                group.append(self._row_of(cmd))
                continue
            if isinstance(cmd, SendCommand):
                group.append(cmd)
                continue
            if group and not await self._process_sends(group):
                return False
            group = []
            if isinstance(cmd, EditCommand | DeleteCommand):
                # After the sends queued before it: an edit may name one of them.
                if not await self._process_mutation(cmd):
                    return False
                continue
            assert isinstance(cmd, RosterCommand)
            if not await self._process_roster(cmd):
                return False
        return not group or await self._process_sends(group)

    # ------------------------------------------------------------ logical sends

    def _row_of(self, job: ChunkedSend) -> SendCommand:
        # Each row is a send of its own to the fence: its deadline starts at its turn.
        deadline = trio.current_time() + self._send_deadline
        return job.row_command(lambda result: self._row_done(job, result), deadline)

    def _row_done(self, job: ChunkedSend, result: SendResult | OperationError) -> None:
        """One row of a logical send was answered: continue, or answer the client."""
        cmd = job.cmd
        if isinstance(result, OperationError):
            job.reply(result)
            return
        if result.state == "held":
            if not job.accepted:
                result.client_message_id = cmd.client_message_id
                job.reply(result)
                return
            self._on_send("partial_held", False)
            job.reply(
                SendResult(
                    state="partial_held",
                    target_key=result.target_key,
                    client_message_id=cmd.client_message_id,
                    accepted=[
                        {"messageId": a["messageId"], "acceptedSeq": a["acceptedSeq"]}
                        for a in job.accepted
                    ],
                    held_chunk=job.index,
                    seen_up_to_seq=result.seen_up_to_seq,
                    latest_seq=result.latest_seq,
                    needs_refresh_until_seq=result.needs_refresh_until_seq,
                )
            )
            return
        assert result.message_id is not None
        assert result.accepted_seq is not None
        job.accepted.append(
            {
                "messageId": result.message_id,
                "acceptedSeq": result.accepted_seq,
                "state": result.state,
            }
        )
        job.any_sent = job.any_sent or result.state == "sent"
        job.last_accepted_seq = max(job.last_accepted_seq, result.accepted_seq)
        job.index += 1
        if job.index < len(job.rows):
            if self.before_requeue is not None:
                self.before_requeue(job)
            self._continuations.append(job)
            return
        job.reply(
            SendResult(
                state="sent" if job.any_sent else "already_sent",
                target_key=result.target_key,
                client_message_id=cmd.client_message_id,
                message_id=result.message_id,
                accepted_seq=result.accepted_seq,
                latest_seq=result.latest_seq,
                chunks=job.accepted,
                explain=result.explain,
            )
        )

    # ------------------------------------------------------------ sends

    async def _process_sends(self, cmds: list[SendCommand]) -> bool:
        """Commit ``cmds``, deciding them again after every fence loss; False
        when the actor must stop (the database failed).

        A loss means another writer (another node's actor) moved the scope:
        the actor reloads and decides again on the database's history, so a
        freshness gate that fails now answers ``held`` exactly as on one node.
        Losses in a row back off, and from the second one on the attempt holds
        the scope's lock (:mod:`actors.fence_backoff`). A send whose deadline
        comes first is answered ``unavailable`` and nothing of it is stored:
        its plan is dropped with the cache it was decided on.
        """
        losses = 0
        # Idempotency hits the commits found: kept across reloads, as the
        # record may be older than a snapshot's window.
        races: list[IdempotencyRace] = []
        while True:
            try:
                if self._backoff.locks(losses):
                    return await self._try_sends_locked(cmds, races)
                return await self._try_sends(cmds, reloaded=losses > 0)
            except (FenceLost, IdempotencyRace) as exc:
                if isinstance(exc, IdempotencyRace):
                    races.append(exc)
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("scope_commit_failed", error=repr(exc))
                for cmd in cmds:
                    cmd.reply(_unavailable("the message was not stored; retry"))
                return False
            losses += 1
            self.fence_losses += 1
            self._on_fence_lost()
            wait = self._backoff.wait(losses, _rng)
            log.info("scope_fence_retry", losses=losses, wait=round(wait, 4), races=len(races))
            cmds = self._within_deadline(cmds, trio.current_time() + wait)
            if cmds and wait:
                await trio.sleep(wait)
            if cmds and self._backoff.locks(losses):
                continue  # that attempt loads the scope under the lock
            if not await self._reload():
                for cmd in cmds:
                    cmd.reply(_unavailable("scope state could not be loaded; retry"))
                return False
            self._remember(races)
            if not cmds:
                return True

    def _within_deadline(self, cmds: list[SendCommand], retry_at: float) -> list[SendCommand]:
        """The sends that may still be retried at ``retry_at``; the others are
        answered ``unavailable``."""
        kept = []
        for cmd in cmds:
            if cmd.deadline is None:
                cmd.deadline = trio.current_time() + self._send_deadline
            if retry_at < cmd.deadline:
                kept.append(cmd)
            else:
                cmd.reply(_unavailable("could not commit after concurrent writers; retry"))
        return kept

    def _remember(self, races: list[IdempotencyRace]) -> None:
        assert self.state is not None
        for race in races:
            self.state.remember(race.author_id, race.client_message_id, race.record)

    def _adopt(self, snapshot: ScopeSnapshot) -> None:
        self.state = ScopeState(snapshot)
        # A store without a database clock (a test double) falls back to the
        # node's; PgScopeStore always reads the database's.
        db_now = snapshot.db_now or datetime.now(UTC)
        self._clock = DbClock(db_now, trio.current_time())

    def now(self) -> datetime:
        """The timestamp the next message gets: database time (``actors/clock.py``)."""
        assert self._clock is not None
        assert self.state is not None
        return self._clock.now(trio.current_time(), self.state.time_floor)

    async def _reload(self) -> bool:
        # Cleared before loading: a change marked while the load runs may not be
        # in the snapshot, and then the fence catches it.
        self.stale = False
        try:
            self._adopt(await self._store.load_scope(self.scope_id))
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            log.warning("scope_reload_failed", error=repr(exc))
            return False
        return True

    async def _try_sends(self, cmds: list[SendCommand], *, reloaded: bool) -> bool:
        if self.stale and not reloaded:
            raise FenceLost(self.scope_id)
        state = self.state
        assert state is not None
        outcomes = await self._decide_sends(state, cmds, self._lookup, reloaded=reloaded)
        committed = await self._apply(outcomes, self._store.apply_sends)
        self._answer_sends(state, cmds, outcomes, committed)
        return True

    async def _try_sends_locked(
        self, cmds: list[SendCommand], races: list[IdempotencyRace]
    ) -> bool:
        """One attempt inside ``ScopeStore.locked``: loaded, decided and
        written while no other writer can move the scope, so the winner of
        the race waits for this one instead of committing ahead of it again."""
        self.stale = False
        async with self._store.locked(self.scope_id) as scope:
            self._adopt(await scope.load_scope())
            self._remember(races)
            state = self.state
            assert state is not None
            outcomes = await self._decide_sends(state, cmds, scope.find_idempotent, reloaded=True)
            committed = await self._apply(outcomes, scope.apply_sends)
        # The block's end committed: only now may the sends be answered.
        self._answer_sends(state, cmds, outcomes, committed)
        return True

    async def _lookup(self, author_id: str, client_message_id: str) -> IdempotencyRecord | None:
        return await self._store.find_idempotent(self.scope_id, author_id, client_message_id)

    async def _decide_sends(
        self, state: ScopeState, cmds: list[SendCommand], lookup: Lookup, *, reloaded: bool
    ) -> list[SendResult | OperationError | Append]:
        now = self.now()
        outcomes: list[SendResult | OperationError | Append] = []
        for cmd in cmds:
            try:
                decision = state.decide(cmd, now, reloaded=reloaded)
                if isinstance(decision, NeedsReload):
                    raise FenceLost(self.scope_id)
                if isinstance(decision, NeedsLookup):
                    record = await lookup(cmd.author.id, cmd.client_message_id)
                    if record is not None:
                        state.remember(cmd.author.id, cmd.client_message_id, record)
                    decision = state.decide(cmd, now, looked_up=True, reloaded=reloaded)
            except OperationError as exc:
                outcomes.append(exc)
                continue
            assert isinstance(decision, Immediate | Append)
            outcomes.append(decision.result if isinstance(decision, Immediate) else decision)
        return outcomes

    async def _apply(
        self,
        outcomes: list[SendResult | OperationError | Append],
        apply: Callable[[list[MessagePlan]], Awaitable[list[CommittedSend]]],
    ) -> list[CommittedSend]:
        plans = [o.plan for o in outcomes if isinstance(o, Append)]
        if not plans:
            return []
        committed = await apply(plans)
        self.commits += 1
        if committed[-1].db_now is not None and self._clock is not None:
            self._clock.anchor(committed[-1].db_now, trio.current_time())
        return committed

    def _answer_sends(
        self,
        state: ScopeState,
        cmds: list[SendCommand],
        outcomes: list[SendResult | OperationError | Append],
        committed: list[CommittedSend],
    ) -> None:
        """Reply to each send and publish what was committed."""
        published = []
        done = iter(committed)
        # Replies and events of one commit leave as one write per session.
        with self._publisher.batch():
            for cmd, outcome in zip(cmds, outcomes, strict=True):
                if isinstance(outcome, Append):
                    commit = next(done)
                    published.append((outcome.plan, commit))
                    result: SendResult | OperationError = state.sent_result(cmd, outcome.plan)
                    self._on_send("sent", outcome.compat)
                else:
                    result = outcome
                    if isinstance(outcome, SendResult):
                        self._on_send(outcome.state, False)
                cmd.reply(result)
            if published:
                self._publisher.publish_messages(self.scope_id, published)
                activity = state.thread_activity(published)
                if activity is not None:
                    self._publisher.publish_thread(activity)
        if published:
            self._after_commit(state, published)

    def _after_commit(self, state: ScopeState, published: list[tuple[Any, CommittedSend]]) -> None:
        """The plan's Explain at debug level, and roster events for thread memberships."""
        for plan, commit in published:
            log.debug(
                "send_explain",
                scope_id=self.scope_id,
                message_id=commit.message_id,
                seq=commit.seq,
                readers=len(plan.readers),
                wakes=len(plan.wakes),
                memberships=len(plan.memberships),
                explain=plan.explain,
            )
            for mutation in plan.memberships:
                op = "joined" if mutation.read_through_message else "invited"
                self._publish_roster(state, mutation.member.id, op, mutation.visibility)

    # ------------------------------------------------------------ edits and deletes

    async def _process_mutation(self, cmd: MutationCommand) -> bool:
        """Policy, Planner, Applier, then publish; False when the actor must stop."""
        for attempt in range(COMMIT_ATTEMPTS):
            if self.stale and not await self._reload():
                cmd.reply(_unavailable("scope state could not be loaded; retry"))
                return False
            state = self.state
            assert state is not None
            try:
                result = await self._mutate(state, cmd)
            except FenceLost:
                log.info("scope_mutation_fence_retry")
                if not await self._reload():
                    cmd.reply(_unavailable("scope state could not be loaded; retry"))
                    return False
                continue
            except OperationError as exc:
                if exc.code is ErrorCode.FORBIDDEN and attempt == 0 and not self.stale:
                    # The cache may be behind a join on another node: a refusal
                    # is decided on the database's roster.
                    if not await self._fresh_for_roster(state):
                        cmd.reply(_unavailable("scope state could not be loaded; retry"))
                        return False
                    if self.state is not state:
                        continue
                cmd.reply(exc)
                return True
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("scope_mutation_failed", error=repr(exc))
                cmd.reply(_unavailable("the change was not stored; retry"))
                return False
            cmd.reply(result)
            return True
        cmd.reply(_unavailable("could not commit after concurrent writers; retry"))
        return False

    async def _mutate(self, state: ScopeState, cmd: MutationCommand) -> dict[str, object]:
        target = await self._store.mutation_target(self.scope_id, cmd.message_id)
        if target is None:
            raise OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId")
        stored = target.message
        if isinstance(cmd, DeleteCommand):
            author_id, owner_id = stored.author.id, target.channel_owner_id
            _require(can_delete(state.visibility, cmd.actor, author_id, owner_id), "delete")
            if stored.deleted_at is not None:
                return {}  # idempotent: the tombstone is already there
            plan = plan_delete(stored, cmd.actor, state.scope_context(), self.now())
        else:
            decision = can_edit(state.visibility, cmd.actor, stored.author.id, stored.message_type)
            _require(decision, "edit")
            same = _unchanged(target, cmd)
            if same is not None:
                return same
            if cmd.revision is not None and cmd.revision != stored.revision:
                raise _conflict(stored.revision, deleted=False)
            plan = plan_edit(stored, cmd.actor, cmd.content, state.scope_context(), self.now())
        outcome = await self._store.apply_mutation(plan)
        if isinstance(outcome, MutationConflict):
            raise _conflict(outcome.revision, deleted=outcome.deleted)
        # The database's time of the write is what readers are shown.
        if plan.kind == "edit":
            plan = replace(
                plan, message=msgspec.structs.replace(plan.message, edited_at=outcome.at)
            )
            shown = summaries_by_reader(outcome.reactions, plan.readers, state.members)
            outcome = replace(outcome, reactions_shown=shown)
        else:
            plan = replace(
                plan, message=msgspec.structs.replace(plan.message, deleted_at=outcome.at)
            )
        with self._publisher.batch():
            self._publisher.publish_mutation(plan, outcome)
        log.debug(
            "mutation_explain",
            kind=plan.kind,
            message_id=stored.id,
            readers=len(plan.readers),
            woken=sorted(outcome.woken),
        )
        return {} if plan.kind == "delete" else _edit_result(plan)

    # ------------------------------------------------------------ roster

    async def _fresh_for_roster(self, current: ScopeState) -> bool:
        """Reload unless the cached roster is the database's; False if loading failed."""
        if not self.stale and current.thread is None:
            try:
                generation = await self._store.roster_generation(self.scope_id)
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("scope_generation_read_failed", error=repr(exc))
                return False
            if generation == current.roster_generation:
                return True
        return await self._reload()

    async def _process_roster(self, cmd: RosterCommand) -> bool:
        current = self.state
        assert current is not None
        # A thread's roster also changes outside its actor (the parent's roster,
        # and a leave of the parent ends thread memberships), and any scope's
        # roster changes on other nodes: decide on a fresh snapshot whenever
        # the cache may be behind. Roster requests are rare; one read checks.
        if not await self._fresh_for_roster(current):
            cmd.reply(_unavailable("scope state could not be loaded; retry"))
            return False
        state = self.state
        assert state is not None
        try:
            result = await self._apply_roster(state, cmd)
        except OperationError as exc:
            cmd.reply(exc)
            return True
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            log.warning("scope_roster_failed", op=cmd.op, error=repr(exc))
            cmd.reply(_unavailable("membership change was not stored; retry"))
            return False
        cmd.reply(result)
        return True

    async def _apply_roster(self, state: ScopeState, cmd: RosterCommand) -> dict[str, object]:
        member = cmd.member
        decision = _roster_decision(state, cmd)
        if decision is not None and not decision:
            raise OperationError(
                ErrorCode.FORBIDDEN,
                f"{cmd.op} is not allowed here ({decision.reason.replace('_', ' ')})",
                details={"reason": decision.reason},
            )
        if cmd.op in ("join", "invite"):
            if state.is_current_member(member.id):
                return {}
            owner = member.owner_member_id if cmd.visibility == "private" else None
            change = await self._store.join(
                self.scope_id,
                member,
                visibility=cmd.visibility,
                owner_member_id=owner,
                state=NotificationState.ACTIVE,
            )
            assert change.membership is not None
            state.apply_membership(member, change.membership)
            state.roster_changed(change.generation)
            op = "joined" if cmd.op == "join" else "invited"
            self._publish_roster(state, member.id, op, cmd.visibility)
            return {}
        if cmd.op in ("leave", "remove"):
            # Removing is leaving on someone else's word: the same interval end,
            # the same thread memberships ended with it, the same event.
            if not state.is_current_member(member.id):
                return {}
            visibility = next(m.visibility for m in state.intervals[member.id] if m.is_current)
            audience = self._roster_audience(state, member.id, visibility)
            closed = await self._store.leave(self.scope_id, member.id)
            if closed.membership is not None:
                state.apply_membership(member, closed.membership)
            state.roster_changed(closed.generation)
            self._publisher.publish_membership(
                self.scope_id, member.id, "left", visibility, audience
            )
            return {}
        if cmd.op == "setNotification":
            if not state.is_current_member(member.id):
                raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
            generation = await self._store.set_notification(self.scope_id, member.id, cmd.state)
            state.notification[member.id] = cmd.state
            state.roster_changed(generation)
            return {"state": cmd.state.value}
        raise OperationError(ErrorCode.VALIDATION_FAILED, f"unknown roster op {cmd.op}")

    # ------------------------------------------------------------ reactions

    async def _process_reacts(self, cmds: list[ReactCommand]) -> bool:
        """Decide on the cached roster, write in fenced group statements, then push.

        Each statement checks the scope's ``roster_generation`` is still the
        cache's (the viewer parameters come from it) and the SQL readable
        predicate on each message; a generation miss reloads and tries the
        rest again. The queued reactions go in as few statements as keep each
        message to one row per statement, in arrival order, so every answer
        is the one a statement per reaction would give. False only when the
        scope could not be loaded.
        """
        pending = cmds
        for attempt in range(COMMIT_ATTEMPTS):
            if self.stale and not await self._reload():
                return _fail_reacts(pending, "scope state could not be loaded; retry")
            state = self.state
            assert state is not None
            if attempt == 0 and any(not can_react(state.visibility, c.reactor) for c in pending):
                # The cache may be behind a join on another node: a refusal is
                # decided on the database's roster.
                if not await self._fresh_for_roster(state):
                    return _fail_reacts(pending, "scope state could not be loaded; retry")
                state = self.state
                assert state is not None
            allowed: list[ReactCommand] = []
            for cmd in pending:
                decision = can_react(state.visibility, cmd.reactor)
                if decision:
                    allowed.append(cmd)
                else:
                    cmd.reply(_react_forbidden(decision.reason))
            pending = []
            groups = _one_per_message(allowed)
            for index, group in enumerate(groups):
                outcomes = await self._write_reacts(state, group)
                if outcomes is None:
                    continue
                if not outcomes[0].fenced:
                    # One fence for the scope: this group and the later ones retry.
                    pending = [cmd for rest in groups[index:] for cmd in rest]
                    break
                with self._publisher.batch():
                    for cmd, outcome in zip(group, outcomes, strict=True):
                        self._answer_react(state, cmd, outcome)
            if not pending:
                return True
            if not await self._reload():
                return _fail_reacts(pending, "scope state could not be loaded; retry")
        for cmd in pending:
            cmd.reply(_unavailable("could not react after concurrent roster changes; retry"))
        return True

    async def _write_reacts(
        self, state: ScopeState, group: list[ReactCommand]
    ) -> list[ReactionOutcome] | None:
        """One statement for ``group``; None (each told to retry) when it failed."""
        writes = [
            ReactionWrite(
                op=cmd.op,
                reactor=cmd.reactor,
                message_id=cmd.message_id,
                emoji=cmd.emoji,
                public_reader=self._reactor(state, cmd.reactor).public_reader,
                wake=self._reactor(state, cmd.reactor).wake,
            )
            for cmd in group
        ]
        try:
            return await self._store.react_many(
                self.scope_id,
                state.roster_generation,
                writes,
                grant_scopes=_grant_scopes(state),
                in_thread=state.thread is not None,
            )
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            log.warning("scope_reaction_failed", count=len(group), error=repr(exc))
            for cmd in group:
                cmd.reply(_unavailable("the reaction was not stored; retry"))
            return None

    def _reactor(self, state: ScopeState, reactor: Member) -> _Reactor:
        """What the roster says about ``reactor``, computed once per roster.

        Kept for the state object and roster generation it was read from: a
        roster change this actor applies bumps the generation or replaces the
        state (a reload), and one it could not adopt makes the next
        statement miss the fence and reload before anything is published.
        """
        key = (id(state), state.roster_generation)
        if key != self._reactors_of:
            self._reactors, self._reactors_of = {}, key
        known = self._reactors.get(reactor.id)
        if known is None:
            known = self._reactors[reactor.id] = _reactor_view(state, reactor)
        return known

    def _answer_react(self, state: ScopeState, cmd: ReactCommand, outcome: ReactionOutcome) -> None:
        if not outcome.found:
            cmd.reply(OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId"))
        elif not outcome.readable:
            cmd.reply(_react_forbidden("message_not_readable"))
        elif not outcome.room:
            cmd.reply(
                OperationError(
                    ErrorCode.VALIDATION_FAILED,
                    "a message carries at most 20 distinct reactions",
                    path="$.emoji",
                    details={"reason": "too_many_distinct_emoji"},
                )
            )
        else:
            cmd.reply({"changed": outcome.changed})
            if outcome.changed:
                self._publisher.publish_reaction(self._reaction_activity(state, cmd, outcome))

    def _reaction_activity(
        self, state: ScopeState, cmd: ReactCommand, outcome: ReactionOutcome
    ) -> ReactionActivity:
        """Who hears of the change: the message's readers shown this reactor's
        reactions; the author too when the reaction wakes it."""
        assert outcome.author_id is not None
        assert outcome.seq is not None
        assert outcome.created_at is not None
        reactor = cmd.reactor
        known = self._reactor(state, reactor)
        shown = known.audience
        if known.per_message:
            shown |= readers(
                state.visibility,
                known.per_message,
                outcome.author_id,
                outcome.seq,
                outcome.created_at,
            )
        author = state.members.get(outcome.author_id)
        woken = (
            frozenset({outcome.author_id})
            if cmd.op == "add"
            and outcome.author_id in shown
            and reaction_wakes(state.notification.get(outcome.author_id), author, reactor)
            else frozenset()
        )
        return ReactionActivity(
            scope_id=self.scope_id,
            message_id=cmd.message_id,
            member_id=reactor.id,
            emoji=cmd.emoji,
            op=cmd.op,
            audience=shown,
            wakes=woken,
        )

    def _publish_roster(self, state: ScopeState, member_id: str, op: str, visibility: str) -> None:
        audience = self._roster_audience(state, member_id, visibility)
        self._publisher.publish_membership(self.scope_id, member_id, op, visibility, audience)

    @staticmethod
    def _roster_audience(state: ScopeState, member_id: str, visibility: str) -> frozenset[str]:
        """Who hears of a roster change: the scope's readers (taken before a leave,
        so the one leaving hears it too)."""
        audience = state.current_readers() | state.parent_readers | {member_id}
        if visibility == "private":
            # Private members are shown only to viewers allowed to see them
            # (docs/design.md#private-agents):
            # the member itself and its owner.
            member = state.members[member_id]
            audience = audience & {member_id, member.owner_member_id or ""}
        return audience


def _require(decision: Decision, op: str) -> None:
    if not decision:
        raise OperationError(
            ErrorCode.FORBIDDEN,
            f"{op} is not allowed here ({decision.reason.replace('_', ' ')})",
            details={"reason": decision.reason},
        )


def _conflict(revision: int, *, deleted: bool) -> OperationError:
    if deleted:
        return OperationError(
            ErrorCode.CONFLICT,
            "the message was deleted",
            details={"revision": revision, "deleted": True},
        )
    return OperationError(
        ErrorCode.CONFLICT,
        "the message was edited since that revision; read it again",
        path="$.revision",
        details={"revision": revision},
    )


def _unchanged(target: MutationTarget, cmd: EditCommand) -> dict[str, object] | None:
    """The answer to an edit that changes nothing, or None.

    The content already stored writes nothing, so a retried edit whose reply
    was lost succeeds instead of reading as a conflict; a tombstone is never
    edited.
    """
    stored = target.message
    if stored.deleted_at is not None:
        raise _conflict(stored.revision, deleted=True)
    if stored.content != cmd.content:
        return None
    edited = stored.edited_at
    return {"messageId": stored.id, "revision": stored.revision, "editedAt": _rfc3339(edited)}


def _rfc3339(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _edit_result(plan: MutationPlan) -> dict[str, object]:
    message = plan.message
    return {
        "messageId": message.id,
        "revision": message.revision,
        "editedAt": _rfc3339(message.edited_at),
    }


def _roster_decision(state: ScopeState, cmd: RosterCommand) -> Decision | None:
    """Policy's word on a roster request (None: the op needs no authority check)."""
    if cmd.op == "join":
        return can_join(state.scope, cmd.member)
    if cmd.op == "leave":
        return can_leave(state.scope)
    if cmd.op == "invite":
        return can_invite(state.scope, state.visibility, cmd.actor, cmd.member, cmd.visibility)
    if cmd.op == "remove":
        return can_remove(state.scope, state.visibility, cmd.actor, cmd.member)
    return None


def _react_forbidden(reason: str) -> OperationError:
    return OperationError(
        ErrorCode.FORBIDDEN,
        "you cannot react to this message",
        details={"reason": reason},
    )


def _one_per_message(cmds: list[ReactCommand]) -> list[list[ReactCommand]]:
    """Consecutive runs of ``cmds`` naming each message at most once."""
    groups: list[list[ReactCommand]] = []
    seen: set[str] = set()
    for cmd in cmds:
        if not groups or cmd.message_id in seen:
            groups.append([])
            seen = set()
        groups[-1].append(cmd)
        seen.add(cmd.message_id)
    return groups


def _fail_reacts(cmds: list[ReactCommand], message: str) -> bool:
    for cmd in cmds:
        cmd.reply(_unavailable(message))
    return False


def _public_reader(state: ScopeState, member: Member) -> bool:
    """The reactor holds a current public membership (the SQL predicate's ``viewer_public``)."""
    return not member.is_private_agent and any(
        m.is_current and not m.is_private for m in state.intervals.get(member.id, ())
    )


def _grant_scopes(state: ScopeState) -> tuple[str, ...]:
    parent = state.thread.parent_scope_id if state.thread is not None else None
    return (state.scope.id, parent) if parent else (state.scope.id,)


def _wake_candidates(state: ScopeState, reactor: Member) -> frozenset[str]:
    """Agents a reaction by ``reactor`` would wake were it on their own message."""
    return frozenset(
        member_id
        for member_id, setting in state.notification.items()
        if setting is NotificationState.AUTO_WAKE
        and reaction_wakes(setting, state.members.get(member_id), reactor)
    )


@dataclass(frozen=True, slots=True)
class _Reactor:
    """A reactor as the cached roster sees it, whatever the message."""

    public_reader: bool
    wake: frozenset[str]
    # Readers shown its reactions on every message: humans and public agents
    # read every message of a scope they read (actors/visibility.py).
    audience: frozenset[str]
    # Private agents shown its reactions that read message by message.
    per_message: tuple[str, ...]


def _reactor_view(state: ScopeState, reactor: Member) -> _Reactor:
    candidates = state.current_readers() | state.parent_readers | {reactor.id}
    shown = [
        member
        for member_id in candidates
        if (member := state.members.get(member_id)) is not None and sees_reaction(member, reactor)
    ]
    public = [m.id for m in shown if not m.is_private_agent]
    # Any message will do for them: their readability does not depend on it.
    anything = datetime.fromtimestamp(0, UTC)
    return _Reactor(
        public_reader=_public_reader(state, reactor),
        wake=_wake_candidates(state, reactor),
        audience=readers(state.visibility, public, "", 0, anything),
        per_message=tuple(m.id for m in shown if m.is_private_agent),
    )
