"""Hostile and malformed input over real WebSockets.

Every bad frame gets the documented ``error`` (or close code) and, where
docs/protocol.md says so, the session stays open: each check ends with a ``ping``
that must still get its ``pong``. After all of it the node still serves a
normal send, and ``/metrics`` counts it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Request

from actors.model import MemberType
from node.client import Client, ClientError, ConnectionClosed, open_client
from tests.nodes import RunningNode, World, make_channel, running_node

TIMEOUT = 10.0
_ids = itertools.count(1000)


def _raw(obj: dict[str, Any]) -> str:
    return msgspec.json.encode(obj).decode()


async def _next_error(client: Client) -> dict[str, Any]:
    """The next ``error`` event (errors with id null are not request answers)."""
    events = await client.events_until(lambda e: e.get("type") == "error", timeout=TIMEOUT)
    return events[-1]


async def _assert_alive(client: Client) -> None:
    """A ``ping`` request still gets its ``pong`` (which the client queues as an event)."""
    request_id = next(_ids)
    await client.send_raw(_raw({"type": "ping", "id": request_id}))
    events = await client.events_until(lambda e: e.get("type") == "pong", timeout=TIMEOUT)
    assert events[-1] == {"type": "pong", "id": request_id}
    assert not [e for e in events if e.get("type") == "error"], events


async def _error_for(client: Client, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a request frame and return its answer, which must be an ``error``."""
    with trio.fail_after(TIMEOUT):
        answer = await client.request_frame(frame)
    assert answer["type"] == "error", answer
    assert answer["id"] == frame["id"]
    assert isinstance(answer["retryable"], bool)
    assert isinstance(answer["message"], str)
    return answer


async def _close_code_of(node: RunningNode, *texts: str, query: str = "") -> int | None:
    """Open a WebSocket by hand, send ``texts`` and return the node's close code.

    Plain wsproto over a trio stream that is closed on the way out, whoever
    closes first (trio-websocket's client leaves its socket to the garbage
    collector when the server initiates the close).
    """
    ws = WSConnection(ConnectionType.CLIENT)
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        async with stream:
            await stream.send_all(ws.send(Request(host="127.0.0.1", target=f"/v1/ws{query}")))
            while data := await stream.receive_some(65536):
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        for text in texts:
                            await stream.send_all(ws.send(Message(data=text)))
                    elif isinstance(event, CloseConnection):
                        await stream.send_all(ws.send(event.response()))
                        return event.code
    return None


async def _http_get(port: int, path: str) -> tuple[int, str]:
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body.decode()


