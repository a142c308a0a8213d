"""Search: readiness and rebuild of the projection.

docs/design.md#search. Readiness lives in ``scope_message_search_state``
(scope key ``*``): a workspace without a row is ready (every send projects its
message), an import that writes messages beside the send path marks it
``building`` (:func:`mark_building`) and :func:`rebuild` makes it ready again.
A rebuild of a ready workspace never touches its row and never deletes the
document of a live message: it only adds what is missing and rewrites what
differs, so searches running meanwhile see at least what they saw before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from storage.errors import map_errors
from storage.pg import TrioConnection

REBUILD_BATCH = 5000

READY = "read_ready"
BUILDING = "building"


@dataclass(frozen=True, slots=True)
class Status:
    state: str  # read_ready or building
    indexed: int  # documents of the workspace
    messages: int  # live (not deleted) messages of the workspace

    def view(self) -> dict[str, object]:
        return {"state": self.state, "indexed": self.indexed, "messages": self.messages}


SELECT_READY = """
SELECT read_ready FROM scope_message_search_state
WHERE workspace_id = %s AND scope_key = '*'
"""
COUNT_INDEXED = "SELECT count(*) FROM scope_message_search_docs WHERE workspace_id = %s"
COUNT_LIVE = "SELECT count(*) FROM scope_messages WHERE workspace_id = %s AND deleted_at IS NULL"
# Only a ready projection may stop being ready by an import; a rebuild's own
# progress never clears read_ready (it never writes a ready row).
MARK_BUILDING = """
INSERT INTO scope_message_search_state
    (workspace_id, scope_key, migration_state, backfill_state, finalize_state, read_ready)
VALUES (%(workspace_id)s, '*', 'complete', %(backfill)s, %(finalize)s, false)
ON CONFLICT (workspace_id, scope_key) DO UPDATE
SET backfill_state = EXCLUDED.backfill_state, finalize_state = EXCLUDED.finalize_state,
    read_ready = false, updated_at = now()
WHERE NOT scope_message_search_state.read_ready OR %(force)s
"""
MARK_READY = """
INSERT INTO scope_message_search_state
    (workspace_id, scope_key, migration_state, backfill_state, finalize_state, read_ready)
VALUES (%s, '*', 'complete', 'complete', 'complete', true)
ON CONFLICT (workspace_id, scope_key) DO UPDATE
SET migration_state = 'complete', backfill_state = 'complete', finalize_state = 'complete',
    read_ready = true, updated_at = now()
"""
# One batch of the backfill, in global-seq order: every live message gets its
# document (the same row the send statement writes), a document whose body
# differs is rewritten, a deleted message's document goes. FOR SHARE makes a
# concurrent edit wait or be seen, so an old body never overwrites a new one.
BACKFILL_BATCH = """
WITH batch AS (
    SELECT m.id, m.workspace_id, m.scope_id, m.seq, m.author_member_id, m.content,
           m.created_at, m.deleted_at, m.workspace_global_seq
    FROM scope_messages m
    WHERE m.workspace_id = %(workspace_id)s AND m.workspace_global_seq > %(after)s
    ORDER BY m.workspace_global_seq
    LIMIT %(batch)s
    FOR SHARE
), written AS (
    INSERT INTO scope_message_search_docs
        (message_id, workspace_id, scope_id, seq, author_member_id, body, created_at)
    SELECT b.id, b.workspace_id, b.scope_id, b.seq, b.author_member_id, b.content, b.created_at
    FROM batch b WHERE b.deleted_at IS NULL
    ON CONFLICT (message_id) DO UPDATE SET body = EXCLUDED.body
    WHERE scope_message_search_docs.body IS DISTINCT FROM EXCLUDED.body
    RETURNING 1
), dropped AS (
    DELETE FROM scope_message_search_docs d USING batch b
    WHERE d.message_id = b.id AND b.deleted_at IS NOT NULL
    RETURNING 1
)
SELECT max(workspace_global_seq), count(*), (SELECT count(*) FROM written),
       (SELECT count(*) FROM dropped)
FROM batch
"""


async def is_ready(conn: TrioConnection, workspace_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(SELECT_READY, (workspace_id,))
        row = await cur.fetchone()
    return row is None or bool(row[0])


async def status(conn: TrioConnection, workspace_id: str) -> Status:
    ready = await is_ready(conn, workspace_id)
    with map_errors():
        indexed = await (await conn.execute(COUNT_INDEXED, (workspace_id,))).fetchone()
        live = await (await conn.execute(COUNT_LIVE, (workspace_id,))).fetchone()
    assert indexed is not None
    assert live is not None
    return Status(READY if ready else BUILDING, int(indexed[0]), int(live[0]))


async def mark_building(conn: TrioConnection, workspace_id: str, *, force: bool = True) -> None:
    """Before messages are written beside the send path (an import, a restore):
    search answers ``search_unavailable`` until :func:`rebuild` completes."""
    params = {
        "workspace_id": workspace_id,
        "backfill": "pending",
        "finalize": "pending",
        "force": force,
    }
    with map_errors():
        await conn.execute(MARK_BUILDING, params)


async def rebuild(
    conn: TrioConnection,
    workspace_id: str,
    *,
    batch: int = REBUILD_BATCH,
    progress: Callable[[int], None] | None = None,
) -> Status:
    """Backfill then finalize; the workspace is ``read_ready`` afterwards.

    ``conn`` is in autocommit: each batch commits alone, so a rebuild holds no
    long transaction and a stopped one is resumed by running it again.
    """
    if not await is_ready(conn, workspace_id):
        await _set_building(conn, workspace_id, "running", "pending")
    after = 0
    examined = 0
    while True:
        with map_errors():
            cur = await conn.execute(
                BACKFILL_BATCH, {"workspace_id": workspace_id, "after": after, "batch": batch}
            )
            row = await cur.fetchone()
        assert row is not None
        if not row[1]:
            break
        after = int(row[0])
        examined += int(row[1])
        if progress is not None:
            progress(examined)
    if not await is_ready(conn, workspace_id):
        await _set_building(conn, workspace_id, "complete", "running")
    with map_errors():
        # Fresh statistics, so the planner picks the text indexes for the new rows.
        await conn.execute("ANALYZE scope_message_search_docs")
        await conn.execute(MARK_READY, (workspace_id,))
    return await status(conn, workspace_id)


async def _set_building(
    conn: TrioConnection, workspace_id: str, backfill: str, finalize: str
) -> None:
    params = {
        "workspace_id": workspace_id,
        "backfill": backfill,
        "finalize": finalize,
        "force": False,
    }
    with map_errors():
        await conn.execute(MARK_BUILDING, params)
