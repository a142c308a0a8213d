"""Attachments: upload rows, reservations by a send, reads, release and sweep.

The lifecycle (docs/design.md#attachments):

- **Upload.** The bytes are staged and hashed while they arrive, then one
  transaction inserts the row and files the blob under its hash, unless the
  uploader's unclaimed uploads would go over its quota (:func:`create`).
- **Reserve.** Before a send reaches its scope's actor, the node reserves the
  uploads it names for that send (``claim_key`` = scope and
  ``clientMessageId``): only the sender's own, unclaimed uploads, not
  reserved by another send in the last :data:`RESERVATION` (a retry of the
  same send passes, and so does one whose uploads it already claimed). A
  second send of the same upload is refused at once instead of being stored
  without it.
- **Claim.** The send's statement (``storage/applier.py``) sets
  ``message_id``/``scope_id`` on the uploads named in the message's
  ``metadata.attachmentIds`` that are still the author's and unclaimed.
- **Read.** A claimed upload is read by whoever reads its message (the one
  SQL predicate); an unclaimed one by its uploader only.
- **Release and sweep.** :func:`release_attachments` (a message deleted)
  makes its uploads unreadable at once; :func:`sweep` removes released rows
  and unclaimed uploads older than :data:`UNCLAIMED_TTL`, and each blob once
  no row names it any more.

A blob is shared by every row with its hash. Whoever inserts or removes a row
of a hash holds ``pg_advisory_xact_lock`` on the hash while it touches the
blob, so a sweep that finds a hash unreferenced cannot delete the file under
an upload that is just adding a row for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from actors.ids import new_id
from actors.model import Member
from storage import access, messages, scopes
from storage.blobs import BlobStore, StagedBlob
from storage.errors import map_errors
from storage.pg import TrioConnection

ID_PREFIX = "att_"
UNCLAIMED_TTL = timedelta(hours=24)
# How long a send's reservation keeps other sends off an upload. A send
# commits in milliseconds; one that failed and is never retried frees its
# uploads after this.
RESERVATION = timedelta(minutes=5)
SWEEP_BATCH = 100
# What the least upload counts for against a quota: a file costs at least a
# disk block and a row, so a quota also bounds how many files a member keeps.
MIN_CHARGE = 4096

_COLUMNS = """id, workspace_id, scope_id, message_id, uploaded_by_member_id, storage_driver,
storage_object_key, filename, content_type, byte_size, created_at, released_at"""

INSERT = f"""
INSERT INTO attachments (id, workspace_id, uploaded_by_member_id, storage_driver,
    storage_object_key, filename, content_type, byte_size)
VALUES (%(id)s, %(workspace_id)s, %(uploader_id)s, %(driver)s, %(digest)s, %(name)s,
    %(content_type)s, %(size)s)
RETURNING {_COLUMNS}
"""
SELECT = f"SELECT {_COLUMNS} FROM attachments WHERE id = %s"
LOCK_BLOB = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
# Serialises one member's uploads while its quota is checked and its row added.
LOCK_UPLOADER = "SELECT pg_advisory_xact_lock(hashtextextended('uploader:' || %s, 0))"

# A member's uploads no message has claimed yet: the bytes they count, and the
# seconds until the oldest of them is past its time (the sweeper takes it then).
UNCLAIMED_USAGE = """
SELECT coalesce(sum(greatest(byte_size, %(min_charge)s)), 0),
       extract(epoch FROM min(created_at) + %(ttl)s::interval - now())
