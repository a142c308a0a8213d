"""Reading what a message cites, re-checked against the viewer (docs/design.md#sources).

The rows are written by the Applier with the message (``actors/sources.py``).
Reading a message shows each of its sources as ``{messageId, scopeId, seq,
kind}`` only when the *viewer* may read the cited message now, through the
one SQL readable predicate; otherwise ``{messageId: null, kind, unavailable:
true}``: the sender's right to cite it is not the reader's right to see it.
``recipient_context`` rows are never shown: they are the durable rows that
open a message to a private agent (the predicate's ``context`` reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.model import Member, ScopeInfo, ScopeType
from actors.sources import VIEW_KIND
from storage import access, scopes
from storage.errors import map_errors
from storage.pg import TrioConnection
from storage.visibility import READABLE_JOIN, Viewer

SELECT_SOURCES = """
SELECT message_id, source_kind, source_message_id, source_scope_id, source_seq
FROM scope_message_sources
WHERE message_id = ANY(%s) AND context_member_id IS NULL
ORDER BY message_id, ordinal
"""
READABLE_IN_SCOPE = f"""
SELECT m.id FROM scope_messages m
{READABLE_JOIN}
WHERE m.id = ANY(%(ids)s) AND m.scope_id = %(scope_id)s AND v.reason IS NOT NULL
"""
HAS_CONTEXT = """
SELECT EXISTS (
    SELECT 1 FROM scope_message_sources
    WHERE context_member_id = %s AND source_scope_id = %s
)
"""


def unavailable(kind: str) -> dict[str, Any]:
    return {"messageId": None, "kind": kind, "unavailable": True}


def pending(kind: str) -> dict[str, Any]:
    """A source not yet checked for this reader (live events): read the message
    with ``history`` to have it resolved."""
    return {"messageId": None, "kind": kind, "pending": True}


async def any_viewer(conn: TrioConnection, info: ScopeInfo, member: Member) -> Viewer | None:
    """The member's predicate parameters in a scope: ``access.viewer_for``, and for
    a private agent with no membership there still a Viewer, so its context rows
    count (the predicate reads nothing else for it)."""
    viewer = await access.viewer_for(conn, info, member)
    if viewer is None and member.is_private_agent:
        grant_scopes = (info.id,) + ((info.parent_scope_id,) if info.parent_scope_id else ())
        viewer = Viewer(member, False, grant_scopes, info.type is ScopeType.THREAD)
    return viewer


async def context_viewer(conn: TrioConnection, info: ScopeInfo, member: Member) -> Viewer | None:
    """A private agent that holds no membership of the scope but was given explicit
    context in it reads there exactly what its context rows open (history, resume)."""
    if not member.is_private_agent:
        return None
    with map_errors():
        cur = await conn.execute(HAS_CONTEXT, (member.id, info.id))
        row = await cur.fetchone()
    if not (row and row[0]):
        return None
    return await any_viewer(conn, info, member)


async def sources_for(
    conn: TrioConnection, message_ids: Sequence[str], member: Member
) -> dict[str, list[dict[str, Any]]]:
    """Message id → its sources as ``member`` may see them (messages without
    sources are left out). One query when none of them cites anything."""
    if not message_ids:
        return {}
    with map_errors():
        cur = await conn.execute(SELECT_SOURCES, (list(message_ids),))
        rows = await cur.fetchall()
    if not rows:
        return {}
    by_scope: dict[str, set[str]] = {}
    for _, _, source_id, scope_id, _ in rows:
        by_scope.setdefault(scope_id, set()).add(source_id)
    readable: set[str] = set()
    for scope_id, ids in by_scope.items():
        info = await scopes.get_scope(conn, scope_id)
        if info is None or info.workspace_id != member.workspace_id:
            continue
        viewer = await any_viewer(conn, info, member)
        if viewer is None:
            continue
        params = {"ids": sorted(ids), "scope_id": scope_id, **viewer.params()}
        with map_errors():
            cur = await conn.execute(READABLE_IN_SCOPE, params)
            readable.update(row[0] for row in await cur.fetchall())
    out: dict[str, list[dict[str, Any]]] = {}
    for message_id, stored_kind, source_id, scope_id, seq in rows:
        kind = VIEW_KIND[stored_kind]
        shown = (
            {"messageId": source_id, "scopeId": scope_id, "seq": seq, "kind": kind}
            if source_id in readable
            else unavailable(kind)
        )
        out.setdefault(message_id, []).append(shown)
    return out


# The context rows of one scope's messages: what the twin's
# ``VisibilityContext.context`` holds (private agent → message ids).
SELECT_CONTEXT = """
SELECT context_member_id, source_message_id FROM scope_message_sources
WHERE source_scope_id = %s AND context_member_id IS NOT NULL
"""
