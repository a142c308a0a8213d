"""Scopes, channel profiles, memberships and notification settings.

Creating scopes (channels, DMs, threads, a workspace's ``#general``), the
roster writes, read positions and the listings (a member's scopes, a scope's
members, the channel browser, the people a member may name). What a scope
actor loads is ``storage/snapshots.py``; what exists for a member and what it
may read there, ``storage/access.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actors.ids import new_id
from actors.model import (
    Member,
    Membership,
    MemberType,
    NotificationState,
    ScopeInfo,
    ScopeType,
)
from actors.policy import dm_membership
from actors.ports import RosterChange, ScopeMissing
from storage.directory import member_from_row
from storage.errors import UniqueViolation, map_errors
from storage.pg import TrioConnection

SCOPE_COLUMNS = """
s.id, s.workspace_id, s.type, s.latest_seq, s.parent_scope_id, s.root_message_id,
p.slug, p.display_name, p.visibility, s.roster_generation, p.owner_member_id
"""
SELECT_SCOPE = f"""
SELECT {SCOPE_COLUMNS}
FROM scopes s LEFT JOIN scope_channel_profiles p ON p.scope_id = s.id
WHERE s.id = %s
"""
SELECT_CHANNEL_BY_SLUG = """
SELECT scope_id FROM scope_channel_profiles WHERE workspace_id = %s AND slug = %s
"""
SELECT_BY_IDENTITY = "SELECT id FROM scopes WHERE identity_key = %s"
SELECT_THREAD = """
SELECT id FROM scopes
WHERE parent_scope_id = %s AND root_message_id = %s AND type = 'thread'
"""
SELECT_SERVICE_SCOPES = """
SELECT id FROM scopes WHERE workspace_id = %s AND type = 'service_account' ORDER BY id
"""
SELECT_GENERATION = "SELECT roster_generation FROM scopes WHERE id = %s"
INSERT_SCOPE = """
INSERT INTO scopes (id, workspace_id, type, identity_key, created_by_member_id,
                    parent_scope_id, root_message_id)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
RETURNING id
"""
INSERT_PROFILE = """
INSERT INTO scope_channel_profiles
    (scope_id, workspace_id, slug, display_name, description, visibility, owner_member_id,
     is_default)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""
