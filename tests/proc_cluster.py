"""Real node subprocesses behind a real HAProxy, and clients that survive them.

What ``scopenode cluster up`` starts, but with handles a test needs: each
node's process (to kill -9 or drain it by pid), its port (to connect
directly), and the HAProxy process (to reload with ``-sf``). Everything
started here is stopped here, by pid.

:class:`ResumingClient` reconnects with the library's :class:`Backoff`,
resumes from the last seq it saw, and retries an unanswered send with the
same ``clientMessageId``. It does what ``open_reconnecting_client`` does, by
hand, because it must record what the library hides: every seq received on
the wire (duplicates included, which the library would drop), every
acknowledged send, and when each connection was resumed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio_websocket

from actors.model import MemberType
from bench.nodeproc import stop_process, wait_healthy
from node.client import Backoff, ConnectionClosed, open_client
from node.cluster_cli import find_haproxy, free_ports, haproxy_config
from node.limits import RAISED_LIMITS_ENV
from storage import directory, scopes
from storage.pg import connect

START_TIMEOUT = 60.0
# The library's backoff (full jitter): reconnects of many clients do not align.
BACKOFF = Backoff(base=0.05, cap=0.3)
RECONNECT_ERRORS = (
    ConnectionClosed,
    OSError,
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
)


@dataclass
class NodeProc:
    name: str
    port: int
    process: trio.Process

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"


class ProcCluster:
    """Nodes on one database and HAProxy in front (see module doc)."""

    def __init__(self, database_url: str, run_dir: Path) -> None:
        self.database_url = database_url
        self.run_dir = run_dir
        self.nodes: list[NodeProc] = []
        self._next = 0
        self.port = free_ports(1)[0]
        self.proxies: list[trio.Process] = []

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    async def add_node(self) -> NodeProc:
        i = self._next
        self._next += 1  # before the first await: nodes may start concurrently
        port = free_ports(1)[0]
        command = [sys.executable, "-m", "node", "serve", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--data-dir", str(self.run_dir / f"node{i}")]
        command += ["--database-url", self.database_url, "--node-id", f"node{i}"]
        command += ["--log-level", "warning"]
        with (self.run_dir / f"node{i}.log").open("ab") as log:
            process = await trio.lowlevel.open_process(
                command, stdout=log, stderr=log, env={**RAISED_LIMITS_ENV, **os.environ}
            )
        node = NodeProc(f"node{i}", port, process)
        self.nodes.append(node)
        await wait_healthy(f"ws://127.0.0.1:{port}", process, START_TIMEOUT)
        return node

    async def start_proxy(self, nodes: Sequence[NodeProc] | None = None) -> None:
        """Write the configuration for ``nodes`` (all by default) and start
        HAProxy, or reload it (``-sf``: the old process keeps its established
        tunnels until they close, then exits)."""
        haproxy = find_haproxy()
        assert haproxy is not None
        config = self.run_dir / "haproxy.cfg"
        ports = [n.port for n in (self.nodes if nodes is None else nodes)]
        config.write_text(haproxy_config("127.0.0.1", self.port, ports))
        command = [haproxy, "-db", "-f", str(config)]
        if self.proxies:
            command += ["-sf", str(self.proxies[-1].pid)]
        with (self.run_dir / "haproxy.log").open("ab") as log:
            proxy = await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL, stderr=log)
        self.proxies.append(proxy)
        await wait_healthy(f"ws://127.0.0.1:{self.port}", proxy, START_TIMEOUT)

    def kill(self, node: NodeProc) -> None:
        os.kill(node.process.pid, signal.SIGKILL)

    async def routes(self, nodes: Sequence[NodeProc], teams: Sequence[Team]) -> dict[str, str]:
        """workspace -> node name that HAProxy with ``nodes`` picks, asked of a
        second, short-lived HAProxy on another port (the same configuration,
        so the same consistent hash)."""
        haproxy = find_haproxy()
        assert haproxy is not None
        port = free_ports(1)[0]
        config = self.run_dir / "haproxy-probe.cfg"
        config.write_text(haproxy_config("127.0.0.1", port, [n.port for n in nodes]))
        probe = await trio.lowlevel.open_process(
            [haproxy, "-db", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_healthy(f"ws://127.0.0.1:{port}", probe, START_TIMEOUT)
            found = {}
            for team in teams:
                url = f"ws://127.0.0.1:{port}/v1/ws?workspace={team.workspace_id}"
                async with open_client(url, team.tokens[0]) as client:
                    found[team.workspace_id] = str(client.welcome["nodeId"])
            return found
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(probe)

    async def stop(self) -> None:
        for proxy in reversed(self.proxies):
            await stop_process(proxy)
        async with trio.open_nursery() as nursery:
            for node in self.nodes:
                nursery.start_soon(stop_process, node.process)


@asynccontextmanager
async def proc_cluster(
    database_url: str, run_dir: Path, count: int, *, proxy: bool = True
) -> AsyncIterator[ProcCluster]:
    cluster = ProcCluster(database_url, run_dir)
    try:
        # The first node founds the demo workspace alone.
        await cluster.add_node()
        async with trio.open_nursery() as nursery:
            for _ in range(count - 1):
                nursery.start_soon(cluster.add_node)
        if proxy:
            await cluster.start_proxy()
        yield cluster
    finally:
        with trio.CancelScope(shield=True):
            await cluster.stop()


@dataclass
class Team:
    workspace_id: str
    tokens: list[str]
    general: str


async def make_team(database_url: str, name: str, people: int) -> Team:
    """A workspace whose ``people`` humans all are in its ``#general``."""
    async with await connect(database_url, autocommit=True) as conn:
        workspace_id = await directory.create_workspace(conn, name)
        tokens = []
        for i in range(people):
            member = await directory.create_member(
                conn, workspace_id=workspace_id, type_=MemberType.HUMAN, handle=f"p{i}"
            )
            await scopes.join_on_creation(conn, member)
            tokens.append(await directory.issue_token(conn, member.id))
        general = await scopes.channel_by_slug(conn, workspace_id, "general")
        assert general is not None
    return Team(workspace_id, tokens, general)


