"""``scopenode cluster up``: one PostgreSQL, N nodes and HAProxy in front, for trials.

It starts the embedded PostgreSQL of ``--data-dir`` (or uses
``--database-url``), N ``scopenode serve`` processes on free ports of
127.0.0.1, and HAProxy on the public port with a configuration generated like
``deploy/haproxy.cfg``; prints the public URL and the demo token as ``serve``
does, and on Ctrl-C (or SIGTERM) stops everything it started, in reverse:
HAProxy, the nodes (SIGTERM, so they drain), PostgreSQL. Node logs go to
``<data-dir>/cluster/node<i>.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from node.listen import listen_problem

USAGE_ERROR = 2
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
HAPROXY_PATHS = ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy")
HAPROXY_MISSING = (
    "haproxy not found on PATH or in /usr/sbin; install it (Debian: apt-get install haproxy)"
)

_HEAD = """\
# HAProxy in front of scopenode nodes that share one PostgreSQL (docs/cluster.md).
#
# Routing is an optimisation, never a correctness condition: sends are fenced
# in the database and other nodes' events reach every node by LISTEN/NOTIFY.
# Keeping a workspace's sessions on one node just keeps its scope actors warm
# there and its events local.
#
# - Requests that carry ?workspace=W (the WebSocket /v1/ws?workspace=W, and
#   /v1/attachments/...?workspace=W when a client adds it) hash on W with a
#   consistent hash: adding or removing a node moves only that node's share.
# - Requests without it (the web client's page /, /v1/whoami before the client
#   knows its workspace, an attachment link without the parameter) hash on the
#   client address instead. Any node serves them correctly.
# - `scopenode cluster up` writes a copy of this file with its own ports.
# Reload without dropping connections: haproxy -f haproxy.cfg -sf $(cat haproxy.pid)

global
    # maxconn is derived from the file-descriptor limit (ulimit -n).
    log stderr format short local0 notice

defaults
    mode http
    # No `option http-server-close`: the WebSocket upgrade needs the
    # connection kept; after the 101 HAProxy is a tunnel.
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    # A WebSocket idles between heartbeats; the tunnel timeout governs it.
    timeout tunnel 1h
    timeout client-fin 5s
    # A node that refuses a new connection (down, draining) is skipped: every
    # retry goes to another node, after a turn-around of min(timeout connect,
    # 1 s), so a client of a killed node is through before the health check
    # has marked it down.
    option redispatch 1
    retries 2

frontend scopenode
    bind {bind}
    # The nodes see the proxy's loopback address: a scraper reads each node's
    # /metrics on its own port (or --metrics-bind), never through the front door.
    http-request deny deny_status 403 if {{ path /metrics }}
    use_backend by_workspace if {{ url_param(workspace) -m found }}
    default_backend by_source

backend by_workspace
    balance url_param workspace
    hash-type consistent
    option httpchk GET /healthz
    http-check expect status 200
    # Down after 2 failed checks 500 ms apart: a draining node answers 503 and
    # a killed one refuses the connection, so each of its checks fails at once.
    # Being marked down cuts all the node's sessions, so a check waits past the
    # node's own 2 s deadline for its database ping: the node's answer decides,
    # not a CPU stall. Unset, the wait is `inter` (500 ms), and a node stalled
    # for 2 s on a busy host lost every session to the other nodes.
    timeout check 3s
    default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
