"""Group commit across actors: batches commit together, a missed batch alone fails."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
import trio

from actors.model import MemberType
from actors.ports import FenceLost
from actors.scope_state import Append, ScopeState, SendCommand
from node.database import autocommit
from storage import directory, scopes
from storage.group_commit import GroupCommitter
from storage.pg import connect, open_pool
from storage.store import PgScopeStore


async def test_batches_of_many_scopes_commit_together_and_a_miss_fails_alone(
    database_url: str,
) -> None:
    async with await connect(database_url, autocommit=True) as conn:
        ws = await directory.create_workspace(conn, "gc")
        author = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="ann"
        )
        scope_ids = [
            await scopes.create_channel(
                conn, creator=author, slug=f"c{i}", name="c", visibility="public", description=""
            )
            for i in range(6)
        ]
    async with (
        open_pool(database_url, size=4, configure=autocommit) as pool,
        trio.open_nursery() as nursery,
    ):
        committer = GroupCommitter(pool, lanes=1)
        nursery.start_soon(committer.run)
        store = PgScopeStore(pool)
        now = datetime.now(UTC)
        batches = []
        for index, scope_id in enumerate(scope_ids):
            state = ScopeState(await store.load_scope(scope_id))
            plans = []
            for n in range(3):
                cmd = SendCommand(author, f"m{n}", f"c{n}", reply=lambda _: None)
                decision = state.decide(cmd, now)
                assert isinstance(decision, Append)
                plans.append(decision.plan)
            # Scope 2's batch starts at a seq the database never had: a fence miss.
            batches.append(plans[1:] if index == 2 else plans)
        outcomes: dict[str, object] = {}

        async def submit(scope_id: str, plans: list[object]) -> None:
            try:
                outcomes[scope_id] = await committer.apply(plans)  # type: ignore[arg-type]
            except FenceLost as exc:
                outcomes[scope_id] = exc

        async with trio.open_nursery() as senders:
            for scope_id, plans in zip(scope_ids, batches, strict=True):
                senders.start_soon(submit, scope_id, plans)
        nursery.cancel_scope.cancel()
    assert isinstance(outcomes[scope_ids[2]], FenceLost)
    for scope_id in scope_ids[:2] + scope_ids[3:]:
        result = outcomes[scope_id]
        assert [c.seq for c in result] == [1, 2, 3]  # type: ignore[attr-defined]
    assert committer.plans_committed == 15
    assert committer.transactions < 5  # several batches per transaction
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT scope_id, count(*), max(seq) FROM scope_messages GROUP BY scope_id"
        ).fetchall()
    assert {r[0]: (r[1], r[2]) for r in rows} == {s: (3, 3) for s in scope_ids if s != scope_ids[2]}


@pytest.mark.parametrize("lanes", [1, 3])
async def test_single_batches_still_commit(database_url: str, lanes: int) -> None:
    async with await connect(database_url, autocommit=True) as conn:
        ws = await directory.create_workspace(conn, "gc")
        author = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="ann"
        )
        scope_id = await scopes.create_channel(
            conn, creator=author, slug="one", name="c", visibility="public", description=""
        )
    async with (
        open_pool(database_url, size=4, configure=autocommit) as pool,
        trio.open_nursery() as nursery,
    ):
        committer = GroupCommitter(pool, lanes=lanes)
        nursery.start_soon(committer.run)
        state = ScopeState(await PgScopeStore(pool).load_scope(scope_id))
        for n in range(3):
            decision = state.decide(
                SendCommand(author, "x", f"k{n}", reply=lambda _: None), datetime.now(UTC)
            )
            assert isinstance(decision, Append)
            (done,) = await committer.apply([decision.plan])
            assert done.seq == n + 1
        nursery.cancel_scope.cancel()