async def add_agent(database_url: str, team: Team, handle: str) -> tuple[str, str]:
    """A public agent in ``team``'s default channels: (member id, token)."""
    async with await connect(database_url, autocommit=True) as conn:
        member = await directory.create_member(
            conn, workspace_id=team.workspace_id, type_=MemberType.AGENT, handle=handle
        )
        await scopes.join_on_creation(conn, member)
        return member.id, await directory.issue_token(conn, member.id)


@dataclass
class ResumingClient:
    """One member's session through ``url``, kept alive across node failures."""

    url: str
    token: str
    scope_id: str
    name: str
    received: list[int] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)  # clientMessageId -> seq
    nodes: list[str] = field(default_factory=list)  # the node of each connection
    resumed_at: list[float] = field(default_factory=list)
    dropped_at: list[float] = field(default_factory=list)
    connected: trio.Event = field(default_factory=trio.Event)
    sends_done: int = 0
    pending: str | None = None  # a send whose reply never came
    errors: list[str] = field(default_factory=list)
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    until: int | None = None  # the test sets the seq to receive before leaving
    _failures: int = 0  # reconnect attempts since the last welcome
    _resume_owed: bool = False  # bounced, and not yet resumed since

    @property
    def node(self) -> str | None:
        return self.nodes[-1] if self.nodes else None

    async def run(self, sends: int, interval: float, deadline: float) -> None:
        """Send ``sends`` messages ``interval`` apart and keep receiving, until
        every send is acknowledged and :attr:`until` is received, or ``deadline``
        (trio time)."""
        with trio.move_on_at(deadline):
            while not self._finished(sends):
                try:
                    with trio.CancelScope() as self._scope:
                        await self._connection(sends, interval)
                except* RECONNECT_ERRORS as group:
                    # The node or the proxy went away: reconnect and resume.
                    self.errors.extend(repr(e) for e in group.exceptions)
                self.dropped_at.append(trio.current_time())
                await trio.sleep(BACKOFF.delay(self._failures))
                self._failures += 1

    def bounce(self) -> None:
        """Drop the connection, as a network blip would: the client reconnects
        and resumes, even if it has nothing left to send or receive."""
        self._resume_owed = True
        self._scope.cancel()

    def _finished(self, sends: int) -> bool:
        # A slow reload can put the bounce after the last send: without the
        # owed resume, a client told `until` during its backoff left unresumed.
        return (
            not self._resume_owed
            and self.sends_done >= sends
            and self.until is not None
            and max(self.received, default=0) >= self.until
        )

    async def _connection(self, sends: int, interval: float) -> None:
        # Resume from 0 on the first connection too: a teammate may have sent
        # before this session existed, and every client must see every seq.
        resume = {self.scope_id: self.received[-1] if self.received else 0}
        async with open_client(self.url, self.token, resume=resume, connect_timeout=5) as client:
            self.nodes.append(str(client.welcome["nodeId"]))
            self._failures = 0
            self.connected.set()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive, client)
                while self.sends_done < sends:
                    cmid = self.pending or f"{self.name}-{self.sends_done}"
                    self.pending = cmid
                    reply = await client.send("#general", f"{cmid}", clientMessageId=cmid)
                    assert reply["state"] in ("sent", "already_sent"), reply
                    self.acked[cmid] = int(reply["acceptedSeq"])
                    self.pending = None
                    self.sends_done += 1
                    await trio.sleep(interval)
                while not self._finished(sends):
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()

    async def _receive(self, client: Any) -> None:
        while True:
            event = await client.next_event()
            if event["type"] == "message" and event["scopeId"] == self.scope_id:
                self.received.append(int(event["message"]["seq"]))
            elif event["type"] == "resumed":
                state = event["scopes"].get(self.scope_id, {})
                assert not state.get("hasMore"), event
                self.resumed_at.append(trio.current_time())
                self._resume_owed = False


