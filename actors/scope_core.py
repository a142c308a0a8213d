"""What every path of a scope actor shares: the cached ScopeState and how it is reloaded.

A scope actor (``actors/scope_actor.py``) is one class assembled from its paths: sends
(``actors/scope_sends.py``), edits and deletes (``actors/scope_mutations.py``), reactions
(``actors/scope_reactions.py``) and roster changes (``actors/scope_roster.py``), each a
mixin over :class:`ScopeCore`. The core owns the store and publisher ports, the ScopeState
cache and the database clock; the two ways the cache catches up with the database (a
reload, and the roster-generation read before a refusal); and who hears of a roster
change, which the send path (thread memberships a send creates) and the roster path both
publish.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import structlog
import trio

from actors.clock import DbClock
from actors.model import ScopeSnapshot
from actors.ports import Publisher, ScopeStore
from actors.scope_state import ScopeState
from protocol.errors import ErrorCode, OperationError

log = structlog.get_logger(__name__)

# Tries of an edit, a delete or a reaction against roster changes by other writers.
COMMIT_ATTEMPTS = 3

# How a roster change, an edit, a delete or a reaction is answered.
Reply = Callable[[dict[str, object] | OperationError], None]


def unavailable(message: str) -> OperationError:
    return OperationError(ErrorCode.UNAVAILABLE, message)


class ScopeCore:
    """The state every path of the actor reads and replaces."""

    def __init__(self, scope_id: str, store: ScopeStore, publisher: Publisher) -> None:
        self.scope_id = scope_id
        self._store = store
        self._publisher = publisher
        self.state: ScopeState | None = None
        self._clock: DbClock | None = None
        # Set when a grant change was written outside this actor on this node:
        # reload before the next send rather than spend a round trip on a fence
        # miss. Only a shortcut; the generation fence is what guarantees it.
        self.stale = False

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
