"""Workspaces, members and credentials (identity). Tokens are stored hashed."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from actors.ids import new_id
from actors.lru import Lru
from actors.model import Member, MemberType
from storage.errors import map_errors
from storage.pg import TrioConnection

MEMBER_COLUMNS = "id, workspace_id, type, handle, display_name, owner_member_id, is_private"

INSERT_WORKSPACE = "INSERT INTO workspaces (id, name) VALUES (%s, %s)"
INSERT_MEMBER = f"""
INSERT INTO members ({MEMBER_COLUMNS}, is_admin)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""
SELECT_MEMBER = f"SELECT {MEMBER_COLUMNS} FROM members WHERE id = %s"
SELECT_MEMBERS = f"SELECT {MEMBER_COLUMNS} FROM members WHERE id = ANY(%s::text[])"
SELECT_MEMBER_BY_HANDLE = (
    f"SELECT {MEMBER_COLUMNS} FROM members WHERE workspace_id = %s AND handle = %s"
)
# ``in_scope``: a current member of the scope or, for a thread, of its channel
# (whose members read the thread).
SELECT_MENTIONED = f"""
SELECT {", ".join("m." + c for c in MEMBER_COLUMNS.split(", "))},
       EXISTS (
           SELECT 1 FROM scope_memberships sm
           WHERE sm.member_id = m.id AND sm.effective_to_seq IS NULL
             AND (sm.scope_id = %(scope)s
                  OR sm.scope_id = (SELECT parent_scope_id FROM scopes WHERE id = %(scope)s))
       )
FROM members m
WHERE m.workspace_id = %(workspace)s AND m.handle = ANY(%(handles)s::text[])
  AND m.status = 'active'
"""
SELECT_WORKSPACE = "SELECT id, name FROM workspaces WHERE id = %s"
SELECT_WORKSPACES = """
SELECT w.id, w.name, w.created_at, (SELECT count(*) FROM members m WHERE m.workspace_id = w.id)
FROM workspaces w ORDER BY w.created_at, w.id
"""
SELECT_WORKSPACE_MEMBERS = f"""
SELECT {MEMBER_COLUMNS}, status, is_admin FROM members
WHERE workspace_id = %s ORDER BY created_at, id
"""
SET_ADMIN = "UPDATE members SET is_admin = %s WHERE id = %s AND type = 'human' RETURNING id"
# The oldest human of the workspace, admins first: who owns a channel the
# operator creates without naming an owner.
SELECT_CHANNEL_OWNER = f"""
SELECT {MEMBER_COLUMNS} FROM members
WHERE workspace_id = %s AND type = 'human' AND status = 'active'
ORDER BY is_admin DESC, created_at, id LIMIT 1
"""
SELECT_ADMIN = "SELECT is_admin FROM members WHERE id = %s AND status = 'active'"
SELECT_ACTIVE = "SELECT 1 FROM members WHERE id = %s AND status = 'active'"
# ``avatar_color`` NULL in the request keeps the stored one.
SET_PROFILE = f"""
UPDATE members SET display_name = %s, avatar_color = COALESCE(%s, avatar_color)
WHERE id = %s AND status = 'active'
RETURNING {MEMBER_COLUMNS}, avatar_color
"""
DEACTIVATE_MEMBER = "UPDATE members SET status = 'deactivated' WHERE id = %s RETURNING id"
INSERT_TOKEN = "INSERT INTO credentials (member_id, token_hash) VALUES (%s, %s)"
# Every node LISTENs here; the notification is delivered at commit, so a node
# closes the token's live sessions as soon as the revocation is durable.
REVOCATION_CHANNEL = "scopenode_token_revoked"
REVOKE_TOKEN = f"""
WITH revoked AS (
    UPDATE credentials SET revoked_at = now() WHERE token_hash = %s AND revoked_at IS NULL
    RETURNING id
)
SELECT id, pg_notify('{REVOCATION_CHANNEL}', id::text) FROM revoked
"""
# Every live token of a member at once, each announced as REVOKE_TOKEN does.
REVOKE_MEMBER_TOKENS = f"""
WITH revoked AS (
    UPDATE credentials SET revoked_at = now() WHERE member_id = %s AND revoked_at IS NULL
    RETURNING id
)
SELECT id, pg_notify('{REVOCATION_CHANNEL}', id::text) FROM revoked
"""
REVOKED_AMONG = """
SELECT id FROM credentials WHERE id = ANY(%s::bigint[]) AND revoked_at IS NOT NULL
"""
AUTHENTICATE = f"""
SELECT {", ".join("m." + c.strip() for c in MEMBER_COLUMNS.split(","))}, c.id, m.is_admin
FROM credentials c JOIN members m ON m.id = c.member_id
WHERE c.token_hash = %s AND c.revoked_at IS NULL AND m.status = 'active'
"""
# A download link's credential: its member and the key the link was signed with.
LINK_CREDENTIAL = f"""
SELECT {", ".join("m." + c.strip() for c in MEMBER_COLUMNS.split(","))}, c.token_hash
FROM credentials c JOIN members m ON m.id = c.member_id
WHERE c.id = %s AND c.revoked_at IS NULL AND m.status = 'active'
"""
FIRST_HUMAN = f"""
SELECT {MEMBER_COLUMNS} FROM members WHERE type = 'human' ORDER BY created_at LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class WorkspaceListing:
    id: str
    name: str
    created_at: datetime
    members: int


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


# Every actor of a channel's threads caches the channel's roster: one shared
# object per member (as it was last read) instead of a copy per actor.
MEMBERS_INTERNED = 50_000
_members: Lru[tuple[Any, ...], Member] = Lru("members_interned", MEMBERS_INTERNED)


def member_from_row(row: tuple[Any, ...]) -> Member:
    return _members.intern(
        tuple(row[:7]),
        lambda: Member(
            id=row[0],
            workspace_id=row[1],
            type=MemberType(row[2]),
            handle=row[3],
            display_name=row[4],
            owner_member_id=row[5],
            is_private=bool(row[6]),
        ),
    )


async def create_workspace(conn: TrioConnection, name: str) -> str:
    workspace_id = new_id("ws")
    with map_errors():
        await conn.execute(INSERT_WORKSPACE, (workspace_id, name))
    return workspace_id


async def create_member(
    conn: TrioConnection,
    *,
    workspace_id: str,
    type_: MemberType,
    handle: str,
    display_name: str | None = None,
    owner_member_id: str | None = None,
    private: bool = False,
    admin: bool = False,
) -> Member:
    member = Member(
        id=new_id("mem"),
        workspace_id=workspace_id,
        type=type_,
        handle=handle.lower(),
        display_name=display_name or handle,
        owner_member_id=owner_member_id,
        is_private=private,
    )
    with map_errors():
        await conn.execute(
            INSERT_MEMBER,
            (
                member.id,
                member.workspace_id,
                member.type.value,
                member.handle,
                member.display_name,
                member.owner_member_id,
                member.is_private,
                admin,
            ),
        )
    return member


async def issue_token(conn: TrioConnection, member_id: str) -> str:
    token = "snt_" + secrets.token_urlsafe(32)
    with map_errors():
        await conn.execute(INSERT_TOKEN, (member_id, token_hash(token)))
    return token


async def revoke_token(conn: TrioConnection, token: str) -> bool:
    with map_errors():
        cur = await conn.execute(REVOKE_TOKEN, (token_hash(token),))
        return await cur.fetchone() is not None


async def set_admin(conn: TrioConnection, member_id: str, admin: bool) -> bool:
    """Make a human member an admin or not; False when there is no such human."""
    with map_errors():
        cur = await conn.execute(SET_ADMIN, (admin, member_id))
        return await cur.fetchone() is not None


async def is_admin(conn: TrioConnection, member_id: str) -> bool:
    """Whether the member is an active admin now (a demotion counts at once)."""
    with map_errors():
        cur = await conn.execute(SELECT_ADMIN, (member_id,))
        row = await cur.fetchone()
    return bool(row and row[0])


async def is_active(conn: TrioConnection, member_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(SELECT_ACTIVE, (member_id,))
        return await cur.fetchone() is not None


async def revoke_member_tokens(conn: TrioConnection, member_id: str) -> int:
    """Revoke every live token of a member; how many there were."""
    with map_errors():
        cur = await conn.execute(REVOKE_MEMBER_TOKENS, (member_id,))
        return len(await cur.fetchall())


async def set_profile(
    conn: TrioConnection, member_id: str, name: str, avatar_color: str | None = None
) -> tuple[Member, str | None] | None:
    """Rename an active member (and set its avatar colour, unless None); the
    member and its colour as now stored, or None when there is no such member.

    Messages store no author name: history, listings and search read this row.
    """
    with map_errors():
        cur = await conn.execute(SET_PROFILE, (name, avatar_color, member_id))
        row = await cur.fetchone()
    return (member_from_row(row), row[7]) if row else None


async def deactivate_member(conn: TrioConnection, member_id: str) -> int | None:
    """Deactivate a member and revoke every token it holds, in one transaction;
    the number of tokens revoked, or None when there is no such member.

    A deactivated member authenticates no more (``AUTHENTICATE``), and each
    revoked token's live sessions are closed by the nodes it is announced to.
    """
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(DEACTIVATE_MEMBER, (member_id,))
            if await cur.fetchone() is None:
                return None
            cur = await conn.execute(REVOKE_MEMBER_TOKENS, (member_id,))
            return len(await cur.fetchall())


async def channel_owner(conn: TrioConnection, workspace_id: str) -> Member | None:
    """Who owns a channel the operator creates without naming an owner."""
    with map_errors():
        cur = await conn.execute(SELECT_CHANNEL_OWNER, (workspace_id,))
        row = await cur.fetchone()
    return member_from_row(row) if row else None


async def authenticate(conn: TrioConnection, token: str) -> Member | None:
    found = await authenticate_credential(conn, token)
    return found[0] if found else None


async def authenticate_credential(
    conn: TrioConnection, token: str
) -> tuple[Member, int, bool] | None:
    """The token's member, credential id (what a session is revoked by) and
    whether the member is an admin."""
    with map_errors():
        cur = await conn.execute(AUTHENTICATE, (token_hash(token),))
        row = await cur.fetchone()
    return (member_from_row(row), int(row[7]), bool(row[8])) if row else None


async def link_credential(conn: TrioConnection, credential_id: int) -> tuple[Member, bytes] | None:
    """A live credential's member and token hash (what signs its download links)."""
    with map_errors():
        cur = await conn.execute(LINK_CREDENTIAL, (credential_id,))
        row = await cur.fetchone()
    return (member_from_row(row), bytes(row[7])) if row else None


