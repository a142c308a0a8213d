"""The raw send baseline puts its workers on scopes as the workload puts senders."""

from __future__ import annotations

import psycopg
import pytest

from bench.dbbaseline import DbPlan, measure_db

COUNT_SCOPES = (
    "SELECT count(DISTINCT m.scope_id) FROM scope_messages m"
    " JOIN workspaces w ON w.id = m.workspace_id WHERE w.name = 'bench-baseline'"
)


@pytest.mark.parametrize(("per_scope", "scopes"), [(1, 4), (2, 2)])
async def test_concurrent_workers_share_scopes_as_asked(
    database_url: str, per_scope: int, scopes: int
) -> None:
    plan = DbPlan(sequential=0, concurrency=(4,), duration_s=0.3, per_scope=per_scope)
    result = await measure_db(database_url, plan)
    level = result["concurrent"]["4"]
    assert level["workers_per_scope"] == per_scope
    assert level["transactions"] >= 4
    with psycopg.connect(database_url) as conn:
        row = conn.execute(COUNT_SCOPES).fetchone()
        pending = conn.execute(
            "SELECT count(*) FROM scope_fanout_outbox WHERE status = 'pending'"
        ).fetchone()
    assert row is not None
    assert row[0] == scopes
    # Every worker's outbox rows were settled, shared scopes included.
    assert pending == (0,)
