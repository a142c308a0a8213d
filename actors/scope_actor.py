"""The scope actor: one task, one bounded mailbox, a ScopeState inside.

Sends queued while a transaction is in flight are drained and committed
together in the next transaction (group commit); each is still decided in
order, and each is answered only after its transaction committed (R-13).
Replies and events leave through synchronous callbacks, so the sender's
``reply`` is queued before any ``message`` event of the same send.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
import trio

from actors.model import Member, NotificationState
from actors.ports import FenceLost, IdempotencyRace, Publisher, ScopeStore
from actors.scope_state import (
    Append,
    Immediate,
    NeedsLookup,
    NeedsReload,
    ScopeState,
    SendCommand,
)
from protocol.errors import ErrorCode, OperationError
from protocol.frames import SendResult

log = structlog.get_logger(__name__)

MAX_BATCH = 64
COMMIT_ATTEMPTS = 3

RosterReply = Callable[[dict[str, object] | OperationError], None]


@dataclass(slots=True)
class RosterCommand:
    """join / leave / invite / setNotification, serialised with the scope's sends."""

    op: str
    actor: Member
    member: Member
    reply: RosterReply
    visibility: str = "public"
    state: NotificationState = NotificationState.ACTIVE


Command = SendCommand | RosterCommand
SendObserver = Callable[[str, bool], None]


def _unavailable(message: str) -> OperationError:
    return OperationError(ErrorCode.UNAVAILABLE, message)


