"""Baseline (b): the raw WebSocket fan-out limit of this machine.

A minimal server with wsproto over trio streams: it accepts ``clients``
WebSocket connections, then broadcasts ``messages`` text frames. Each frame
is framed once with wsproto's ``FrameProtocol`` (server→client frames are
unmasked, so the same bytes are valid for every connection) and appended to
every connection's pending buffer; one writer task per connection sends
everything queued in a single ``send_all``. The producer never awaits a
single recipient except for backpressure above ``HIGH_WATER`` bytes.

Run standalone (the bench does, so the server has a core of its own)::

    python -m bench.rawfanout --clients N --messages M [--size BYTES]

It prints ``PORT <n>`` once listening and, when done, one JSON line of
:class:`ServerStats`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field

import trio
import trio.lowlevel
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request
from wsproto.frame_protocol import FrameProtocol

from bench.stats import own_cpu_s, raise_fd_limit
from bench.wsframes import mark

HIGH_WATER = 4 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass
class ServerStats:
    clients: int = 0
    messages: int = 0
    frame_bytes: int = 0
    t_first_ns: int = 0
    t_last_ns: int = 0
    t_flushed_ns: int = 0
    cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def envelope(seq: int, t_ns: int, size: int) -> str:
    """A ``message`` event of about ``size`` bytes carrying its send time."""
    head = f'{{"type":"message","scopeId":"scp_bench","message":{{"seq":{seq},"content":"'
    body = mark(t_ns)
    tail = '"}}'
    pad = max(0, size - len(head) - len(body) - len(tail) - 1)
    return f"{head}{body} {'x' * pad}{tail}"


class _Client:
    __slots__ = ("drained", "pending", "stream", "wake")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.pending = bytearray()
        self.wake = trio.Event()
        self.drained = trio.Event()


async def accept_upgrade(stream: trio.SocketStream) -> str:
    """Accept a client's WebSocket upgrade; the request's path."""
    ws = WSConnection(ConnectionType.SERVER)
    with trio.fail_after(HANDSHAKE_TIMEOUT_S):
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("EOF during handshake")
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    await stream.send_all(ws.send(AcceptConnection()))
                    return event.target


async def _writer(c: _Client, done: trio.Event) -> None:
    try:
        while True:
            if not c.pending:
                if done.is_set():
                    return
                await c.wake.wait()
                c.wake = trio.Event()
                continue
            data, c.pending = c.pending, bytearray()
            await c.stream.send_all(data)
            c.drained.set()
    except trio.BrokenResourceError:
        c.pending = bytearray()
    finally:
        c.drained.set()
        await c.stream.aclose()


async def serve_fanout(
    clients: int,
    messages: int,
    *,
    size: int = 230,
    burst: int = 1,
    host: str = "127.0.0.1",
    port: int = 0,
    accept_timeout_s: float = 120.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> ServerStats:
    """Accept ``clients`` connections, broadcast ``messages`` frames, flush, close.

    The producer broadcasts ``burst`` messages back to back before it yields to
    the writers (a node under load has several events queued per tick).
    """
    stats = ServerStats(clients=clients, messages=messages)
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=4096)
    listener = listeners[0]
    task_status.started(listener.socket.getsockname()[1])
    conns: list[_Client] = []
    all_in = trio.Event()
    done = trio.Event()

    async def accept_one(stream: trio.SocketStream, writers: trio.Nursery) -> None:
        try:
            await accept_upgrade(stream)
        except (trio.TooSlowError, ConnectionError, trio.BrokenResourceError) as e:
            stats.errors.append(f"handshake: {e!r}")
            await stream.aclose()
            return
        c = _Client(stream)
        conns.append(c)
        writers.start_soon(_writer, c, done)
        if len(conns) >= clients:
            all_in.set()

    async with trio.open_nursery() as writers:
        async with trio.open_nursery() as acceptors:

            async def accept_loop() -> None:
                while True:
                    stream = await listener.accept()
                    acceptors.start_soon(accept_one, stream, writers)

            acceptors.start_soon(accept_loop)
            with trio.move_on_after(accept_timeout_s):
                await all_in.wait()
            acceptors.cancel_scope.cancel()
        await listener.aclose()
        fp = FrameProtocol(client=False, extensions=[])
        stats.t_first_ns = time.monotonic_ns()
        for seq in range(1, messages + 1):
            frame = bytes(fp.send_data(envelope(seq, time.monotonic_ns(), size), fin=True))
            stats.frame_bytes = len(frame)
            for c in conns:
                c.pending += frame
                c.wake.set()
            if seq % burst and seq != messages:
                continue
            for c in conns:
                if len(c.pending) > HIGH_WATER:
                    c.drained = trio.Event()
                    await c.drained.wait()
            await trio.lowlevel.checkpoint()
        stats.t_last_ns = time.monotonic_ns()
        done.set()
        for c in conns:
            c.wake.set()
    stats.t_flushed_ns = time.monotonic_ns()
    stats.clients = len(conns)
    stats.cpu_s = own_cpu_s()
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rawfanout")
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--messages", type=int, required=True)
    p.add_argument("--size", type=int, default=230)
    p.add_argument("--burst", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    raise_fd_limit()

    async def run() -> ServerStats:
        holder: list[ServerStats] = []

        async def serve(task_status: trio.TaskStatus[int]) -> None:
            stats = await serve_fanout(
                args.clients,
                args.messages,
                size=args.size,
                burst=args.burst,
                port=args.port,
                task_status=task_status,
            )
            holder.append(stats)

        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve)
            print(f"PORT {port}", flush=True)
        return holder[0]

    stats = trio.run(run)
    sys.stdout.write(json.dumps(asdict(stats)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
