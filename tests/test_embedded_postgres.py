"""The embedded PostgreSQL launcher: start, reuse, stop, crash recovery, long paths.

Every server started here is stopped (or killed by pid) and its files outside
pytest's temporary directory are removed, whatever the test outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from storage.embedded import EmbeddedPostgres

ServerFactory = Callable[[Path], EmbeddedPostgres]


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


def remove_cluster_outside(server: EmbeddedPostgres, keep_under: Path) -> None:
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

    def make(data_dir: Path) -> EmbeddedPostgres:
        server = EmbeddedPostgres(data_dir)
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
            remove_cluster_outside(server, tmp_path)


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
    assert postmaster_pid(second) == pid
    second.stop()

    assert select_one(dsn) == ("scopenode",)
    first.stop()
    assert not (first.cluster_dir / "postmaster.pid").exists()


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