FROM attachments
WHERE uploaded_by_member_id = %(member_id)s AND message_id IS NULL AND released_at IS NULL
"""

# The uploads a send may claim: reserved for it now, or already claimed by
# this very send (a retry answered already_sent). A chunked send stores its
# first row, which carries the attachments, as ``<clientMessageId>#0``.
RESERVE = f"""
WITH wanted AS (
    SELECT DISTINCT unnest(%(ids)s::text[]) AS id
), reserved AS (
    UPDATE attachments a
    SET claim_key = %(key)s, claim_reserved_at = now()
    WHERE a.id IN (SELECT id FROM wanted)
      AND a.uploaded_by_member_id = %(author_id)s
      AND a.message_id IS NULL AND a.released_at IS NULL
      AND (a.claim_key IS NULL OR a.claim_key = %(key)s
           OR a.claim_reserved_at < now() - %(reservation)s::interval)
    RETURNING {_COLUMNS}
), claimed AS (
    SELECT {", ".join("a." + c.strip() for c in _COLUMNS.split(","))}
    FROM attachments a JOIN scope_messages m ON m.id = a.message_id
    WHERE a.id IN (SELECT id FROM wanted)
      AND a.uploaded_by_member_id = %(author_id)s AND a.released_at IS NULL
      AND m.scope_id = %(scope_id)s AND m.author_member_id = %(author_id)s
      AND m.client_message_id IN (%(client_message_id)s, %(client_message_id)s || '#0')
)
SELECT * FROM reserved UNION ALL SELECT * FROM claimed
"""

RELEASE = """
UPDATE attachments SET released_at = now()
WHERE message_id = %s AND released_at IS NULL
"""

# Rows the sweeper removes: released ones, and uploads nobody claimed in time.
# SKIP LOCKED: nodes sharing the database sweep disjoint batches.
SWEEP_ROWS = """
WITH released AS (
    SELECT id FROM attachments WHERE released_at IS NOT NULL
    ORDER BY released_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT id FROM attachments
    WHERE message_id IS NULL AND created_at < now() - %(ttl)s::interval
    ORDER BY created_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
)
DELETE FROM attachments
WHERE id IN (SELECT id FROM released) OR id IN (SELECT id FROM expired)
RETURNING storage_driver, storage_object_key
"""
REFERENCED = (
    "SELECT EXISTS (SELECT 1 FROM attachments "
    "WHERE storage_driver = %s AND storage_object_key = %s)"
)


@dataclass(frozen=True, slots=True)
class Attachment:
    id: str
    workspace_id: str
    scope_id: str | None
    message_id: str | None
    uploader_id: str
    driver: str
    digest: str
    name: str
    content_type: str
    size: int
    created_at: datetime
    released_at: datetime | None

    def view(self) -> dict[str, Any]:
        """What a message carries for this upload (``attachments[i]``)."""
        return {
            "id": self.id,
            "name": self.name,
            "contentType": self.content_type,
            "size": self.size,
        }


@dataclass(frozen=True, slots=True)
class Usage:
    """A member's unclaimed uploads: bytes counted against its quota, and the
    seconds until the oldest expires (None when it has none)."""

    charged: int
    expires_in: float | None


class QuotaExceeded(Exception):
    """The upload would take its uploader's unclaimed bytes over the quota."""

    def __init__(self, usage: Usage, quota: int) -> None:
        super().__init__(f"unclaimed uploads are limited to {quota} bytes per member")
        self.usage = usage
        self.quota = quota


def charge_of(size: int) -> int:
    """What an upload of ``size`` bytes counts against a quota."""
    return max(size, MIN_CHARGE)


def _row(row: Sequence[Any]) -> Attachment:
    return Attachment(
        id=row[0],
        workspace_id=row[1],
        scope_id=row[2],
        message_id=row[3],
        uploader_id=row[4],
        driver=row[5],
        digest=row[6],
        name=row[7],
        content_type=row[8],
        size=int(row[9]),
        created_at=row[10],
        released_at=row[11],
    )


def _interval(value: timedelta) -> str:
    return f"{value.total_seconds()} seconds"


async def create(
    conn: TrioConnection,
    blobs: BlobStore,
    staged: StagedBlob,
    *,
    digest: str,
    workspace_id: str,
    uploader_id: str,
    name: str,
    content_type: str,
    size: int,
    quota: int | None = None,
) -> Attachment:
    """Insert the row of a staged upload and file its blob, atomically enough:
    the row commits only once the blob is in place (a commit that fails after
    it leaves a blob no row names, which costs disk, never a broken row).

    With a ``quota``, raises :class:`QuotaExceeded` instead when the uploader's
    unclaimed uploads and this one would count more than ``quota`` bytes; the
    check and the insert are serialised per uploader, across nodes."""
    params = {
        "id": new_id("att"),
        "workspace_id": workspace_id,
        "uploader_id": uploader_id,
        "driver": blobs.driver,
        "digest": digest,
        "name": name,
        "content_type": content_type,
        "size": size,
    }
    with map_errors():
        async with conn.transaction():
            if quota is not None:
                await conn.execute(LOCK_UPLOADER, (uploader_id,))
                usage = await _usage(conn, uploader_id)
                if usage.charged + charge_of(size) > quota:
                    raise QuotaExceeded(usage, quota)
            await conn.execute(LOCK_BLOB, (digest,))
            cur = await conn.execute(INSERT, params)
            row = await cur.fetchone()
            assert row is not None
            await blobs.put(staged, digest)
    return _row(row)


