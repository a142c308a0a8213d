"""Read-only figures and consistency checks of one workspace (the soak bench's).

Nothing here is on a request path: each query scans the workspace's rows, which
is what an after-the-fact audit wants and a node must never do per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from storage.pg import TrioConnection

DATABASE_SIZE = "SELECT pg_database_size(current_database())"
WORKSPACE_TOTALS = """
SELECT count(*), coalesce(sum(latest_seq), 0) FROM scopes WHERE workspace_id = %s
"""
# Each acked send must be the row the reply named, in the scope it named, with
# the client's id: a lost row and a row moved elsewhere both show up here.
MISSING_ACKED = """
SELECT a.id
FROM unnest(%s::text[], %s::text[], %s::text[]) AS a(id, scope_id, client_message_id)
LEFT JOIN scope_messages m
  ON m.id = a.id AND m.scope_id = a.scope_id AND m.client_message_id = a.client_message_id
WHERE m.id IS NULL
"""
DUPLICATE_CLIENT_IDS = """
SELECT author_member_id, client_message_id, count(*)
FROM scope_messages
WHERE workspace_id = %s AND client_message_id IS NOT NULL
GROUP BY author_member_id, client_message_id
HAVING count(*) > 1
LIMIT %s
"""
# Gap-free means the seqs are exactly 1..latest_seq: as many rows as the
# highest seq, all distinct, and the scope's counter agrees.
SEQ_ANOMALIES = """
SELECT s.id, s.latest_seq, count(m.seq), count(DISTINCT m.seq), coalesce(max(m.seq), 0)
FROM scopes s LEFT JOIN scope_messages m ON m.scope_id = s.id
WHERE s.workspace_id = %s
GROUP BY s.id, s.latest_seq
HAVING count(m.seq) <> coalesce(max(m.seq), 0)
    OR count(DISTINCT m.seq) <> count(m.seq)
    OR s.latest_seq <> coalesce(max(m.seq), 0)
LIMIT %s
"""


@dataclass(frozen=True)
class AckedSend:
    scope_id: str
    message_id: str
    client_message_id: str


async def database_size(conn: TrioConnection) -> int:
    """Bytes of the connected database."""
    cur = await conn.execute(DATABASE_SIZE)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def workspace_totals(conn: TrioConnection, workspace_id: str) -> tuple[int, int]:
    """(scopes, messages) of the workspace; messages as the scopes' latest seqs."""
    cur = await conn.execute(WORKSPACE_TOTALS, (workspace_id,))
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


async def missing_acked(conn: TrioConnection, sends: Sequence[AckedSend]) -> list[str]:
    """Message ids of acknowledged sends with no matching stored row."""
    cur = await conn.execute(
        MISSING_ACKED,
        (
            [s.message_id for s in sends],
            [s.scope_id for s in sends],
            [s.client_message_id for s in sends],
        ),
    )
    return [str(row[0]) for row in await cur.fetchall()]


async def duplicate_client_ids(
    conn: TrioConnection, workspace_id: str, limit: int = 20
) -> list[tuple[str, str, int]]:
    """(author, clientMessageId, rows) stored more than once in the workspace."""
    cur = await conn.execute(DUPLICATE_CLIENT_IDS, (workspace_id, limit))
    return [(str(r[0]), str(r[1]), int(r[2])) for r in await cur.fetchall()]


async def seq_anomalies(
    conn: TrioConnection, workspace_id: str, limit: int = 20
) -> list[dict[str, int | str]]:
    """Scopes whose seqs are not exactly 1..latest_seq."""
    cur = await conn.execute(SEQ_ANOMALIES, (workspace_id, limit))
    return [
        {"scopeId": str(r[0]), "latestSeq": r[1], "rows": r[2], "distinct": r[3], "maxSeq": r[4]}
        for r in await cur.fetchall()
    ]
