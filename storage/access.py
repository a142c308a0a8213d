"""What exists for a member, and what it may read there.

A scope the member may not know of answers exactly as a missing one
(docs/authorization.md); a scope it knows of is read through the readable
predicate with the member's :class:`~storage.visibility.Viewer`, built here
from its memberships (:func:`viewer_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.model import Member, ScopeInfo, ScopeType
from storage.errors import map_errors
from storage.pg import TrioConnection
from storage.scopes import SCOPE_COLUMNS, scope_from_row
from storage.visibility import Viewer

SELECT_RIGHTS = """
SELECT
    bool_or(effective_to_seq IS NULL AND visibility = 'public'),
    bool_or(effective_to_seq IS NULL AND visibility = 'private'),
    count(*) > 0,
    EXISTS (
        SELECT 1 FROM scopes t
        JOIN scope_memberships p ON p.scope_id = t.parent_scope_id
        WHERE t.id = %(scope_id)s AND t.type = 'thread' AND p.member_id = %(member_id)s
          AND p.visibility = 'public' AND p.effective_to_seq IS NULL
    )
FROM scope_memberships WHERE scope_id = %(scope_id)s AND member_id = %(member_id)s
"""


@dataclass(frozen=True, slots=True)
class ReadRights:
    current_public: bool
    current_private: bool
    any_membership: bool
    parent_public: bool = False  # threads: a current public member of the parent


async def read_rights(conn: TrioConnection, scope_id: str, member_id: str) -> ReadRights:
    with map_errors():
        cur = await conn.execute(SELECT_RIGHTS, {"scope_id": scope_id, "member_id": member_id})
        row = await cur.fetchone()
    assert row is not None
    return ReadRights(bool(row[0]), bool(row[1]), bool(row[2]), bool(row[3]))


async def viewer_for(conn: TrioConnection, info: ScopeInfo, member: Member) -> Viewer | None:
    """The member's read rights in a scope as a predicate Viewer; None if it has none.

    Humans and public agents read by current public membership, and a thread
    only while they are current public members of the parent;
    private agents by any membership interval (rows are filtered by the
    predicate).
    """
    if info.type is ScopeType.WORKFLOW:
        # Product-gated: no generic read, whatever membership the member holds.
        return None
    rights = await read_rights(conn, info.id, member.id)
    public = rights.current_public and not member.is_private_agent
    in_thread = info.type is ScopeType.THREAD
    if member.is_private_agent:
        if not rights.any_membership:
            return None
    elif not (rights.parent_public if in_thread else public):
        return None
    grant_scopes = (info.id,) + ((info.parent_scope_id,) if info.parent_scope_id else ())
    return Viewer(member, public, grant_scopes, in_thread)


# ---------------------------------------------------------------- what exists for a member
#
# A scope of the member's workspace exists for it when it is a public channel
# or a thread of one, when the member holds or held a membership in it or (a
# thread) in its parent, or when explicit context opened one of its messages to
# it (a private agent). Any other scope answers exactly as one that does not
# exist (docs/authorization.md): the lookup and the membership test are one
# statement, so an unknown scope and a missing one cost the same round trip.
# Memberships and channel visibility never change back, so a scope once known
# stays known. A workflow scope is known to no one here: its transcript is read
# through its plan alone (storage/workflows.py, docs/workflows.md).
_KNOWN_FROM = """
FROM scopes s
LEFT JOIN scope_channel_profiles p ON p.scope_id = s.id
LEFT JOIN scope_channel_profiles pp ON pp.scope_id = s.parent_scope_id
"""
_KNOWN_WHERE = """
s.workspace_id = %(workspace_id)s AND s.type <> 'workflow' AND (
    coalesce(p.visibility, pp.visibility) = 'public'
    OR EXISTS (SELECT 1 FROM scope_memberships k
               WHERE k.member_id = %(member_id)s AND k.scope_id IN (s.id, s.parent_scope_id))
    OR EXISTS (SELECT 1 FROM scope_message_sources c
               WHERE c.context_member_id = %(member_id)s
                 AND c.source_scope_id IN (s.id, s.parent_scope_id)))
"""
_KNOWN_COLUMNS = f"{SCOPE_COLUMNS}, coalesce(p.visibility, pp.visibility) = 'public'"
SELECT_KNOWN_SCOPE = f"""
SELECT {_KNOWN_COLUMNS} {_KNOWN_FROM}
WHERE s.id = %(scope_id)s AND {_KNOWN_WHERE}
"""
SELECT_KNOWN_CHANNEL = f"""
SELECT {_KNOWN_COLUMNS} {_KNOWN_FROM}
WHERE p.workspace_id = %(workspace_id)s AND p.slug = %(slug)s AND {_KNOWN_WHERE}
"""
SELECT_KNOWN_MESSAGE_SCOPE = f"""
SELECT {_KNOWN_COLUMNS} {_KNOWN_FROM}
JOIN scope_messages m ON m.scope_id = s.id
WHERE m.id = %(message_id)s AND {_KNOWN_WHERE}
"""


@dataclass(frozen=True, slots=True)
class KnownScope:
    info: ScopeInfo
    shared: bool  # a public channel or a thread of one: known to the whole workspace


async def _known(conn: TrioConnection, statement: str, keys: dict[str, str]) -> KnownScope | None:
    with map_errors():
        cur = await conn.execute(statement, keys)
        row = await cur.fetchone()
    return KnownScope(scope_from_row(row), bool(row[-1])) if row else None


async def known_scope(conn: TrioConnection, scope_id: str, member: Member) -> KnownScope | None:
    """The scope, if it exists for ``member``; None for a missing one and an unknown one alike."""
    keys = {"scope_id": scope_id, "workspace_id": member.workspace_id, "member_id": member.id}
    return await _known(conn, SELECT_KNOWN_SCOPE, keys)


async def known_channel(conn: TrioConnection, slug: str, member: Member) -> KnownScope | None:
    """The channel ``#slug`` of the member's workspace, if it exists for ``member``."""
    keys = {"slug": slug, "workspace_id": member.workspace_id, "member_id": member.id}
    return await _known(conn, SELECT_KNOWN_CHANNEL, keys)


async def known_message_scope(
    conn: TrioConnection, message_id: str, member: Member
) -> KnownScope | None:
    """The scope of a message, if the scope exists for ``member`` (whether the
    member may read the message is the readable predicate's question)."""
    keys = {"message_id": message_id, "workspace_id": member.workspace_id, "member_id": member.id}
    return await _known(conn, SELECT_KNOWN_MESSAGE_SCOPE, keys)
