"""Attachments over HTTP: ``POST /v1/attachments``, ``GET /v1/attachments/<id>``
and ``POST /v1/attachments/<id>/link`` (a signed link, :mod:`node.attachment_links`).

Both stream (docs/design.md#attachments). An upload is hashed and written to
a staging file in chunks as it arrives, so the node holds at most a few
hundred KiB of it whatever its size; one above the limit is answered ``413``
before its body is read (``Content-Length`` up front, a chunked body at the
limit). A download is sent from the blob in chunks. Every error body is
``{"code", "message"}`` (with ``details`` when there are any); a download the
member may not read is ``404``, like an id that does not exist.

What one member may upload (docs/security.md#uploads): uploads in progress
and a byte rate on this node (:mod:`node.upload_gate`), and a quota of
unclaimed bytes in the database, each answered ``429`` with ``Retry-After``
before the body is read; and a deadline, ``UploadSettings.grace`` plus one
second per ``min_rate`` bytes received, besides the idle timeout between two
reads (``408``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import h11
import structlog
import trio

from actors.model import Member
from node import attachment_links
from node.config import UploadSettings
from node.services import Services
from node.upload_gate import Limit, Refusal
from node.views import rfc3339
from protocol.text import TextKind, text_problem
from storage import attachments, directory
from storage.blobs import BlobStore, FilesystemBlobStore, StagedBlob
from storage.errors import StorageError

log = structlog.get_logger(__name__)

PREFIX = "/v1/attachments"
LINK_SUFFIX = "/link"
# Shown in the browser rather than saved: the browser's own viewer, no page
# of this origin. SVG is not among them: it is a document that can run script.
INLINE_TYPES = frozenset(
    [
        "application/pdf",
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/avif",
        "image/bmp",
    ]
)
# Nothing a file holds runs as a page of this origin. A PDF drops ``sandbox``:
# Chromium does not start its PDF viewer in a sandboxed document, and the
# viewer runs apart from the origin anyway.
DOWNLOAD_POLICY = b"default-src 'none'; sandbox"
PDF_POLICY = b"default-src 'none'; frame-ancestors 'none'"
RECEIVE_BYTES = 64 * 1024
# Bytes gathered before one write to the staging file (one thread hop each).
# The file is created at the first write, so an upload holds no file before
# this much has arrived.
WRITE_BYTES = 256 * 1024
# After answering early (401, 413, …) the rest of the body is read and thrown
# away for a moment before closing, so that the close does not reset the
# connection under the answer before the client has read it.
LINGER_SECONDS = 1.0
LINGER_BYTES = 1024 * 1024
SWEEP_INTERVAL = 600.0
MAX_NAME = 255
MAX_CONTENT_TYPE = 255
DEFAULT_CONTENT_TYPE = "application/octet-stream"
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_CONTENT_TYPE = re.compile(rf"^{_TOKEN}/{_TOKEN}(\s*;[\x20-\x7e]*)?$")
_REASONS = {
    200: b"OK",
    201: b"Created",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    503: b"Service Unavailable",
}


class HttpError(Exception):
    """An answer other than success; ``retry_after`` (seconds) becomes the
    ``Retry-After`` header and ``details.retryAfterMs``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details or {})
        # Whole seconds in the header (rounded up); milliseconds in the body.
        self.retry_after: int | None = None
        if retry_after is not None:
            self.retry_after = max(1, math.ceil(retry_after))
            self.details["retryAfterMs"] = max(1, math.ceil(retry_after * 1000))


@cache
def blob_store(root: Path) -> BlobStore:
    """The node's blob driver for ``root`` (the filesystem driver)."""
    return FilesystemBlobStore(root)


def is_attachment_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


