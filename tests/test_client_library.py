"""node.client against a tiny in-test fake node on a real WebSocket (port 0);
its reconnect loop against a real node, behind a relay a test can cut."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio_websocket
from structlog.testing import capture_logs

from node.client import (
    Backoff,
    Client,
    ClientError,
    ConnectionClosed,
    ProtocolViolation,
    ReconnectGaveUp,
    ReconnectingClient,
    SessionEnded,
    is_retryable,
    open_client,
    open_reconnecting_client,
)
from node.cluster_cli import free_ports
from storage import directory
from storage.pg import connect
from tests.nodes import World, make_channel, running_node
from tests.proc_cluster import tcp_relay

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


async def test_a_cancelled_client_closes_at_once(node: FakeNode) -> None:
    # Its reader is cancelled with it: waiting for the node's answer to the
    # close held every cancelled client for the whole connect timeout.
    async def hold(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_client(node.url, GOOD_TOKEN, connect_timeout=5.0):
            task_status.started()
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(hold)
        started = trio.current_time()
        nursery.cancel_scope.cancel()
    assert trio.current_time() - started < 1.0


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


# --- staying connected: backoff, resume, each event once (node.client.reconnect) ---

FAST = Backoff(base=0.05, cap=0.2, deadline=20)


def test_backoff_doubles_to_the_cap_with_full_jitter() -> None:
    backoff = Backoff(base=0.1, cap=1.0)
    assert [backoff.ceiling(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.ceiling(10_000) == 1.0
    rng = random.Random(3)
    delays = [backoff.delay(3, rng) for _ in range(400)]
    assert all(0.0 <= d <= 0.8 for d in delays)
    # Full jitter: spread over the whole range, not bunched below the ceiling.
    assert min(delays) < 0.1
    assert max(delays) > 0.7


def test_backoff_limits_attempts_or_time_and_rejects_nonsense() -> None:
    assert not Backoff().exhausted(10**6, 10**6)
    assert Backoff(max_attempts=3).exhausted(3, 0.0)
    assert not Backoff(max_attempts=3).exhausted(2, 0.0)
    assert Backoff(deadline=5).exhausted(1, 5.0)
    assert not Backoff(deadline=5).exhausted(1, 4.9)
    for bad in ({"base": 0}, {"base": 2, "cap": 1}, {"max_attempts": 0}, {"deadline": 0}):
        with pytest.raises(ValueError):
            Backoff(**bad)


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (None, True),
        (1001, True),
        (1006, True),
        (1011, True),
        (1012, True),
        (4408, True),
        (4429, True),
        (4503, True),
        (1000, False),
        (1002, False),
        (1008, False),
        (4401, False),
        (4403, False),
    ],
)
def test_which_closes_are_retried(code: int | None, retryable: bool) -> None:
    assert is_retryable(ConnectionClosed(code)) is retryable


def test_other_failures_to_connect() -> None:
    assert is_retryable(OSError("refused"))
    assert is_retryable(trio.TooSlowError())
    assert is_retryable(trio_websocket.ConnectionRejected(502, (), b""))
    assert is_retryable(trio_websocket.ConnectionRejected(503, (), b""))
    assert not is_retryable(trio_websocket.ConnectionRejected(404, (), b""))
    refused = {"type": "error", "id": None, "code": "rate_limited", "retryable": True}
    assert is_retryable(ClientError(refused, "hello"))
    assert not is_retryable(ClientError({**refused, "retryable": False}, "hello"))
    assert not is_retryable(ProtocolViolation({"type": "reply"}))
    # The loop's own ends are final, whatever their code.
    assert not is_retryable(SessionEnded(1006))
    assert not is_retryable(ReconnectGaveUp(1006))


async def test_events_repeated_across_sessions_are_handed_over_once() -> None:
    client = ReconnectingClient(lambda resume: open_client("ws://unused", ""), FAST)

    def message(scope: str, seq: int) -> dict[str, Any]:
        return {"type": "message", "scopeId": scope, "message": {"seq": seq}}

    arriving = [message("a", 1), message("a", 2), message("b", 1)]
    arriving += [{"type": "deliver", "deliveryId": "d1"}, {"type": "resumed", "scopes": {}}]
    # A second session: a resume overlapping what was seen, the pending delivery again.
    arriving += [message("a", 2), message("a", 3), {"type": "deliver", "deliveryId": "d1"}]
    arriving += [{"type": "deliver", "deliveryId": "d2"}, {"type": "resumed", "scopes": {}}]
    for event in arriving:
        client._hand_over(event)
    handed = [await client.next_event(timeout=1) for _ in range(client.pending_events())]
    assert [(e["type"], e.get("message", {}).get("seq"), e.get("deliveryId")) for e in handed] == [
        ("message", 1, None),
        ("message", 2, None),
        ("message", 1, None),
        ("deliver", None, "d1"),
        ("resumed", None, None),
        ("message", 3, None),
        ("deliver", None, "d2"),
        ("resumed", None, None),
    ]
    assert client.repeats_dropped == [("message", "a:2"), ("deliver", "d1")]
    assert client.resume_point() == {"a": 3, "b": 1}


async def test_a_dropped_client_reconnects_resumes_and_sees_every_seq_once(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob = await world.member("ann"), await world.member("bob")
        async with world.client(bob) as b, tcp_relay(node.services.port) as relay:
            scope_id = await make_channel(b, "work")
            url = f"{relay.url}?workspace={world.workspace_id}"
            async with open_reconnecting_client(url, ann.token, backoff=FAST) as a:
                await a.request("join", scopeId=scope_id)
                for i in range(3):
                    await b.send("#work", f"before {i}")
                seen = await seqs_until(a, scope_id, 3)
                relay.hold()
                assert relay.cut() == 1
                for i in range(3):
                    await b.send("#work", f"while away {i}")
                # A send while no session is up waits for the next one.
                async with trio.open_nursery() as nursery:
                    sent: list[dict[str, Any]] = []
                    nursery.start_soon(lambda: send_into(a, sent))
                    await trio.sleep(0.5)  # attempts are refused meanwhile
                    assert sent == []
                    refused = relay.accepted - 1
                    relay.release()
                seen += await seqs_until(a, scope_id, 7)
                assert seen == list(range(1, 8))  # each once, in order
                assert sent[0]["state"] == "sent"
                assert sent[0]["acceptedSeq"] == 7
                assert refused >= 1
                assert len(a.welcomes) == 2
                assert a.resume_point() == {scope_id: 7}
                # The missed three came by resume, before live traffic.
                assert a.repeats_dropped == []
                assert await a.request("scopes")


async def send_into(client: Client, results: list[dict[str, Any]]) -> None:
    results.append(await client.send("#work", "from ann", clientMessageId="ann-1"))


async def seqs_until(client: Client, scope_id: str, last: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < last:
        event = await client.next_event(timeout=10)
        if event["type"] == "message" and event["scopeId"] == scope_id:
            seqs.append(int(event["message"]["seq"]))
    return seqs


async def test_a_revoked_token_ends_the_loop_with_session_ended(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        url = f"{node.url}?workspace={world.workspace_id}"
        async with open_reconnecting_client(url, ann.token, backoff=FAST) as a:
            async with await connect(database_url, autocommit=True) as conn:
                assert await directory.revoke_token(conn, ann.token)
            with pytest.raises(SessionEnded) as ended:
                await a.next_event(timeout=5)
            assert ended.value.code == 4401
            with pytest.raises(SessionEnded):
                await a.request("scopes")
            assert len(a.welcomes) == 1
        # The first connect of a revoked token fails at once, without retrying.
        with pytest.raises(SessionEnded) as refused:
            async with open_reconnecting_client(url, ann.token, backoff=FAST):
                pass
        assert refused.value.code == 4401


async def test_the_loop_gives_up_after_its_attempts(tmp_path: Path) -> None:
    nobody = f"ws://127.0.0.1:{free_ports(1)[0]}/v1/ws"
    backoff = Backoff(base=0.01, cap=0.05, max_attempts=3)
    with capture_logs() as logs, pytest.raises(ReconnectGaveUp) as gave_up:
        async with open_reconnecting_client(nobody, "snt_whatever", backoff=backoff):
            pass
    assert isinstance(gave_up.value.__cause__, trio_websocket.HandshakeError)  # refused
    scheduled = [e for e in logs if e["event"] == "reconnect_scheduled"]
    assert [e["failures"] for e in scheduled] == [1, 2]
    assert [e["delay"] <= backoff.ceiling(e["failures"]) for e in scheduled] == [True, True]


async def test_a_draining_close_reconnects_and_resumes_where_it_stopped(node: FakeNode) -> None:
    async with open_reconnecting_client(
        node.url, GOOD_TOKEN, backoff=FAST, resume={"scp_x": 4}
    ) as client:
        assert (await client.next_event(timeout=5))["message"]["seq"] == 5
        assert (await client.next_event(timeout=5))["type"] == "resumed"
        with pytest.raises(ConnectionClosed) as caught:
            await client.request("hang")  # not safe to repeat: the caller hears of the close
        assert caught.value.code == 4503
        # The next hello resumes after seq 5, so the fake node replays seq 6.
        assert (await client.next_event(timeout=5))["message"]["seq"] == 6
        assert (await client.request("echo", n=1))["echo"]["n"] == 1
        assert len(client.welcomes) == 2
        assert client.resume_point() == {"scp_x": 6}
