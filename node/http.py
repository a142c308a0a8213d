"""The plain HTTP side of the node's port: /healthz, /metrics, /v1/whoami, the web client."""

from __future__ import annotations

import json
from importlib import resources

import h11
import structlog

from node.services import Services
from storage import directory, health
from storage.errors import StorageError

log = structlog.get_logger(__name__)

HEALTH_TIMEOUT = 2.0
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


async def respond(services: Services, request: h11.Request) -> tuple[int, str, bytes]:
    """(status, content type, body) for a non-WebSocket request."""
    path = request.target.decode("latin-1").split("?", 1)[0]
    method = request.method.decode("latin-1")
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", b"method not allowed\n"
    if path == "/healthz":
        if (
            services.ready
            and not services.draining
            and await health.ping(services.pool, timeout=HEALTH_TIMEOUT)
        ):
            return 200, "text/plain", b"ok\n"
        return 503, "text/plain", b"unavailable\n"
    if path == "/metrics":
        return 200, "text/plain; version=0.0.4; charset=utf-8", services.metrics.render().encode()
    if path == "/v1/whoami":
        return await whoami(services, request)
    name = "index.html" if path in ("/", "/index.html") else path.lstrip("/")
    if "/" in name or name.startswith("."):
        return 404, "text/plain", b"not found\n"
    asset = resources.files("node").joinpath("web", name)
    if not asset.is_file():
        return 404, "text/plain", b"not found\n"
    suffix = name[name.rfind(".") :]
    return 200, _CONTENT_TYPES.get(suffix, "application/octet-stream"), asset.read_bytes()


async def whoami(services: Services, request: h11.Request) -> tuple[int, str, bytes]:
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


def _bearer(request: h11.Request) -> str | None:
    for name, value in request.headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _json(status: int, body: dict[str, str]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()
