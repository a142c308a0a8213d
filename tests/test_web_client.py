"""The browser client is served from the node's own port (no browser here)."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import trio

from tests.nodes import running_node


async def http_get(port: int, path: str) -> tuple[int, dict[str, str], str]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ", 2)[1]), headers, body.decode()


async def client_modules(port: int) -> list[tuple[int, dict[str, str], str]]:
    """/app.js and every module it imports, transitively, fetched as the browser does."""
    answers = []
    seen: set[str] = set()
    todo = ["/app.js"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        answer = await http_get(port, path)
        answers.append(answer)
        folder = posixpath.dirname(path)
        specifiers = re.findall(r'from "(\.{1,2}/[^"]+)"', answer[2])
        todo.extend(posixpath.normpath(posixpath.join(folder, spec)) for spec in specifiers)
    return answers


async def test_web_client_assets_are_served(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        port = node.services.port

        status, headers, index = await http_get(port, "/")
        assert status == 200
        assert headers["content-type"].startswith("text/html")
        assert 'src="/app.js"' in index
        assert 'type="module"' in index
        assert 'href="/app.css"' in index
        assert 'rel="icon"' in index
        for needle in (
            ">Token<",
            ">Sign in<",
            'aria-label="Conversations"',
            'aria-label="Messages"',
        ):
            assert needle in index, needle

        status, headers, same = await http_get(port, "/index.html")
        assert status == 200
        assert same == index

        script = ""
        for status, headers, module in await client_modules(port):
            assert status == 200
            assert headers["content-type"].startswith("text/javascript")
            script += module
        for needle in ('"hello"', "/v1/ws", 'split("\\n")', "resume", "4401", "4429"):
            assert needle in script, needle
        # Message text reaches the page only as text nodes.
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script, sink

        status, headers, css = await http_get(port, "/app.css")
        assert status == 200
        assert headers["content-type"].startswith("text/css")
        assert "{" in css

        status, _, _ = await http_get(port, "/missing.js")
        assert status == 404
