"""The scope actor: one task, one bounded mailbox, a ScopeState inside.

The task takes what the mailbox holds as one batch (up to ``MAX_BATCH``
commands, then the remainders of logical sends) and runs it in arrival
order: runs of sends go to the send path as one group, an edit or a delete
and a roster change in between end the run. Reactions run after the rest of
the batch. Each path lives in its own module over the shared core
(``actors/scope_core.py``): sends in ``actors/scope_sends.py``, edits and
deletes in ``actors/scope_mutations.py``, reactions in
``actors/scope_reactions.py``, roster changes in ``actors/scope_roster.py``.
The actor passivates after an idle period and fails what is still queued
when it stops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import structlog
import trio

from actors.cards import CardCommand
from actors.fence_backoff import SEND_DEADLINE, FenceBackoff
from actors.mentions import live_handles
from actors.ports import Publisher, ScopeStore
from actors.scope_core import unavailable
from actors.scope_mutations import DeleteCommand, EditCommand, MutationPath
from actors.scope_reactions import ReactCommand, ReactionPath
from actors.scope_roster import RosterCommand, RosterPath
from actors.scope_sends import ChunkedSend, SendObserver, SendPath
from actors.scope_state import ROW_LIMIT, SendCommand, split_content
from protocol.errors import ErrorCode, OperationError

log = structlog.get_logger(__name__)

MAX_BATCH = 64

Command = (
    SendCommand
    | RosterCommand
    | ChunkedSend
    | ReactCommand
    | EditCommand
    | DeleteCommand
    | CardCommand
)


class ScopeActor(SendPath, MutationPath, ReactionPath, RosterPath):
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
        super().__init__(scope_id, store, publisher)
        # The send path's (actors/scope_sends.py).
        self.row_limit = row_limit
        self._send_deadline = send_deadline
        self._backoff = backoff or FenceBackoff()
        self.fence_losses = 0
        self._on_fence_lost = on_fence_lost or (lambda: None)
        self._continuations = deque()
        self.before_requeue = None
        self._on_send = on_send or (lambda state, compat: None)
        self.commits = 0
        # The reaction path's (actors/scope_reactions.py).
        self._reactors = {}
        self._reactors_of = (0, -1)
        # The mailbox's.
        self._send, self._receive = trio.open_memory_channel[Command](mailbox_size)
        self._idle_timeout = idle_timeout
        self.accepting = True
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

    # ------------------------------------------------------------ outside API

    def submit_nowait(self, cmd: Command) -> None:
        """Queue a command; raises ``overloaded``/``unavailable`` instead of waiting."""
        if not self.accepting:
            raise unavailable("scope actor is stopping; retry")
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
            self._continuations.popleft().reply(unavailable("scope actor stopped; retry"))
        while True:
            try:
                cmd = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            cmd.reply(unavailable("scope actor stopped; retry"))

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
                cmd.reply(unavailable("scope actor is reloading; retry"))
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
            if isinstance(cmd, EditCommand | DeleteCommand | CardCommand):
                # After the sends queued before it: an edit may name one of them.
                if not await self._process_mutation(cmd):
                    return False
                continue
            assert isinstance(cmd, RosterCommand)
            if not await self._process_roster(cmd):
                return False
        return not group or await self._process_sends(group)