async def listen_for_revocations(conn: TrioConnection) -> None:
    """Subscribe ``conn`` to revocations; payloads are credential ids."""
    with map_errors():
        await conn.execute(f"LISTEN {REVOCATION_CHANNEL}")


async def revoked_among(conn: TrioConnection, credential_ids: Sequence[int]) -> list[int]:
    """The given credentials that are revoked (a primary-key probe per id)."""
    with map_errors():
        cur = await conn.execute(REVOKED_AMONG, (list(credential_ids),))
        return [int(row[0]) for row in await cur.fetchall()]


async def get_member(conn: TrioConnection, member_id: str) -> Member | None:
    with map_errors():
        cur = await conn.execute(SELECT_MEMBER, (member_id,))
        row = await cur.fetchone()
    return member_from_row(row) if row else None


async def get_members(conn: TrioConnection, member_ids: list[str]) -> dict[str, Member]:
    """The members with these ids (any workspace), by id; unknown ids are absent."""
    with map_errors():
        cur = await conn.execute(SELECT_MEMBERS, (member_ids,))
        rows = await cur.fetchall()
    return {row[0]: member_from_row(row) for row in rows}


async def get_member_by_handle(
    conn: TrioConnection, workspace_id: str, handle: str
) -> Member | None:
    with map_errors():
        cur = await conn.execute(SELECT_MEMBER_BY_HANDLE, (workspace_id, handle))
        row = await cur.fetchone()
    return member_from_row(row) if row else None


