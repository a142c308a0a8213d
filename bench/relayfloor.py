"""A bare relay: a reaction, or a send, through a server that does nothing else.

A reaction through the node is a WebSocket request, the reaction statement
and a reply, then one ``reaction`` event to every reader. This server does
only that and nothing else: no authentication, no actor, no policy, no
protocol frames beyond a short JSON reply — one frame in, the very storage
call the node's Applier makes (``storage.reactions.react``, one autocommit
connection per reactor), one reply frame written straight to the socket,
then the event's bytes (framed once) written to every reader socket, on trio
in one process, as the node writes them. What it costs over the raw
statement is what this relay pays for a process boundary, a socket and a
reply; the node's distance to it is an estimate of what the node itself adds
(a better relay would lower the floor).

``--events thread`` writes the readers' events from a second thread instead,
so the next request can be read and run while the events go out (the write
system calls release the interpreter's lock).

``serve-sends`` is the same floor for sends: a request is a bare frame; per
scope, the requests queued while the scope's last chain commits go as the next
chain, as a scope actor hands them over, to the node's own committer
(``storage.group_commit.GroupCommitter`` with the node's lanes and gathering:
a lone chain as the single-send statement, chains of several scopes as one
group statement, both through the prepared-statement call the node's sends
take); the reply goes out after commit. No actor state, policy, plan beyond
the row itself, event or outbox delivery. Each scope is a baseline scope of its
own (``storage.send_baseline.baseline_values``). It stays up across a bench's
rounds, as a node does; a ``SETTLE`` line on its standard input settles the
outbox rows it left (as the raw phase's are) and answers ``SETTLED
<statements> <sends>``.

Run by ``scopenode bench reactions --relay-floor`` (``bench.workloads.reactions``)
and ``scopenode bench throughput --curve … --relay-floor`` (``bench.curve``)::

    python -m bench.relayfloor serve --dsn DSN --scope S --members M1,M2 [--events thread]
    python -m bench.relayfloor readers --url ws://127.0.0.1:PORT/reader --count N
    python -m bench.relayfloor serve-sends --dsn DSN --scopes R --lanes 2 --gather-ms 1

``serve`` and ``serve-sends`` print ``PORT <n>`` once listening and serve
until their standard input closes (``serve-sends`` then prints ``STATEMENTS
<n>``); ``readers`` prints ``READY`` once its sessions are open and,
when its standard input closes, ``EVENTS <n>`` (every event its sessions got).
"""

from __future__ import annotations

import argparse
import functools
import os
import queue
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio

from actors.model import DeliveryPolicy
from actors.planner import Explain, MessageIntent, MessagePlan, OutboxEvent
from actors.ports import ReactionOutcome
from actors.scope_state import SendCommand, payload_digest
from bench import leanws
from bench.rawfanout import accept_upgrade
from bench.stats import Latency
from node.database import autocommit
from protocol.wsframes import TEXT, InboundFrames, frame
from storage import directory, pg, send_baseline
from storage import reactions as stored_reactions
from storage import scopes as stored_scopes
from storage.group_commit import GroupCommitter
from storage.pool import open_pool
from storage.visibility import Viewer

EMOJI = "👍"
MAX_MESSAGE = 64 * 1024


class Ask(msgspec.Struct):
    m: str
    op: str


_decode_ask = msgspec.json.Decoder(Ask).decode


