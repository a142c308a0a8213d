"""Scope actors on this node: created on demand, passivated when idle."""

from __future__ import annotations

import math
from collections.abc import Callable

import structlog
import trio

from actors.cards import CardCommand
from actors.ports import Publisher, ScopeMissing, ScopeStore
from actors.scope_actor import Command, ScopeActor
from actors.scope_mutations import DeleteCommand, EditCommand
from actors.scope_roster import RosterCommand
from actors.scope_sends import SendObserver
from actors.scope_state import ROW_LIMIT, SendCommand, SendReply
from protocol.errors import ErrorCode, OperationError
from protocol.frames import SendResult

log = structlog.get_logger(__name__)


class _Started:
    """Passes ``started()`` on and remembers it (one class for every actor: a
    class defined per call cost each live actor a type object, ~2.6 KB).

    Once passed on, trio's status object is let go: it holds the nursery the
    actor started in, with that nursery's cancel scope, sets and lists, eight
    objects a live actor would otherwise keep for the collector to walk."""

    __slots__ = ("_status", "done")

    def __init__(self, status: trio.TaskStatus[None]) -> None:
        self._status: trio.TaskStatus[None] | None = status
        self.done = False

    def started(self, value: None = None) -> None:
        assert self._status is not None, "an actor reports started once"
        self.done = True
        self._status.started()
        self._status = None


class ActorRegistry:
    def __init__(
        self,
        nursery: trio.Nursery,
        store: ScopeStore,
        publisher: Publisher,
        *,
        idle_timeout: float = 120.0,
        mailbox_size: int = 1024,
        on_send: SendObserver | None = None,
        row_limit: int = ROW_LIMIT,
    ) -> None:
        self._nursery = nursery
        # Send batches decided again on a reloaded scope since start: a steady
        # rise means two nodes host the same scopes at once.
        self.fence_losses = 0
        self._row_limit = row_limit
        self._store = store
        self._publisher = publisher
        self._idle_timeout = idle_timeout
        self._mailbox_size = mailbox_size
        self._on_send = on_send
        self._actors: dict[str, ScopeActor] = {}
        self._starting: dict[str, trio.Event] = {}
        self.draining = False
        # One timer for every actor instead of a task and a nursery per actor
        # (~4 KB each, and thousands of thread actors live at once).
        nursery.start_soon(self._passivate_idle)

    def __len__(self) -> int:
        return len(self._actors)

    def actor_nowait(self, scope_id: str) -> ScopeActor | None:
        actor = self._actors.get(scope_id)
        return actor if actor is not None and actor.accepting else None

    async def actor(self, scope_id: str) -> ScopeActor:
        """The running actor of ``scope_id``, starting (and loading) it if needed."""
        while True:
            actor = self.actor_nowait(scope_id)
            if actor is not None:
                return actor
            if self.draining:
                raise OperationError(ErrorCode.UNAVAILABLE, "node is draining; reconnect")
            starting = self._starting.get(scope_id)
            if starting is not None:
                await starting.wait()
                continue
            return await self._start(scope_id)

    async def _start(self, scope_id: str) -> ScopeActor:
        event = self._starting[scope_id] = trio.Event()
        actor = ScopeActor(
            scope_id,
            self._store,
            self._publisher,
            mailbox_size=self._mailbox_size,
            idle_timeout=None,
            on_send=self._on_send,
            row_limit=self._row_limit,
            on_fence_lost=self._fence_lost,
        )
        try:
            await self._nursery.start(self._run, actor)
            self._actors[scope_id] = actor
        except ScopeMissing:
            raise OperationError(ErrorCode.NOT_FOUND, "no such scope") from None
        except OperationError:
            raise
        except Exception as exc:
            log.warning("actor_start_failed", scope_id=scope_id, error=repr(exc))
            raise OperationError(ErrorCode.UNAVAILABLE, "scope could not be loaded; retry") from exc
        finally:
            del self._starting[scope_id]
            event.set()
        return actor

    def _fence_lost(self) -> None:
        self.fence_losses += 1

    async def _run(
        self, actor: ScopeActor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        status = _Started(task_status)
        del task_status  # this frame lives as long as the actor (see _Started)
        try:
            await actor.run(task_status=status)
        except Exception as exc:
            if not status.done:
                raise
            # A crashed actor must not take the node down: the next command reloads.
            log.error("actor_crashed", scope_id=actor.scope_id, error=repr(exc))
        finally:
            if self._actors.get(actor.scope_id) is actor:
                del self._actors[actor.scope_id]

    async def submit(self, scope_id: str, cmd: Command) -> None:
        actor = self.actor_nowait(scope_id) or await self.actor(scope_id)
        actor.submit_nowait(cmd)

    async def send(
        self, scope_id: str, build: Callable[[SendReply], SendCommand], wait_s: float = math.inf
    ) -> SendResult | OperationError | None:
        """Queue one send, built around its reply, and wait for the actor's answer
        (None when none came within ``wait_s``)."""
        done = trio.Event()
        outcome: list[SendResult | OperationError] = []

        def reply(result: SendResult | OperationError) -> None:
            outcome.append(result)
            done.set()

        await self.submit(scope_id, build(reply))
        with trio.move_on_after(wait_s):
            await done.wait()
        return outcome[0] if outcome else None

    async def ask(
        self, scope_id: str, cmd: RosterCommand | EditCommand | DeleteCommand | CardCommand
    ) -> dict[str, object]:
        """Queue a command that answers once and wait for the answer; a refusal raises."""
        done = trio.Event()
        outcome: list[dict[str, object] | OperationError] = []

        def reply(result: dict[str, object] | OperationError) -> None:
            outcome.append(result)
            done.set()

        cmd.reply = reply
        await self.submit(scope_id, cmd)
        await done.wait()
        if isinstance(outcome[0], OperationError):
            raise outcome[0]
        return outcome[0]

    def invalidate(self, scope_id: str) -> None:
        """Stop accepting on the actor so the next command reloads fresh state."""
        actor = self._actors.pop(scope_id, None)
        if actor is not None:
            actor.accepting = False

    async def _passivate_idle(self) -> None:
        """Every idle period, stop the actors that took no batch in the last
        one: an actor stops one to two periods after its last command."""
        while True:
            await trio.sleep(self._idle_timeout)
            for actor in list(self._actors.values()):
                if actor.passivate_if_unused() and self._actors.get(actor.scope_id) is actor:
                    del self._actors[actor.scope_id]

    def passivate_least_recent(self, count: int) -> int:
        """Passivate up to ``count`` idle actors, least recently used first;
        returns how many stopped (an actor with work queued is skipped)."""
        stopped = 0
        for actor in sorted(self._actors.values(), key=lambda a: a.last_batch_at):
            if stopped >= count:
                break
            if actor.passivate_if_idle():
                del self._actors[actor.scope_id]
                stopped += 1
        return stopped

    def busy(self) -> bool:
        """True while some actor still has queued commands."""
        return any(actor.statistics()["queued"] for actor in self._actors.values())

    def statistics(self) -> dict[str, int]:
        return {"actors": len(self._actors)}
