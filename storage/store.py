"""PostgreSQL implementation of the actor's ScopeStore port, over a Pool."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from actors.cards import CardChange, CardTarget
from actors.model import IdempotencyRecord, Member, NotificationState, ScopeSnapshot
from actors.planner import MessagePlan, MutationPlan
from actors.ports import (
    CommittedMutation,
    CommittedSend,
    LockedScope,
    MutationConflict,
    MutationTarget,
    ReactionOutcome,
    ReactionWrite,
    RosterChange,
)
from actors.scope_state import RECENT_TAIL
from storage import applier, cards, messages, mutations, reactions, scopes, snapshots
from storage.group_commit import GroupCommitter
from storage.pg import TrioConnection
from storage.pool import Pool


class PgScopeStore:
    def __init__(
        self,
        pool: Pool,
        committer: GroupCommitter | None = None,
        on_commit: Callable[[float, int], None] | None = None,
    ) -> None:
        """``on_commit(seconds, sends)``: how long each batch of sends took to commit."""
        self._pool = pool
        self._committer = committer
        self._on_commit = on_commit

    async def load_scope(self, scope_id: str) -> ScopeSnapshot:
        async with self._pool.connection() as conn:
            return await snapshots.load_snapshot(conn, scope_id, recent=RECENT_TAIL)

    @asynccontextmanager
    async def locked(self, scope_id: str) -> AsyncIterator[LockedScope]:
        async with self._pool.connection() as conn, conn.transaction():
            await snapshots.lock_for_send(conn, scope_id)
            yield PgLockedScope(conn, scope_id)

    async def roster_generation(self, scope_id: str) -> int:
        async with self._pool.connection() as conn:
            return await scopes.roster_generation(conn, scope_id)

    async def find_idempotent(
        self, scope_id: str, author_id: str, client_message_id: str
    ) -> IdempotencyRecord | None:
        async with self._pool.connection() as conn:
            return await messages.find_idempotent(conn, scope_id, author_id, client_message_id)

    async def apply_sends(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        started = time.perf_counter()
        if self._committer is not None:
            committed = await self._committer.apply(plans)
        else:
            async with self._pool.connection() as conn:
                committed = await applier.apply_sends(conn, plans)
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started, len(committed))
        return committed

    async def join(
        self,
        scope_id: str,
        member: Member,
        *,
        visibility: str,
        owner_member_id: str | None,
        state: NotificationState,
    ) -> RosterChange:
        async with self._pool.connection() as conn:
            return await scopes.join(
                conn,
                scope_id,
                member,
                visibility=visibility,
                owner_member_id=owner_member_id,
                state=state,
            )

    async def leave(self, scope_id: str, member_id: str) -> RosterChange:
        async with self._pool.connection() as conn:
            return await scopes.leave(conn, scope_id, member_id)

    async def set_notification(
        self, scope_id: str, member_id: str, state: NotificationState
    ) -> int:
        async with self._pool.connection() as conn:
            return await scopes.set_notification(conn, scope_id, member_id, state)

    async def react_many(
        self,
        scope_id: str,
        generation: int,
        writes: Sequence[ReactionWrite],
        *,
        grant_scopes: tuple[str, ...],
        in_thread: bool,
    ) -> list[ReactionOutcome]:
        async with self._pool.connection() as conn:
            return await reactions.react_many(
                conn, scope_id, generation, writes, grant_scopes=grant_scopes, in_thread=in_thread
            )

    async def mutation_target(self, scope_id: str, message_id: str) -> MutationTarget | None:
        async with self._pool.connection() as conn:
            return await mutations.target(conn, scope_id, message_id)

    async def apply_mutation(self, plan: MutationPlan) -> CommittedMutation | MutationConflict:
        async with self._pool.connection() as conn:
            return await mutations.apply(conn, plan)

    async def card_target(self, scope_id: str, message_id: str) -> CardTarget | None:
        async with self._pool.connection() as conn:
            return await cards.target(conn, scope_id, message_id)

    async def apply_card(
        self, plan: MutationPlan, change: CardChange
    ) -> CommittedMutation | MutationConflict:
        async with self._pool.connection() as conn:
            return await cards.apply(conn, plan, change)


class PgLockedScope:
    """One transaction holding the scope's send locks (``PgScopeStore.locked``)."""

    def __init__(self, conn: TrioConnection, scope_id: str) -> None:
        self._conn = conn
        self._scope_id = scope_id

    async def load_scope(self) -> ScopeSnapshot:
        return await snapshots.read_snapshot(self._conn, self._scope_id, recent=RECENT_TAIL)

    async def find_idempotent(
        self, author_id: str, client_message_id: str
    ) -> IdempotencyRecord | None:
        return await messages.find_idempotent(
            self._conn, self._scope_id, author_id, client_message_id
        )

    async def apply_sends(self, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
        # Inside the transaction: committed when the ``locked`` block ends.
        return await applier.apply_sends(self._conn, plans)