SELECT_DEFAULT_CHANNELS = """
SELECT scope_id FROM scope_channel_profiles WHERE workspace_id = %s AND is_default ORDER BY slug
"""
# Every channel of the workspace for the operator (admin list-channels), with
# its current member count; not a member's view, so private channels included.
SELECT_ADMIN_CHANNELS = """
SELECT p.scope_id, p.slug, p.display_name, p.visibility, p.is_default, p.owner_member_id,
       s.latest_seq,
       (SELECT count(*) FROM scope_memberships m
        WHERE m.scope_id = p.scope_id AND m.effective_to_seq IS NULL)
FROM scope_channel_profiles p JOIN scopes s ON s.id = p.scope_id
WHERE p.workspace_id = %s
ORDER BY p.slug
"""
MEMBER_COLUMNS_M = (
    "mem.id, mem.workspace_id, mem.type, mem.handle, mem.display_name, "
    "mem.owner_member_id, mem.is_private"
)
INSERT_MEMBERSHIP = """
INSERT INTO scope_memberships
    (scope_id, member_id, visibility, owner_member_id, effective_from_seq, last_read_seq)
SELECT s.id, %(member_id)s, %(visibility)s, %(owner_id)s, s.latest_seq + 1, s.latest_seq
FROM scopes s WHERE s.id = %(scope_id)s
RETURNING effective_from_seq, last_read_seq
"""
CLOSE_MEMBERSHIP = """
UPDATE scope_memberships m
SET effective_to_seq = s.latest_seq + 1, removed_at = now(), updated_at = now()
FROM scopes s
WHERE s.id = m.scope_id AND m.scope_id = %(scope_id)s AND m.member_id = %(member_id)s
  AND m.effective_to_seq IS NULL
RETURNING m.visibility, m.owner_member_id, m.effective_from_seq, m.effective_to_seq,
          m.last_read_seq
"""
# Leaving (or being removed from) a scope ends the member's memberships of the
# reply threads under it too, in the same transaction: a thread is read through
# its parent, and a membership left behind would keep a former member of a
# private channel reading its threads. Each such thread's generation is bumped
# first (it locks the row, so the interval ends at the thread's true latest
# seq, and the thread's actor reloads before its next send).
CLOSE_THREAD_MEMBERSHIPS = """
WITH threads AS (
    UPDATE scopes t SET roster_generation = t.roster_generation + 1
    WHERE t.parent_scope_id = %(scope_id)s AND t.type = 'thread'
      AND EXISTS (
          SELECT 1 FROM scope_memberships tm
          WHERE tm.scope_id = t.id AND tm.member_id = %(member_id)s
            AND tm.effective_to_seq IS NULL)
    RETURNING t.id, t.latest_seq
), closed AS (
    UPDATE scope_memberships m
    SET effective_to_seq = threads.latest_seq + 1, removed_at = now(), updated_at = now()
    FROM threads
    WHERE m.scope_id = threads.id AND m.member_id = %(member_id)s
      AND m.effective_to_seq IS NULL
    RETURNING m.scope_id
)
DELETE FROM scope_notification_settings n
USING closed
WHERE n.scope_id = closed.scope_id AND n.member_id = %(member_id)s
"""
UPSERT_NOTIFICATION = """
INSERT INTO scope_notification_settings (scope_id, member_id, state)
VALUES (%s, %s, %s)
ON CONFLICT (scope_id, member_id) DO UPDATE SET state = excluded.state, updated_at = now()
"""
DELETE_NOTIFICATION = (
    "DELETE FROM scope_notification_settings WHERE scope_id = %s AND member_id = %s"
)
# Every roster change bumps the generation in its own transaction; sends are
# fenced on it, so an actor that missed the change reloads instead of fanning
# out to a stale roster. The bump comes first: it locks the scope row, so no
# send commits between it and the interval bounds read from ``latest_seq``.
BUMP_ROSTER = """
UPDATE scopes SET roster_generation = roster_generation + 1 WHERE id = %s
RETURNING roster_generation
"""
SELECT_MEMBER_SCOPES = """
SELECT s.id, s.type, p.slug, coalesce(p.display_name, svc.display_name, t.title), s.latest_seq,
       m.last_read_seq, coalesce(n.state, 'active'),
       (SELECT count(*) FROM scope_messages x
        WHERE x.scope_id = s.id AND x.seq > m.last_read_seq
          AND x.author_member_id <> m.member_id
          -- A rewind's notice raises no unread (docs/rewind.md).
          AND x.message_type <> 'rewind_notice') AS unread,
       svc.id, svc.handle
FROM scope_memberships m
JOIN scopes s ON s.id = m.scope_id
LEFT JOIN scope_channel_profiles p ON p.scope_id = s.id
LEFT JOIN members svc ON s.type = 'service_account' AND svc.id = s.created_by_member_id
-- A task's name is its title (docs/tasks.md).
LEFT JOIN scope_task_profiles t ON t.scope_id = s.id
LEFT JOIN scope_notification_settings n ON n.scope_id = s.id AND n.member_id = m.member_id
WHERE m.member_id = %s AND m.effective_to_seq IS NULL AND s.type <> 'workflow'
ORDER BY s.latest_message_at DESC NULLS LAST, s.id
"""
SELECT_MEMBERS = f"""
SELECT {MEMBER_COLUMNS_M}, m.visibility, m.owner_member_id
FROM scope_memberships m JOIN members mem ON mem.id = m.member_id
WHERE m.scope_id = %s AND m.effective_to_seq IS NULL
ORDER BY mem.handle
"""
MARK_READ = """
UPDATE scope_memberships m
SET last_read_seq = greatest(m.last_read_seq, least(%(seq)s, s.latest_seq)),
    last_read_global_seq = greatest(m.last_read_global_seq, coalesce(
        (SELECT workspace_global_seq FROM scope_messages
         WHERE scope_id = s.id AND seq = least(%(seq)s, s.latest_seq)), 0)),
    updated_at = now()
FROM scopes s
WHERE s.id = m.scope_id AND m.scope_id = %(scope_id)s AND m.member_id = %(member_id)s
  AND m.effective_to_seq IS NULL
RETURNING m.last_read_seq
"""


@dataclass(frozen=True, slots=True)
class ScopeSummary:
    id: str
    type: str
    slug: str | None
    name: str | None
    latest_seq: int
    last_read_seq: int
    notification: str
    unread: int
    # A service account's conversation: the service member (its creator).
    service_member_id: str | None = None
    service_handle: str | None = None


@dataclass(frozen=True, slots=True)
class MemberListing:
    member: Member
    visibility: str
    owner_member_id: str | None