def gaps_and_duplicates(seqs: list[int]) -> tuple[list[int], list[int]]:
    """(missing seqs below the highest, seqs received more than once)."""
    seen: set[int] = set()
    duplicates = []
    for seq in seqs:
        if seq in seen:
            duplicates.append(seq)
        seen.add(seq)
    missing = [s for s in range(1, max(seqs, default=0) + 1) if s not in seen]
    return missing, duplicates


async def scope_history(database_url: str, scope_id: str) -> dict[int, str]:
    """seq -> clientMessageId of every stored message of the scope (all come
    from clients here, so every one has an id)."""
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT seq, client_message_id FROM scope_messages WHERE scope_id = %s ORDER BY seq",
            (scope_id,),
        )
        return {int(row[0]): str(row[1]) for row in await cur.fetchall()}


def check_scope(clients: list[ResumingClient], history: dict[int, str]) -> None:
    """Every acknowledged send stored once at its seq, seqs gap-free, and every
    client saw every seq once, in order."""
    latest = max(history)
    assert sorted(history) == list(range(1, latest + 1)), "stored seqs have a gap"
    stored = Counter(history.values())
    assert [cmid for cmid, n in stored.items() if n > 1] == [], "a send stored twice"
    for client in clients:
        for cmid, seq in client.acked.items():
            assert history.get(seq) == cmid, (client.name, cmid, seq)
        missing, duplicates = gaps_and_duplicates(client.received)
        assert not missing, (client.name, missing, client.received, client.resumed_at)
        assert not duplicates, (client.name, duplicates, client.received)
        assert client.received == sorted(client.received), client.name
        assert client.received[-1] == latest, client.name


async def all_sent(clients: list[ResumingClient], sends: int, deadline: float) -> None:
    with trio.move_on_at(deadline):
        while any(c.sends_done < sends for c in clients):
            await trio.sleep(0.05)


async def stay_until_latest(
    database_url: str, teams: Sequence[Team], clients: Sequence[ResumingClient]
) -> None:
    """Tell every client to leave once it has received its scope's last seq."""
    for team in teams:
        latest = max(await scope_history(database_url, team.general))
        for client in clients:
            if client.scope_id == team.general:
                client.until = latest


UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class TcpRelay:
    """A TCP relay to a node's port whose connections a test can cut at once,
    as a network drop would: the client sees its socket end with no close
    frame (1006), and the node sees its session's socket end too."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepted = 0
        self.held = False
        self._open: set[trio.CancelScope] = set()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def cut(self) -> int:
        """Drop every open connection; returns how many there were."""
        for scope in self._open:
            scope.cancel()
        return len(self._open)

    def hold(self) -> None:
        """From now on, answer new connections 503 (no node is reachable)."""
        self.held = True

    def release(self) -> None:
        self.held = False

    async def handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        if self.held:
            # What HAProxy answers when no server is up.
            with contextlib.suppress(trio.BrokenResourceError):
                await client.send_all(UNAVAILABLE)
            await client.aclose()
            return
        with trio.CancelScope() as scope:
            self._open.add(scope)
            try:
                node = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                async with client, node, trio.open_nursery() as nursery:
                    nursery.start_soon(_pipe, client, node, nursery.cancel_scope)
                    nursery.start_soon(_pipe, node, client, nursery.cancel_scope)
            except OSError:
                await client.aclose()  # the node is not there: the client sees its socket end
            finally:
                self._open.discard(scope)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        async for chunk in source:
            await sink.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()  # one side ended: so does the relayed connection


@asynccontextmanager
async def tcp_relay(target_port: int) -> AsyncIterator[TcpRelay]:
    relay = TcpRelay(target_port)
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, relay.handle, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        relay.port = int(listeners[0].socket.getsockname()[1])
        try:
            yield relay
        finally:
            nursery.cancel_scope.cancel()


def team_clients(url: str, teams: Sequence[Team]) -> list[ResumingClient]:
    """One resuming client per person of every team, through ``url`` (HAProxy)."""
    return [
        ResumingClient(f"{url}?workspace={team.workspace_id}", token, team.general, f"t{t}p{i}")
        for t, team in enumerate(teams)
        for i, token in enumerate(team.tokens)
    ]


async def warmed_up(clients: Sequence[ResumingClient], acks: int, limit: float = 20) -> None:
    """Wait until every client has ``acks`` sends acknowledged."""
    with trio.fail_after(limit):
        while min(len(c.acked) for c in clients) < acks:
            await trio.sleep(0.05)
