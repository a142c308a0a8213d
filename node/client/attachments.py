"""Uploading and downloading attachments over HTTP, with a session's token.

A minimal HTTP/1.1 client on trio streams and h11 (already there for the
WebSocket handshake): one request per connection, bodies streamed both ways,
so a file is never read into memory whole. :meth:`Client.upload` and
:meth:`Client.download` (``node/client/connection.py``) call these with the
session's URL and token; they can also be used without a session.

An upload answered early (``413`` before the body was sent, ``401``) is read
while the body is still going out, and the rest of the body is not sent.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import h11
import trio

CHUNK_BYTES = 256 * 1024
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class AttachmentError(Exception):
    """The node refused: ``status`` and the body's ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def http_base(url: str) -> str:
    """``ws://host:port/v1/ws?…`` (or an http URL) → ``http://host:port``."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return f"{scheme}://{parts.netloc}"


async def upload(
    base_url: str,
    token: str,
    source: bytes | str | os.PathLike[str],
    name: str | None = None,
    content_type: str | None = None,
    *,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Upload bytes, or the file at a path; returns ``{"attachmentId", "name",
    "contentType", "size"}``. ``name`` defaults to the file's name."""
    if isinstance(source, bytes):
        size = len(source)
        body: AsyncIterator[bytes] = _bytes_chunks(source)
        if name is None:
            raise ValueError("name is required when uploading bytes")
    else:
        path = Path(source)
        size = (await trio.to_thread.run_sync(path.stat)).st_size
        body = _file_chunks(path)
        name = name if name is not None else path.name
    headers = [
        ("content-type", content_type or DEFAULT_CONTENT_TYPE),
        ("content-length", str(size)),
    ]
    target = f"/v1/attachments?name={quote(name, safe='')}"
    with trio.fail_after(timeout):
        status, _, payload = await _exchange(base_url, token, "POST", target, headers, body)
    return _json_or_raise(status, payload)


async def download(
    base_url: str, token: str, attachment_id: str, *, timeout: float = 300.0
) -> bytes:
    """The attachment's bytes (``404`` for one the member may not read)."""
    parts: list[bytes] = []

    async def keep(chunk: bytes) -> None:
        parts.append(chunk)

    await _download(base_url, token, attachment_id, keep, timeout)
    return b"".join(parts)


async def download_to(
    base_url: str,
    token: str,
    attachment_id: str,
    path: str | os.PathLike[str],
    *,
    timeout: float = 300.0,
) -> int:
    """Write the attachment to ``path`` as it arrives; returns its size."""
    written = 0
    file = await trio.open_file(path, "wb")
    try:

        async def write(chunk: bytes) -> None:
            nonlocal written
            written += len(chunk)
            await file.write(chunk)

        await _download(base_url, token, attachment_id, write, timeout)
    finally:
        await file.aclose()
    return written


async def _download(
    base_url: str, token: str, attachment_id: str, sink: Any, timeout: float
) -> None:
    target = f"/v1/attachments/{quote(attachment_id, safe='')}"
    with trio.fail_after(timeout):
        status, _, payload = await _exchange(base_url, token, "GET", target, [], None, sink=sink)
    if status != 200:
        _json_or_raise(status, payload)


# ----------------------------------------------------------------- plumbing


async def _bytes_chunks(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), CHUNK_BYTES):
        yield bytes(view[start : start + CHUNK_BYTES])


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await trio.open_file(path, "rb") as file:
        while chunk := await file.read(CHUNK_BYTES):
            yield chunk


def _json_or_raise(status: int, payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload) if payload else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if 200 <= status < 300:
        return body
    raise AttachmentError(
        status, str(body.get("code", "http_error")), str(body.get("message", payload[:200]))
    )


async def _connect(base_url: str) -> trio.abc.Stream:
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    if parts.scheme == "https":
        return await trio.open_ssl_over_tcp_stream(
            host, parts.port or 443, ssl_context=ssl.create_default_context()
        )
    return await trio.open_tcp_stream(host, parts.port or 80)


async def _exchange(
    base_url: str,
    token: str,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: AsyncIterator[bytes] | None,
    *,
    sink: Any = None,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One request; (status, headers, body). A 2xx body goes to ``sink`` when
    given (chunk by chunk), any other body is returned."""
    host = urlsplit(base_url).netloc
    http = h11.Connection(h11.CLIENT)
    all_headers = [
        ("host", host),
        ("authorization", f"Bearer {token}"),
        ("connection", "close"),
        *headers,
    ]
    if body is None:
        all_headers.append(("content-length", "0"))
    stream = await _connect(base_url)
    async with stream:
        await stream.send_all(
            http.send(h11.Request(method=method, target=target, headers=all_headers))
        )
        async with trio.open_nursery() as nursery:
            if body is not None:
                nursery.start_soon(_send_body, stream, http, body)
            else:
                await stream.send_all(http.send(h11.EndOfMessage()))
            answer = await _read_response(stream, http, sink)
            # Answered before the body was all sent (an early 413 or 401): stop.
            nursery.cancel_scope.cancel()
    return answer


async def _send_body(
    stream: trio.abc.Stream, http: h11.Connection, body: AsyncIterator[bytes]
) -> None:
    try:
        async for chunk in body:
            await stream.send_all(http.send(h11.Data(data=chunk)))
        await stream.send_all(http.send(h11.EndOfMessage()))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the node answered and closed; the answer is read by the caller


async def _read_response(
    stream: trio.abc.Stream, http: h11.Connection, sink: Any
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    status = 0
    headers: list[tuple[bytes, bytes]] = []
    kept: list[bytes] = []
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            try:
                data = bytes(await stream.receive_some(CHUNK_BYTES))
            except trio.BrokenResourceError:
                data = b""
            http.receive_data(data)
        elif isinstance(event, h11.Response):
            status, headers = event.status_code, list(event.headers)
        elif isinstance(event, h11.Data):
            if sink is not None and 200 <= status < 300:
                await sink(bytes(event.data))
            else:
                kept.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return status, headers, b"".join(kept)
        elif isinstance(event, h11.InformationalResponse):
            continue
        elif isinstance(event, h11.ConnectionClosed):
            raise AttachmentError(
                status or 502, "connection_closed", "the node closed the connection"
            )
