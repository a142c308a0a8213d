"""Attachments over HTTP: ``POST /v1/attachments`` and ``GET /v1/attachments/<id>``.

Both stream (docs/design.md#attachments). An upload is hashed and written to
a staging file in chunks as it arrives, so the node holds at most a few
hundred KiB of it whatever its size; one above the limit is answered ``413``
before its body is read (``Content-Length`` up front, a chunked body at the
limit). A download is sent from the blob in chunks. Every error body is
``{"code", "message"}``; a download the member may not read is ``404``, like
an id that does not exist.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import h11
import structlog
import trio

from actors.model import Member
from node.services import Services
from storage import attachments, directory
from storage.blobs import BlobStore, FilesystemBlobStore
from storage.errors import StorageError

log = structlog.get_logger(__name__)

PREFIX = "/v1/attachments"
RECEIVE_BYTES = 64 * 1024
# Bytes gathered before one write to the staging file (one thread hop each).
WRITE_BYTES = 256 * 1024
# A client that stops sending mid-body is dropped after this long.
BODY_IDLE_TIMEOUT = 30.0
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
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Content Too Large",
    503: b"Service Unavailable",
}


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


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
        else:
            if request.method not in (b"GET", b"HEAD"):
                raise HttpError(405, "method_not_allowed", "GET an attachment")
            await download(services, stream, http, request, target.path[len(PREFIX) + 1 :])
    except HttpError as exc:
        await _answer_early(stream, http, exc)
    except StorageError as exc:
        log.warning("attachment_storage_failed", code=exc.code)
        await _answer_early(stream, http, HttpError(503, "unavailable", "storage unavailable"))


async def sweep_forever(services: Services, interval: float = SWEEP_INTERVAL) -> None:
    """The node's sweeper: released uploads, unclaimed ones older than a day,
    and staging files of uploads cut off by a crash. Nodes sharing a database
    and a directory sweep disjoint batches (``storage.attachments.sweep``)."""
    blobs = blob_store(services.settings.attachments_path)
    ttl = attachments.UNCLAIMED_TTL
    while True:
        await trio.sleep(interval)
        try:
            removed = 0
            async with services.pool.connection() as conn:
                while (batch := await attachments.sweep(conn, blobs, ttl=ttl)) > 0:
                    removed += batch
                    if batch < attachments.SWEEP_BATCH:
                        break
            if isinstance(blobs, FilesystemBlobStore):
                await blobs.sweep_staging(ttl.total_seconds())
            if removed:
                log.info("attachments_swept", removed=removed)
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
    if http.they_are_waiting_for_100_continue:
        await stream.send_all(http.send(h11.InformationalResponse(status_code=100, headers=[])))
    blobs = blob_store(settings.attachments_path)
    staged = await blobs.stage()
    try:
        digest, size = await _receive_body(stream, http, staged, limit)
        async with services.pool.connection() as conn:
            stored = await attachments.create(
                conn,
                blobs,
                staged,
                digest=digest,
                workspace_id=member.workspace_id,
                uploader_id=member.id,
                name=name,
                content_type=content_type,
                size=size,
            )
    finally:
        with trio.CancelScope(shield=True):
            await staged.discard()
    log.info("attachment_uploaded", attachment_id=stored.id, size=size)
    await _send_json(stream, http, 201, {"attachmentId": stored.id, **_public(stored.view())})


def _public(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k != "id"}


async def _receive_body(
    stream: trio.SocketStream, http: h11.Connection, staged: Any, limit: int
) -> tuple[str, int]:
    """Hash and stage the body as it arrives; (SHA-256 hex, size)."""
    hasher = hashlib.sha256()
    size = 0
    pending: list[bytes] = []
    pending_bytes = 0
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            with trio.move_on_after(BODY_IDLE_TIMEOUT) as idle:
                data = await stream.receive_some(RECEIVE_BYTES)
            if idle.cancelled_caught:
                raise HttpError(400, "validation_failed", "the upload stalled")
            if not data:
                raise trio.BrokenResourceError("client closed mid-upload")
            http.receive_data(data)
        elif isinstance(event, h11.Data):
            chunk = bytes(event.data)
            size += len(chunk)
            if size > limit:
                raise HttpError(413, "payload_too_large", f"uploads are limited to {limit} bytes")
            hasher.update(chunk)
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= WRITE_BYTES:
                await staged.write(b"".join(pending))
                pending, pending_bytes = [], 0
        elif isinstance(event, h11.EndOfMessage):
            if pending:
                await staged.write(b"".join(pending))
            return hasher.hexdigest(), size
        else:
            raise trio.BrokenResourceError(f"unexpected HTTP event {type(event).__name__}")


def _file_name(query: str) -> str:
    names = parse_qs(query, keep_blank_values=True).get("name", [])
    name = names[0] if names else ""
    if not name or len(name) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise HttpError(
            400,
            "validation_failed",
            f"?name= is required: the file name, 1 to {MAX_NAME} characters, no control characters",
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
) -> None:
    member = await _authenticate(services, request)
    if not attachment_id.startswith("att_") or "/" in attachment_id or len(attachment_id) > 128:
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
    headers = [
        (b"content-type", found.content_type.encode("latin-1")),
        (b"content-length", str(found.size).encode()),
        (b"content-disposition", content_disposition(found.name).encode()),
        # The bytes are whatever a member uploaded: never sniffed, never run
        # as a page of this origin.
        (b"x-content-type-options", b"nosniff"),
        (b"content-security-policy", b"default-src 'none'; sandbox"),
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


def content_disposition(name: str) -> str:
    """``attachment`` with the name in RFC 5987 form and a plain ASCII fallback."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


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
    stream: trio.SocketStream, http: h11.Connection, status: int, body: dict[str, Any]
) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
    ]
    response = h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b""))
    await stream.send_all(
        http.send(response) + http.send(h11.Data(data=payload)) + http.send(h11.EndOfMessage())
    )


async def _answer_early(stream: trio.SocketStream, http: h11.Connection, exc: HttpError) -> None:
    """Send the error, then let the client read it before the connection goes."""
    if http.our_state is not h11.SEND_RESPONSE:
        return  # a response already started: nothing more can be said
    await _send_json(stream, http, exc.status, {"code": exc.code, "message": exc.message})
    if http.their_state is h11.SEND_BODY:
        with trio.move_on_after(LINGER_SECONDS):
            await stream.send_eof()
            drained = 0
            while drained < LINGER_BYTES:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    break
                drained += len(data)