async def handle(
    services: Services, stream: trio.SocketStream, http: h11.Connection, request: h11.Request
) -> None:
    """Answer one attachments request on ``stream`` (then the caller closes it)."""
    target = urlsplit(request.target.decode("latin-1"))
    try:
        if services.draining or not services.ready:
            raise HttpError(503, "unavailable", "the node is not serving; retry")
        if target.path == PREFIX:
            if request.method != b"POST":
                raise HttpError(405, "method_not_allowed", "POST an upload here")
            await upload(services, stream, http, request, target.query)
        elif target.path.endswith(LINK_SUFFIX):
            if request.method != b"POST":
                raise HttpError(405, "method_not_allowed", "POST for a download link")
            attachment_id = target.path[len(PREFIX) + 1 : -len(LINK_SUFFIX)]
            await issue_link(services, stream, http, request, attachment_id)
        else:
            if request.method not in (b"GET", b"HEAD"):
                raise HttpError(405, "method_not_allowed", "GET an attachment")
            attachment_id = target.path[len(PREFIX) + 1 :]
            await download(services, stream, http, request, attachment_id, target.query)
    except HttpError as exc:
        await _answer_early(stream, http, exc)
    except StorageError as exc:
        log.warning("attachment_storage_failed", code=exc.code)
        await _answer_early(stream, http, HttpError(503, "unavailable", "storage unavailable"))


