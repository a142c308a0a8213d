"""node.client against a tiny in-test fake node on a real WebSocket (port 0)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import trio
import trio_websocket

from node.client import Client, ClientError, ConnectionClosed, open_client

GOOD_TOKEN = "tok-good"
WELCOME_MEMBER = {"id": "mem_1", "type": "agent", "handle": "bot", "displayName": "Bot"}


def encode(*objects: dict[str, Any]) -> str:
    """One server frame holding ``objects`` separated by newlines."""
    return "\n".join(msgspec.json.encode(obj).decode() for obj in objects)


def reply(frame: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"type": "reply", "id": frame["id"], "op": frame["type"], "result": result}


@dataclass
class FakeNode:
    """Just enough of the v1 protocol (docs/protocol.md) to exercise the client.

    Ops: any unknown op echoes its frame as the result; ``fail`` answers
    ``error``; ``burst`` answers with a reply and two events coalesced in one
    frame; ``collect`` holds replies until ``count`` of them arrived, then
    answers in reverse order; ``hold``/``release`` park a request until
    released; ``hang`` closes with 4503 instead of answering; ``garbage`` sends
    a frame that is not JSON; ``flood`` sends ``count`` events in one frame.
    """

    url: str = ""
    heartbeat_ms: int = 20_000
    collected: list[dict[str, Any]] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)
    hold_arrived: trio.Event = field(default_factory=trio.Event)
    pong: dict[str, Any] | None = None

    async def handle(self, request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            hello = msgspec.json.decode(await ws.get_message())
            if hello.get("type") != "hello" or hello.get("token") != GOOD_TOKEN:
                await ws.aclose(4401, "unauthenticated")
                return
            welcome = {
                "type": "welcome",
                "protocol": 1,
                "sessionId": "ses_1",
                "nodeId": "node_1",
                "workspaceId": "ws_1",
                "member": WELCOME_MEMBER,
                "heartbeatMs": self.heartbeat_ms,
                "capabilities": hello.get("capabilities", []),
            }
            resume = hello.get("resume") or {}
            resumed = [
                {"type": "message", "scopeId": scope, "message": {"seq": seq + 1}}
                for scope, seq in resume.items()
            ]
            if resume:
                scopes = {
                    scope: {"latestSeq": seq + 1, "hasMore": False} for scope, seq in resume.items()
                }
                resumed.append({"type": "resumed", "scopes": scopes})
            await ws.send_message(encode(welcome, *resumed))
            while True:
                await self.answer(ws, msgspec.json.decode(await ws.get_message()))
        except trio_websocket.ConnectionClosed:
            pass

    async def answer(self, ws: trio_websocket.WebSocketConnection, frame: dict[str, Any]) -> None:
        match frame.get("type"):
            case "fail":
                error = {
                    "type": "error",
                    "id": frame["id"],
                    "code": "forbidden",
                    "message": "not a member",
                    "retryable": False,
                    "details": {"scopeId": "scp_1"},
                }
                await ws.send_message(encode(error))
            case "burst":
                events = [{"type": "message", "n": 1}, {"type": "message", "n": 2}]
                await ws.send_message(encode(reply(frame, {"ok": True}), *events))
            case "collect":
                self.collected.append(frame)
                if len(self.collected) == frame["count"]:
                    replies = [reply(f, {"n": f["n"]}) for f in reversed(self.collected)]
                    await ws.send_message(encode(*replies))
            case "hold":
                self.held.append(frame)
                self.hold_arrived.set()
            case "release":
                late = [reply(f, {"late": True}) for f in self.held]
                await ws.send_message(encode(*late, reply(frame, {"released": len(late)})))
            case "ping":
                await ws.send_message(encode({"type": "pong", "id": frame["id"]}))
            case "ping-me":
                await ws.send_message(encode({"type": "ping", "id": "srv-1"}))
                self.pong = msgspec.json.decode(await ws.get_message())
                await ws.send_message(encode(reply(frame, {"pong": self.pong})))
            case "hang":
                await ws.aclose(4503, "draining")
            case "garbage":
                await ws.send_message("this is not json")
            case "flood":
                await ws.send_message(
                    encode(*({"type": "ping", "n": n} for n in range(frame["count"])))
                )
            case "bad":
                await ws.send_message(
                    encode(
                        {
                            "type": "error",
                            "id": None,
                            "code": "bad_frame",
                            "message": "?",
                            "retryable": False,
                            "details": {},
                        }
                    )
                )
            case _:
                await ws.send_message(encode(reply(frame, {"echo": frame})))


@pytest.fixture
async def node(nursery: trio.Nursery) -> FakeNode:
    fake = FakeNode()
    server = await nursery.start(trio_websocket.serve_websocket, fake.handle, "127.0.0.1", 0, None)
    fake.url = f"ws://127.0.0.1:{server.port}/v1/ws?workspace=ws_1"
    return fake


async def test_welcome_and_member_id(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN, kind="daemon", capabilities=["ack"]) as client:
        assert client.welcome["type"] == "welcome"
        assert client.welcome["capabilities"] == ["ack"]
        assert client.member_id == "mem_1"


async def test_request_returns_result_and_sends_fields(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        result = await client.request("scopes", limit=3)
        assert result["echo"] == {"type": "scopes", "id": 1, "limit": 3}


async def test_fifty_concurrent_requests_match_replies_by_id(node: FakeNode) -> None:
    results: dict[int, dict[str, Any]] = {}

    async def one(client: Client, n: int) -> None:
        results[n] = await client.request("collect", n=n, count=50)

    async with open_client(node.url, GOOD_TOKEN) as client:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for n in range(50):
                    nursery.start_soon(one, client, n)
        assert client.pending_events() == 0
    # The fake answered all 50 in reverse order, in one coalesced frame.
    assert results == {n: {"n": n} for n in range(50)}


async def test_error_reply_raises_client_error(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        with pytest.raises(ClientError) as caught:
            await client.request("fail", scopeId="scp_1")
        assert caught.value.code == "forbidden"
        assert caught.value.message == "not a member"
        assert caught.value.retryable is False
        assert caught.value.details == {"scopeId": "scp_1"}
        assert caught.value.op == "fail"
        # The session lives on.
        assert (await client.request("scopes"))["echo"]["type"] == "scopes"


async def test_request_frame_returns_error_frames_and_keeps_id_type(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        error = await client.request_frame({"type": "fail", "id": "req-a"})
        assert error["type"] == "error"
        assert error["id"] == "req-a"
        answer = await client.request_frame({"type": "echo", "id": 7})
        assert answer == reply({"type": "echo", "id": 7}, {"echo": {"type": "echo", "id": 7}})


async def test_coalesced_frame_is_split_into_reply_and_events(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        assert await client.request("burst") == {"ok": True}
        assert client.pending_events() == 2
        assert await client.next_event(timeout=5) == {"type": "message", "n": 1}
        assert await client.next_event(timeout=5) == {"type": "message", "n": 2}
        with pytest.raises(trio.TooSlowError):
            await client.next_event(timeout=0)


async def test_events_coalesced_with_welcome_are_kept(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN, resume={"scp_1": 4, "scp_2": 0}) as client:
        events = await client.events_until(lambda e: e["type"] == "resumed", timeout=5)
    assert [(e["type"], e.get("scopeId")) for e in events] == [
        ("message", "scp_1"),
        ("message", "scp_2"),
        ("resumed", None),
    ]
    assert events[-1]["scopes"]["scp_1"] == {"latestSeq": 5, "hasMore": False}


async def test_events_until_times_out_with_what_it_saw(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        await client.request("burst")
        with pytest.raises(trio.TooSlowError, match="2 seen"):
            await client.events_until(lambda e: e["type"] == "never", timeout=0.2)


async def test_error_with_null_id_is_an_event(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        await client.send_raw(encode({"type": "bad", "id": None}))
        event = await client.next_event(timeout=5)
        assert event["type"] == "error"
        assert event["code"] == "bad_frame"


async def test_send_and_history_helpers(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        sent = (await client.send("#general", "hi @bob", messageType="text"))["echo"]
        assert sent["target"] == "#general"
        assert sent["content"] == "hi @bob"
        assert sent["messageType"] == "text"
        assert sent["clientMessageId"].startswith("c-")
        again = (await client.send("#general", "hi", clientMessageId="c-1"))["echo"]
        assert again["clientMessageId"] == "c-1"
        page = (await client.history("#general", afterSeq=3, limit=10))["echo"]
        assert page == {
            "type": "history",
            "id": 3,
            "target": "#general",
            "afterSeq": 3,
            "limit": 10,
        }


async def test_bad_token_raises_connection_closed_4401(node: FakeNode) -> None:
    with pytest.raises(ConnectionClosed) as caught:
        async with open_client(node.url, "tok-bad"):
            pytest.fail("a bad token must not yield a client")
    assert caught.value.code == 4401


async def test_pending_request_fails_when_server_closes(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        with pytest.raises(ConnectionClosed) as caught:
            await client.request("hang")
        assert caught.value.code == 4503
        assert client.close_code == 4503
        assert await client.wait_closed(timeout=5) == 4503
        with pytest.raises(ConnectionClosed):
            await client.next_event(timeout=5)
        with pytest.raises(ConnectionClosed):
            await client.request("scopes")


async def test_events_before_close_are_drained_before_connection_closed(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        await client.request("burst")
        with pytest.raises(ConnectionClosed):
            await client.request("hang")
        assert [(await client.next_event(timeout=5))["n"] for _ in range(2)] == [1, 2]
        with pytest.raises(ConnectionClosed) as caught:
            await client.next_event(timeout=5)
        assert caught.value.code == 4503


async def test_cancelled_request_drops_its_late_reply(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.request, "hold")
            with trio.fail_after(5):
                await node.hold_arrived.wait()
            nursery.cancel_scope.cancel()
        # The late reply to "hold" arrives in the same frame, before this one.
        assert await client.request("release") == {"released": 1}
        assert client.pending_events() == 0


async def test_invalid_json_from_server_closes_with_1002(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        with pytest.raises(ConnectionClosed) as caught:
            await client.request("garbage")
        assert caught.value.code == 1002
        assert client.close_code == 1002


async def test_event_queue_overflow_closes_after_keeping_what_fits(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN, max_pending_events=3) as client:
        await client.send_raw(encode({"type": "flood", "id": None, "count": 5}))
        assert await client.wait_closed(timeout=5) == 1008
        assert [(await client.next_event(timeout=5))["n"] for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ConnectionClosed):
            await client.next_event(timeout=5)


async def test_unbounded_event_queue_when_asked(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN, max_pending_events=math.inf) as client:
        await client.send_raw(encode({"type": "flood", "id": None, "count": 500}))
        events = await client.events_until(lambda e: e["n"] == 499, timeout=5)
        assert len(events) == 500


async def test_aclose_records_our_code(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        await client.aclose(4000)
        assert await client.wait_closed(timeout=5) == 4000
        with pytest.raises(ConnectionClosed):
            await client.request("scopes")


async def test_exception_from_the_callers_block_is_not_wrapped(node: FakeNode) -> None:
    with pytest.raises(KeyError, match="from the caller"):
        await use_then_raise(node.url, KeyError("from the caller's block"))


async def use_then_raise(url: str, error: Exception) -> None:
    async with open_client(url, GOOD_TOKEN) as client:
        await client.request("scopes")
        raise error


async def test_ping_answers(node: FakeNode) -> None:
    async with open_client(node.url, GOOD_TOKEN) as client:
        # A ping sent with request_frame returns its pong; a raw one queues it.
        assert await client.request_frame({"type": "ping", "id": 9}) == {"type": "pong", "id": 9}
        await client.send_raw(encode({"type": "ping", "id": "raw"}))
        assert await client.next_event(timeout=5) == {"type": "pong", "id": "raw"}
        # A ping from the node is answered by the client itself.
        assert await client.request("ping-me") == {"pong": {"type": "pong", "id": "srv-1"}}
        assert client.pending_events() == 0
