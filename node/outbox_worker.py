"""The outbox worker: retries and replays what the inline path did not finish.

It leases due rows (skipping rows other workers hold), re-checks suppression before
every push, pushes to the sessions on this node, and reschedules with
exponential backoff and jitter up to the row's ``max_attempts``. Delivered
and dead rows are pruned after the retention period.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import structlog
import trio

from actors.model import Member, StoredMessage
from node.hub import Hub, LiveSession, wake_frame
from node.views import stored_message_view, task_wake
from protocol.codec import encode
from protocol.frames import MessageDeletedEvent, MessageEvent, MessageUpdatedEvent, MessageView
from protocol.wsframes import frame
from storage import access, cards, messages, outbox, reactions, scopes, tasks
from storage.outbox import LeasedRow
from storage.pg import TrioConnection
from storage.pool import Pool

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    poll_interval: float = 1.0
    batch: int = 100
    lease: timedelta = timedelta(seconds=30)
    backoff_base: float = 2.0
    backoff_cap: float = 300.0
    no_daemon_recheck: timedelta = timedelta(seconds=60)
    retention: timedelta = timedelta(days=7)
    prune_every: float = 30.0


def backoff(attempts: int, settings: WorkerSettings, rng: random.Random) -> timedelta:
    """Exponential in the attempts made, capped, with up to 25 % jitter."""
    delay = min(settings.backoff_cap, settings.backoff_base * 2 ** max(attempts - 1, 0))
    return timedelta(seconds=delay * (1 + rng.random() / 4))


class OutboxWorker:
    def __init__(
        self,
        pool: Pool,
        hub: Hub,
        owner: str,
        settings: WorkerSettings,
        on_counts: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        self._on_counts = on_counts or (lambda counts: None)
        self._pool = pool
        self._hub = hub
        self._owner = owner
        self._settings = settings
        self._rng = random.Random()
        self.pushed = 0

    async def run(self) -> None:
        next_prune = trio.current_time()
        while True:
            try:
                handled = await self.run_once()
                if trio.current_time() >= next_prune:
                    async with self._pool.connection() as conn:
                        await outbox.prune(conn, self._settings.retention)
                        self._on_counts(await outbox.status_counts(conn))
                    next_prune = trio.current_time() + self._settings.prune_every
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("outbox_worker_failed", error=repr(exc))
                handled = 0
            if handled < self._settings.batch:
                await trio.sleep(self._settings.poll_interval)

    async def run_once(self) -> int:
        """Lease and handle one batch of due rows; returns how many."""
        async with self._pool.connection() as conn:
            rows = await outbox.lease_due(
                conn, self._owner, limit=self._settings.batch, lease=self._settings.lease
            )
            for row in rows:
                await self._handle(conn, row)
        return len(rows)

    async def _handle(self, conn: TrioConnection, row: LeasedRow) -> None:
        if row.fanout_type == "agent_wake":
            await self._wake(conn, row)
        elif row.fanout_type == "realtime":
            await self._replay(conn, row)
        elif row.fanout_type == "mutation":
            await self._project(conn, row)
        else:
            await outbox.finish(conn, row, self._owner, "failed", "unknown fanout type")

    async def _wake(self, conn: TrioConnection, row: LeasedRow) -> None:
        assert row.target_member_id is not None
        if row.message_id is None:
            await self._task_wake(conn, row)
            return
        reason = await outbox.wake_suppression(conn, row.message_id, row.target_member_id)
        if reason is not None:
            await outbox.finish(conn, row, self._owner, "suppressed", reason)
            return
        daemons = await self._daemons(conn, row, row.target_member_id)
        if not daemons:
            return
        if row.attempts > row.max_attempts:
            await outbox.finish(conn, row, self._owner, "failed", outbox.NOT_ACKNOWLEDGED)
            return
        message = await messages.get_message(conn, row.message_id)
        if message is None:
            await outbox.finish(conn, row, self._owner, "suppressed", "message_gone")
            return
        view = stored_message_view(message, row.target_member_id)
        wake_id, wake = wake_frame(
            row.message_id, row.target_member_id, row.scope_id, message.seq, row.reason or "", view
        )
        await self._push(conn, row, daemons, wake_id, wake)

    async def _daemons(
        self, conn: TrioConnection, row: LeasedRow, member_id: str
    ) -> list[LiveSession]:
        """The member's daemon sessions; none connected is not a failed attempt
        (the row is looked at again later, and handed over on connect)."""
        daemons = [s for s in self._hub.sessions_of(member_id) if s.is_daemon]
        if not daemons:
            await outbox.reschedule(
                conn,
                row,
                self._owner,
                delay=self._settings.no_daemon_recheck,
                error=None,
                refund_attempt=True,
            )
        return daemons

    async def _push(
        self,
        conn: TrioConnection,
        row: LeasedRow,
        daemons: list[LiveSession],
        wake_id: str,
        wake: bytes,
    ) -> None:
        """Push a wake to the daemons; the row waits for the ack (again after a
        backoff) or, at its last attempt, fails."""
        if not await outbox.still_leased(conn, row, self._owner):
            return  # suppressed since it was leased (a rewind): no wake
        for session in daemons:
            session.push_wake(wake_id, wake)
        self.pushed += 1
        if row.attempts >= row.max_attempts:
            await outbox.finish(conn, row, self._owner, "failed", outbox.NOT_ACKNOWLEDGED)
            return
        await outbox.reschedule(
            conn,
            row,
            self._owner,
            delay=backoff(row.attempts, self._settings, self._rng),
            error=outbox.NOT_ACKNOWLEDGED,
        )

    async def _task_wake(self, conn: TrioConnection, row: LeasedRow) -> None:
        """``worker_first_targeted``: an agent's task assignment, to exactly that
        agent, unless it was unassigned since (docs/tasks.md)."""
        agent = row.target_member_id
        assert agent is not None
        found = None
        if (
            row.task_id is not None
            and row.event_ref_id is not None
            and await tasks.still_assigned(conn, row.task_id, agent)
        ):
            found = await tasks.assignment(conn, row.task_id, row.event_ref_id)
        if found is None:
            await outbox.finish(conn, row, self._owner, "suppressed", "unassigned")
            return
        daemons = await self._daemons(conn, row, agent)
        if not daemons:
            return
        wake_id, event = task_wake(row.event_ref_id or "", agent, found, row.reason or "")
        await self._push(conn, row, daemons, wake_id, frame(encode(event)))

    async def _replay(self, conn: TrioConnection, row: LeasedRow) -> None:
        """A realtime row never marked delivered: push to connected readers, no unread rebuild."""
        assert row.message_id is not None
        message = await messages.get_message(conn, row.message_id)
        info = await scopes.get_scope(conn, row.scope_id) if message is not None else None
        if not await outbox.still_leased(conn, row, self._owner):
            return  # suppressed since it was leased (a rewind): no push
        if message is not None and row.recipients is not None:
            self._replay_frozen(row, message, row.recipients)
        elif message is not None and info is not None:
            for listing in await scopes.current_members(conn, row.scope_id):
                sessions = self._hub.sessions_of(listing.member.id)
                if not sessions:
                    continue
                # The same read rights as history: parent grants and the thread rule.
                viewer = await access.viewer_for(conn, info, listing.member)
                if viewer is None:
                    continue
                page = await messages.page(
                    conn,
                    row.scope_id,
                    viewer,
                    after=message.seq - 1,
                    before=message.seq + 1,
                    limit=1,
                    ascending=True,
                )
                if page.messages:
                    view = stored_message_view(message, listing.member.id)
                    await _with_card(conn, view, message, listing.member)
                    payload = encode(MessageEvent(scope_id=row.scope_id, message=view))
                    for session in sessions:
                        session.deliver_events(row.scope_id, [(message.seq, frame(payload))])
                        self.pushed += 1
        await outbox.finish(conn, row, self._owner, "delivered")

    def _replay_frozen(
        self, row: LeasedRow, message: StoredMessage, recipients: list[list[str]]
    ) -> None:
        """``inline_targeted``: exactly the readers frozen when the send committed
        (docs/tasks.md), whoever joined or left since. The notification state
        frozen with each decides nothing here: like the inline push, a replay
        reaches every reader's sessions."""
        for member_id, _state in recipients:
            sessions = self._hub.sessions_of(member_id)
            if not sessions:
                continue
            view = stored_message_view(message, member_id)
            payload = encode(MessageEvent(scope_id=row.scope_id, message=view))
            for session in sessions:
                session.deliver_events(row.scope_id, [(message.seq, frame(payload))])
                self.pushed += 1

    async def _project(self, conn: TrioConnection, row: LeasedRow) -> None:
        """An edit or delete whose projection was never marked delivered (the node
        died between commit and push): send the message as it is now to its
        connected readers, once. A projection is idempotent, so a replay after a
        push that was made but not recorded is harmless; unread and wakes are
        not touched (docs/design.md#edits-and-deletes)."""
        assert row.message_id is not None
        message = await messages.get_message(conn, row.message_id)
        info = await scopes.get_scope(conn, row.scope_id) if message is not None else None
        if message is None or info is None:
            await outbox.finish(conn, row, self._owner, "suppressed", "message_gone")
            return
        deleted = message.deleted_at is not None
        if row.reason != "delete" and deleted:
            # The delete's own row tells readers; this edit is moot.
            await outbox.finish(conn, row, self._owner, "suppressed", "message_deleted")
            return
        if not await outbox.still_leased(conn, row, self._owner):
            return  # suppressed since it was leased (a rewind): no projection
        for listing in await scopes.current_members(conn, row.scope_id):
            sessions = self._hub.sessions_of(listing.member.id)
            if not sessions:
                continue
            viewer = await access.viewer_for(conn, info, listing.member)
            if viewer is None:
                continue
            if await messages.readable_message(conn, row.scope_id, message.id, viewer) is None:
                continue
            if deleted:
                payload = encode(
                    MessageDeletedEvent(
                        scope_id=row.scope_id, message_id=message.id, seq=message.seq
                    )
                )
            else:
                view = stored_message_view(message, listing.member.id)
                shown = await reactions.summaries(conn, [message.id], listing.member)
                view.reactions = [s.view() for s in shown.get(message.id, [])]
                await _with_card(conn, view, message, listing.member)
                payload = encode(MessageUpdatedEvent(scope_id=row.scope_id, message=view))
            for session in sessions:
                if not session.is_muted(row.scope_id):
                    session.push(payload)
                    self.pushed += 1
        await outbox.finish(conn, row, self._owner, "delivered")


async def _with_card(
    conn: TrioConnection, view: MessageView, message: StoredMessage, member: Member
) -> None:
    """A card message's ``card`` as ``member`` may see it now (docs/cards.md)."""
    card = (await cards.cards_for(conn, [message], member)).get(message.id)
    if card is not None:
        view.card = card