class ScopeActor:
    def __init__(
        self,
        scope_id: str,
        store: ScopeStore,
        publisher: Publisher,
        *,
        mailbox_size: int = 1024,
        idle_timeout: float = 120.0,
        on_send: SendObserver | None = None,
    ) -> None:
        self.scope_id = scope_id
        self._store = store
        self._publisher = publisher
        self._send, self._receive = trio.open_memory_channel[Command](mailbox_size)
        self._idle_timeout = idle_timeout
        self._on_send = on_send or (lambda state, compat: None)
        self.accepting = True
        self.state: ScopeState | None = None
        self.commits = 0

    # ------------------------------------------------------------ outside API

    def submit_nowait(self, cmd: Command) -> None:
        """Queue a command; raises ``overloaded``/``unavailable`` instead of waiting."""
        if not self.accepting:
            raise _unavailable("scope actor is stopping; retry")
        try:
            self._send.send_nowait(cmd)
        except trio.WouldBlock:
            raise OperationError(ErrorCode.OVERLOADED, "scope mailbox is full; retry") from None

    def statistics(self) -> dict[str, int]:
        return {
            "queued": self._receive.statistics().current_buffer_used,
            "latest_seq": self.state.latest_seq if self.state else -1,
            "commits": self.commits,
        }

    # ------------------------------------------------------------ the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, report started, serve until idle or broken, then fail what is queued."""
        with structlog.contextvars.bound_contextvars(scope_id=self.scope_id):
            try:
                self.state = ScopeState(await self._store.load_scope(self.scope_id))
                task_status.started()
                await self._serve()
            finally:
                self.accepting = False
                self._fail_queued()

    async def _serve(self) -> None:
        while True:
            first = None
            with trio.move_on_after(self._idle_timeout):
                first = await self._receive.receive()
            if first is None:
                if self._receive.statistics().current_buffer_used == 0:
                    return  # idle: passivate (no await between check and return)
                continue
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            if not await self._process(batch):
                return

    def _fail_queued(self) -> None:
        while True:
            try:
                cmd = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            cmd.reply(_unavailable("scope actor stopped; retry"))

    async def _process(self, batch: list[Command]) -> bool:
        """Run a batch in arrival order; False when the actor must stop and reload."""
        group: list[SendCommand] = []
        for cmd in batch:
            if isinstance(cmd, SendCommand):
                group.append(cmd)
                continue
            if group and not await self._process_sends(group):
                return False
            group = []
            if not await self._process_roster(cmd):
                return False
        return not group or await self._process_sends(group)

    # ------------------------------------------------------------ sends

    async def _process_sends(self, cmds: list[SendCommand]) -> bool:
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                return await self._try_sends(cmds, reloaded=attempt > 0)
            except (FenceLost, IdempotencyRace) as exc:
                log.info("scope_fence_retry", error=type(exc).__name__)
                if isinstance(exc, IdempotencyRace) and self.state is not None:
                    self.state.remember(exc.author_id, exc.client_message_id, exc.record)
                if not await self._reload():
                    break
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("scope_commit_failed", error=repr(exc))
                for cmd in cmds:
                    cmd.reply(_unavailable("the message was not stored; retry"))
                return False
        for cmd in cmds:
            cmd.reply(_unavailable("could not commit after concurrent writers; retry"))
        return False

    async def _reload(self) -> bool:
        try:
            self.state = ScopeState(await self._store.load_scope(self.scope_id))
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            log.warning("scope_reload_failed", error=repr(exc))
            return False
        return True

    async def _try_sends(self, cmds: list[SendCommand], *, reloaded: bool) -> bool:
        state = self.state
        assert state is not None
        now = datetime.now(UTC)
        outcomes: list[SendResult | OperationError | Append] = []
        for cmd in cmds:
            try:
                decision = state.decide(cmd, now, reloaded=reloaded)
                if isinstance(decision, NeedsReload):
                    raise FenceLost(self.scope_id)
                if isinstance(decision, NeedsLookup):
                    record = await self._store.find_idempotent(
                        self.scope_id, cmd.author.id, cmd.client_message_id
                    )
                    if record is not None:
                        state.remember(cmd.author.id, cmd.client_message_id, record)
                    decision = state.decide(cmd, now, looked_up=True, reloaded=reloaded)
            except OperationError as exc:
                outcomes.append(exc)
                continue
            assert isinstance(decision, Immediate | Append)
            outcomes.append(decision.result if isinstance(decision, Immediate) else decision)
        appends = [o for o in outcomes if isinstance(o, Append)]
        committed = await self._store.apply_sends([a.plan for a in appends]) if appends else []
        self.commits += 1 if appends else 0
        published = []
        done = iter(committed)
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
        return True

    # ------------------------------------------------------------ roster

    async def _process_roster(self, cmd: RosterCommand) -> bool:
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
        if cmd.op in ("join", "invite"):
            if state.is_current_member(member.id):
                return {}
            owner = member.owner_member_id if cmd.visibility == "private" else None
            membership = await self._store.join(
                self.scope_id,
                member,
                visibility=cmd.visibility,
                owner_member_id=owner,
                state=NotificationState.ACTIVE,
            )
            state.apply_membership(member, membership)
            op = "joined" if cmd.op == "join" else "invited"
            self._publish_roster(state, member.id, op, cmd.visibility)
            return {}
        if cmd.op == "leave":
            if not state.is_current_member(member.id):
                return {}
            visibility = next(m.visibility for m in state.intervals[member.id] if m.is_current)
            audience = state.current_readers()
            closed = await self._store.leave(self.scope_id, member.id)
            if closed is not None:
                state.apply_membership(member, closed)
            self._publisher.publish_membership(
                self.scope_id, member.id, "left", visibility, audience
            )
            return {}
        if cmd.op == "setNotification":
            if not state.is_current_member(member.id):
                raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
            await self._store.set_notification(self.scope_id, member.id, cmd.state)
            state.notification[member.id] = cmd.state
            return {"state": cmd.state.value}
        raise OperationError(ErrorCode.VALIDATION_FAILED, f"unknown roster op {cmd.op}")

    def _publish_roster(self, state: ScopeState, member_id: str, op: str, visibility: str) -> None:
        audience = state.current_readers()
        if visibility == "private":
            # Private members are shown only to viewers allowed to see them:
            # the member itself and its owner.
            member = state.members[member_id]
            audience = audience & {member_id, member.owner_member_id or ""}
        self._publisher.publish_membership(self.scope_id, member_id, op, visibility, audience)