async def test_malformed_frames_get_errors_and_the_session_stays_open(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        alice = await world.member("alice")
        async with world.client(alice) as a:
            await make_channel(a, "general")

            # Not JSON at all.
            await a.send_raw('{"type": "ping", "id": ')
            error = await _next_error(a)
            assert error["id"] is None
            assert error["code"] == "bad_frame"
            assert error["retryable"] is False
            await _assert_alive(a)

            # JSON, but not an object.
            await a.send_raw("[1, 2, 3]")
            error = await _next_error(a)
            assert (error["id"], error["code"]) == (None, "bad_frame")
            await _assert_alive(a)

            # Unknown type: bad_frame with id null even though an id was given.
            await a.send_raw(_raw({"type": "teleport", "id": 7}))
            error = await _next_error(a)
            assert (error["id"], error["code"]) == (None, "bad_frame")
            await _assert_alive(a)

            # No type at all.
            await a.send_raw(_raw({"id": 8, "target": "#general"}))
            error = await _next_error(a)
            assert (error["id"], error["code"]) == (None, "bad_frame")
            await _assert_alive(a)

            # A binary frame.
            await a.send_raw(b'{"type":"ping","id":1}')
            error = await _next_error(a)
            assert (error["id"], error["code"]) == (None, "bad_frame")
            await _assert_alive(a)

            # Oversized (> 256 KiB): payload_too_large, the session stays open.
            big = _raw(
                {
                    "type": "send",
                    "id": "big",
                    "target": "#general",
                    "content": "x" * (256 * 1024 + 1),
                    "clientMessageId": "c-big",
                }
            )
            await a.send_raw(big)
            error = await _next_error(a)
            assert error["code"] == "payload_too_large"
            await _assert_alive(a)
            page = await a.history("#general")
            assert page["messages"] == []

            # Nothing above was queued as an event besides the errors we read.
            assert a.pending_events() == 0


WRONG_FIELDS: list[tuple[dict[str, Any], str]] = [
    (
        {
            "type": "send",
            "target": "#general",
            "content": "x",
            "clientMessageId": "c-1",
            "freshness": {"targetKey": "scp_x", "seenUpToSeq": "3"},
        },
        "$.freshness.seenUpToSeq",
    ),
    ({"type": "history", "target": "#general", "limit": 1000}, "$.limit"),
    ({"type": "history", "target": "#general", "afterSeq": -1}, "$.afterSeq"),
    ({"type": "send", "content": "x", "clientMessageId": "c-2"}, "$.target"),
    ({"type": "history"}, "$.target"),
    (
        {
            "type": "send",
            "target": "#general",
            "content": "x",
            "clientMessageId": "c-4",
            "freshness": {"targetKey": "scp_x"},
        },
        "$.freshness.seenUpToSeq",
    ),
    ({"type": "send", "target": 5, "content": "x", "clientMessageId": "c-3"}, "$.target"),
    ({"type": "markRead", "scopeId": "scp_x", "seq": "1"}, "$.seq"),
]


async def test_wrong_field_types_get_validation_failed(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        alice = await world.member("alice")
        async with world.client(alice) as a:
            await make_channel(a, "general")
            for request_id in ("req-1", 41):
                for frame, path in WRONG_FIELDS:
                    error = await _error_for(a, {**frame, "id": request_id})
                    assert error["code"] == "validation_failed", frame
                    assert error["details"]["path"] == path, (frame, error)
                    await _assert_alive(a)
            page = await a.history("#general")
            assert page["messages"] == []


async def test_authentication_failures_close_the_connection(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node, "one")
        other = World(node, (await World.create(node, "two")).workspace_id)
        alice = await world.member("alice")
        stranger = await other.member("stranger")

        # A bad token.
        with pytest.raises(ConnectionClosed) as closed:
            async with open_client(f"{node.url}?workspace={world.workspace_id}", "snt_nope"):
                pass
        assert closed.value.code == 4401

        # A revoked-looking / empty token.
        with pytest.raises(ConnectionClosed) as closed:
            async with open_client(node.url, ""):
                pass
        assert closed.value.code == 4401

        # The first frame is not hello: a request, garbage, or an invalid hello.
        assert await _close_code_of(node, _raw({"type": "ping", "id": 1})) == 4401
        assert await _close_code_of(node, "not json") == 4401
        assert await _close_code_of(node, _raw({"type": "hello", "token": 5})) == 4401
        hello = {"type": "hello", "client": {"kind": "daemon", "name": "t", "version": "1"}}
        assert await _close_code_of(node, _raw({**hello, "token": "snt_bad"})) == 4401
        query = f"?workspace={world.workspace_id}"
        stranger_hello = _raw({**hello, "token": stranger.token})
        assert await _close_code_of(node, stranger_hello, query=query) == 4403

        # A valid token of another workspace.
        with pytest.raises(ConnectionClosed) as closed:
            async with world.client(stranger):
                pass
        assert closed.value.code == 4403

        # The right workspace still works.
        async with world.client(alice) as a:
            assert a.member_id == alice.id


async def test_operation_errors(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        alice = await world.member("alice")
        bob = await world.member("bob")
        bot = await world.member("bot", MemberType.AGENT)
        async with (
            world.client(alice) as a,
            world.client(bob) as b,
            world.client(bot, kind="daemon", capabilities=["freshness"]) as agent,
        ):
            scope_id = await make_channel(a, "general", agent)
            secret_id = await a.request(
                "createChannel", slug="secret", name="Secret", visibility="private"
            )
            assert (await a.send("#general", "one"))["acceptedSeq"] == 1

            # A non-member sends to and reads a private channel: it does not exist for it.
            for target in ("#secret", f"scope:{secret_id['scopeId']}"):
                with pytest.raises(ClientError) as failed:
                    await b.send(target, "let me in")
                assert failed.value.code == "not_found"
                with pytest.raises(ClientError) as failed:
                    await b.history(target)
                assert failed.value.code == "not_found"

            # A non-member sends to and reads a public channel it has not joined.
            with pytest.raises(ClientError) as failed:
                await b.send("#general", "drive-by")
            assert failed.value.code == "forbidden"
            with pytest.raises(ClientError) as failed:
                await b.history("#general")
            assert failed.value.code == "forbidden"

            # Freshness: a frontier ahead of the scope, a wrong target key.
            with pytest.raises(ClientError) as failed:
                await agent.send(
                    "#general", "future", freshness={"targetKey": scope_id, "seenUpToSeq": 99}
                )
            assert failed.value.code == "invalid_frontier"
            with pytest.raises(ClientError) as failed:
                await agent.send(
                    "#general",
                    "elsewhere",
                    freshness={"targetKey": secret_id["scopeId"], "seenUpToSeq": 1},
                )
            assert failed.value.code == "target_key_mismatch"

            # Unknown and unparseable targets.
            for client in (a, agent):
                with pytest.raises(ClientError) as failed:
                    await client.send("#nope", "hello?")
                assert failed.value.code == "not_found"
                with pytest.raises(ClientError) as failed:
                    await client.history("#nope")
                assert failed.value.code == "not_found"
                with pytest.raises(ClientError) as failed:
                    await client.send("invalid:xyz", "hello?")
                assert failed.value.code == "invalid_target"
                with pytest.raises(ClientError) as failed:
                    await client.history("invalid:xyz")
                assert failed.value.code == "invalid_target"

            # None of the rejected sends left a trace; the node still serves sends.
            for client in (a, b, agent):
                await _assert_alive(client)
            page = await a.history("#general")
            assert [m["content"] for m in page["messages"]] == ["one"]
            sent = await agent.send(
                "#general", "fresh", freshness={"targetKey": scope_id, "seenUpToSeq": 1}
            )
            assert (sent["state"], sent["acceptedSeq"]) == ("sent", 2)


async def test_node_survives_hostile_input_and_counts_sends(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        alice = await world.member("alice")
        bob = await world.member("bob")
        async with world.client(alice) as a:
            await make_channel(a, "general")
            for text in ("{", "[]", "null", '"hello"', _raw({"type": 1}), "\x00" * 10):
                await a.send_raw(text)
                error = await _next_error(a)
                assert (error["id"], error["code"]) == (None, "bad_frame")
            await a.send_raw(b"\xff\xfe")
            error = await _next_error(a)
            assert error["code"] == "bad_frame"
            for request_id in (None, True, [1], {"x": 1}):
                await a.send_raw(_raw({"type": "ping", "id": request_id}))
                error = await _next_error(a)
                assert error["code"] in ("bad_frame", "validation_failed")
                assert error["id"] is None
            await a.send_raw("x" * (300 * 1024))
            error = await _next_error(a)
            assert error["code"] == "payload_too_large"
            await _assert_alive(a)

        # Connections that misbehave before hello do not hurt the node either.
        for _ in range(3):
            assert await _close_code_of(node, "{}") == 4401

        async with world.client(alice) as a, world.client(bob) as b:
            scope_id = (await a.request("scopes"))["scopes"][0]["id"]
            await b.request("join", scopeId=scope_id)
            sent = await a.send("#general", "still here")
            assert sent["state"] == "sent"
            events = await b.events_until(
                lambda e: e["type"] == "message" and e["message"]["content"] == "still here",
                timeout=TIMEOUT,
            )
            assert events[-1]["scopeId"] == scope_id

        status, body = await _http_get(node.services.port, "/metrics")
        assert status == 200
        lines = body.splitlines()
        assert 'scopenode_sends_total{state="sent"} 1' in lines
        assert any(line.startswith("# TYPE scopenode_sends_total counter") for line in lines)
        status, body = await _http_get(node.services.port, "/healthz")
        assert status == 200