async def mentioned_members(
    conn: TrioConnection, workspace_id: str, scope_id: str, handles: list[str]
) -> list[tuple[Member, bool]]:
    """The active members of the workspace with these handles, each with whether
    it reads ``scope_id``."""
    with map_errors():
        cur = await conn.execute(
            SELECT_MENTIONED, {"scope": scope_id, "workspace": workspace_id, "handles": handles}
        )
        rows = await cur.fetchall()
    return [(member_from_row(row), bool(row[7])) for row in rows]


async def first_human(conn: TrioConnection) -> Member | None:
    with map_errors():
        cur = await conn.execute(FIRST_HUMAN)
        row = await cur.fetchone()
    return member_from_row(row) if row else None


async def workspace_name(conn: TrioConnection, workspace_id: str) -> str | None:
    """The workspace's name, or None when there is no such workspace."""
    with map_errors():
        cur = await conn.execute(SELECT_WORKSPACE, (workspace_id,))
        row = await cur.fetchone()
    return str(row[1]) if row else None


async def list_workspaces(conn: TrioConnection) -> list[WorkspaceListing]:
    with map_errors():
        cur = await conn.execute(SELECT_WORKSPACES)
        rows = await cur.fetchall()
    return [WorkspaceListing(row[0], row[1], row[2], int(row[3])) for row in rows]


async def list_members(conn: TrioConnection, workspace_id: str) -> list[tuple[Member, str, bool]]:
    """Every member of the workspace with its status and whether it is an admin,
    oldest first."""
    with map_errors():
        cur = await conn.execute(SELECT_WORKSPACE_MEMBERS, (workspace_id,))
        rows = await cur.fetchall()
    return [(member_from_row(row), str(row[7]), bool(row[8])) for row in rows]