def scope_from_row(row: tuple[Any, ...]) -> ScopeInfo:
    return ScopeInfo(
        id=row[0],
        workspace_id=row[1],
        type=ScopeType(row[2]),
        latest_seq=row[3],
        parent_scope_id=row[4],
        root_message_id=row[5],
        slug=row[6],
        name=row[7],
        channel_visibility=row[8],
        roster_generation=row[9],
        channel_owner_id=row[10],
    )


async def get_scope(conn: TrioConnection, scope_id: str) -> ScopeInfo | None:
    with map_errors():
        cur = await conn.execute(SELECT_SCOPE, (scope_id,))
        row = await cur.fetchone()
    return scope_from_row(row) if row else None


async def roster_generation(conn: TrioConnection, scope_id: str) -> int:
    with map_errors():
        cur = await conn.execute(SELECT_GENERATION, (scope_id,))
        row = await cur.fetchone()
    if row is None:
        raise ScopeMissing(scope_id)
    return int(row[0])


async def channel_by_slug(conn: TrioConnection, workspace_id: str, slug: str) -> str | None:
    with map_errors():
        cur = await conn.execute(SELECT_CHANNEL_BY_SLUG, (workspace_id, slug))
        row = await cur.fetchone()
    return str(row[0]) if row else None


async def create_channel(
    conn: TrioConnection,
    *,
    creator: Member,
    slug: str,
    name: str,
    visibility: str,
    description: str,
    default: bool = False,
) -> str:
    """Scope + profile + the creator's membership, in one transaction."""
    scope_id = new_id("scp")
    profile = (scope_id, creator.workspace_id, slug, name, description, visibility, creator.id)
    with map_errors():
        async with conn.transaction():
            await conn.execute(
                INSERT_SCOPE,
                (scope_id, creator.workspace_id, "channel", None, creator.id, None, None),
            )
            await conn.execute(INSERT_PROFILE, (*profile, default))
            await _insert_membership(conn, scope_id, creator, "public", None)
    return scope_id


@dataclass(frozen=True, slots=True)
class AdminChannel:
    scope_id: str
    slug: str
    name: str
    visibility: str
    default: bool
    owner_member_id: str
    latest_seq: int
    members: int

    def view(self) -> dict[str, Any]:
        """As the admin page and ``admin list-channels`` show it."""
        return {
            "scopeId": self.scope_id,
            "slug": self.slug,
            "name": self.name,
            "visibility": self.visibility,
            "default": self.default,
            "ownerMemberId": self.owner_member_id,
            "memberCount": self.members,
        }


async def admin_channels(conn: TrioConnection, workspace_id: str) -> list[AdminChannel]:
    """Every channel of the workspace, private ones included (the operator's view)."""
    with map_errors():
        cur = await conn.execute(SELECT_ADMIN_CHANNELS, (workspace_id,))
        rows = await cur.fetchall()
    return [
        AdminChannel(
            scope_id=row[0],
            slug=row[1],
            name=row[2],
            visibility=row[3],
            default=bool(row[4]),
            owner_member_id=row[5],
            latest_seq=int(row[6]),
            members=int(row[7]),
        )
        for row in rows
    ]


async def _default_channels(conn: TrioConnection, workspace_id: str) -> list[str]:
    with map_errors():
        cur = await conn.execute(SELECT_DEFAULT_CHANNELS, (workspace_id,))
        return [str(row[0]) for row in await cur.fetchall()]


async def create_general(conn: TrioConnection, creator: Member) -> str:
    """The workspace's ``#general``: public, a default channel, founded by ``creator``."""
    return await create_channel(
        conn,
        creator=creator,
        slug="general",
        name="General",
        visibility="public",
        description="Everyone",
        default=True,
    )


async def _found_general(conn: TrioConnection, member: Member) -> str | None:
    """Create the workspace's ``#general`` with ``member`` as its founder;
    ``None`` when a ``#general`` exists or a concurrent creation founded it
    first (the slug's unique index waited for that commit)."""
    if await channel_by_slug(conn, member.workspace_id, "general") is not None:
        return None
    try:
        return await create_general(conn, member)
    except UniqueViolation:
        return None


