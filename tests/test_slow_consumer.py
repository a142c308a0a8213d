"""Slow consumers.

One session of 100 in a scope stops reading. With a small outbound cap the
node closes it with 4429 within a bounded time while the 99 others receive
every message; the stalled member then resumes without loss. The delivery
rate of the 99 is printed (run with ``-s``); the fan-out bench
(``scopenode bench fanout``) is where delivery rates are measured.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from bench.client import Session, open_session, ws_url
from node.client import Client
from protocol.errors import CloseCode
from tests.nodes import Person, RunningNode, World, make_channel, running_node

READERS = 99
CONTENT_BYTES = 1_024
CAP_BYTES = 64 * 1024
GRACE = 0.5
SEND_WINDOW = 8
DELIVERY_TIMEOUT = 120.0
CLOSE_TIMEOUT = 10.0
HEARTBEAT_S = 10.0


@dataclass
class RawSession:
    """A WebSocket session driven by hand: handshake and hello, then reads only on demand."""

    stream: trio.SocketStream
    ws: WSConnection
    parts: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None

    def _absorb(self) -> None:
        for event in self.ws.events():
            if isinstance(event, TextMessage):
                self.parts.append(event.data)
                if event.message_finished:
                    text, self.parts = "".join(self.parts), []
                    self.messages += [json.loads(line) for line in text.split("\n") if line]
            elif isinstance(event, CloseConnection):
                self.close_code = event.code

    async def read_until(self, predicate: Callable[[RawSession], bool], timeout: float) -> None:
        with trio.fail_after(timeout):
            while not predicate(self):
                data = await self.stream.receive_some(65536)
                assert data, "connection ended"
                self.ws.receive_data(data)
                self._absorb()

    async def drain(self, timeout: float) -> bool:
        """Read until the node ends the connection; True if it reset rather than closed."""
        with trio.fail_after(timeout):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return True
                if not data:
                    return False
                self.ws.receive_data(data)
                self._absorb()


async def open_raw_session(
    node: RunningNode, workspace_id: str, token: str, resume: dict[str, int] | None = None
) -> RawSession:
    """Connect with a tiny receive buffer (a slow link): a stall, or a burst the
    node writes faster than the link takes it, shows up in the node's queue."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", node.services.port))
    stream = trio.SocketStream(sock)
    ws = WSConnection(ConnectionType.CLIENT)
    raw = RawSession(stream, ws)
    await stream.send_all(
        ws.send(Request(host="127.0.0.1", target=f"/v1/ws?workspace={workspace_id}"))
    )
    accepted = False
    with trio.fail_after(10):
        while not accepted:
            data = await stream.receive_some(65536)
            assert data, "handshake refused"
            ws.receive_data(data)
            for event in ws.events():
                accepted = accepted or isinstance(event, AcceptConnection)
    hello: dict[str, Any] = {"type": "hello", "token": token, "client": {"kind": "browser"}}
    if resume is not None:
        hello["resume"] = resume
    await stream.send_all(ws.send(TextMessage(json.dumps(hello))))
    await raw.read_until(lambda r: any(m["type"] == "welcome" for m in r.messages), 10)
    return raw


class Reader:
    """A reading session's check of what it receives: every message, in seq order.

    The readers are the bench's lean sessions (``bench/client.py``), whose
    events are handed to :meth:`on_event` as they are decoded: with the node in
    the same process, the client library's per-event channel and wsproto
    parsing for 99 readers cost more CPU than the node's fan-out itself.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.expected = 1
        self.out_of_order: list[tuple[int, int]] = []
        self.done = trio.Event()
        self.done_at = 0.0

    def on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("type") != "message" or self.done.is_set():
            return
        seq = frame["message"]["seq"]
        if seq != self.expected:
            self.out_of_order.append((seq, self.expected))
        self.expected = seq + 1
        if seq >= self.count:
            self.done_at = trio.current_time()
            self.done.set()


async def read_all(session: Session, reader: Reader) -> None:
    """Wait for ``reader``'s last message, pinging so the session outlives the
    node's heartbeat timeout when a loaded host stretches the run."""
    with trio.fail_after(DELIVERY_TIMEOUT):
        while not reader.done.is_set():
            with trio.move_on_after(HEARTBEAT_S):
                await reader.done.wait()
            if not reader.done.is_set():
                await session.ping()
    assert not reader.out_of_order, reader.out_of_order[:5]


async def send_load(client: Client, target: str, count: int) -> None:
    numbers = iter(range(count))
    padding = "x" * CONTENT_BYTES

    async def worker() -> None:
        for n in numbers:
            reply = await client.send(target, f"{n} {padding}")
            assert reply["state"] == "sent", reply

    async with trio.open_nursery() as nursery:
        for _ in range(SEND_WINDOW):
            nursery.start_soon(worker)


