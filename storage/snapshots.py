"""What a scope actor caches, read from the database: its snapshot, and the send lock.

The snapshot (scope, memberships and their members, notification settings,
private grants, the recent tail with its idempotency records and, for a
thread, the parent's side) is read in one repeatable-read transaction, or
inside a transaction that holds :func:`lock_for_send`'s locks. Membership
intervals are interned: a channel's roster is cached by its own actor and by
each of its threads' actors.
"""

from __future__ import annotations

from typing import Any

from actors.lru import Lru
from actors.model import (
    IdempotencyRecord,
    Member,
    Membership,
    NotificationState,
    PrivateGrant,
    ScopeInfo,
    ScopeSnapshot,
    StoredMessage,
    ThreadContext,
)
from actors.ports import ScopeMissing
from storage.directory import member_from_row
from storage.errors import map_errors
from storage.messages import SELECT_MESSAGE, message_from_row
from storage.pg import TrioConnection
from storage.scopes import MEMBER_COLUMNS_M, SCOPE_COLUMNS, SELECT_GENERATION, scope_from_row

# The snapshot's first statement also reads the database clock: everything the
# snapshot sees was committed before it, so the actor's clock starts after every
# grant timestamp it loads (see ``actors/clock.py``).
SNAPSHOT_SCOPE = f"""
SELECT {SCOPE_COLUMNS}, clock_timestamp()
FROM scopes s LEFT JOIN scope_channel_profiles p ON p.scope_id = s.id
WHERE s.id = %s
"""
SELECT_MEMBERSHIPS = f"""
SELECT m.member_id, m.visibility, m.owner_member_id, m.effective_from_seq,
       m.effective_to_seq, m.last_read_seq, {MEMBER_COLUMNS_M}
FROM scope_memberships m JOIN members mem ON mem.id = m.member_id
WHERE m.scope_id = %s
ORDER BY m.effective_from_seq, m.id
"""
# The parent of a thread: its current memberships (public ones read the thread,
# private ones are the only private agents that may be admitted).
SELECT_PARENT_ROSTER = f"""
SELECT m.member_id, m.visibility, m.owner_member_id, m.effective_from_seq,
       m.effective_to_seq, m.last_read_seq, {MEMBER_COLUMNS_M}
FROM scope_memberships m JOIN members mem ON mem.id = m.member_id
WHERE m.scope_id = %s AND m.effective_to_seq IS NULL
ORDER BY m.effective_from_seq, m.id
"""
SELECT_NOTIFICATION = "SELECT member_id, state FROM scope_notification_settings WHERE scope_id = %s"
SELECT_GRANTS = """
SELECT id, scope_id, owner_member_id, grantee_member_id, created_at, expires_at, revoked_at
FROM scope_private_grants WHERE scope_id = ANY(%s)
ORDER BY created_at, id
"""
SELECT_RECENT = f"""
SELECT m.id, m.seq, m.workspace_global_seq, m.message_type, m.content, m.created_at,
       m.client_message_id, m.idempotency_payload_digest, {MEMBER_COLUMNS_M}
FROM scope_messages m JOIN members mem ON mem.id = m.author_member_id
WHERE m.scope_id = %s
ORDER BY m.seq DESC
LIMIT %s
"""

# A channel's roster is cached by its own actor and by each of its threads'
# actors: those share one object per membership interval.
MEMBERSHIPS_INTERNED = 100_000
_memberships: Lru[tuple[Any, ...], Membership] = Lru("memberships_interned", MEMBERSHIPS_INTERNED)


def _membership_from_row(row: tuple[Any, ...]) -> Membership:
    key = tuple(row[:6])
    return _memberships.intern(key, lambda: Membership(*key))


async def load_snapshot(conn: TrioConnection, scope_id: str, *, recent: int) -> ScopeSnapshot:
    """Everything a scope actor caches, read in one repeatable-read transaction."""
    with map_errors():
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return await read_snapshot(conn, scope_id, recent=recent)


