"""Invite links: single-purpose codes that let a person create their own member.

A code is shown once, when it is created, and stored only as its SHA-256 (as
session tokens are). An invite expires, may be limited to a number of uses,
and can be revoked. Redeeming one creates a human member (never an admin,
never an agent), joins it to the workspace's default channels and the
invite's own, and issues its session token, all in the transaction that
claims one use: a redemption that fails for any reason leaves nothing behind
and uses nothing up.

Also here: the web origin each node announces at start, which the admin
command that creates an invite builds its link from.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from actors.ids import new_id
from actors.model import Member, MemberType
from storage import directory, scopes
from storage.errors import map_errors
from storage.pg import TrioConnection

INSERT_INVITE = """
INSERT INTO workspace_invites (id, workspace_id, code_hash, join_scope_ids, max_uses, expires_at)
VALUES (%s, %s, %s, %s, %s, now() + %s * interval '1 second')
RETURNING expires_at
"""
REVOKE_INVITE = """
UPDATE workspace_invites SET revoked_at = coalesce(revoked_at, now()) WHERE id = %s
RETURNING id
"""
# Why an invite can or cannot be used, decided on the database's clock (the
# one every expiry in the schema is compared with).
INVITE_STATUS = """
CASE WHEN i.revoked_at IS NOT NULL THEN 'revoked'
     WHEN i.expires_at <= now() THEN 'expired'
     WHEN i.max_uses IS NOT NULL AND i.uses >= i.max_uses THEN 'used_up'
     ELSE 'usable' END
"""
SELECT_INVITE = f"""
SELECT i.id, i.workspace_id, w.name, i.expires_at, {INVITE_STATUS}
FROM workspace_invites i JOIN workspaces w ON w.id = i.workspace_id
WHERE i.code_hash = %s
"""
# Never the code: only its hash is stored.
SELECT_WORKSPACE_INVITES = f"""
SELECT i.id, {INVITE_STATUS}, i.expires_at, i.max_uses, i.uses, i.join_scope_ids, i.created_at
FROM workspace_invites i WHERE i.workspace_id = %s
ORDER BY i.created_at DESC, i.id DESC LIMIT %s
"""
REVOKE_WORKSPACE_INVITE = """
UPDATE workspace_invites SET revoked_at = coalesce(revoked_at, now())
WHERE id = %s AND workspace_id = %s
RETURNING id
"""
# The row lock it takes makes concurrent redemptions of one code queue up, so
# the last use is claimed once.
CLAIM_INVITE = """
UPDATE workspace_invites SET uses = uses + 1
WHERE code_hash = %s AND revoked_at IS NULL AND expires_at > now()
  AND (max_uses IS NULL OR uses < max_uses)