async def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    """Poll an in-process condition the node offers no event for (bounded)."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


@dataclass
class LoadResult:
    rate: float  # deliveries per second to the readers
    raw: RawSession | None = None  # the stalled session, if any
    closed_after: float | None = None  # seconds from the first send to its 4429


async def run_load(
    node: RunningNode,
    world: World,
    sender: Person,
    readers: list[Person],
    count: int,
    slug: str,
    stalled: Person | None = None,
) -> LoadResult:
    """Fan ``count`` messages out to the readers (and the stalled member)."""
    closed = node.services.metrics.sessions_closed
    url = ws_url(node.url.removesuffix("/v1/ws"), world.workspace_id)
    async with AsyncExitStack() as stack:
        s = await stack.enter_async_context(world.client(sender))
        checks = [Reader(count) for _ in readers]
        sessions = [
            await stack.enter_async_context(
                open_session(url, p.token, kind="browser", on_event=check.on_event)
            )
            for p, check in zip(readers, checks, strict=True)
        ]
        scope_id = await make_channel(s, slug)
        for session in sessions:
            await session.request("join", scopeId=scope_id)
        result = LoadResult(0.0)
        if stalled is not None:
            async with world.client(stalled) as joiner:
                await joiner.request("join", scopeId=scope_id)
            result.raw = await open_raw_session(node, world.workspace_id, stalled.token)
        closed_before = closed[CloseCode.SLOW_CONSUMER]
        started = trio.current_time()

        async def watch_close() -> None:
            await wait_until(lambda: closed[CloseCode.SLOW_CONSUMER] > closed_before, CLOSE_TIMEOUT)
            result.closed_after = trio.current_time() - started

        async with trio.open_nursery() as nursery:
            for session, check in zip(sessions, checks, strict=True):
                nursery.start_soon(read_all, session, check)
            nursery.start_soon(send_load, s, f"#{slug}", count)
            if stalled is not None:
                nursery.start_soon(watch_close)
        result.rate = len(readers) * count / (max(c.done_at for c in checks) - started)
    return result


async def resume_everything(
    node: RunningNode, world: World, member: Person, target: str, last_seen: int
) -> list[int]:
    """Reconnect with ``resume`` over the same slow link, then page ``history``
    until nothing more: the seqs missed. The resume burst (200 messages, more
    than four times the cap) must reach a client that reads, not close it."""
    async with world.client(member) as probe:
        scope_id = (await probe.history(target, limit=1))["scopeId"]
    raw = await open_raw_session(node, world.workspace_id, member.token, {scope_id: last_seen})
    try:
        await raw.read_until(
            lambda r: r.close_code is not None or any(m["type"] == "resumed" for m in r.messages),
            30,
        )
    except AssertionError:
        raise AssertionError(f"the resume was cut off after {len(raw.messages)} objects") from None
    finally:
        await raw.stream.aclose()
    assert raw.close_code is None, f"closed with {raw.close_code} while resuming"
    resumed = raw.messages[-1]
    missed = [m["message"]["seq"] for m in raw.messages if m["type"] == "message"]
    has_more = resumed["scopes"][scope_id]["hasMore"]
    async with world.client(member) as again:
        for _ in range(100):  # bounded paging
            if not has_more:
                break
            after = missed[-1] if missed else last_seen
            page = await again.history(target, afterSeq=after, limit=200)
            missed += [m["seq"] for m in page["messages"]]
            has_more = page["hasMore"]
    return missed


@pytest.mark.parametrize(
    "count",
    [
        pytest.param(500, marks=pytest.mark.runs_for(7)),
        pytest.param(2_000, marks=[pytest.mark.slow, pytest.mark.runs_for(14)]),
    ],
)
async def test_stalled_session_is_closed_with_4429_while_99_others_get_everything(
    database_url: str, tmp_path: Path, count: int
) -> None:
    async with running_node(
        database_url, tmp_path, outbound_cap_bytes=CAP_BYTES, slow_consumer_grace=GRACE
    ) as node:
        world = await World.create(node)
        sender = await world.member("sender")
        readers = [await world.member(f"reader{i}") for i in range(READERS)]
        stalled = await world.member("stalled")

        # Warm-up (actors, caches), then the load with a stalled session. The
        # rate is printed, not asserted: the machine may be shared.
        await run_load(node, world, sender, readers, 20, "warmup")
        load = await run_load(node, world, sender, readers, count, "load", stalled)
        print(
            f"\nslow consumer: {READERS} readers x {count} messages of ~{CONTENT_BYTES} B "
            f"(node and clients in one process): {load.rate:,.0f} deliveries/s with one "
            f"stalled session; stalled session closed 4429 after {load.closed_after:.2f} s"
        )
        assert node.services.metrics.sessions_closed[CloseCode.SLOW_CONSUMER] == 1
        assert load.closed_after is not None
        assert load.closed_after < CLOSE_TIMEOUT

        # The stalled client finds the connection ended once it reads again. It
        # cannot see a 4429 close frame: the node gave up on a write the client
        # never took, so the frame has no place on the stream.
        raw = load.raw
        assert raw is not None
        reset = await raw.drain(CLOSE_TIMEOUT)
        await raw.stream.aclose()
        received = [m["message"]["seq"] for m in raw.messages if m["type"] == "message"]
        print(
            f"stalled session: {len(received)} messages were in flight to it, close frame "
            f"{raw.close_code}, connection ended by {'reset' if reset else 'FIN'}"
        )
        assert raw.close_code in (None, CloseCode.SLOW_CONSUMER)
        assert received == list(range(1, len(received) + 1))
        assert len(received) < count

        # It reconnects with resume and pages history: nothing is lost.
        last_seen = received[-1] if received else 0
        missed = await resume_everything(node, world, stalled, "#load", last_seen)
        assert received + missed == list(range(1, count + 1))
        assert node.services.metrics.sessions_closed[CloseCode.SLOW_CONSUMER] == 1
