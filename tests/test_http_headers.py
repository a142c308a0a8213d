"""Security headers on the node's plain HTTP answers, and who may read /metrics.

The web client's files carry a Content-Security-Policy without inline code
and with the page's own WebSocket origin; every answer forbids framing,
sniffing and referrers. ``/metrics`` answers loopback peers, the metrics token
and the ``--metrics-bind`` listener only. The peer check is a pure function of
the peer address (every test connection comes from loopback), so the
non-loopback cases are unit tests of it plus requests handed to a running
node's ``respond`` with a non-loopback peer.
"""

from __future__ import annotations

from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import h11
import pytest
import trio

from node.cli import build_parser
from node.http import (
    METRICS_REFUSED,
    client_policy,
    is_loopback,
    metrics_allowed,
    respond,
    websocket_host,
)
from tests.nodes import running_node

FRAMING = {
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}


def directives(policy: str) -> dict[str, list[str]]:
    """A CSP header as {directive: [sources]}."""
    found: dict[str, list[str]] = {}
    for part in policy.split(";"):
        name, *sources = part.split()
        assert name not in found, f"{name} twice in {policy!r}"
        found[name] = sources
    return found


def request(target: str = "/metrics", **headers: str) -> h11.Request:
    fields = [("Host", "node.example:8765")]
    fields += [(name.replace("_", "-"), value) for name, value in headers.items()]
    return h11.Request(method="GET", target=target, headers=fields)


