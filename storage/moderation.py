"""The moderation audit log: one row per blocked human-origin send or edit.

Audit only: nothing reads it to decide visibility, membership or delivery.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage.errors import map_errors
from storage.pg import TrioConnection

INSERT_AUDIT = """
INSERT INTO moderation_audit_log
    (workspace_id, scope_id, target, human_member_id, author_member_id, content,
     matched_keywords)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""


async def record_blocked(
    conn: TrioConnection,
    *,
    workspace_id: str,
    scope_id: str | None,
    target: str,
    human_member_id: str,
    author_member_id: str,
    content: str,
    matched: Sequence[str],
) -> None:
    with map_errors():
        await conn.execute(
            INSERT_AUDIT,
            (
                workspace_id,
                scope_id,
                target,
                human_member_id,
                author_member_id,
                content,
                list(matched),
            ),
        )
