"""The plain HTTP side of the node's port: /healthz, /metrics, /v1/whoami, the web client.

Every answer carries the headers of :data:`SECURITY_HEADERS`; the web client's
files also carry :func:`client_policy` as their Content-Security-Policy, and
everything else the policy that allows nothing. ``/metrics`` is answered only
as :func:`metrics_allowed` says.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import h11
import structlog
import trio

from node.services import Services
from protocol.errors import ErrorCode
from protocol.text import TextKind, text_problem
from storage import directory, health
from storage.errors import StorageError

log = structlog.get_logger(__name__)

HEALTH_TIMEOUT = 2.0
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_REFUSED = (
    b"forbidden: /metrics answers loopback peers only; scrape it from this host, "
    b"through --metrics-bind, or with Authorization: Bearer <SCOPENODE_METRICS_TOKEN>\n"
)
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)
# Not the web client (health, metrics, JSON, errors): nothing to load, run or frame.
NOTHING_POLICY = "default-src 'none'; frame-ancestors 'none'"
# A proxy on the same host connects from loopback; these say it relays someone else.
FORWARDING_HEADERS = frozenset({b"forwarded", b"x-forwarded-for", b"x-real-ip"})
# A Host header that can stand in a CSP host-source: DNS labels (an IPv4
# address is four of them) and a port. Anything else (spaces, ';', ',', '_',
# '*') could change the policy's meaning, and an IPv6 literal is not in the
# host-source grammar, so such a Host is left out rather than escaped.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?::(?P<port>[0-9]{{1,5}}))?")


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete plain HTTP answer; the listener adds the framing headers."""

    status: int
    content_type: str
    body: bytes
    policy: str = NOTHING_POLICY
    extra: tuple[tuple[str, str], ...] = ()

    def headers(self) -> list[tuple[str, str]]:
        return [*SECURITY_HEADERS, ("Content-Security-Policy", self.policy), *self.extra]


def text(status: int, body: bytes) -> Reply:
    return Reply(status, "text/plain", body)


def json_reply(status: int, body: dict[str, Any], extra: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, "application/json", json.dumps(body).encode(), extra=extra)


class HttpError(Exception):
    """A refused JSON endpoint request: its status and the protocol's error
    shape (``code``, ``message``, ``details``), plus headers such as ``Retry-After``."""

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.extra = extra

    def reply(self) -> Reply:
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.details:
            body["details"] = self.details
        return json_reply(self.status, body, self.extra)


async def read_body(
    stream: trio.SocketStream,
    http: h11.Connection,
    *,
    max_body: int,
    drain_limit: int,
    timeout: float,
) -> bytes:
    """A JSON endpoint's request body, at most ``max_body`` bytes. A larger
    one is read on (up to ``drain_limit``) so that its 413 reaches the client;
    a short, missing or slow body is refused."""
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout):
        while size <= drain_limit:
            event = http.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(64 * 1024)
                if not data:
                    raise HttpError(400, ErrorCode.BAD_FRAME, "the body ended early")
                http.receive_data(data)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size <= max_body:
                    chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if size > max_body:
                    break
                return b"".join(chunks)
            else:
                raise HttpError(400, ErrorCode.BAD_FRAME, "no request body")
        raise HttpError(413, ErrorCode.PAYLOAD_TOO_LARGE, f"at most {max_body} bytes")
    raise HttpError(408, ErrorCode.BAD_FRAME, "the body took too long")


async def respond(services: Services, request: h11.Request, peer: str | None) -> Reply:
    """The answer to a non-WebSocket request from ``peer`` (its IP address, or None)."""
    path = request.target.decode("latin-1").split("?", 1)[0]
    method = request.method.decode("latin-1")
    if method not in ("GET", "HEAD"):
        return text(405, b"method not allowed\n")
    if path == "/healthz":
        if (
            services.ready
            and not services.draining
            and await health.ping(services.pool, timeout=HEALTH_TIMEOUT)
        ):
            return text(200, b"ok\n")
        return text(503, b"unavailable\n")
    if path == "/metrics":
        if not metrics_allowed(peer, request, services.settings.metrics_token):
            return text(403, METRICS_REFUSED)
        return metrics(services)
    if path == "/v1/whoami":
        return await whoami(services, request)
    return static(path, _header(request, b"host"))


def respond_metrics_listener(services: Services, request: h11.Request) -> Reply:
    """The ``--metrics-bind`` listener: ``/metrics`` to whoever reaches it, nothing else.

    Its address is its access control (an interface only the scraper reaches).
    """
    path = request.target.decode("latin-1").split("?", 1)[0]
    if request.method not in (b"GET", b"HEAD"):
        return text(405, b"method not allowed\n")
    if path != "/metrics":
        return text(404, b"not found\n")
    return metrics(services)


