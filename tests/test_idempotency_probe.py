"""Every send probes for its clientMessageId; the probe must stay one index
lookup however many messages its author already wrote in the scope, whatever
the statistics of the table say (a new or busy table is often unanalysed).

Both send statements are checked in the generic plan PostgreSQL keeps for a
statement the node prepared, on a scope whose author wrote ``HISTORY``
messages since the table was last analysed."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from psycopg import pq
from psycopg.generators import execute as execute_gen

from actors.model import Member, MemberType
from actors.planner import MessagePlan
from actors.scope_state import Append, ScopeState, SendCommand
from storage import applier, directory, messages, scopes, snapshots
from storage.pg import Prepared, TrioConnection, connect

HISTORY = 3000


async def busy_scope(conn: TrioConnection) -> tuple[Member, str, str]:
    """An author, a channel holding ``HISTORY`` of its messages, and a quiet one."""
    ws = await directory.create_workspace(conn, "probe")
    author = await directory.create_member(
        conn, workspace_id=ws, type_=MemberType.HUMAN, handle="prolific"
    )
    busy, quiet = [
        await scopes.create_channel(
            conn, creator=author, slug=slug, name=slug, visibility="public", description=""
        )
        for slug in ("busy", "quiet")
    ]
    await conn.execute(
        "INSERT INTO scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
        " author_member_id, author_type, notify_principal_member_id,"
        " idempotency_subject_member_id, client_message_id, idempotency_payload_digest,"
        " message_type, content)"
        " SELECT 'msg_probe_' || g, %(ws)s, %(scope)s, g, nextval('message_global_seq'),"
        " %(author)s, 'human', %(author)s, %(author)s, 'cm-' || g, '\\x00', 'text', 'x'"
        " FROM generate_series(1, %(n)s) AS g",
        {"ws": ws, "scope": busy, "author": author.id, "n": HISTORY},
    )
    await conn.execute("UPDATE scopes SET latest_seq = %s WHERE id = %s", (HISTORY, busy))
    return author, busy, quiet


async def plan_for(conn: TrioConnection, author: Member, scope_id: str, key: str) -> MessagePlan:
    state = ScopeState(await snapshots.load_snapshot(conn, scope_id, recent=16))
    decision = state.decide(
        SendCommand(author, "hello", key, reply=lambda _: None), datetime.now(UTC)
    )
    assert isinstance(decision, Append)
    return decision.plan


def literal(value: bytes | None) -> str:
    return "NULL" if value is None else "'" + value.decode().replace("'", "''") + "'"


async def generic_plan(
    conn: TrioConnection, stmt: Prepared, values: list[bytes | None], name: str
) -> str:
    """EXPLAIN ANALYZE of the node's statement ``stmt`` in its generic plan,
    rolled back. Prepared here under ``name`` with the node's parameter types
    (psycopg's own rollback deallocates every statement of the session)."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.pgconn.send_prepare(name.encode(), stmt.sql, param_types=stmt.types)
    [prepared] = await conn.wait(execute_gen(conn.pgconn))
    assert prepared.status == pq.ExecStatus.COMMAND_OK, prepared.error_message
    await conn.execute("BEGIN")
    try:
        cur = await conn.execute(
            f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE {name}({', '.join(literal(v) for v in values)})"
        )
        return "\n".join(str(row[0]) for row in await cur.fetchall())
    finally:
        await conn.execute("ROLLBACK")


def rows_scanned_for_nothing(plan: str) -> int:
    return max((int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)), default=0)


async def test_the_lookup_reads_the_unique_index_not_the_authors_history(
    database_url: str,
) -> None:
    async with await connect(database_url, autocommit=True) as conn:
        author, busy, _ = await busy_scope(conn)
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) " + messages.FIND_IDEMPOTENT,
            (busy, author.id, author.id, "cm-none"),
        )
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
    assert "scope_messages_idempotency_idx" in plan, plan
    assert rows_scanned_for_nothing(plan) == 0, plan


async def test_both_send_statements_probe_through_the_unique_index(database_url: str) -> None:
    async with await connect(database_url, autocommit=True) as conn:
        author, busy, quiet = await busy_scope(conn)
        single = await plan_for(conn, author, busy, "probe-1")
        group = [
            [await plan_for(conn, author, busy, "probe-2")],
            [await plan_for(conn, author, quiet, "probe-3")],
        ]
        plans = {
            "single": await generic_plan(
                conn, applier._SEND, applier.send_values(single), "probe_single"
            ),
            "group": await generic_plan(
                conn, applier._GROUP, applier.group_values(group), "probe_group"
            ),
        }
    for kind, plan in plans.items():
        assert "scope_messages_author_idx" not in plan, (kind, plan)
        assert rows_scanned_for_nothing(plan) < 10, (kind, plan)
