"""cluster: for each N of ``--nodes``, N nodes on one PostgreSQL behind HAProxy.

One database (embedded in a temporary directory, or ``--database-url``) serves
every size. For each N the bench starts N ``scopenode serve`` subprocesses on
free loopback ports (``node.cluster_cli.node_command``; node0 first, it founds
the demo workspace alone) and HAProxy with the configuration ``scopenode
cluster up`` writes (``node.cluster_cli.haproxy_config``), then measures, in
this order:

1. ``raw_notify``: the NOTIFY → LISTEN round trip on that database with the
   node's own statements (``storage.relay.listen`` / ``notify_many``) on a
   channel of the bench's: one autocommit connection notifies, a task on
   another stamps each notification as it arrives; back to back, then
   (``raw_notify_paced``) one every 20 ms, the pace of the delivery phase's
   sends. A process that slept for milliseconds answers later than a busy
   one, so the paced figure is the floor the cross-node target is held to.
2. ``delivery``: a sender session connected straight to node0 sends
   ``--messages`` paced sends to its workspace's ``#general``; one reader
   session connected straight to node0 (same node) and, for N ≥ 2, one to
   node1 (cross node: the event crosses by NOTIFY) time each ``message``
   event from the moment before its send request left.
3. ``throughput``: ``--senders`` closed-loop senders, one workspace and scope
   each, alternately through HAProxy and straight to the node HAProxy picked
   for that workspace (rounds proxy, direct, direct, proxy; ``--duration`` per
   mode in all), so only the proxy hop differs.
4. ``sessions``: ``--sessions`` sessions over ``--sessions / 2`` workspaces
   through HAProxy (``?workspace=``); which node holds each, from its
   ``welcome.nodeId`` and from every node's ``scopenode_sessions`` gauge.
5. ``failover`` (N ≥ 2): the same sessions, each in a reconnect loop with
   jittered backoff; the node holding most of them is killed with SIGKILL and
   one message is sent to each affected workspace through a surviving node.
   The figure is the time from the kill until every dropped session has
   reconnected through HAProxy, seen ``resumed`` and received its scope's
   latest seq.

Everything started here is stopped here, by pid: HAProxy first, then the
nodes (SIGTERM, SIGKILL after a grace period), then the embedded database.
Every phase is bounded in count and time.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from bench.baseline import open_database
from bench.client import RequestError, Session, open_session, ws_url
from bench.nodeproc import stop_process, wait_healthy
from bench.progress import Progress
from bench.stats import Latency, own_cpu_s, proc_cpu_s
from bench.workloads.common import ratio
from node.cluster_cli import (
    find_haproxy,
    free_ports,
    haproxy_command,
    haproxy_config,
    node_command,
)
from node.limits import RAISED_LIMITS_ENV
from storage import directory, scopes
from storage import relay as relay_sql
from storage.pg import TrioConnection, connect

START_TIMEOUT_S = 120.0
NOTIFY_CHANNEL = "scopenode_bench_rtt"
WARMUP_SENDS = 5
SEND_INTERVAL_S = 0.02  # paced: one send every 20 ms, far below saturation
THROUGHPUT_ROUNDS = ("proxy", "direct", "direct", "proxy")
BACKOFF_S = (0.05, 0.3)  # jittered, so the dropped sessions do not reconnect in step
MAX_CONNECTS = 200  # per failover session, across the whole run
POLL_S = 0.005
CONTENT_PAD = "x" * 100
_GAUGE = re.compile(rb"^scopenode_(\w+) (\S+)$", re.MULTILINE)  # unlabelled samples


@dataclass(frozen=True)
class ClusterPlan:
    sizes: tuple[int, ...]
    notify_samples: int
    sends: int
    senders: int
    sessions: int
    duration_s: float
    timeout_s: float
    database_url: str | None = None
    seed: int = 1


def parse_sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(x) for x in text.split(",") if x.strip())
    if not sizes or min(sizes) < 1:
        raise ValueError(f"cluster sizes of at least 1, got {text!r}")
    return sizes


# ---------------------------------------------------------------- the cluster


@dataclass
class RunningNode:
    name: str
    port: int
    process: trio.Process

    @property
    def base(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@dataclass
class Cluster:
    nodes: list[RunningNode]
    proxy: trio.Process
    port: int

    @property
    def proxy_base(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def node(self, name: str) -> RunningNode:
        return next(n for n in self.nodes if n.name == name)

    def cpu_s(self) -> dict[str, float | None]:
        """CPU seconds so far of every node and of HAProxy."""
        out = {n.name: proc_cpu_s(n.process.pid) for n in self.nodes}
        out["haproxy"] = proc_cpu_s(self.proxy.pid)
        return out


async def _start_node(index: int, dsn: str, run_dir: Path, nodes: list[RunningNode]) -> None:
    port = free_ports(1)[0]
    command = node_command(index, port, run_dir / "data", dsn, "warning")
    with (run_dir / f"node{index}.log").open("ab") as log:
        process = await trio.lowlevel.open_process(
            command, stdout=log, stderr=subprocess.STDOUT, env={**RAISED_LIMITS_ENV, **os.environ}
        )
    node = RunningNode(f"node{index}", port, process)
    nodes.append(node)  # before the wait: a failed start is still stopped
    await wait_healthy(node.base, process, START_TIMEOUT_S)


@asynccontextmanager
async def open_cluster(dsn: str, run_dir: Path, count: int) -> AsyncIterator[Cluster]:
    haproxy = find_haproxy()
    if haproxy is None:
        raise RuntimeError("haproxy not found (Debian: apt-get install haproxy)")
    await trio.Path(run_dir).mkdir(parents=True, exist_ok=True)
    nodes: list[RunningNode] = []
    proxy: trio.Process | None = None
    try:
        # The first node founds the demo workspace alone.
        await _start_node(0, dsn, run_dir, nodes)
        async with trio.open_nursery() as nursery:
            for i in range(1, count):
                nursery.start_soon(_start_node, i, dsn, run_dir, nodes)
        nodes.sort(key=lambda n: int(n.name[4:]))
        port = free_ports(1)[0]
        config = run_dir / "haproxy.cfg"
        config.write_text(haproxy_config("127.0.0.1", port, [n.port for n in nodes]))
        with (run_dir / "haproxy.log").open("ab") as log:
            proxy = await trio.lowlevel.open_process(
                haproxy_command(haproxy, config, run_dir / "haproxy.pid"),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        await wait_healthy(f"ws://127.0.0.1:{port}", proxy, START_TIMEOUT_S)
        yield Cluster(nodes, proxy, port)
    finally:
        with trio.CancelScope(shield=True):
            if proxy is not None:
                await stop_process(proxy)
            async with trio.open_nursery() as nursery:
                for node in nodes:
                    nursery.start_soon(stop_process, node.process)


# ---------------------------------------------------------------- provisioning


@dataclass(frozen=True)
class Team:
    workspace_id: str
    general: str
    tokens: list[str]


async def make_teams(dsn: str, prefix: str, count: int, people: int) -> list[Team]:
    """``count`` workspaces whose ``people`` humans all are in ``#general``."""
    async with await connect(dsn, autocommit=True) as conn:
        return [await _team(conn, f"{prefix}-{t}", people) for t in range(count)]


