"""The bench's raw phases and bare relay commit through the node's own statement call.

A baseline timed through a slower driver path than the node's would flatter
the node. Every statement here is recorded at ``TrioConnection`` (the
connection type the node uses): the node's send, the raw send phase, the bare
relay's commits (through the node's own group committer) and the raw search all go through
``run_prepared``, and none of them through psycopg's generic ``execute``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.search_query import parse
from bench import relayfloor
from bench.dbbaseline import DbPlan, measure_db
from node.database import autocommit
from storage import applier, search_sql, send_baseline
from storage import search as stored_search
from storage.group_commit import GroupCommitter
from storage.pg import Prepared, TrioConnection, connect
from storage.pool import open_pool
from tests.nodes import make_channel, running_world

SEND = b"scopenode_send_v2"
BASELINE = b"scopenode_send_baseline_v1"
GROUP = b"scopenode_send_group_v2"


class Calls:
    def __init__(self) -> None:
        self.prepared: list[bytes] = []
        self.executed: list[str] = []
        # When set, the next prepared statement waits for it before it runs.
        self.hold: trio.Event | None = None

    def count(self, name: bytes) -> int:
        return self.prepared.count(name)

    def executed_any(self, *statements: str) -> bool:
        return any(s in sql for sql in self.executed for s in statements)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    seen = Calls()
    run_prepared = TrioConnection.run_prepared
    execute = TrioConnection.execute

    async def recording_run_prepared(
        self: TrioConnection, stmt: Prepared, params: Sequence[bytes | None]
    ) -> list[tuple[Any, ...]]:
        seen.prepared.append(stmt.name)
        if seen.hold is not None:
            hold, seen.hold = seen.hold, None
            await hold.wait()
        return await run_prepared(self, stmt, params)

    async def recording_execute(self: TrioConnection, query: Any, *args: Any, **kw: Any) -> Any:
        seen.executed.append(query.decode() if isinstance(query, bytes) else str(query))
        return await execute(self, query, *args, **kw)

    monkeypatch.setattr(TrioConnection, "run_prepared", recording_run_prepared)
    monkeypatch.setattr(TrioConnection, "execute", recording_execute)
    return seen


async def test_the_node_sends_through_run_prepared(
    database_url: str, tmp_path: Path, calls: Calls
) -> None:
    async with running_world(database_url, tmp_path) as world:
        alice = await world.member("alice")
        async with world.client(alice) as client:
            await make_channel(client, "path")
            before = calls.count(SEND)
            await client.send("#path", "one")
            assert calls.count(SEND) == before + 1
    assert not calls.executed_any(applier.SEND_MESSAGE)


async def test_the_raw_send_phase_takes_the_same_call(database_url: str, calls: Calls) -> None:
    plan = DbPlan(sequential=5, concurrency=(2,), duration_s=0.3, per_scope=1)
    result = await measure_db(database_url, plan)
    sent = result["sequential"]["count"] + result["concurrent"]["2"]["transactions"]
    assert sent >= 7
    assert calls.count(BASELINE) == sent
    assert not calls.executed_any(send_baseline.RAW_SEND_BASELINE_SQL)


async def test_the_bare_relay_commits_through_the_nodes_committer(
    database_url: str, calls: Calls
) -> None:
    conn = await connect(database_url, autocommit=True)
    try:
        scopes = await relayfloor.send_scopes(conn, 3)
    finally:
        await conn.close()
    seqs: dict[int, list[int]] = {}
    async with open_pool(database_url, size=1, configure=autocommit) as pool:
        # One lane: the first chain runs alone at once, the two that arrive
        # while it runs go next as one group statement (no gathering: which
        # statement takes what then depends on order alone, not on timing).
        committer = GroupCommitter(pool, lanes=1, gather=0.0)
        relay = relayfloor.SendRelay(committer, scopes)

        async def commit(scope: int, count: int) -> None:
            seqs[scope] = await relay.commit(scope, count)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.run)
            async with trio.open_nursery() as sends:
                # The first statement is held in flight until the others arrived
                # (a fast database could otherwise answer it first).
                release = calls.hold = trio.Event()
                sends.start_soon(commit, 0, 1)
                await trio.testing.wait_all_tasks_blocked()
                assert committer.in_flight == 1
                sends.start_soon(commit, 1, 2)
                sends.start_soon(commit, 2, 1)
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            nursery.cancel_scope.cancel()
    assert seqs == {0: [1], 1: [1, 2], 2: [1]}
    assert calls.count(SEND) == 1
    assert calls.count(GROUP) == 1
    assert committer.transactions == 2
    assert not calls.executed_any(applier.SEND_MESSAGE, applier.SEND_GROUP)


async def test_the_raw_search_takes_the_nodes_call(database_url: str, calls: Calls) -> None:
    statement, params = search_sql.build_query(
        parse("hello"),
        search_sql.Filters(workspace_id="ws_none"),
        {},
        sort="recent",
        limit=20,
        after=None,
        raw=True,
        within=None,
    )
    conn = await connect(database_url, autocommit=True)
    try:
        assert await stored_search.run_query(conn, statement, params) == []
    finally:
        await conn.close()
    assert len([n for n in calls.prepared if n.startswith(b"scopenode_search_")]) == 1
    assert statement not in calls.executed