def ask_frame(message_id: str, op: str) -> bytes:
    """The request a reactor sends for one reaction."""
    return msgspec.json.encode(Ask(message_id, op))


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a non-blocking socket, waiting for room if the
    kernel takes less (the relay's readers and load generator drain at once)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def write_each(data: bytes, fds: Sequence[int]) -> None:
    for fd in fds:
        # A reader that left: the relay does not track it.
        with suppress(OSError):
            _write_all(fd, data)


class EventWriter:
    """Writes one payload to many sockets from a thread of its own."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[bytes, list[int]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def put(self, data: bytes, fds: list[int]) -> None:
        self._jobs.put((data, fds))

    def _run(self) -> None:
        while True:
            write_each(*self._jobs.get())


async def _upgrade(stream: trio.SocketStream) -> str | None:
    """The upgraded request's path (None: the client failed the upgrade)."""
    try:
        return await accept_upgrade(stream)
    except (trio.TooSlowError, ConnectionError, trio.BrokenResourceError):
        return None


Route = Callable[[trio.SocketStream, str], Awaitable[None]]


async def _serve_until_stdin_closes(
    route: Route,
    *background: Callable[[], Awaitable[None]],
    on_line: Callable[[str], Awaitable[None]] | None = None,
) -> None:
    """Serve upgraded connections by path (and run ``background``) until the
    bench closes this process's standard input; each line read from it before
    then goes to ``on_line``."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def connection(stream: trio.SocketStream) -> None:
        async with stream:
            target = await _upgrade(stream)
            if target is not None:
                await route(stream, target)

    print(f"PORT {listeners[0].socket.getsockname()[1]}", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, connection, listeners)
        for task in background:
            nursery.start_soon(task)
        while line := await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True):
            if on_line is not None:
                await on_line(line.strip())
        nursery.cancel_scope.cancel()


@dataclass
class Reactors:
    """One autocommit connection and the actor's viewer per reactor, on one channel."""

    conns: list[pg.TrioConnection]
    viewers: list[Viewer]
    scope_id: str
    generation: int

    async def react(self, i: int, message_id: str, op: str) -> ReactionOutcome:
        """Reactor ``i``'s reaction through the storage call the Applier makes."""
        return await stored_reactions.react(
            self.conns[i], op, self.viewers[i], self.scope_id, self.generation, message_id, EMOJI
        )

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


async def connect_reactors(dsn: str, scope_id: str, member_ids: Sequence[str]) -> Reactors:
    conns = [await pg.connect(dsn, autocommit=True) for _ in member_ids]
    viewers, generation = await reactor_viewers(conns[0], scope_id, member_ids)
    return Reactors(conns, viewers, scope_id, generation)


async def _texts(stream: trio.SocketStream) -> AsyncIterator[bytes]:
    """The text messages a client sends, until it sends anything else or leaves."""
    frames = InboundFrames(MAX_MESSAGE)
    while data := await stream.receive_some(65536):
        for kind, payload in frames.feed(data):
            if kind != TEXT:
                return
            yield payload


class ReactionRelay:
    """Reactions committed and published, and nothing else."""

    def __init__(self, reactors: Reactors, threaded: bool) -> None:
        self.reactors = reactors
        self.readers: list[int] = []
        self.writer = EventWriter() if threaded else None

    async def route(self, stream: trio.SocketStream, target: str) -> None:
        fd = stream.socket.fileno()
        if target == "/reader":
            self.readers.append(fd)
            with suppress(trio.BrokenResourceError):
                while await stream.receive_some(65536):
                    pass
            self.readers.remove(fd)
        elif target.startswith("/reactor/"):
            await self._reactor(stream, int(target.rsplit("/", 1)[1]))

    async def _reactor(self, stream: trio.SocketStream, i: int) -> None:
        fd = stream.socket.fileno()
        async for payload in _texts(stream):
            ask = _decode_ask(payload)
            outcome = await self.reactors.react(i, ask.m, ask.op)
            reply = b'{"type":"reply","changed":%s}' % (b"true" if outcome.changed else b"false")
            _write_all(fd, frame(reply))
            if outcome.changed:
                self._publish(ask)

    def _publish(self, ask: Ask) -> None:
        event = frame(
            b'{"type":"reaction","messageId":"%s","emoji":"%s","op":"%s"}'
            % (ask.m.encode(), EMOJI.encode(), ask.op.encode())
        )
        if self.writer is not None:
            self.writer.put(event, list(self.readers))
            return
        write_each(event, self.readers)


async def reactor_viewers(
    conn: pg.TrioConnection, scope_id: str, member_ids: Sequence[str]
) -> tuple[list[Viewer], int]:
    """What the actor passes for a human with a current public membership of a
    channel (a public reader, the channel its only grant scope, no thread), and
    the roster generation: nothing changes the roster during a run."""
    by_id = await directory.get_members(conn, list(member_ids))
    generation = await stored_scopes.roster_generation(conn, scope_id)
    return [Viewer(by_id[m], True, (scope_id,), False) for m in member_ids], generation


async def serve(dsn: str, scope_id: str, member_ids: list[str], threaded: bool) -> None:
    reactors = await connect_reactors(dsn, scope_id, member_ids)
    await _serve_until_stdin_closes(ReactionRelay(reactors, threaded).route)
    await reactors.close()


async def readers(url: str, count: int) -> None:
    events = 0

    async def drain(ws: leanws.LeanWebSocket) -> None:
        nonlocal events
        try:
            while True:
                await ws.get_message()
                events += 1
        except leanws.Closed:
            pass

    sessions = [await leanws.connect(url, 10.0) for _ in range(count)]
    print("READY", flush=True)
    async with trio.open_nursery() as nursery:
        for ws in sessions:
            nursery.start_soon(drain, ws)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()
    print(f"EVENTS {events}", flush=True)


def _no_reply(_result: object) -> None:
    """The relay answers on the socket; a command's own reply is never called."""


class SendRelay:
    """Sends committed as the node commits them, and nothing else: per scope one
    loop hands every request queued behind the scope's running commit to the
    node's own committer as one chain (as a scope actor does), and the
    committer (:class:`storage.group_commit.GroupCommitter`, with the node's
    lanes and gathering) groups the chains of all scopes into its statements."""

    def __init__(self, committer: GroupCommitter, scopes: list[dict[str, Any]]) -> None:
        self.committer = committer
        self.scopes = scopes
        self.waiting: list[list[int]] = [[] for _ in scopes]  # reply fds per scope
        self.lots = [trio.lowlevel.ParkingLot() for _ in scopes]
        self.latest = [int(sc["latest_seq"]) for sc in scopes]
        self.sent = 0

    async def sender(self, stream: trio.SocketStream, scope: int) -> None:
        fd = stream.socket.fileno()
        async for _payload in _texts(stream):
            self.waiting[scope].append(fd)
            self.lots[scope].unpark()

    async def scope_loop(self, scope: int) -> None:
        while True:
            if not self.waiting[scope]:
                await self.lots[scope].park()
                continue
            fds, self.waiting[scope] = self.waiting[scope], []
            seqs = await self.commit(scope, len(fds))
            for fd, seq in zip(fds, seqs, strict=True):
                _write_all(fd, frame(b'{"type":"reply","seq":%d}' % seq))

    async def commit(self, scope: int, count: int) -> list[int]:
        """Commit ``count`` sends to ``scope`` as one chain; their seqs."""
        plans = [self._plan(scope, k) for k in range(count)]
        done = await self.committer.apply(plans)
        self.latest[scope] += count
        self.sent += count
        return [sent.seq for sent in done]

    def _plan(self, scope: int, k: int) -> MessagePlan:
        sc = self.scopes[scope]
        content = sc["content"]
        client_message_id = f"floor-{uuid.uuid4().hex}"
        expected = self.latest[scope] + k
        intent = MessageIntent(
            scope_id=sc["scope_id"],
            workspace_id=sc["workspace_id"],
            message_id=f"msg_{uuid.uuid4().hex}",
            content=content,
            message_type=sc["message_type"],
            client_message_id=client_message_id,
            # What the node keeps for idempotency, computed as it computes it.
            digest=payload_digest(
                sc["scope_id"], SendCommand(sc["author"], content, client_message_id, _no_reply)
            ),
            created_at=datetime.now(UTC),
        )
        return MessagePlan(
            intent=intent,
            author=sc["author"],
            seq=expected + 1,
            expected_seq=expected,
            mentions=(),
            readers=frozenset(),
            wakes=(),
            # The realtime row every send leaves, keyed as the planner keys it.
            outbox=(
                OutboxEvent("realtime", f"rt:{intent.message_id}", DeliveryPolicy.INLINE_ORDINARY),
            ),
            explain=Explain(recipients=()),
            expected_generation=sc["generation"],
        )

    async def settle(self, conn: pg.TrioConnection) -> None:
        """Mark the outbox rows left so far delivered: no node delivers them, and
        a node sharing the database would otherwise replay them later, inside
        another phase."""
        for sc in self.scopes:
            await conn.execute(send_baseline.BASELINE_SETTLE_SQL, (sc["workspace_id"],))


async def send_scopes(conn: pg.TrioConnection, count: int) -> list[dict[str, Any]]:
    scopes: list[dict[str, Any]] = []
    for _ in range(count):
        values = await send_baseline.baseline_values(conn)
        info = await stored_scopes.get_scope(conn, values["scope_id"])
        author = await directory.get_member(conn, values["author_id"])
        assert info is not None
        assert author is not None
        scopes.append(
            {
                **values,
                "author": author,
                "latest_seq": info.latest_seq,
                "generation": info.roster_generation,
            }
        )
    return scopes


async def serve_sends(dsn: str, scopes: int, lanes: int, gather_s: float) -> None:
    setup = await pg.connect(dsn, autocommit=True)
    async with open_pool(dsn, size=lanes, configure=autocommit) as pool:
        committer = GroupCommitter(pool, lanes=lanes, gather=gather_s)
        relay = SendRelay(committer, await send_scopes(setup, scopes))

        async def route(stream: trio.SocketStream, target: str) -> None:
            if target.startswith("/sender/"):
                await relay.sender(stream, int(target.rsplit("/", 1)[1]))

        async def command(line: str) -> None:
            if line == "SETTLE":
                await relay.settle(setup)
                print(f"SETTLED {committer.transactions} {relay.sent}", flush=True)

        loops = [functools.partial(relay.scope_loop, i) for i in range(scopes)]
        await _serve_until_stdin_closes(route, committer.run, *loops, on_line=command)
        await relay.settle(setup)
    print(f"STATEMENTS {committer.transactions}", flush=True)
    await setup.close()


# ------------------------------------------------------------------ the bench's side


async def _line(proc: trio.Process, prefix: str, timeout_s: float) -> str:
    """The rest of the first line ``proc`` prints that starts with ``prefix``."""
    assert proc.stdout is not None
    buf = b""
    with trio.fail_after(timeout_s):
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.startswith(prefix.encode()):
                    return line[len(prefix) :].decode().strip()
            data = await proc.stdout.receive_some(4096)
            if not data:
                raise RuntimeError(f"relay floor process ended before {prefix!r}")
            buf += data


async def _start(stack: AsyncExitStack, *args: str) -> trio.Process:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.relayfloor", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )

    async def stop() -> None:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()

    stack.push_async_callback(stop)
    return proc


async def _finish(proc: trio.Process, prefix: str | None, timeout_s: float) -> str | None:
    """Close ``proc``'s standard input (its signal to end) and read its last word."""
    assert proc.stdin is not None
    await proc.stdin.aclose()
    found = await _line(proc, prefix, timeout_s) if prefix else None
    with trio.fail_after(timeout_s):
        await proc.wait()
    return found


async def run_ops(
    ops: Sequence[Sequence[tuple[str, str]]],
    duration_s: float,
    latency: Latency,
    one: Callable[[int, str, str], Awaitable[None]],
) -> int:
    """Reactor ``i`` runs ``one(i, message_id, op)`` for each of its ops in
    turn, each timed into ``latency``, stopping after a remove once
    ``duration_s`` is over (so every phase ends without reactions); the ops run."""
    deadline = time.monotonic() + duration_s
    done = [0] * len(ops)

    async def worker(i: int) -> None:
        for message_id, op in ops[i]:
            start = time.perf_counter_ns()
            await one(i, message_id, op)
            latency.record_ns(time.perf_counter_ns() - start)
            done[i] += 1
            if op == "remove" and time.monotonic() > deadline:
                return

    async with trio.open_nursery() as nursery:
        for i in range(len(ops)):
            nursery.start_soon(worker, i)
    return sum(done)


class RelayFloor:
    """The relay, its reader processes and one session per reactor."""

    def __init__(self, relay: trio.Process, readers: list[trio.Process]) -> None:
        self.relay = relay
        self.reader_procs = readers
        self.reactors: list[leanws.LeanWebSocket] = []
        self.latency = Latency("relay_floor_reply")
        self.changed = 0

    async def run_phase(
        self, ops: Sequence[Sequence[tuple[str, str]]], duration_s: float, latency: Latency
    ) -> int:
        """The reactors' op sequences through the relay, as the node's phase runs
        them; replies timed into ``latency`` and into ``self.latency``."""

        async def one(i: int, message_id: str, op: str) -> None:
            await self.reactors[i].send_message(ask_frame(message_id, op))
            reply = await self.reactors[i].get_message()
            self.changed += '"changed":true' in reply

        done = await run_ops(ops, duration_s, latency, one)
        self.latency.hist.add(latency.hist)
        return done

    async def close(self, timeout_s: float = 30.0) -> int:
        """End every process; the events the readers got in all."""
        for ws in self.reactors:
            await ws.aclose()
        events = 0
        for proc in self.reader_procs:
            events += int(await _finish(proc, "EVENTS ", timeout_s) or 0)
        await _finish(self.relay, None, timeout_s)
        return events


async def open_relay_floor(
    stack: AsyncExitStack,
    dsn: str,
    scope_id: str,
    reactor_ids: Sequence[str],
    readers: int,
    processes: int,
    events: str,
    timeout_s: float = 60.0,
) -> RelayFloor:
    """Start the relay on ``dsn``, ``readers`` sessions in ``processes``
    processes of their own, and a session per reactor."""
    relay = await _start(
        stack,
        "serve",
        "--dsn",
        dsn,
        "--scope",
        scope_id,
        "--members",
        ",".join(reactor_ids),
        "--events",
        events,
    )
    port = int(await _line(relay, "PORT ", timeout_s))
    procs = []
    processes = max(1, min(processes, readers))
    for k in range(processes if readers else 0):
        count = readers // processes + (k < readers % processes)
        url = f"ws://127.0.0.1:{port}/reader"
        procs.append(await _start(stack, "readers", "--url", url, "--count", str(count)))
    for proc in procs:
        await _line(proc, "READY", timeout_s)
    floor = RelayFloor(relay, procs)
    for i in range(len(reactor_ids)):
        floor.reactors.append(await leanws.connect(f"ws://127.0.0.1:{port}/reactor/{i}", 10.0))
    await trio.sleep(0.2)  # the readers' sessions are registered before any event
    return floor


class SendFloor:
    """The send relay and one session per sender."""

    def __init__(self, relay: trio.Process, senders: list[leanws.LeanWebSocket]) -> None:
        self.relay = relay
        self.senders = senders

    async def run_phase(self, duration_s: float, max_sends: int) -> dict[str, Any]:
        """Every sender sends back to back for ``duration_s``; sends/s and latency."""
        latency = Latency("relay_floor_send")
        per_sender = max(1, max_sends // len(self.senders))
        counts = [0] * len(self.senders)
        t0 = time.monotonic()
        deadline = t0 + duration_s

        async def sender(i: int) -> None:
            ws = self.senders[i]
            for _ in range(per_sender):
                start = time.perf_counter_ns()
                await ws.send_message(b"s")
                await ws.get_message()
                latency.record_ns(time.perf_counter_ns() - start)
                counts[i] += 1
                if time.monotonic() > deadline:
                    return

        async with trio.open_nursery() as nursery:
            for i in range(len(self.senders)):
                nursery.start_soon(sender, i)
        elapsed = time.monotonic() - t0
        return {
            "sends": sum(counts),
            "sends_per_s": round(sum(counts) / elapsed, 1),
            **latency.summary(),
        }

    async def settle(self, timeout_s: float = 60.0) -> tuple[int, int]:
        """Have the relay settle its outbox rows (between phases, while it stays
        up); its statements and sends so far."""
        assert self.relay.stdin is not None
        await self.relay.stdin.send_all(b"SETTLE\n")
        statements, sends = (await _line(self.relay, "SETTLED ", timeout_s)).split()
        return int(statements), int(sends)

    async def close(self, timeout_s: float = 60.0) -> int:
        """Stop the relay (it settles its outbox rows); its statement count."""
        for ws in self.senders:
            await ws.aclose()
        return int(await _finish(self.relay, "STATEMENTS ", timeout_s) or 0)


async def open_send_floor(
    stack: AsyncExitStack,
    dsn: str,
    senders: int,
    per_scope: int,
    lanes: int,
    gather_ms: float,
    timeout_s: float = 60.0,
) -> SendFloor:
    """The send relay on ``dsn`` with ``senders`` sessions, ``per_scope`` to a scope,
    committing with ``lanes`` and ``gather_ms`` as a node with those settings."""
    scopes = max(1, senders // per_scope)
    args = ["serve-sends", "--dsn", dsn, "--scopes", str(scopes), "--lanes", str(lanes)]
    args += ["--gather-ms", str(gather_ms)]
    relay = await _start(stack, *args)
    port = int(await _line(relay, "PORT ", timeout_s))
    sessions = []
    for i in range(senders):
        url = f"ws://127.0.0.1:{port}/sender/{min(i // per_scope, scopes - 1)}"
        sessions.append(await leanws.connect(url, 10.0))
    return SendFloor(relay, sessions)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.relayfloor")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--dsn", required=True)
    s.add_argument("--scope", required=True)
    s.add_argument("--members", required=True, help="reactor member ids, comma-separated")
    s.add_argument("--events", choices=("inline", "thread"), default="inline")
    ss = sub.add_parser("serve-sends")
    ss.add_argument("--dsn", required=True)
    ss.add_argument("--scopes", type=int, required=True)
    ss.add_argument("--lanes", type=int, default=2)
    ss.add_argument("--gather-ms", type=float, default=1.0)
    r = sub.add_parser("readers")
    r.add_argument("--url", required=True)
    r.add_argument("--count", type=int, required=True)
    args = p.parse_args(argv)
    if args.command == "serve":
        members = args.members.split(",")
        trio.run(serve, args.dsn, args.scope, members, args.events == "thread")
    elif args.command == "serve-sends":
        trio.run(serve_sends, args.dsn, args.scopes, args.lanes, args.gather_ms / 1000)
    else:
        trio.run(readers, args.url, args.count)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