"""


def haproxy_config(host: str, port: int, node_ports: Sequence[int]) -> str:
    """The configuration for nodes on 127.0.0.1 at ``node_ports``."""
    text = _HEAD.format(bind=f"{host}:{port}")
    for i, node_port in enumerate(node_ports):
        text += f"    server node{i} 127.0.0.1:{node_port} check\n"
    text += "\nbackend by_source\n    balance source\n    hash-type consistent\n"
    for i, node_port in enumerate(node_ports):
        text += f"    server node{i} 127.0.0.1:{node_port} track by_workspace/node{i}\n"
    return text


def node_command(index: int, port: int, data_dir: Path, dsn: str, log_level: str) -> list[str]:
    """``scopenode serve`` as node ``node<index>`` of a cluster on ``dsn``, on 127.0.0.1."""
    command = [sys.executable, "-m", "node", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--data-dir", str(data_dir), "--database-url", dsn]
    command += ["--node-id", f"node{index}", "--log-level", log_level]
    return command


def haproxy_command(haproxy: str, config: Path, pid_file: Path) -> list[str]:
    """HAProxy in the foreground (``-db``) on ``config``, its pid written for ``-sf`` reloads."""
    return [haproxy, "-db", "-f", str(config), "-p", str(pid_file)]


def find_haproxy() -> str | None:
    found = shutil.which("haproxy")
    if found:
        return found
    return next((p for p in HAPROXY_PATHS if os.access(p, os.X_OK)), None)


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(url: str, process: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not healthy(url):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}) before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready within {READY_TIMEOUT:.0f}s")
        time.sleep(0.1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scopenode cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start PostgreSQL, N nodes and HAProxy; Ctrl-C stops")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8765)
    up.add_argument("--data-dir", type=Path, default=Path(".scopenode"))
    up.add_argument("--database-url", default=None)
    up.add_argument("--log-level", default="info")
    return parser


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def main(argv: Sequence[str] | None = None) -> int:
    """``scopenode cluster ARGS``: the ``scopenode.commands`` entry point ``cluster``."""
    args = build_parser().parse_args(argv)
    if args.nodes < 1:
        print("scopenode: --nodes: at least 1", file=sys.stderr)
        return USAGE_ERROR
    haproxy = find_haproxy()
    if haproxy is None:
        print(f"scopenode: {HAPROXY_MISSING}", file=sys.stderr)
        return USAGE_ERROR
    problem = listen_problem(args.host, args.port)
    if problem is not None:
        print(f"scopenode: {problem}", file=sys.stderr)
        return USAGE_ERROR
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        with _cluster(args, haproxy):
            while True:
                time.sleep(3600)
    except _Stop:
        return 0
    except RuntimeError as exc:
        print(f"scopenode: {exc}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _cluster(args: argparse.Namespace, haproxy: str) -> Iterator[None]:
    from node.database import database_url_from_env, migrate
    from storage.embedded import EmbeddedPostgres

    data_dir: Path = args.data_dir
    run_dir = data_dir / "cluster"
    run_dir.mkdir(parents=True, exist_ok=True)
    embedded: EmbeddedPostgres | None = None
    processes: list[subprocess.Popen[bytes]] = []
    try:
        dsn = args.database_url or database_url_from_env()
        if not dsn:
            embedded = EmbeddedPostgres(data_dir)
            dsn = embedded.start()
        migrate(dsn)
        ports = free_ports(args.nodes)
        for i, port in enumerate(ports):
            log = open(run_dir / f"node{i}.log", "ab")  # noqa: SIM115 (the child keeps it)
            command = node_command(i, port, data_dir, dsn, args.log_level)
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the nodes through us only
            )
            log.close()
            processes.append(process)
            if i == 0:
                # The first node founds the demo workspace alone.
                wait_healthy(f"http://127.0.0.1:{port}/healthz", process, "node0")
        for i, port in enumerate(ports):
            wait_healthy(f"http://127.0.0.1:{port}/healthz", processes[i], f"node{i}")
        config = run_dir / "haproxy.cfg"
        config.write_text(haproxy_config(args.host, args.port, ports))
        proxy = subprocess.Popen(
            haproxy_command(haproxy, config, run_dir / "haproxy.pid"),
            stdout=subprocess.DEVNULL,
            stderr=open(run_dir / "haproxy.log", "ab"),  # noqa: SIM115
            start_new_session=True,
        )
        processes.append(proxy)
        host = args.host if args.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        wait_healthy(f"http://{host}:{args.port}/healthz", proxy, "haproxy")
        _announce(args, data_dir, ports)
        yield
    finally:
        _stop_all(processes)
        if embedded is not None:
            embedded.stop()


def _announce(args: argparse.Namespace, data_dir: Path, ports: Sequence[int]) -> None:
    from node.app import login_link

    token_file = data_dir / "demo-token"
    token = token_file.read_text().strip() if token_file.exists() else None
    lines = [
        f"scopenode cluster ready: ws://{args.host}:{args.port}/v1/ws  "
        f"web client: http://{args.host}:{args.port}/",
        "nodes: " + " ".join(f"node{i}=127.0.0.1:{p}" for i, p in enumerate(ports)),
    ]
    if token:
        lines.append(f"login: {login_link(args.host, args.port, token)}")
        lines.append(f"demo token: {token}")
    print("\n".join(lines), flush=True)


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """HAProxy first (it is last in the list), then the nodes drain together."""
    for process in reversed(processes):
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