async def join_on_creation(
    conn: TrioConnection, member: Member, extra: Sequence[str] = ()
) -> list[str]:
    """Join a member just created to its workspace's default channels and to
    ``extra`` (channel scope ids); the scope ids joined, in the caller's transaction.

    Humans and public agents get the defaults; a private agent enters channels
    only through its owner, and a service member only where it is put. A
    human also joins every service account's scope of its workspace. A
    workspace without a default gets ``#general`` (a default, founded by this
    member) so that every team has somewhere to start.
    """
    joined: list[str] = []
    if member.type in (MemberType.HUMAN, MemberType.AGENT) and not member.is_private_agent:
        defaults = await _default_channels(conn, member.workspace_id)
        if not defaults:
            founded = await _found_general(conn, member)
            if founded is not None:
                joined.append(founded)
            else:
                # Someone else's #general, possibly committed since the first
                # read (read committed: this read sees it): join it if default.
                defaults = await _default_channels(conn, member.workspace_id)
        extra = [*defaults, *extra]
    if member.type is MemberType.HUMAN:
        # Every human is in the audience of every service of its workspace.
        with map_errors():
            cur = await conn.execute(SELECT_SERVICE_SCOPES, (member.workspace_id,))
            extra = [*extra, *(str(row[0]) for row in await cur.fetchall())]
    for scope_id in dict.fromkeys(extra):
        if scope_id not in joined:
            await join(
                conn,
                scope_id,
                member,
                visibility="public",
                owner_member_id=None,
                state=NotificationState.ACTIVE,
            )
            joined.append(scope_id)
    return joined


async def get_or_create_dm(conn: TrioConnection, a: Member, b: Member) -> str:
    """The DM between two members (identity ``dm:`` + sorted ids), created with both.

    The caller checks :func:`actors.policy.can_open_dm` first; a private agent
    (only ever in its owner's DM) is a private member with its owner set.
    """
    identity = "dm:" + ":".join(sorted({a.id, b.id}))
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(
                INSERT_SCOPE, (new_id("scp"), a.workspace_id, "dm", identity, a.id, None, None)
            )
            created = await cur.fetchone()
            if created is not None:
                for member in {a.id: a, b.id: b}.values():
                    visibility, owner = dm_membership(member)
                    await _insert_membership(conn, str(created[0]), member, visibility, owner)
                return str(created[0])
            cur = await conn.execute(SELECT_BY_IDENTITY, (identity,))
            row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def get_or_create_thread(
    conn: TrioConnection, parent: ScopeInfo, root_message_id: str, creator: Member
) -> str:
    """The reply thread of ``root_message_id`` in ``parent``, created if missing.

    ``scopes_thread_root_idx`` makes creation race-safe: insert-or-nothing, then select.
    """
    with map_errors():
        cur = await conn.execute(
            INSERT_SCOPE,
            (
                new_id("scp"),
                parent.workspace_id,
                "thread",
                None,
                creator.id,
                parent.id,
                root_message_id,
            ),
        )
        created = await cur.fetchone()
        if created is not None:
            return str(created[0])
        cur = await conn.execute(SELECT_THREAD, (parent.id, root_message_id))
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def _insert_membership(
    conn: TrioConnection,
    scope_id: str,
    member: Member,
    visibility: str,
    owner_id: str | None,
    state: NotificationState = NotificationState.ACTIVE,
) -> RosterChange:
    generation = await _bump_roster(conn, scope_id)
    cur = await conn.execute(
        INSERT_MEMBERSHIP,
        {
            "scope_id": scope_id,
            "member_id": member.id,
            "visibility": visibility,
            "owner_id": owner_id,
        },
    )
    row = await cur.fetchone()
    if row is None:
        raise ScopeMissing(scope_id)
    await conn.execute(UPSERT_NOTIFICATION, (scope_id, member.id, state.value))
    return RosterChange(
        Membership(member.id, visibility, owner_id, row[0], None, row[1]), generation
    )


async def _bump_roster(conn: TrioConnection, scope_id: str) -> int:
    cur = await conn.execute(BUMP_ROSTER, (scope_id,))
    row = await cur.fetchone()
    if row is None:
        raise ScopeMissing(scope_id)
    return int(row[0])


async def join(
    conn: TrioConnection,
    scope_id: str,
    member: Member,
    *,
    visibility: str,
    owner_member_id: str | None,
    state: NotificationState,
) -> RosterChange:
    """Open a membership interval; the change carries the scope's new roster generation."""
    with map_errors():
        async with conn.transaction():
            return await _insert_membership(
                conn, scope_id, member, visibility, owner_member_id, state
            )


async def leave(conn: TrioConnection, scope_id: str, member_id: str) -> RosterChange:
    """Close the member's interval (no membership in the change when it had none),
    and its memberships of every thread under the scope."""
    with map_errors():
        async with conn.transaction():
            generation = await _bump_roster(conn, scope_id)
            keys = {"scope_id": scope_id, "member_id": member_id}
            cur = await conn.execute(CLOSE_MEMBERSHIP, keys)
            row = await cur.fetchone()
            await conn.execute(CLOSE_THREAD_MEMBERSHIPS, keys)
            if row is None:
                return RosterChange(None, generation)
            await conn.execute(DELETE_NOTIFICATION, (scope_id, member_id))
    return RosterChange(Membership(member_id, row[0], row[1], row[2], row[3], row[4]), generation)


