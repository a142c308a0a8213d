"""Every send probes for its clientMessageId; the probe must stay one index
lookup however many messages its author already wrote in the scope, whatever
the statistics of the table say (a fresh or busy table is often unanalysed)."""

from __future__ import annotations

from actors.model import MemberType
from storage import directory, messages, scopes
from storage.pg import connect

# One author's history in one scope, written without the table being analysed.
HISTORY = 3000


async def test_the_idempotency_probe_reads_the_unique_index_not_the_authors_history(
    database_url: str,
) -> None:
    async with await connect(database_url, autocommit=True) as conn:
        ws = await directory.create_workspace(conn, "probe")
        author = await directory.create_member(
            conn, workspace_id=ws, type_=MemberType.HUMAN, handle="prolific"
        )
        scope_id = await scopes.create_channel(
            conn, creator=author, slug="busy", name="busy", visibility="public", description=""
        )
    async with await connect(database_url) as conn:
        # Rolled back: the rows exist for the plan only.
        await conn.execute(
            "INSERT INTO scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
            " author_member_id, author_type, notify_principal_member_id,"
            " idempotency_subject_member_id, client_message_id, idempotency_payload_digest,"
            " message_type, content)"
            " SELECT 'msg_probe_' || g, %(ws)s, %(scope)s, g, nextval('message_global_seq'),"
            " %(author)s, 'human', %(author)s, %(author)s, 'cm-' || g, '\\x00', 'text', 'x'"
            " FROM generate_series(1, %(n)s) AS g",
            {"ws": ws, "scope": scope_id, "author": author.id, "n": HISTORY},
        )
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + messages.FIND_IDEMPOTENT,
            (scope_id, author.id, author.id, "cm-none"),
        )
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
        await conn.rollback()
    assert "scope_messages_idempotency_idx" in plan, plan
    assert "Rows Removed by Filter" not in plan, plan
