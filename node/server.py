"""The listener: HTTP requests and WebSocket upgrades on one port.

h11 reads the request head; wsproto answers a ``/v1/ws`` upgrade
(``initiate_upgrade_connection``) and a :class:`Session` takes the stream with
the bytes read past the head; ``/v1/attachments`` requests stream through
:mod:`node.attachments`; ``/v1/invites/…`` requests (small JSON bodies) are
answered by :mod:`node.invites`; everything else is answered by :mod:`node.http` and
closed. The ``--metrics-bind`` listener answers ``/metrics`` alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from urllib.parse import parse_qs, urlsplit

import h11
import structlog
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request

from actors.ids import new_id
from node import attachments, invites, webhooks
from node.attachments import is_attachment_path
from node.http import Reply, respond, respond_metrics_listener, text
from node.services import Services
from node.session import Session

log = structlog.get_logger(__name__)
HEAD_TIMEOUT = 10.0
MAX_HEAD = 16 * 1024


async def handle_connection(services: Services, stream: trio.SocketStream) -> None:
    """Serve one TCP connection; never lets an exception escape to the listener."""
    async with _closed_at_end(stream, "connection_failed"):
        await _handle(services, stream)


@asynccontextmanager
async def _closed_at_end(stream: trio.SocketStream, failure: str) -> AsyncIterator[None]:
    """Close ``stream`` after the block. A peer that goes away or speaks
    garbled HTTP is routine; anything else is logged as ``failure``, and
    neither reaches the listener, which would stop serving."""
    try:
        yield
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        pass
    except Exception as exc:
        log.exception(failure, error=repr(exc))
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


@dataclass(frozen=True, slots=True)
class Upgrade:
    """What a session keeps of its HTTP upgrade: the bytes read past the head."""

    received: bytes
    workspace: str | None


async def _handle(services: Services, stream: trio.SocketStream) -> None:
    # The HTTP parser and the handshake live only in _accept's frame, so an idle
    # session does not keep them alive.
    upgrade = await _accept(services, stream)
    if upgrade is not None:
        await _run_session(services, stream, upgrade)


async def serve_metrics(
    services: Services, host: str, port: int, *, task_status: trio.TaskStatus[int]
) -> None:
    """The ``--metrics-bind`` listener; reports the port it listens on."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(partial(handle_metrics_connection, services), listeners)
    finally:
        for listener in listeners:
            with trio.CancelScope(shield=True):
                await listener.aclose()


async def handle_metrics_connection(services: Services, stream: trio.SocketStream) -> None:
    """Serve one connection of the ``--metrics-bind`` listener: ``/metrics`` only."""
    async with _closed_at_end(stream, "metrics_connection_failed"):
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        request = await _read_head(stream, http)
        if request is not None:
            reply = respond_metrics_listener(services, request)
            await _plain(stream, reply, head_only=request.method == b"HEAD")


async def _read_head(stream: trio.SocketStream, http: h11.Connection) -> h11.Request | None:
    """The request head, or None (closed, garbled or too slow: nothing to answer)."""
    with trio.move_on_after(HEAD_TIMEOUT):
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                http.receive_data(data)
                if not data:
                    return None
            elif isinstance(event, h11.Request):
                return event
            else:
                return None
    return None


def peer_address(stream: trio.SocketStream) -> str | None:
    """The IP address of the other end of a TCP connection, or None when it has none."""
    try:
        address = stream.socket.getpeername()
    except OSError:
        return None
    if isinstance(address, tuple) and address and isinstance(address[0], str):
        return address[0]
    return None


async def _accept(services: Services, stream: trio.SocketStream) -> Upgrade | None:
    """Read the request head; answer plain HTTP, or complete a WebSocket upgrade."""
    http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    request = await _read_head(stream, http)
    if request is None:
        return None
    headers = {k.lower(): v for k, v in request.headers}
    target = urlsplit(request.target.decode("latin-1"))
    if target.path == "/v1/ws" and b"websocket" in headers.get(b"upgrade", b"").lower():
        if services.draining or not services.ready:
            await _plain(stream, text(503, b"draining\n"))
            return None
        http.next_event()  # PAUSED: the rest of the bytes belong to WebSocket
        if not await _handshake(stream, request):
            return None
        return Upgrade(
            bytes(http.trailing_data[0]), parse_qs(target.query).get("workspace", [None])[0]
        )
    if is_attachment_path(target.path):
        # Streams its body both ways, so it gets the connection itself.
        await attachments.handle(services, stream, http, request)
        return None
    if invites.is_invite_path(target.path):
        reply = await invites.handle(services, stream, http, request, peer_address(stream))
    elif webhooks.is_webhook_path(target.path):
        reply = await webhooks.handle(services, stream, http, request)
    else:
        reply = await respond(services, request, peer_address(stream))
    await _plain(stream, reply, head_only=request.method == b"HEAD")
    return None


_REASONS = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


async def _plain(stream: trio.SocketStream, reply: Reply, *, head_only: bool = False) -> None:
    extra = "".join(f"{name}: {value}\r\n" for name, value in reply.headers())
    head = (
        f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Error')}\r\n"
        f"Content-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n"
        f"{extra}Connection: close\r\nCache-Control: no-store\r\n\r\n"
    ).encode()
    await stream.send_all(head if head_only else head + reply.body)


async def _handshake(stream: trio.SocketStream, request: h11.Request) -> bool:
    ws = WSConnection(ConnectionType.SERVER)
    ws.initiate_upgrade_connection(list(request.headers), request.target)
    for event in ws.events():
        if isinstance(event, Request):
            # permessage-deflate stays off: frames are built once for every reader.
            await stream.send_all(ws.send(AcceptConnection()))
            return True
    await stream.send_all(ws.send(RejectConnection(status_code=400)))
    return False


async def _run_session(services: Services, stream: trio.SocketStream, upgrade: Upgrade) -> None:
    session_id = new_id("ses")
    services.metrics.sessions_opened += 1
    session = Session(
        services,
        stream,
        upgrade.received,
        workspace_param=upgrade.workspace,
        session_id=session_id,
    )
    services.sessions.add(session)
    try:
        with structlog.contextvars.bound_contextvars(session_id=session_id):
            await session.run()
    finally:
        services.sessions.discard(session)