def metrics(services: Services) -> Reply:
    return Reply(200, METRICS_TYPE, services.metrics.render().encode())


def static(path: str, host: bytes | None) -> Reply:
    """A file of the web client (node/web), under :func:`client_policy`."""
    name = "index.html" if path in ("/", "/index.html") else path.lstrip("/")
    # Subfolders (the client's views/) are fine; an empty or dot-led part
    # ("..", ".hidden", "a//b") is never a file of the client.
    parts = name.split("/")
    if any(not part or part.startswith(".") or "\\" in part for part in parts):
        return text(404, b"not found\n")
    asset = resources.files("node").joinpath("web", *parts)
    if not asset.is_file():
        return text(404, b"not found\n")
    suffix = name[name.rfind(".") :]
    content_type = _CONTENT_TYPES.get(suffix, "application/octet-stream")
    return Reply(200, content_type, asset.read_bytes(), client_policy(host))


def client_policy(host: bytes | None) -> str:
    """The web client's Content-Security-Policy for a page fetched with ``Host: host``.

    Scripts and styles come from the node's own files only (nothing inline);
    images also from ``blob:`` (attachment previews, fetched with the bearer
    token) and ``data:`` (the favicon with its unread dot). Connections go to the
    node itself: the WebSocket origin is named explicitly, both schemes (the
    page picks ``wss:`` behind TLS), because not every browser lets ``'self'``
    cover ``ws:``. A Host that is not a plain name[:port] is not echoed (the
    page's own origin is still ``'self'``).
    """
    connect = "'self'"
    if (origin := websocket_host(host)) is not None:
        connect += f" ws://{origin} wss://{origin}"
    return (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        f"connect-src {connect}; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )


def websocket_host(host: bytes | None) -> str | None:
    """``host[:port]`` from a Host header, lower-cased, or None when it is not one."""
    if host is None:
        return None
    value = host.decode("latin-1").strip().lower()
    match = _HOST.fullmatch(value)
    if match is None:
        return None
    port = match["port"]
    if port is not None and not 0 < int(port) <= 65535:
        return None
    return value


def metrics_allowed(peer: str | None, request: h11.Request, token: str | None) -> bool:
    """Whether ``/metrics`` may be answered to ``request`` from ``peer``.

    Yes for the metrics token (``Authorization: Bearer``, when one is
    configured), else only for a loopback peer that does not relay someone
    else's request (a proxy on this host adds ``Forwarded`` or
    ``X-Forwarded-For``). Scrapers elsewhere use ``--metrics-bind`` or the token.
    """
    if token:
        given = _bearer(request)
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return True
    relayed = any(name.lower() in FORWARDING_HEADERS for name, _ in request.headers)
    return is_loopback(peer) and not relayed


def is_loopback(peer: str | None) -> bool:
    """Whether ``peer`` is a loopback IP address (127.0.0.0/8, ::1, or 127.x mapped into IPv6)."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


async def whoami(services: Services, request: h11.Request) -> Reply:
    """``Authorization: Bearer <token>`` -> the token's workspace and member.

    A client that holds only a token learns here the ``?workspace=`` to put on
    its WebSocket URL (a routing proxy needs it before the ``hello``).
    """
    token = _bearer(request)
    if token is None:
        return _json(401, {"error": "unauthorized", "message": "Authorization: Bearer <token>"})
    try:
        async with services.pool.connection() as conn:
            member = await directory.authenticate(conn, token)
    except StorageError as exc:
        log.warning("whoami_failed", code=exc.code)
        return _json(503, {"error": "unavailable", "message": "database unavailable"})
    if member is None:
        return _json(401, {"error": "unauthorized", "message": "unknown or revoked token"})
    return _json(
        200,
        {
            "workspaceId": member.workspace_id,
            "memberId": member.id,
            "handle": member.handle,
            "displayName": member.display_name,
            "type": member.type.value,
        },
    )


def _header(request: h11.Request, name: bytes) -> bytes | None:
    for key, value in request.headers:
        if key.lower() == name:
            return bytes(value)
    return None


def _bearer(request: h11.Request) -> str | None:
    for name, value in request.headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            # A token that breaks the text rule was never issued: unauthorized.
            if scheme.lower() == "bearer" and token.strip():
                return token.strip() if text_problem(token.strip(), TextKind.KEY) is None else None
    return None


def _json(status: int, body: dict[str, str]) -> Reply:
    return Reply(status, "application/json", json.dumps(body).encode())
