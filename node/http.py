"""The plain HTTP side of the node's port: /healthz, /metrics, the web client."""

from __future__ import annotations

from importlib import resources

import h11

from node.services import Services
from storage import health

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
        return 200, "text/plain; version=0.0.4", services.metrics.render().encode()
    name = "index.html" if path in ("/", "/index.html") else path.lstrip("/")
    if "/" in name or name.startswith("."):
        return 404, "text/plain", b"not found\n"
    asset = resources.files("node").joinpath("web", name)
    if not asset.is_file():
        return 404, "text/plain", b"not found\n"
    suffix = name[name.rfind(".") :]
    return 200, _CONTENT_TYPES.get(suffix, "application/octet-stream"), asset.read_bytes()
