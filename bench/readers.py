"""Cheap WebSocket reader processes for fan-out and idle workloads.

Each reader process holds many plain TCP sockets, performs a hand-written
HTTP upgrade, optionally sends pre-encoded setup frames (``hello``, ``join``)
and waits for the JSON object that ends setup, then only counts frames with
:class:`bench.wsframes.FrameCounter`. Several processes share the
connections so the generator is not the bottleneck; each one reports its own
CPU time.

Control protocol on the pipe (parent ⇄ child):

* child → parent ``("ready", summary)`` once every connection finished setup
  or failed; ``("progress", events)`` about twice a second;
  ``("result", summary)`` last.
* parent → child ``"stop"``: report and exit.

A child reports on its own when every live connection has counted
``expected_events`` markers, or when ``timeout_s`` has passed since ready.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import selectors
import socket
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from bench.stats import Latency, own_cpu_s, raise_fd_limit
from bench.wsframes import FrameCounter, parse_upgrade_response, upgrade_request
from protocol.wsframes import OP_PING, WebSocketError, client_frame


@dataclass(frozen=True)
class ReaderTarget:
    """One reader connection.

    ``setup_frames`` are sent right after the upgrade; setup ends when a JSON
    object arrives whose ``type`` equals ``done_type`` or whose ``id`` equals
    ``done_id`` (an ``error`` with that id fails the connection). With neither
    set, the connection counts from the upgrade on.
    """

    host: str
    port: int
    path: str
    setup_frames: bytes = b""
    done_type: str | None = None
    done_id: str | None = None


@dataclass(frozen=True)
class ReaderPlan:
    expected_events: int
    sample_every: int = 50
    setup_timeout_s: float = 60.0
    timeout_s: float = 60.0
    keepalive_s: float | None = 15.0


@dataclass
class ReaderSummary:
    """Counts merged over every reader process."""

    connections: int = 0
    failed: int = 0
    events: int = 0
    messages: int = 0
    min_events: int | None = None
    max_events: int | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    latency: Latency = field(default_factory=lambda: Latency("delivery"))

    def merge(self, part: dict[str, Any]) -> None:
        self.connections += part["connections"]
        self.failed += part["failed"]
        self.events += part["events"]
        self.messages += part["messages"]
        self.cpu_s += part.get("cpu_s", 0.0)
        for key, pick in (("min_events", min), ("max_events", max)):
            v = part.get(key)
            if v is not None:
                cur = getattr(self, key)
                setattr(self, key, v if cur is None else pick(cur, v))
        for key, pick in (("first_ns", min), ("last_ns", max)):
            v = part.get(key)
            if v is not None:
                cur = getattr(self, key)
                setattr(self, key, v if cur is None else pick(cur, v))
        self.errors.extend(part.get("errors", [])[: max(0, 10 - len(self.errors))])
        hist = part.get("hist")
        if hist:
            self.latency.add_encoded(hist)


_UPGRADE, _SETUP, _COUNT, _DEAD = range(4)


class _Conn:
    __slots__ = ("buf", "fc", "sock", "state", "target")

    def __init__(self, target: ReaderTarget, sock: socket.socket, sample_every: int) -> None:
        self.target = target
        self.sock = sock
        self.state = _UPGRADE
        self.buf = bytearray()
        self.fc = FrameCounter(sample_every, keep_payloads=bool(target.done_type or target.done_id))


def _setup_outcome(conn: _Conn) -> str | None:
    """``"ok"``, ``"error: …"`` or None (setup still pending) from kept payloads."""
    t = conn.target
    payloads = conn.fc.payloads
    conn.fc.payloads = []
    for payload in payloads:
        for line in payload.split(b"\n"):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                return f"error: undecodable setup frame {line[:80]!r}"
            if not isinstance(obj, dict):
                continue
            if t.done_id is not None and obj.get("id") == t.done_id:
                if obj.get("type") == "error":
                    return f"error: {obj.get('code')}: {obj.get('message')}"
                return "ok"
            if t.done_type is not None and obj.get("type") == t.done_type:
                return "ok"
    return None


def _reader_main(targets: list[ReaderTarget], plan: ReaderPlan, ctl: Connection) -> None:
    raise_fd_limit()
    sel = selectors.DefaultSelector()
    conns: list[_Conn] = []
    errors: list[str] = []
    failed = 0
    hist = Latency("delivery")
    first_ns: int | None = None
    last_ns: int | None = None

    def fail(c: _Conn, why: str) -> None:
        nonlocal failed
        if c.state == _DEAD:
            return
        if c.state == _COUNT and 0 < plan.expected_events <= c.fc.events:
            # The server closed after sending everything: a finished reader, not a failure.
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(c.sock)
            return
        c.state = _DEAD
        failed += 1
        if len(errors) < 10:
            errors.append(why)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(c.sock)
        c.sock.close()

    for t in targets:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(10.0)
        c = _Conn(t, s, plan.sample_every)
        conns.append(c)
        try:
            s.connect((t.host, t.port))
            s.sendall(upgrade_request(t.host, t.port, t.path))
        except OSError as e:
            fail(c, f"connect: {e}")
            continue
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, c)
    sel.register(ctl, selectors.EVENT_READ, None)

    def summary() -> dict[str, Any]:
        live = [c for c in conns if c.state == _COUNT]
        counts = [c.fc.events for c in live]
        return {
            "connections": len(live),
            "failed": failed,
            "events": sum(counts),
            "messages": sum(c.fc.messages for c in live),
            "min_events": min(counts) if counts else None,
            "max_events": max(counts) if counts else None,
            "first_ns": first_ns,
            "last_ns": last_ns,
            "hist": hist.encode(),
            "cpu_s": own_cpu_s(),
            "errors": errors,
        }

    ready_sent = False
    setup_deadline = time.monotonic() + plan.setup_timeout_s
    count_deadline = float("inf")
    next_ping = time.monotonic() + (plan.keepalive_s or float("inf"))
    next_progress = time.monotonic() + 0.5
    stop = False
    while not stop:
        for key, _ in sel.select(timeout=0.1):
            if key.data is None:
                with contextlib.suppress(EOFError):
                    if ctl.recv() == "stop":
                        stop = True
                continue
            c = key.data
            try:
                data = c.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError as e:
                fail(c, f"recv: {e}")
                continue
            if not data:
                fail(c, "eof")
                continue
            now = time.monotonic_ns()
            try:
                if c.state == _UPGRADE:
                    c.buf += data
                    head = parse_upgrade_response(c.buf)
                    if head is None:
                        continue
                    data = bytes(c.buf[head:])
                    c.buf = bytearray()
                    c.state = _SETUP if c.fc.keep_payloads else _COUNT
                    if c.target.setup_frames:
                        c.sock.setblocking(True)
                        c.sock.sendall(c.target.setup_frames)
                        c.sock.setblocking(False)
                before = c.fc.events
                c.fc.feed(data)
            except (WebSocketError, OSError) as e:
                fail(c, str(e))
                continue
            if c.state == _SETUP:
                outcome = _setup_outcome(c)
                if outcome == "ok":
                    c.state = _COUNT
                    c.fc.keep_payloads = False
                elif outcome is not None:
                    fail(c, outcome)
                    continue
            if c.fc.events != before:
                last_ns = now
                if first_ns is None:
                    first_ns = now
                for t_ns in c.fc.take_samples():
                    hist.record_ns(now - t_ns)
            if c.fc.closed:
                fail(c, f"closed by server ({c.fc.close_code})")
        mono = time.monotonic()
        if not ready_sent:
            pending = sum(1 for c in conns if c.state in (_UPGRADE, _SETUP))
            if pending and mono > setup_deadline:
                for c in conns:
                    if c.state in (_UPGRADE, _SETUP):
                        fail(c, "setup timeout")
                pending = 0
            if not pending:
                ctl.send(("ready", summary()))
                ready_sent = True
                count_deadline = mono + plan.timeout_s
        else:
            if mono > count_deadline or (
                plan.expected_events > 0
                and all(c.fc.events >= plan.expected_events for c in conns if c.state == _COUNT)
            ):
                stop = True
            if mono > next_progress:
                ctl.send(("progress", sum(c.fc.events for c in conns if c.state == _COUNT)))
                next_progress = mono + 0.5
        if mono > next_ping and plan.keepalive_s:
            ping = client_frame(b"", OP_PING)
            for c in conns:
                if c.state in (_SETUP, _COUNT):
                    with contextlib.suppress(OSError):
                        c.sock.send(ping)
            next_ping = mono + plan.keepalive_s
    ctl.send(("result", summary()))
    for c in conns:
        if c.state != _DEAD:
            c.sock.close()


class ReaderPool:
    """Reader connections spread over ``processes`` child processes (spawned)."""

    def __init__(self, targets: list[ReaderTarget], plan: ReaderPlan, *, processes: int) -> None:
        self.targets = targets
        self.plan = plan
        n = max(1, min(processes, len(targets) or 1))
        self._parts = [targets[i::n] for i in range(n)]
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._pipes: list[Connection] = []
        self._results: dict[int, dict[str, Any]] = {}
        self.progress_events = 0
        self._progress: dict[int, int] = {}

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        for part in self._parts:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_reader_main, args=(part, self.plan, child), daemon=True)
            p.start()
            child.close()
            self._procs.append(p)
            self._pipes.append(parent)

    def _wait_all(self, kind: str, timeout: float) -> ReaderSummary:
        # A process may report its result while the parent still waits for "ready"
        # (setup failed everywhere, or it timed out): a result answers both.
        got: dict[int, dict[str, Any]] = dict(self._results)
        deadline = time.monotonic() + timeout
        while len(got) < len(self._pipes):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"readers: no {kind} after {timeout:.0f}s")
            for conn in wait([p for i, p in enumerate(self._pipes) if i not in got], left):
                assert isinstance(conn, Connection)
                i = self._pipes.index(conn)
                try:
                    tag, payload = conn.recv()
                except EOFError as e:
                    raise RuntimeError("a reader process died") from e
                if tag == "progress":
                    self._progress[i] = payload
                    self.progress_events = sum(self._progress.values())
                elif tag == "result":
                    self._results[i] = payload
                    got[i] = payload
                elif tag == kind:
                    got[i] = payload
        out = ReaderSummary()
        for part in got.values():
            out.merge(part)
        return out

    def wait_ready(self, timeout: float) -> ReaderSummary:
        """Block until every process finished setup; summary of the setup phase."""
        return self._wait_all("ready", timeout)

    def wait_result(self, timeout: float) -> ReaderSummary:
        """Block until every process reported its final counts; merged summary."""
        return self._wait_all("result", timeout)

    def stop(self) -> None:
        """Ask every process to report and exit now."""
        for i, p in enumerate(self._pipes):
            if i not in self._results:
                with contextlib.suppress(OSError):
                    p.send("stop")

    def close(self) -> None:
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in self._pipes:
            c.close()