async def http_get(
    port: int, path: str, *, host: str = "127.0.0.1", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one GET."""
    client = h11.Connection(h11.CLIENT)
    fields = [("Host", f"{host}:{port}"), ("Connection", "close"), *(headers or {}).items()]
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(
                client.send(h11.Request(method="GET", target=path, headers=fields))
            )
            await stream.send_all(client.send(h11.EndOfMessage()))
            response, body = None, b""
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
    assert response is not None
    found = {name.decode().lower(): value.decode() for name, value in response.headers}
    return response.status_code, found, body


# ---------------------------------------------------------------- the pure rules


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.7", False),
        ("192.0.2.10", False),
        ("0.0.0.0", False),
        ("::ffff:10.0.0.7", False),
        ("2001:db8::1", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # a name is not an address
        ("", False),
        (None, False),
    ],
)
def test_loopback_is_an_address_in_127_8_or_1(peer: str | None, loopback: bool) -> None:
    assert is_loopback(peer) is loopback


def test_metrics_from_loopback_without_a_token() -> None:
    assert metrics_allowed("127.0.0.1", request(), None)
    assert metrics_allowed("::1", request(), "s3cret")


def test_metrics_refused_to_a_non_loopback_peer_without_the_token() -> None:
    assert not metrics_allowed("192.0.2.10", request(), None)
    assert not metrics_allowed("192.0.2.10", request(), "s3cret")
    assert not metrics_allowed("192.0.2.10", request(Authorization="Bearer wrong"), "s3cret")
    assert not metrics_allowed("192.0.2.10", request(Authorization="Basic s3cret"), "s3cret")
    # No token configured: a bearer header opens nothing.
    assert not metrics_allowed("192.0.2.10", request(Authorization="Bearer s3cret"), None)
    assert not metrics_allowed("192.0.2.10", request(Authorization="Bearer"), "")
    assert not metrics_allowed(None, request(), None)


def test_metrics_token_opens_it_from_anywhere() -> None:
    assert metrics_allowed("192.0.2.10", request(Authorization="Bearer s3cret"), "s3cret")
    assert metrics_allowed("2001:db8::1", request(Authorization="bearer  s3cret"), "s3cret")
    relayed = request(Authorization="Bearer s3cret", X_Forwarded_For="198.51.100.4")
    assert metrics_allowed("127.0.0.1", relayed, "s3cret")


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded", "X-Real-IP", "x-forwarded-for"])
def test_metrics_relayed_by_a_proxy_on_this_host_is_not_loopback(header: str) -> None:
    relayed = h11.Request(
        method="GET", target="/metrics", headers=[("Host", "x"), (header, "198.51.100.4")]
    )
    assert not metrics_allowed("127.0.0.1", relayed, None)


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        (b"127.0.0.1:8765", "127.0.0.1:8765"),
        (b"Chat.Example.COM", "chat.example.com"),
        (b"chat.example.com:443", "chat.example.com:443"),
        (b"node-1.internal:80", "node-1.internal:80"),
        (b"evil.example; script-src *", None),
        (b"evil.example 'unsafe-inline'", None),
        (b"a.example,b.example", None),
        (b"*.example", None),
        (b"under_score.example", None),
        (b"[::1]:8765", None),  # IPv6 literals are not CSP host-sources: 'self' covers them
        (b"node:99999", None),
        (b"node:0", None),
        (b"node:", None),
        (b"-node", None),
        (b"", None),
        (None, None),
    ],
)
def test_websocket_origin_only_from_a_plain_host(host: bytes | None, origin: str | None) -> None:
    assert websocket_host(host) == origin


def test_client_policy_is_strict_and_names_its_websocket() -> None:
    policy = directives(client_policy(b"chat.example.com:8443"))
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["img-src"] == ["'self'", "blob:", "data:"]
    assert policy["connect-src"] == [
        "'self'",
        "ws://chat.example.com:8443",
        "wss://chat.example.com:8443",
    ]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'none'"]
    for sources in policy.values():
        assert not {"'unsafe-inline'", "'unsafe-eval'", "*", "http:", "https:"} & set(sources)


def test_client_policy_leaves_out_a_host_it_cannot_quote() -> None:
    policy = directives(client_policy(b"evil.example; script-src *"))
    assert policy["connect-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]


class _InlineFinder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script" and not named.get("src"):
            self.found.append("inline <script>")
        if tag == "style":
            self.found.append("<style>")
        for name, value in attrs:
            if name.startswith("on") or name == "style":
                self.found.append(f"<{tag} {name}=...>")
            if (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:...>")


def test_index_html_has_no_inline_code() -> None:
    finder = _InlineFinder()
    finder.feed(resources.files("node").joinpath("web", "index.html").read_text("utf-8"))
    assert finder.found == []


def test_metrics_bind_flag() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--metrics-bind", "10.1.2.3:9100"])
    assert args.metrics_bind == ("10.1.2.3", 9100)
    assert parser.parse_args(["serve", "--metrics-bind", "[::1]:9100"]).metrics_bind == (
        "::1",
        9100,
    )
    assert parser.parse_args(["serve"]).metrics_bind is None
    for bad in ("9100", ":9100", "10.1.2.3:", "10.1.2.3:0", "10.1.2.3:70000", "host:http"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["serve", "--metrics-bind", bad])
        assert exited.value.code == 2, bad


# ---------------------------------------------------------------- a running node


async def test_web_client_files_carry_the_policy_and_every_answer_the_headers(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, metrics_token=None) as node:
        port = node.services.port
        for path, content_type in (
            ("/", "text/html"),
            ("/index.html", "text/html"),
            ("/app.js", "text/javascript"),
            ("/app.css", "text/css"),
        ):
            status, headers, _ = await http_get(port, path)
            assert status == 200, path
            assert headers["content-type"].startswith(content_type), path
            for name, value in FRAMING.items():
                assert headers[name] == value, (path, name)
            policy = directives(headers["content-security-policy"])
            assert policy["connect-src"] == [
                "'self'",
                f"ws://127.0.0.1:{port}",
                f"wss://127.0.0.1:{port}",
            ], path
            assert policy["frame-ancestors"] == ["'none'"]
            assert policy["default-src"] == ["'self'"]
        for path, expected in (
            ("/healthz", 200),
            ("/metrics", 200),
            ("/v1/whoami", 401),
            ("/missing.js", 404),
            ("/../pyproject.toml", 404),
        ):
            status, headers, _ = await http_get(port, path)
            assert status == expected, path
            for name, value in FRAMING.items():
                assert headers[name] == value, (path, name)
            assert directives(headers["content-security-policy"]) == {
                "default-src": ["'none'"],
                "frame-ancestors": ["'none'"],
            }, path


async def test_metrics_refused_to_others_on_a_node_without_a_token(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, metrics_token=None) as node:
        port = node.services.port
        status, _, body = await http_get(port, "/metrics")
        assert status == 200
        assert b"scopenode_sessions " in body
        # A proxy on this host relaying someone else's request.
        status, headers, body = await http_get(
            port, "/metrics", headers={"X-Forwarded-For": "198.51.100.4"}
        )
        assert (status, body) == (403, METRICS_REFUSED)
        assert headers["content-type"] == "text/plain"
        # The node's answer to the same request from a peer that is not loopback.
        answer = await respond(node.services, request(), "192.0.2.10")
        assert (answer.status, answer.body) == (403, METRICS_REFUSED)
        answer = await respond(node.services, request(Authorization="Bearer x"), "192.0.2.10")
        assert answer.status == 403
        answer = await respond(node.services, request(), "127.0.0.1")
        assert answer.status == 200
        assert b"scopenode_sessions " in answer.body
        assert node.services.metrics_port is None


async def test_metrics_token_and_metrics_listener(database_url: str, tmp_path: Path) -> None:
    async with running_node(
        database_url, tmp_path, metrics_token="s3cret", metrics_bind=("127.0.0.2", 0)
    ) as node:
        port = node.services.port
        answer = await respond(node.services, request(Authorization="Bearer s3cret"), "192.0.2.10")
        assert answer.status == 200
        assert b"scopenode_sessions " in answer.body
        answer = await respond(node.services, request(Authorization="Bearer s3cre"), "192.0.2.10")
        assert (answer.status, answer.body) == (403, METRICS_REFUSED)
        relayed = {"X-Forwarded-For": "198.51.100.4"}
        status, _, _ = await http_get(port, "/metrics", headers=relayed)
        assert status == 403
        status, _, body = await http_get(
            port, "/metrics", headers={**relayed, "Authorization": "Bearer s3cret"}
        )
        assert status == 200
        assert b"scopenode_sessions " in body

        # The separate listener answers /metrics to whoever reaches it, and nothing else.
        metrics_port = node.services.metrics_port
        assert metrics_port is not None
        assert metrics_port != port
        status, headers, body = await http_get(
            metrics_port, "/metrics", host="127.0.0.2", headers=relayed
        )
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        assert headers["x-content-type-options"] == "nosniff"
        assert b"scopenode_sessions " in body
        for path in ("/", "/healthz", "/v1/whoami", "/app.js"):
            status, _, _ = await http_get(metrics_port, path, host="127.0.0.2")
            assert status == 404, path
        # It listens where it was told, and only there.
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", metrics_port)