async def sweep_forever(
    services: Services,
    interval: float = SWEEP_INTERVAL,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The node's sweeper: released uploads, unclaimed ones older than a day,
    and staging files of uploads cut off by a crash. Nodes sharing a database
    and a directory sweep disjoint batches (``storage.attachments.sweep``).

    Started, it has made the store private (folders 0700) and removed the
    staging files no live upload holds."""
    blobs = blob_store(services.settings.attachments_path)
    ttl = attachments.UNCLAIMED_TTL
    await blobs.prepare()
    staged = await blobs.sweep_staging(ttl.total_seconds())
    if staged:
        log.info("attachment_staging_swept", removed=staged)
    task_status.started()
    while True:
        await trio.sleep(interval)
        try:
            removed = 0
            async with services.pool.connection() as conn:
                while (batch := await attachments.sweep(conn, blobs, ttl=ttl)) > 0:
                    removed += batch
                    if batch < attachments.SWEEP_BATCH:
                        break
            staged = await blobs.sweep_staging(ttl.total_seconds())
            if removed or staged:
                log.info("attachments_swept", removed=removed, staging=staged)
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            # The next round tries again; nothing is lost by waiting.
            log.warning("attachment_sweep_failed", error=repr(exc))


# ------------------------------------------------------------------ upload


async def upload(
    services: Services,
    stream: trio.SocketStream,
    http: h11.Connection,
    request: h11.Request,
    query: str,
) -> None:
    settings = services.settings
    member = await _authenticate(services, request)
    name = _file_name(query)
    content_type = _content_type(request)
    limit = settings.max_attachment_bytes
    declared = _content_length(request)
    if declared is not None and declared > limit:
        raise HttpError(413, "payload_too_large", f"uploads are limited to {limit} bytes")
    limits = settings.uploads
    gate = services.uploads
    # Paid up front: the bytes it declares (at least a block); a chunked body
    # pays the rest as it arrives.
    paid = attachments.charge_of(declared or 0)
    refusal = gate.admit(member.id, paid, limits, trio.current_time())
    if refusal is not None:
        raise _refused(refusal, limits)
    refund = paid
    try:
        await _check_quota(services, member, paid, limits)
        refund = 0
        if http.they_are_waiting_for_100_continue:
            response = h11.InformationalResponse(status_code=100, headers=[])
            await stream.send_all(http.send(response))

        charged = paid

        def charge(received: int) -> None:
            nonlocal charged
            if received > charged:
                gate.charge(member.id, received - charged, limits, trio.current_time())
                charged = received

        stored = await _store(services, member, stream, http, name, content_type, charge)
    finally:
        gate.release(member.id, refund)
    log.info("attachment_uploaded", attachment_id=stored.id, size=stored.size)
    await _send_json(stream, http, 201, {"attachmentId": stored.id, **_public(stored.view())})


async def _store(
    services: Services,
    member: Member,
    stream: trio.SocketStream,
    http: h11.Connection,
    name: str,
    content_type: str,
    charge: Callable[[int], None],
) -> attachments.Attachment:
    settings = services.settings
    limits = settings.uploads
    staging = _Staging(blob_store(settings.attachments_path))
    try:
        digest, size = await _receive_body(
            stream, http, staging, settings.max_attachment_bytes, limits, charge
        )
        staged = await staging.ready()
        async with services.pool.connection() as conn:
            return await attachments.create(
                conn,
                staging.blobs,
                staged,
                digest=digest,
                workspace_id=member.workspace_id,
                uploader_id=member.id,
                name=name,
                content_type=content_type,
                size=size,
                quota=limits.quota,
            )
    except attachments.QuotaExceeded as exc:
        raise _over_quota(exc.usage, exc.quota) from None
    finally:
        with trio.CancelScope(shield=True):
            await staging.discard()


def _public(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k != "id"}


def _refused(refusal: Refusal, limits: UploadSettings) -> HttpError:
    if refusal.limit is Limit.UPLOADS:
        message = f"at most {limits.per_member} uploads at once; retry when one is done"
    else:
        message = f"uploads are limited to {limits.rate} bytes/s per member; retry later"
    details = {"limit": str(refusal.limit)}
    return HttpError(429, "rate_limited", message, details=details, retry_after=refusal.wait)


async def _check_quota(
    services: Services, member: Member, paid: int, limits: UploadSettings
) -> None:
    """Refuse before the body is read what the quota cannot take; the insert
    checks again (:func:`storage.attachments.create`)."""
    if paid > limits.quota:
        raise HttpError(
            413,
            "payload_too_large",
            f"unclaimed uploads are limited to {limits.quota} bytes per member",
        )
    async with services.pool.connection() as conn:
        usage = await attachments.unclaimed_usage(conn, member.id)
    if usage.charged + paid > limits.quota:
        raise _over_quota(usage, limits.quota)


def _over_quota(usage: attachments.Usage, quota: int) -> HttpError:
    # Room comes back when the member sends the uploads it has, or when the
    # oldest expires and the next sweep takes it.
    expires_in = usage.expires_in
    wait = expires_in if expires_in is not None and expires_in > 0 else SWEEP_INTERVAL
    return HttpError(
        429,
        "rate_limited",
        f"unclaimed uploads are limited to {quota} bytes per member; "
        "attach the ones uploaded to a message, or retry later",
        details={"limit": "quota", "quota": quota, "unclaimed": usage.charged},
        retry_after=wait,
    )


class _Staging:
    """The staging file of one upload, created at its first write: an upload
    that has sent less than ``WRITE_BYTES`` holds its connection only."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.staged: StagedBlob | None = None

    async def write(self, data: bytes) -> None:
        if self.staged is None:
            self.staged = await self.blobs.stage()
        await self.staged.write(data)

    async def ready(self) -> StagedBlob:
        """The staged blob (an empty one for an empty body)."""
        if self.staged is None:
            self.staged = await self.blobs.stage()
        return self.staged

    async def discard(self) -> None:
        if self.staged is not None:
            await self.staged.discard()


async def _receive_body(
    stream: trio.SocketStream,
    http: h11.Connection,
    staging: _Staging,
    limit: int,
    limits: UploadSettings,
    charge: Callable[[int], None],
) -> tuple[str, int]:
    """Hash and stage the body as it arrives; (SHA-256 hex, size).

    Cut with ``408`` when nothing arrives for ``limits.idle_timeout``, and
    when the body falls behind its deadline: ``limits.grace`` seconds after
    the start plus one second per ``limits.min_rate`` bytes received, which
    ends an upload that trickles a byte now and then after the grace.
    """
    hasher = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    pending_bytes = 0
    started = trio.current_time()
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            deadline = started + limits.grace + size / limits.min_rate
            idle = trio.current_time() + limits.idle_timeout
            data = None
            with trio.move_on_at(min(deadline, idle)):
                data = await stream.receive_some(RECEIVE_BYTES)
            if data is None:
                raise _too_slow(limits, stalled=idle <= deadline)
            if not data:
                raise trio.BrokenResourceError("client closed mid-upload")
            http.receive_data(data)
        elif isinstance(event, h11.Data):
            chunk = bytes(event.data)
            size += len(chunk)
            if size > limit:
                raise HttpError(413, "payload_too_large", f"uploads are limited to {limit} bytes")
            charge(size)
            hasher.update(chunk)
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= WRITE_BYTES:
                await staging.write(b"".join(pending))
                pending, pending_bytes = [], 0
        elif isinstance(event, h11.EndOfMessage):
            if pending:
                await staging.write(b"".join(pending))
            return hasher.hexdigest(), size
        else:
            raise trio.BrokenResourceError(f"unexpected HTTP event {type(event).__name__}")


def _too_slow(limits: UploadSettings, *, stalled: bool) -> HttpError:
    if stalled:
        message = f"the upload sent nothing for {limits.idle_timeout:g} s"
    else:
        message = (
            f"the upload fell below {limits.min_rate} bytes/s (after the first {limits.grace:g} s)"
        )
    return HttpError(408, "validation_failed", message)


def _file_name(query: str) -> str:
    """``?name=``: shown to every reader as the file's label, so it is a name by
    the project's text rule (no controls, no direction or invisible characters)."""
    names = parse_qs(query, keep_blank_values=True).get("name", [])
    name = names[0] if names else ""
    problem = text_problem(name, TextKind.NAME) if name else "required"
    if problem is None and len(name) > MAX_NAME:
        problem = f"at most {MAX_NAME} characters"
    if problem is not None:
        raise HttpError(
            400,
            "validation_failed",
            f"?name=: {problem} (the file name, 1 to {MAX_NAME} characters)",
            details={"path": "name"},
        )
    return name


def _content_type(request: h11.Request) -> str:
    value = _header(request, b"content-type")
    if value is None:
        return DEFAULT_CONTENT_TYPE
    text = value.decode("latin-1").strip()
    if len(text) > MAX_CONTENT_TYPE or not _CONTENT_TYPE.match(text):
        raise HttpError(400, "validation_failed", "Content-Type must be a MIME type, type/subtype")
    return text


def _content_length(request: h11.Request) -> int | None:
    value = _header(request, b"content-length")
    # h11 has already refused a malformed Content-Length.
    return int(value) if value is not None else None


# ------------------------------------------------------------------ download


async def download(
    services: Services,
    stream: trio.SocketStream,
    http: h11.Connection,
    request: h11.Request,
    attachment_id: str,
    query: str = "",
) -> None:
    member = await _downloader(services, request, attachment_id, query)
    if not _is_attachment_id(attachment_id):
        raise HttpError(404, "not_found", "no such attachment")
    async with services.pool.connection() as conn:
        found = await attachments.readable_attachment(conn, attachment_id, member)
    if found is None:
        raise HttpError(404, "not_found", "no such attachment")
    blobs = blob_store(services.settings.attachments_path)
    chunks = blobs.open(found.digest)
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = b""
    except FileNotFoundError:
        log.error("attachment_bytes_missing", attachment_id=found.id, digest=found.digest)
        raise HttpError(404, "not_found", "no such attachment") from None
    kind = _media_type(found.content_type)
    headers = [
        (b"content-type", found.content_type.encode("latin-1")),
        (b"content-length", str(found.size).encode()),
        (b"content-disposition", content_disposition(found.name, found.content_type).encode()),
        # The bytes are whatever a member uploaded: never sniffed, never run
        # as a page of this origin.
        (b"x-content-type-options", b"nosniff"),
        (b"content-security-policy", PDF_POLICY if kind == "application/pdf" else DOWNLOAD_POLICY),
        (b"cache-control", b"private, no-store"),
        (b"connection", b"close"),
    ]
    try:
        await stream.send_all(http.send(h11.Response(status_code=200, headers=headers)))
        if request.method == b"HEAD":
            return
        sent = 0
        chunk = first
        while chunk:
            sent += len(chunk)
            await stream.send_all(http.send(h11.Data(data=chunk)))
            chunk = await anext(chunks, b"")
        await stream.send_all(http.send(h11.EndOfMessage()))
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def content_disposition(name: str, content_type: str = "") -> str:
    """``inline`` for PDFs and images, else ``attachment``; the name in RFC 5987
    form and a plain ASCII fallback."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    how = "inline" if _media_type(content_type) in INLINE_TYPES else "attachment"
    return f"{how}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def _media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


def _is_attachment_id(attachment_id: str) -> bool:
    return (
        attachment_id.startswith("att_") and "/" not in attachment_id and len(attachment_id) <= 128
    )


async def issue_link(
    services: Services,
    stream: trio.SocketStream,
    http: h11.Connection,
    request: h11.Request,
    attachment_id: str,
) -> None:
    """``200 {url, expiresAt}``: a download link valid for a minute, for a
    member who may read the attachment now (``404`` otherwise)."""
    token = _bearer(request)
    if token is None:
        raise HttpError(401, "unauthorized", "Authorization: Bearer <token>")
    async with services.pool.connection() as conn:
        found = await directory.authenticate_credential(conn, token)
        if found is None:
            raise HttpError(401, "unauthorized", "unknown or revoked token")
        member, credential_id, _ = found
        readable = _is_attachment_id(attachment_id) and (
            await attachments.readable_attachment(conn, attachment_id, member)
        )
    if not readable:
        raise HttpError(404, "not_found", "no such attachment")
    key = directory.token_hash(token)
    url, expires = attachment_links.link_path(
        PREFIX, attachment_id, key, credential_id, time.time()
    )
    expires_at = rfc3339(datetime.fromtimestamp(expires, UTC))
    await _send_json(stream, http, 200, {"url": url, "expiresAt": expires_at})


async def _downloader(
    services: Services, request: h11.Request, attachment_id: str, query: str
) -> Member:
    """Who downloads: the bearer token's member, or a signed link's."""
    link = attachment_links.parse(query)
    if link is None:
        return await _authenticate(services, request)
    found = None
    if link.credential_id:
        async with services.pool.connection() as conn:
            found = await directory.link_credential(conn, link.credential_id)
    if found is None or not attachment_links.is_valid(link, attachment_id, found[1], time.time()):
        raise HttpError(403, "forbidden", "this download link has expired or is not valid")
    return found[0]


# ------------------------------------------------------------------ shared


async def _authenticate(services: Services, request: h11.Request) -> Member:
    token = _bearer(request)
    if token is None:
        raise HttpError(401, "unauthorized", "Authorization: Bearer <token>")
    async with services.pool.connection() as conn:
        member = await directory.authenticate(conn, token)
    if member is None:
        raise HttpError(401, "unauthorized", "unknown or revoked token")
    return member


def _bearer(request: h11.Request) -> str | None:
    value = _header(request, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.decode("latin-1").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _header(request: h11.Request, name: bytes) -> bytes | None:
    for key, value in request.headers:
        if key.lower() == name:
            return bytes(value)
    return None


async def _send_json(
    stream: trio.SocketStream,
    http: h11.Connection,
    status: int,
    body: dict[str, Any],
    *,
    retry_after: int | None = None,
) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    response = h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b""))
    await stream.send_all(
        http.send(response) + http.send(h11.Data(data=payload)) + http.send(h11.EndOfMessage())
    )


async def _answer_early(stream: trio.SocketStream, http: h11.Connection, exc: HttpError) -> None:
    """Send the error, then let the client read it before the connection goes."""
    if http.our_state is not h11.SEND_RESPONSE:
        return  # a response already started: nothing more can be said
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.details:
        body["details"] = exc.details
    await _send_json(stream, http, exc.status, body, retry_after=exc.retry_after)
    if http.their_state is h11.SEND_BODY:
        with trio.move_on_after(LINGER_SECONDS):
            await stream.send_eof()
            drained = 0
            while drained < LINGER_BYTES:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    break
                drained += len(data)