async def _team(conn: TrioConnection, name: str, people: int) -> Team:
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
    return Team(workspace_id, general, tokens)


# ---------------------------------------------------------------- 1. raw NOTIFY


async def raw_notify(
    dsn: str, samples: int, timeout_s: float, interval_s: float = 0.0
) -> dict[str, Any]:
    """NOTIFY → LISTEN round trip: before the NOTIFY until the listener has it.

    ``interval_s`` paces the samples as the delivery phase paces its sends:
    on this kind of machine a process that slept for milliseconds answers
    later than one kept busy, so a floor for paced deliveries is paced too."""
    lat = Latency("raw_notify")
    arrived: dict[str, int] = {}
    wake = trio.Event()

    async def listen(conn: TrioConnection, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal wake
        await relay_sql.listen(conn, NOTIFY_CHANNEL)
        task_status.started()
        while True:
            async with aclosing(conn.notifies(timeout=1.0)) as notifies:
                async for notify in notifies:
                    arrived[notify.payload] = time.perf_counter_ns()
                    wake.set()

    async with (
        await connect(dsn, autocommit=True) as listener,
        await connect(dsn, autocommit=True) as sender,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(listen, listener)
        with trio.move_on_after(timeout_s):
            for i in range(samples):
                key = str(i)
                wake = trio.Event()
                start = time.perf_counter_ns()
                await relay_sql.notify_many(sender, NOTIFY_CHANNEL, [key])
                while key not in arrived:
                    await wake.wait()
                    wake = trio.Event()
                lat.record_ns(arrived[key] - start)
                if interval_s:
                    await trio.sleep(interval_s)
        nursery.cancel_scope.cancel()
    return lat.summary()


# ---------------------------------------------------------------- 2. delivery


class _Reader:
    """Times the ``message`` events of one scope against the sends' start times."""

    def __init__(self, scope: str, sent_at: dict[int, int]) -> None:
        self.scope = scope
        self.sent_at = sent_at
        self.latency = Latency("delivery")
        self.max_seq = 0
        self.timed: set[int] = set()

    def on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("type") != "message" or frame.get("scopeId") != self.scope:
            return
        now = time.perf_counter_ns()
        message = frame["message"]
        self.max_seq = max(self.max_seq, int(message["seq"]))
        head = str(message.get("content", "")).split(" ", 1)[0]
        if head.startswith("lat-"):
            i = int(head[4:])
            if i in self.sent_at and i not in self.timed:
                self.timed.add(i)
                self.latency.record_ns(now - self.sent_at[i])


async def _wait_until(predicate: Any, timeout_s: float) -> bool:
    with trio.move_on_after(timeout_s):
        # Conditions over many sessions' counters: polling keeps the handlers trivial.
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(POLL_S)
        return True
    return False


async def delivery(
    cluster: Cluster, dsn: str, team: Team, sends: int, timeout_s: float, progress: Progress
) -> dict[str, Any]:
    sent_at: dict[int, int] = {}
    reply = Latency("send_reply")
    members: list[str] = []
    same = _Reader(team.general, sent_at)
    cross = _Reader(team.general, sent_at) if len(cluster.nodes) > 1 else None
    readers = [r for r in (same, cross) if r is not None]
    first = cluster.nodes[0].base
    target = f"scope:{team.general}"
    async with AsyncExitStack() as stack:
        sender = await stack.enter_async_context(
            open_session(ws_url(first, team.workspace_id), team.tokens[0], kind="browser")
        )
        for reader, node, token in zip(readers, cluster.nodes, team.tokens[1:], strict=False):
            url = ws_url(node.base, team.workspace_id)
            session = await stack.enter_async_context(
                open_session(url, token, kind="browser", on_event=reader.on_event)
            )
            members.append(session.member_id)
        # Warm the scope's actor and every node's relay before timing anything.
        latest = 0
        for w in range(WARMUP_SENDS):
            warm = await sender.request(
                "send", target=target, content=f"warm {w}", clientMessageId=f"warm-{w}"
            )
            latest = int(warm["acceptedSeq"])
        await _wait_until(lambda: all(r.max_seq >= latest for r in readers), timeout_s)
        progress.phase("delivery", sends)
        t0 = time.monotonic()
        with trio.move_on_after(timeout_s):
            for i in range(sends):
                await trio.sleep_until(_trio_at(t0 + i * SEND_INTERVAL_S))
                sent_at[i] = time.perf_counter_ns()
                await sender.request(
                    "send",
                    target=target,
                    content=f"lat-{i} {CONTENT_PAD}",
                    clientMessageId=f"lat-{i}",
                )
                reply.record_ns(time.perf_counter_ns() - sent_at[i])
                progress.update(i + 1)
        progress.close()
        await _wait_until(lambda: all(len(r.timed) >= len(sent_at) for r in readers), timeout_s)
    out: dict[str, Any] = {
        "sends": len(sent_at),
        "interval_ms": SEND_INTERVAL_S * 1000,
        "same_node": same.latency.summary(),
        "cross_node": cross.latency.summary() if cross else None,
        "sender_reply": reply.summary(),
    }
    out["complete"] = all(len(r.timed) == len(sent_at) == sends for r in readers)
    if cross is not None:
        # What the receiving node reads per relayed message, alone.
        out["relay_read"] = await relay_read(dsn, team.general, latest, members[1:], sends)
        out["relay_read_lean"] = await relay_read(
            dsn, team.general, latest, members[1:], sends, lean=True
        )
    return out


async def relay_read(
    dsn: str, scope: str, first_seq: int, candidates: list[str], count: int, *, lean: bool = False
) -> dict[str, Any]:
    """``storage.relay.readers_in_range`` for one message at a time (a paced
    send's notification), as the receiving node runs it for its sessions'
    members; with ``lean``, ``messages_in_range``, what it runs instead once it
    knows the readers of the scope's roster. Back to back, on one connection."""
    lat = Latency("relay_read_lean" if lean else "relay_read")
    async with await connect(dsn, autocommit=True) as conn:
        for k in range(count):
            seq = first_seq + 1 + k
            start = time.perf_counter_ns()
            if lean:
                await relay_sql.messages_in_range(conn, scope, seq, seq)
            else:
                await relay_sql.readers_in_range(conn, scope, seq, seq, candidates)
            lat.record_ns(time.perf_counter_ns() - start)
    return lat.summary()


def _trio_at(monotonic_s: float) -> float:
    """trio's clock for a ``time.monotonic`` instant."""
    return trio.current_time() + (monotonic_s - time.monotonic())


# ---------------------------------------------------------------- 3. throughput


async def throughput(
    cluster: Cluster, teams: Sequence[Team], duration_s: float, timeout_s: float
) -> dict[str, Any]:
    """Closed-loop sends, alternately through HAProxy and straight to the node."""
    sends: Counter[str] = Counter()
    elapsed: dict[str, float] = {}
    errors: Counter[str] = Counter()
    cpu: dict[str, dict[str, float]] = {"proxy": {}, "direct": {}}
    groups: dict[str, list[float]] = {"proxy": [0.0, 0.0], "direct": [0.0, 0.0]}
    route: dict[str, str] = {}  # workspace -> node HAProxy picked
    per_round = duration_s / THROUGHPUT_ROUNDS.count("proxy")
    for mode in THROUGHPUT_ROUNDS:
        urls = [_throughput_url(cluster, team, mode, route) for team in teams]
        async with AsyncExitStack() as stack:
            sessions = [
                await stack.enter_async_context(open_session(url, team.tokens[0], kind="browser"))
                for url, team in zip(urls, teams, strict=True)
            ]
            if mode == "proxy":
                for team, s in zip(teams, sessions, strict=True):
                    route[team.workspace_id] = str(s.welcome["nodeId"])
            before, groups_before = cluster.cpu_s(), await group_commits(cluster)
            count, took = await _closed_loop(sessions, teams, per_round, timeout_s, errors)
            after, groups_after = cluster.cpu_s(), await group_commits(cluster)
        for k in (0, 1):
            groups[mode][k] += groups_after[k] - groups_before[k]
        sends[mode] += count
        elapsed[mode] = elapsed.get(mode, 0.0) + took
        for name, value in after.items():
            spent = (value or 0.0) - (before.get(name) or 0.0)
            cpu[mode][name] = round(cpu[mode].get(name, 0.0) + spent, 3)
    rate = {m: round(sends[m] / elapsed[m], 1) if elapsed.get(m) else 0.0 for m in sends}
    return {
        "senders": len(teams),
        "rounds": list(THROUGHPUT_ROUNDS),
        "seconds_per_round": round(per_round, 3),
        "proxy": _mode_result(sends["proxy"], rate.get("proxy"), cpu["proxy"], groups["proxy"]),
        "direct": _mode_result(
            sends["direct"], rate.get("direct"), cpu["direct"], groups["direct"]
        ),
        "proxy_over_direct": ratio(rate.get("proxy"), rate.get("direct")),
        "senders_per_node": dict(Counter(route.values())),
        "errors": dict(errors),
    }


def _mode_result(
    sends: int, rate: float | None, cpu: dict[str, float], groups: list[float]
) -> dict[str, Any]:
    node_cpu = sum(v for k, v in cpu.items() if k != "haproxy")
    return {
        "sends": sends,
        "sends_per_s": rate,
        "cpu_s": dict(cpu),
        "node_cpu_ms_per_send": round(1000 * node_cpu / sends, 3) if sends else None,
        "sends_per_group_statement": round(groups[1] / groups[0], 2) if groups[0] else None,
    }


def _throughput_url(cluster: Cluster, team: Team, mode: str, route: dict[str, str]) -> str:
    if mode == "proxy":
        return ws_url(cluster.proxy_base, team.workspace_id)
    return ws_url(cluster.node(route[team.workspace_id]).base, team.workspace_id)


async def _closed_loop(
    sessions: Sequence[Session],
    teams: Sequence[Team],
    duration_s: float,
    timeout_s: float,
    errors: Counter[str],
) -> tuple[int, float]:
    counts = [0] * len(sessions)
    t0 = time.monotonic()
    deadline = t0 + duration_s

    async def sender(i: int) -> None:
        target = f"scope:{teams[i].general}"
        k = 0
        while time.monotonic() < deadline:
            k += 1
            try:
                await sessions[i].request(
                    "send",
                    target=target,
                    content=f"tp {k} {CONTENT_PAD}",
                    clientMessageId=f"tp-{t0}-{k}",
                )
            except RequestError as e:
                errors[e.code] += 1
                continue
            counts[i] += 1

    with trio.move_on_after(duration_s + timeout_s):
        async with trio.open_nursery() as nursery:
            for i in range(len(sessions)):
                nursery.start_soon(sender, i)
    return sum(counts), time.monotonic() - t0


# ---------------------------------------------------------------- 4/5. sessions, failover


@dataclass
class FailoverClient:
    """One session through HAProxy that reconnects with jittered backoff and
    resumes from the last seq it saw, recording what the failover figure needs."""

    url: str
    token: str
    scope: str
    seqs: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    connected: trio.Event = field(default_factory=trio.Event)
    errors: list[str] = field(default_factory=list)
    resumes: int = 0  # ``resumed`` frames seen
    resumed_after: int | None = None  # resumes count at the kill: later ones are resumes after it
    target_seq: int | None = None  # set once the post-kill send is acknowledged
    done_ns: int | None = None
    welcomes_ns: list[int] = field(default_factory=list)
    failures_ns: list[int] = field(default_factory=list)

    @property
    def node(self) -> str | None:
        return self.nodes[-1] if self.nodes else None

    @property
    def last_seq(self) -> int:
        return max(self.seqs, default=0)

    async def run(self, stop: trio.Event) -> None:
        for _ in range(MAX_CONNECTS):
            try:
                await self._connection(stop)
            except Exception as e:  # the node or the proxy went away: reconnect and resume
                self.errors.append(f"{type(e).__name__}: {e}"[:200])
                self.failures_ns.append(time.perf_counter_ns())
            if stop.is_set():
                return
            await trio.sleep(random.uniform(*BACKOFF_S))

    async def _connection(self, stop: trio.Event) -> None:
        resume = {self.scope: self.last_seq}
        async with open_session(
            self.url, self.token, kind="browser", resume=resume, on_event=self.on_event,
            connect_timeout=5.0,
        ) as session:  # fmt: skip
            self.nodes.append(str(session.welcome["nodeId"]))
            self.welcomes_ns.append(time.perf_counter_ns())
            self.connected.set()
            self.check()
            # The bench's session reports its end as a flag only.
            while session.closed is None and not stop.is_set():  # noqa: ASYNC110
                await trio.sleep(POLL_S)

    def on_event(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "message" and frame.get("scopeId") == self.scope:
            self.seqs.append(int(frame["message"]["seq"]))
        elif kind == "resumed":
            self.resumes += 1
        self.check()

    def check(self) -> None:
        """Stamp the moment this session is back: resumed after the kill and
        holding its scope's latest seq."""
        if self.done_ns is not None or self.resumed_after is None or self.target_seq is None:
            return
        if self.resumes > self.resumed_after and self.last_seq >= self.target_seq:
            self.done_ns = time.perf_counter_ns()


async def sessions_and_failover(
    cluster: Cluster, teams: Sequence[Team], timeout_s: float, progress: Progress
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    clients = [
        FailoverClient(ws_url(cluster.proxy_base, team.workspace_id), token, team.general)
        for team in teams
        for token in team.tokens
    ]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        progress.phase("sessions", len(clients))
        for i, client in enumerate(clients):
            nursery.start_soon(client.run, stop)
            with trio.move_on_after(timeout_s):
                await client.connected.wait()
            progress.update(i + 1)
        progress.close()
        held = await _sessions_held(cluster, clients)
        failover = None
        if len(cluster.nodes) > 1:
            failover = await _failover(cluster, teams, clients, timeout_s)
        stop.set()
    return held, failover


async def _sessions_held(cluster: Cluster, clients: Sequence[FailoverClient]) -> dict[str, Any]:
    by_welcome = Counter(c.node for c in clients if c.node is not None)
    # Sessions of the earlier phases close asynchronously on the nodes.
    gauges: dict[str, int | None] = {}
    for _ in range(20):
        gauges = {n.name: await sessions_gauge(n.port) for n in cluster.nodes}
        if all(gauges[n] == by_welcome.get(n, 0) for n in gauges):
            break
        await trio.sleep(0.1)
    return {
        "sessions": len(clients),
        "connected": sum(1 for c in clients if c.node is not None),
        "workspaces": len({c.scope for c in clients}),
        "per_node_welcome": {n.name: by_welcome.get(n.name, 0) for n in cluster.nodes},
        "per_node_metrics": gauges,
    }


async def _failover(
    cluster: Cluster, teams: Sequence[Team], clients: Sequence[FailoverClient], timeout_s: float
) -> dict[str, Any]:
    # Every session holds a seq before the kill, so a resume has something to catch up from.
    for team in teams:
        await _send_direct(cluster.nodes[0], team, "before")
    await _wait_until(lambda: all(c.last_seq >= 1 for c in clients), timeout_s)
    victim_name, _ = Counter(c.node for c in clients).most_common(1)[0]
    victim = cluster.node(str(victim_name))
    survivor = next(n for n in cluster.nodes if n is not victim)
    dropped = [c for c in clients if c.node == victim.name]
    for c in dropped:
        c.resumed_after = c.resumes
    killed_ns = time.perf_counter_ns()
    os.kill(victim.process.pid, 9)
    send_ms = Latency("send_after_kill")
    for team in {c.scope: t for t in teams for c in dropped if c.scope == t.general}.values():
        start = time.perf_counter_ns()
        seq = await _send_direct(survivor, team, "after")
        send_ms.record_ns(time.perf_counter_ns() - start)
        for c in dropped:
            if c.scope == team.general:
                c.target_seq = seq
                c.check()
    back = await _wait_until(lambda: all(c.done_ns is not None for c in dropped), timeout_s)
    lat = Latency("failover")
    back_ns = [c.done_ns - killed_ns for c in dropped if c.done_ns is not None]
    for ns in back_ns:
        lat.record_ns(ns)
    moved = Counter(c.node for c in dropped)
    welcome = Latency("welcome_after_kill")
    for c in dropped:
        later = [ns for ns in c.welcomes_ns if ns > killed_ns]
        if later:
            welcome.record_ns(later[0] - killed_ns)
    errors = Counter(e.split(":", 1)[0] for c in dropped for e in c.errors)
    failed = Latency("failed_attempt_after_kill")
    for c in dropped:
        for ns in c.failures_ns:
            if ns > killed_ns:
                failed.record_ns(ns - killed_ns)
    return {
        "killed": victim.name,
        "sessions_dropped": len(dropped),
        "sessions_back": sum(1 for c in dropped if c.done_ns is not None),
        "all_back_ms": round(max(back_ns) / 1e6, 1) if back and back_ns else None,
        "per_session": lat.summary(),
        "moved_to": dict(moved),
        "ok": back and victim.name not in moved,
        "first_welcome_after_kill": welcome.summary(),
        "sends_after_kill": send_ms.summary(),
        "connect_attempts_failed": dict(errors),
        "failure_examples": sorted({e for c in dropped for e in c.errors})[:3],
        "failed_attempts_after_kill": failed.summary(),
    }


async def _send_direct(node: RunningNode, team: Team, label: str) -> int:
    """One send to the team's ``#general`` over a session straight to ``node``."""
    url = ws_url(node.base, team.workspace_id)
    async with open_session(url, team.tokens[0], kind="browser") as s:
        target = f"scope:{team.general}"
        reply = await s.request("send", target=target, content=label, clientMessageId=label)
    return int(reply["acceptedSeq"])


async def sessions_gauge(port: int, timeout: float = 2.0) -> int | None:
    """The node's ``scopenode_sessions`` gauge, from its ``/metrics``."""
    found = (await node_gauges(port, timeout)).get("sessions")
    return int(found) if found is not None else None


async def node_gauges(port: int, timeout: float = 2.0) -> dict[str, float]:
    """The node's unlabelled ``scopenode_*`` samples, from its ``/metrics``."""
    body = await http_get("127.0.0.1", port, "/metrics", timeout)
    return {m[1].decode(): float(m[2]) for m in _GAUGE.finditer(body or b"")}


async def group_commits(cluster: Cluster) -> tuple[float, float]:
    """(statements, sends) of every node's group committer so far."""
    statements = sends = 0.0
    for node in cluster.nodes:
        gauges = await node_gauges(node.port)
        statements += gauges.get("group_commit_statements", 0.0)
        sends += gauges.get("group_commit_sends", 0.0)
    return statements, sends


async def http_get(host: str, port: int, path: str, timeout: float) -> bytes | None:
    """The body of ``GET path`` (HTTP/1.0: no chunking, closed at the end), or None."""
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                data = b""
                while chunk := await stream.receive_some(65536):
                    data += chunk
    except (OSError, trio.TooSlowError, trio.BrokenResourceError):
        return None
    return data.split(b"\r\n\r\n", 1)[-1]


# ---------------------------------------------------------------- one size, all sizes


async def run_size(
    dsn: str, run_dir: Path, n: int, plan: ClusterPlan, progress: Progress
) -> dict[str, Any]:
    prefix = f"bench-cluster-{plan.seed}-n{n}"
    latency_team, *_ = await make_teams(dsn, f"{prefix}-lat", 1, 3)
    tp_teams = await make_teams(dsn, f"{prefix}-tp", plan.senders, 1)
    session_teams = await make_teams(dsn, f"{prefix}-s", max(1, plan.sessions // 2), 2)
    progress.phase(f"start {n} nodes", n)
    async with open_cluster(dsn, run_dir / f"n{n}", n) as cluster:
        progress.close()
        out: dict[str, Any] = {"nodes": n}
        out["raw_notify"] = await raw_notify(dsn, plan.notify_samples, plan.timeout_s)
        # The floor of the target: paced as the deliveries are.
        out["raw_notify_paced"] = await raw_notify(
            dsn, plan.notify_samples, plan.timeout_s, SEND_INTERVAL_S
        )
        out["delivery"] = await delivery(
            cluster, dsn, latency_team, plan.sends, plan.timeout_s, progress
        )
        out["target"] = cross_node_target(out["raw_notify_paced"], out["delivery"])
        out["throughput"] = await throughput(cluster, tp_teams, plan.duration_s, plan.timeout_s)
        out["sessions"], out["failover"] = await sessions_and_failover(
            cluster, session_teams, plan.timeout_s, progress
        )
    return out


def cross_node_target(raw: dict[str, Any], delivered: dict[str, Any]) -> dict[str, Any] | None:
    """cross-node p50 − same-node p50 against 2 × the raw NOTIFY → LISTEN p50
    (``raw``: the round trip measured at the deliveries' pace)."""
    cross = delivered.get("cross_node")
    if not cross or not cross.get("count") or not raw.get("count"):
        return None
    extra = round(cross["p50_ms"] - delivered["same_node"]["p50_ms"], 3)
    allowed = round(2 * raw["p50_ms"], 3)
    return {
        "cross_minus_same_p50_ms": extra,
        "two_raw_notify_p50_ms": allowed,
        "extra_over_raw_notify_p50": ratio(extra, raw["p50_ms"]),
        "met": extra <= allowed,
    }


async def run(plan: ClusterPlan, progress: Progress) -> dict[str, Any]:
    by_size: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scopenode-bench-cluster-") as tmp:
        async with open_database(plan.database_url, os.path.join(tmp, "pg")) as dsn:
            from node.database import migrate

            await trio.to_thread.run_sync(migrate, dsn)
            for n in plan.sizes:
                by_size[str(n)] = await run_size(dsn, Path(tmp), n, plan, progress)
    return {
        "sizes": list(plan.sizes),
        "by_nodes": by_size,
        "generator_cpu_s": round(own_cpu_s(), 3),
    }


# ---------------------------------------------------------------- table


def render(results: dict[str, Any]) -> str:
    parts = [_render_size(size) for size in results["by_nodes"].values()]
    return "\n".join(parts)


def _p(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("count"):
        return "-"
    return f"p50 {summary['p50_ms']:.3f} ms  p99 {summary['p99_ms']:.3f} ms  (n={summary['count']})"


def _render_size(r: dict[str, Any]) -> str:
    d, tp, s, f, t = r["delivery"], r["throughput"], r["sessions"], r["failover"], r["target"]
    rows = [
        ("raw NOTIFY -> LISTEN", _p(r["raw_notify"])),
        (f"  every {SEND_INTERVAL_S * 1000:.0f} ms, as sends", _p(r.get("raw_notify_paced"))),
        ("same-node delivery", _p(d["same_node"])),
        ("cross-node delivery", _p(d["cross_node"])),
        ("sender's reply", _p(d["sender_reply"])),
        ("relay read (SQL alone)", _p(d.get("relay_read"))),
        ("  lean (roster known)", _p(d.get("relay_read_lean"))),
        ("deliveries complete", str(d["complete"])),
    ]
    if t:
        verdict = "met" if t["met"] else "NOT met"
        rows.append(
            (
                "cross - same p50",
                f"{t['cross_minus_same_p50_ms']:.3f} ms vs 2 x paced raw p50 "
                f"{t['two_raw_notify_p50_ms']:.3f} ms: {verdict}",
            )
        )
    rows += [
        ("sends/s via HAProxy", f"{tp['proxy']['sends_per_s']:,.1f}"),
        ("sends/s direct", f"{tp['direct']['sends_per_s']:,.1f}"),
        ("HAProxy / direct", str(tp["proxy_over_direct"])),
        (
            "node CPU ms/send",
            f"{tp['proxy']['node_cpu_ms_per_send']} via HAProxy, "
            f"{tp['direct']['node_cpu_ms_per_send']} direct",
        ),
        (
            "sends per group statement",
            f"{tp['proxy']['sends_per_group_statement']} via HAProxy, "
            f"{tp['direct']['sends_per_group_statement']} direct",
        ),
        ("sessions per node", _per_node(s["per_node_welcome"])),
        ("  (node gauges)", _per_node(s["per_node_metrics"])),
    ]
    if f:
        rows.append(
            (
                "failover",
                f"kill -9 {f['killed']} ({f['sessions_dropped']} sessions): "
                f"{f['sessions_back']} back, all in {f['all_back_ms']} ms, ok={f['ok']}",
            )
        )
        rows.append(("  failed attempt after kill", _p(f["failed_attempts_after_kill"])))
        rows.append(("  first welcome after kill", _p(f["first_welcome_after_kill"])))
    title = f"cluster of {r['nodes']} node{'s' if r['nodes'] > 1 else ''}"
    width = max(len(k) for k, _ in rows)
    lines = [title, "-" * len(title), *(f"  {k:<{width}}  {v}" for k, v in rows)]
    return "\n".join(lines) + "\n"


def _per_node(counts: dict[str, Any]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items())
