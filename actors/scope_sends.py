"""The scope actor's send path: deciding, committing and answering sends.

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

A commit that loses the send fence to another writer is decided again on a
reload, backing off and from the second loss on under the scope's lock
(:mod:`actors.fence_backoff`), until each send's deadline.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from actors.fence_backoff import FenceBackoff
from actors.mentions import live_handles
from actors.model import IdempotencyRecord
from actors.planner import MessagePlan
from actors.ports import CommittedSend, FenceLost, IdempotencyRace
from actors.scope_core import ScopeCore, unavailable
from actors.scope_state import (
    Append,
    Immediate,
    NeedsLookup,
    NeedsReload,
    ScopeState,
    SendCommand,
    chunk_client_message_id,
)
from protocol.errors import OperationError
from protocol.frames import FreshnessIn, SendResult

log = structlog.get_logger(__name__)

# (author id, clientMessageId) -> the stored send, if any.
Lookup = Callable[[str, str], Awaitable[IdempotencyRecord | None]]
# Told (state, compat) of every answered send: the node's send counters.
SendObserver = Callable[[str, bool], None]


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


_rng = random.Random()


class SendPath(ScopeCore):
    """Sends and logical sends; the fields are set by ``ScopeActor.__init__``."""

    row_limit: int
    _send_deadline: float
    _backoff: FenceBackoff
    # Send batches decided again because the cache was behind the database.
    fence_losses: int
    _on_fence_lost: Callable[[], None]
    # Rows of logical sends waiting for their next turn (behind the mailbox).
    _continuations: deque[ChunkedSend]
    # Test seam: called just before a logical send's remainder is queued again.
    before_requeue: Callable[[ChunkedSend], None] | None
    _on_send: SendObserver
    # Transactions committed.
    commits: int

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
                    cmd.reply(unavailable("the message was not stored; retry"))
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
                    cmd.reply(unavailable("scope state could not be loaded; retry"))
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
                cmd.reply(unavailable("could not commit after concurrent writers; retry"))
        return kept

    def _remember(self, races: list[IdempotencyRace]) -> None:
        assert self.state is not None
        for race in races:
            self.state.remember(race.author_id, race.client_message_id, race.record)

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