# A send decided under these locks cannot lose its fence to another writer:
# every change a snapshot depends on bumps the scope's row or, for a thread,
# its parent's. The parent is locked first, as a parent's leave does.
LOCK_PARENT_FOR_SEND = """
SELECT 1 FROM scopes
WHERE id = (SELECT parent_scope_id FROM scopes WHERE id = %s)
FOR SHARE
"""
LOCK_FOR_SEND = "SELECT 1 FROM scopes WHERE id = %s FOR NO KEY UPDATE"


async def lock_for_send(conn: TrioConnection, scope_id: str) -> None:
    """Inside the caller's transaction: keep every other writer off the scope
    (and off a thread's parent roster) until it ends."""
    with map_errors():
        await conn.execute(LOCK_PARENT_FOR_SEND, (scope_id,))
        cur = await conn.execute(LOCK_FOR_SEND, (scope_id,))
        if await cur.fetchone() is None:
            raise ScopeMissing(scope_id)


async def read_snapshot(conn: TrioConnection, scope_id: str, *, recent: int) -> ScopeSnapshot:
    """``load_snapshot``'s reads, inside the caller's transaction: one that is
    repeatable-read, or holds :func:`lock_for_send`'s locks."""
    with map_errors():
        cur = await conn.execute(SNAPSHOT_SCOPE, (scope_id,))
        row = await cur.fetchone()
        if row is None:
            raise ScopeMissing(scope_id)
        scope = scope_from_row(row)
        db_now = row[-1]
        cur = await conn.execute(SELECT_MEMBERSHIPS, (scope_id,))
        membership_rows = await cur.fetchall()
        cur = await conn.execute(SELECT_NOTIFICATION, (scope_id,))
        notification = {r[0]: NotificationState(r[1]) for r in await cur.fetchall()}
        grant_scopes = [scope_id] + ([scope.parent_scope_id] if scope.parent_scope_id else [])
        cur = await conn.execute(SELECT_GRANTS, (grant_scopes,))
        grants = tuple(PrivateGrant(*r) for r in await cur.fetchall())
        cur = await conn.execute(SELECT_RECENT, (scope_id, recent))
        recent_rows = await cur.fetchall()
        thread = await _thread_context(conn, scope) if scope.parent_scope_id else None
    members: dict[str, Member] = {}
    memberships = []
    for r in membership_rows:
        members[r[0]] = member_from_row(r[6:13])
        memberships.append(_membership_from_row(r))
    messages = []
    idempotency = {}
    for r in reversed(recent_rows):
        author = member_from_row(r[8:15])
        members.setdefault(author.id, author)
        messages.append(
            StoredMessage(
                id=r[0],
                scope_id=scope_id,
                seq=r[1],
                global_seq=r[2],
                author=author,
                message_type=r[3],
                content=r[4],
                created_at=r[5],
                client_message_id=r[6],
            )
        )
        if r[6] is not None:
            idempotency[(author.id, r[6])] = IdempotencyRecord(r[0], r[1], bytes(r[7]))
    return ScopeSnapshot(
        scope=scope,
        memberships=tuple(memberships),
        members=members,
        notification=notification,
        grants=grants,
        recent=tuple(messages),
        idempotency=idempotency,
        thread=thread,
        db_now=db_now,
    )


async def _thread_context(conn: TrioConnection, scope: ScopeInfo) -> ThreadContext:
    """The parent side of a thread (inside the snapshot's transaction)."""
    assert scope.parent_scope_id is not None
    cur = await conn.execute(SELECT_GENERATION, (scope.parent_scope_id,))
    generation = await cur.fetchone()
    assert generation is not None
    cur = await conn.execute(SELECT_PARENT_ROSTER, (scope.parent_scope_id,))
    members: dict[str, Member] = {}
    memberships = []
    for r in await cur.fetchall():
        members[r[0]] = member_from_row(r[6:13])
        memberships.append(_membership_from_row(r))
    root = None
    if scope.root_message_id is not None:
        cur = await conn.execute(SELECT_MESSAGE, (scope.root_message_id,))
        row = await cur.fetchone()
        if row is not None and row[1] == scope.parent_scope_id:
            root = message_from_row(row)
    return ThreadContext(
        parent_scope_id=scope.parent_scope_id,
        parent_generation=int(generation[0]),
        root=root,
        parent_memberships=tuple(memberships),
        parent_members=members,
    )