RETURNING id, workspace_id, join_scope_ids
"""
SELECT_SLUGS = "SELECT scope_id, slug FROM scope_channel_profiles WHERE scope_id = ANY(%s::text[])"
UPSERT_WEB_ORIGIN = """
INSERT INTO node_web_origins (origin, node_id) VALUES (%s, %s)
ON CONFLICT (origin) DO UPDATE SET node_id = excluded.node_id, started_at = now()
"""
SELECT_WEB_ORIGIN = "SELECT origin FROM node_web_origins ORDER BY started_at DESC LIMIT 1"


class InviteStatus(enum.StrEnum):
    USABLE = "usable"
    EXPIRED = "expired"
    USED_UP = "used_up"
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class CreatedInvite:
    id: str
    code: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class InviteState:
    id: str
    workspace_id: str
    workspace_name: str
    expires_at: datetime
    status: InviteStatus


@dataclass(frozen=True, slots=True)
class InviteListing:
    id: str
    status: InviteStatus
    expires_at: datetime
    max_uses: int | None
    uses: int
    join_scope_ids: list[str]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Redeemed:
    invite_id: str
    member: Member
    token: str
    joined: list[str]


class InviteUnusable(Exception):
    """The code names no invite (``status`` None) or one that cannot be used."""

    def __init__(self, status: InviteStatus | None) -> None:
        super().__init__(status.value if status else "unknown")
        self.status = status


def new_code() -> str:
    return "sni_" + secrets.token_urlsafe(24)


async def create_invite(
    conn: TrioConnection,
    workspace_id: str,
    *,
    expires_in_s: int,
    max_uses: int | None,
    join_scope_ids: Sequence[str] = (),
) -> CreatedInvite:
    """A new invite; its code is returned here and never again."""
    invite_id = new_id("inv")
    code = new_code()
    with map_errors():
        cur = await conn.execute(
            INSERT_INVITE,
            (
                invite_id,
                workspace_id,
                directory.token_hash(code),
                list(join_scope_ids),
                max_uses,
                expires_in_s,
            ),
        )
        row = await cur.fetchone()
    assert row is not None
    return CreatedInvite(invite_id, code, row[0])


async def revoke_invite(
    conn: TrioConnection, invite_id: str, workspace_id: str | None = None
) -> bool:
    """Revoke an invite (again: no change); False when there is no such invite
    (in ``workspace_id``, when given)."""
    with map_errors():
        if workspace_id is None:
            cur = await conn.execute(REVOKE_INVITE, (invite_id,))
        else:
            cur = await conn.execute(REVOKE_WORKSPACE_INVITE, (invite_id, workspace_id))
        return await cur.fetchone() is not None


async def list_invites(
    conn: TrioConnection, workspace_id: str, limit: int = 200
) -> list[InviteListing]:
    """The workspace's invites, newest first."""
    with map_errors():
        cur = await conn.execute(SELECT_WORKSPACE_INVITES, (workspace_id, limit))
        rows = await cur.fetchall()
    return [
        InviteListing(
            id=row[0],
            status=InviteStatus(row[1]),
            expires_at=row[2],
            max_uses=row[3],
            uses=int(row[4]),
            join_scope_ids=list(row[5]),
            created_at=row[6],
        )
        for row in rows
    ]


async def lookup(conn: TrioConnection, code: str) -> InviteState | None:
    with map_errors():
        cur = await conn.execute(SELECT_INVITE, (directory.token_hash(code),))
        row = await cur.fetchone()
    if row is None:
        return None
    return InviteState(row[0], row[1], row[2], row[3], InviteStatus(row[4]))


async def redeem(
    conn: TrioConnection, code: str, *, handle: str, display_name: str | None
) -> Redeemed:
    """Claim one use of the invite and create its member, or do nothing.

    Raises :class:`InviteUnusable`, or ``UniqueViolation`` when the handle is
    taken in the workspace (nothing is claimed then either).
    """
    code_hash = directory.token_hash(code)
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(CLAIM_INVITE, (code_hash,))
            row = await cur.fetchone()
            if row is None:
                state = await lookup(conn, code)
                raise InviteUnusable(state.status if state else None)
            invite_id, workspace_id, join_scope_ids = row
            # Fixed here, never taken from the request: an invite makes a
            # plain human member, so it can give no one more than that.
            member = await directory.create_member(
                conn,
                workspace_id=workspace_id,
                type_=MemberType.HUMAN,
                handle=handle,
                display_name=display_name,
                owner_member_id=None,
                private=False,
                admin=False,
            )
            joined = await scopes.join_on_creation(conn, member, list(join_scope_ids))
            token = await directory.issue_token(conn, member.id)
    return Redeemed(invite_id, member, token, joined)


async def channel_slugs(conn: TrioConnection, scope_ids: Sequence[str]) -> list[str]:
    """``#slug`` of each channel, in the order given."""
    with map_errors():
        cur = await conn.execute(SELECT_SLUGS, (list(scope_ids),))
        slugs = {str(row[0]): str(row[1]) for row in await cur.fetchall()}
    return [f"#{slugs[s]}" for s in scope_ids if s in slugs]


async def record_web_origin(conn: TrioConnection, origin: str, node_id: str) -> None:
    with map_errors():
        await conn.execute(UPSERT_WEB_ORIGIN, (origin, node_id))


async def web_origin(conn: TrioConnection) -> str | None:
    """The web origin the most recently started node on this database announced."""
    with map_errors():
        cur = await conn.execute(SELECT_WEB_ORIGIN)
        row = await cur.fetchone()
    return str(row[0]) if row else None