async def set_notification(
    conn: TrioConnection, scope_id: str, member_id: str, state: NotificationState
) -> int:
    """Store the setting (it decides wakes); returns the scope's new roster generation."""
    with map_errors():
        async with conn.transaction():
            generation = await _bump_roster(conn, scope_id)
            await conn.execute(UPSERT_NOTIFICATION, (scope_id, member_id, state.value))
    return generation


async def mark_read(conn: TrioConnection, scope_id: str, member_id: str, seq: int) -> int | None:
    with map_errors():
        cur = await conn.execute(
            MARK_READ, {"scope_id": scope_id, "member_id": member_id, "seq": seq}
        )
        row = await cur.fetchone()
    return int(row[0]) if row else None


async def scopes_of_member(conn: TrioConnection, member_id: str) -> list[ScopeSummary]:
    with map_errors():
        cur = await conn.execute(SELECT_MEMBER_SCOPES, (member_id,))
        rows = await cur.fetchall()
    return [ScopeSummary(*row) for row in rows]


async def current_members(conn: TrioConnection, scope_id: str) -> list[MemberListing]:
    with map_errors():
        cur = await conn.execute(SELECT_MEMBERS, (scope_id,))
        rows = await cur.fetchall()
    return [MemberListing(member_from_row(row[:7]), row[7], row[8]) for row in rows]


# The channel browser: public channels of the workspace, and private ones only
# where the viewer holds a current membership. Member counts are of current
# public memberships: a private agent's membership is never revealed.
SELECT_CHANNELS = """
SELECT s.id, p.slug, p.display_name, p.description, p.visibility,
       (SELECT count(*) FROM scope_memberships c
        WHERE c.scope_id = s.id AND c.effective_to_seq IS NULL AND c.visibility = 'public'),
       EXISTS (SELECT 1 FROM scope_memberships j
               WHERE j.scope_id = s.id AND j.member_id = %(member_id)s
                 AND j.effective_to_seq IS NULL)
FROM scope_channel_profiles p
JOIN scopes s ON s.id = p.scope_id
WHERE p.workspace_id = %(workspace_id)s AND s.type = 'channel'
  AND (p.visibility = 'public' OR EXISTS (
        SELECT 1 FROM scope_memberships v
        WHERE v.scope_id = s.id AND v.member_id = %(member_id)s
          AND v.effective_to_seq IS NULL))
ORDER BY p.slug
"""
# Members of the workspace a viewer may name: humans, public agents and service
# members; a private agent only to its owner (and to itself).
SELECT_PEOPLE = """
SELECT mem.id, mem.handle, mem.display_name, mem.type, mem.owner_member_id, mem.is_private,
       mem.avatar_color
FROM members mem
WHERE mem.workspace_id = %(workspace_id)s AND mem.status = 'active'
  AND (NOT mem.is_private OR mem.owner_member_id = %(member_id)s OR mem.id = %(member_id)s)
ORDER BY mem.handle
"""


@dataclass(frozen=True, slots=True)
class BrowsedChannel:
    id: str
    slug: str
    name: str
    description: str
    visibility: str
    member_count: int
    joined: bool


@dataclass(frozen=True, slots=True)
class PersonListing:
    id: str
    handle: str
    display_name: str
    type: str
    owner_member_id: str | None
    private: bool
    avatar_color: str | None = None


async def channels_for(conn: TrioConnection, viewer: Member) -> list[BrowsedChannel]:
    """Channels of the viewer's workspace it may see, by slug."""
    keys = {"workspace_id": viewer.workspace_id, "member_id": viewer.id}
    with map_errors():
        cur = await conn.execute(SELECT_CHANNELS, keys)
        rows = await cur.fetchall()
    return [BrowsedChannel(*row) for row in rows]


async def people_for(conn: TrioConnection, viewer: Member) -> list[PersonListing]:
    """Active members of the viewer's workspace it may see, by handle."""
    keys = {"workspace_id": viewer.workspace_id, "member_id": viewer.id}
    with map_errors():
        cur = await conn.execute(SELECT_PEOPLE, keys)
        rows = await cur.fetchall()
    return [PersonListing(*row) for row in rows]
