"""Heartbeat timeout, hello timeout and actor passivation."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.nodes import World, make_channel, running_node


async def test_silent_session_is_closed_with_4408(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path, heartbeat_ms=200) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as quiet, world.client(ann, heartbeat=True) as chatty:
            with trio.fail_after(10):
                code = await quiet.wait_closed(timeout=10)
            assert code == 4408
            # A client that pings stays connected past the same deadline.
            assert (await chatty.request("scopes"))["scopes"] is not None
            assert chatty.close_code is None


async def test_no_hello_closes_with_4401(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path, hello_timeout=0.3) as node:
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        request = (
            "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await stream.send_all(request.encode())
        received = b""
        with trio.fail_after(10):
            while True:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                received += chunk
        await stream.aclose()
        head, _, frames = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        # A close frame (opcode 8) carrying 4401.
        assert frames[0] == 0x88
        assert int.from_bytes(frames[2:4], "big") == 4401


async def test_idle_actor_passivates_and_reloads(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path, actor_idle_timeout=0.2) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as a:
            await make_channel(a, "idle")
            assert (await a.send("#idle", "one"))["acceptedSeq"] == 1
            assert len(node.services.registry) == 1
            with trio.fail_after(5):
                while len(node.services.registry):
                    await trio.sleep(0.05)
            assert (await a.send("#idle", "two"))["acceptedSeq"] == 2
            assert len(node.services.registry) == 1


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
async def test_http_endpoints(database_url: str, tmp_path: Path, path: str) -> None:
    async with running_node(database_url, tmp_path) as node:
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(4096):
                received += chunk
        await stream.aclose()
        assert received.startswith(b"HTTP/1.1 200")
        if path == "/metrics":
            assert b"scopenode_sessions " in received
            assert b'scopenode_outbox_rows{status="pending"}' in received