async def unclaimed_usage(conn: TrioConnection, member_id: str) -> Usage:
    """What ``member_id``'s unclaimed uploads count against its quota."""
    with map_errors():
        return await _usage(conn, member_id)


async def _usage(conn: TrioConnection, member_id: str) -> Usage:
    params = {"member_id": member_id, "min_charge": MIN_CHARGE, "ttl": _interval(UNCLAIMED_TTL)}
    cur = await conn.execute(UNCLAIMED_USAGE, params)
    row = await cur.fetchone()
    assert row is not None
    return Usage(int(row[0]), None if row[1] is None else float(row[1]))


async def get(conn: TrioConnection, attachment_id: str) -> Attachment | None:
    with map_errors():
        cur = await conn.execute(SELECT, (attachment_id,))
        row = await cur.fetchone()
    return _row(row) if row else None


async def reserve_for_send(
    conn: TrioConnection,
    *,
    author_id: str,
    scope_id: str,
    client_message_id: str,
    attachment_ids: Sequence[str],
) -> dict[str, Attachment]:
    """Reserve the uploads a send names; returns those it may claim, by id.

    An id missing from the answer is unknown, someone else's, already claimed
    by another message, released, or reserved by another send.
    """
    params = {
        "ids": list(attachment_ids),
        "key": f"{scope_id}\n{client_message_id}",
        "author_id": author_id,
        "scope_id": scope_id,
        "client_message_id": client_message_id,
        "reservation": _interval(RESERVATION),
    }
    with map_errors():
        cur = await conn.execute(RESERVE, params)
        rows = await cur.fetchall()
    return {found.id: found for found in map(_row, rows)}


async def readable_attachment(
    conn: TrioConnection, attachment_id: str, member: Member
) -> Attachment | None:
    """The upload if ``member`` may download it, else None (whatever the reason).

    A claimed upload is read through its message and the one readable
    predicate (``storage/visibility.py``); an unclaimed one by its uploader.
    """
    found = await get(conn, attachment_id)
    if found is None or found.released_at is not None:
        return None
    if found.workspace_id != member.workspace_id:
        return None
    if found.message_id is None or found.scope_id is None:
        return found if found.uploader_id == member.id else None
    info = await scopes.get_scope(conn, found.scope_id)
    if info is None:
        return None
    viewer = await access.viewer_for(conn, info, member)
    if viewer is None:
        return None
    readable = await messages.readable_message(conn, info.id, found.message_id, viewer)
    # A tombstone's files are gone with it, even before its uploads are released.
    if readable is None or readable.message.deleted_at is not None:
        return None
    return found


async def release_attachments(conn: TrioConnection, message_id: str) -> int:
    """Drop the claims of a deleted message: its uploads answer 404 from now on
    and the sweeper removes them (and their bytes, once no other upload has the
    same content). Returns how many uploads were released.

    The delete statement (``storage.mutations.DELETE_MESSAGE``) releases its
    message's uploads itself, in the same statement; this is for maintenance
    and tests. It writes no file; idempotent.
    """
    with map_errors():
        cur = await conn.execute(RELEASE, (message_id,))
    return max(cur.rowcount, 0)


async def sweep(
    conn: TrioConnection,
    blobs: BlobStore,
    *,
    ttl: timedelta = UNCLAIMED_TTL,
    batch: int = SWEEP_BATCH,
) -> int:
    """Remove one batch of released and expired unclaimed uploads; returns the
    number of rows removed (call again while it is ``batch`` or more)."""
    removed = 0
    with map_errors():
        async with conn.transaction():
            cur = await conn.execute(SWEEP_ROWS, {"batch": batch, "ttl": _interval(ttl)})
            rows = await cur.fetchall()
            removed = len(rows)
            # Sorted: two sweepers lock shared hashes in one order.
            for driver, digest in sorted({(str(d), str(k)) for d, k in rows}):
                if driver != blobs.driver:
                    continue
                await conn.execute(LOCK_BLOB, (digest,))
                cur = await conn.execute(REFERENCED, (driver, digest))
                row = await cur.fetchone()
                if row is not None and not row[0]:
                    await blobs.delete(digest)
    return removed
