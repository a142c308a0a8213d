"""Graceful shutdown (issue 4, acceptance 6).

``scopenode serve`` on an empty data dir (embedded PostgreSQL) with two
sessions connected gets SIGTERM: both sessions are closed with 4503, the
process exits 0 within a bound, and no PostgreSQL process of its cluster is
left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import trio

from bench.nodeproc import free_port, stop_process, wait_healthy
from node.client import open_client
from protocol.errors import CloseCode

START_TIMEOUT = 120.0  # initdb on first start
EXIT_TIMEOUT = 30.0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return False


def postmaster_pid(cluster_dir: Path) -> int | None:
    try:
        return int((cluster_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def processes_in(cluster_dir: Path) -> list[int]:
    """Live processes whose working directory is the cluster (postmaster and backends)."""
    found = []
    target = cluster_dir.resolve()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(os.readlink(entry / "cwd")) == target and pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def cluster_layout(data_dir: Path) -> tuple[Path, Path]:
    """The embedded cluster's directory and socket directory, as the node recorded them."""
    layout = json.loads((data_dir / "pg-layout.json").read_text())
    return Path(layout["cluster_dir"]), Path(layout["socket_dir"])


def cleanup_cluster(data_dir: Path, keep_under: Path) -> None:
    """Stop a PostgreSQL the node left running (fast shutdown, by its pid) and
    delete cluster files that live outside the test's tmp dir."""
    if not (data_dir / "pg-layout.json").exists():
        return
    cluster_dir, socket_dir = cluster_layout(data_dir)
    pid = postmaster_pid(cluster_dir)
    if pid is not None and pid_alive(pid) and pid in processes_in(cluster_dir):
        os.kill(pid, signal.SIGINT)
    for path in (cluster_dir, socket_dir):
        if not path.resolve().is_relative_to(keep_under.resolve()):
            shutil.rmtree(path, ignore_errors=True)


async def test_sigterm_closes_sessions_with_4503_exits_0_and_stops_postgres(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    log_path = tmp_path / "node.log"
    port = free_port()
    cmd = [sys.executable, "-m", "node", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--data-dir", str(data_dir), "--log-level", "info"]
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    with log_path.open("wb") as log:
        proc = await trio.lowlevel.open_process(cmd, stdout=log, stderr=log, env=env)
    try:
        try:
            await wait_healthy(f"ws://127.0.0.1:{port}", proc, START_TIMEOUT)
        except (RuntimeError, trio.TooSlowError) as exc:
            raise AssertionError(f"node did not start: {log_path.read_text()[-3000:]}") from exc
        token = (data_dir / "demo-token").read_text().strip()
        cluster_dir, _ = cluster_layout(data_dir)
        pg_pid = postmaster_pid(cluster_dir)
        assert pg_pid is not None
        assert pid_alive(pg_pid)

        url = f"ws://127.0.0.1:{port}/v1/ws"
        async with open_client(url, token) as first, open_client(url, token) as second:
            await first.send("#general", "before the shutdown")
            seen = await second.events_until(lambda e: e["type"] == "message", timeout=10)
            assert seen[-1]["message"]["content"] == "before the shutdown"

            os.kill(proc.pid, signal.SIGTERM)
            assert await first.wait_closed(EXIT_TIMEOUT) == CloseCode.DRAINING
            assert await second.wait_closed(EXIT_TIMEOUT) == CloseCode.DRAINING
            assert "node draining" in (first.close_reason or "")

        with trio.fail_after(EXIT_TIMEOUT):
            await proc.wait()
        assert proc.returncode == 0, log_path.read_text()[-3000:]
        assert not pid_alive(pg_pid), "the embedded PostgreSQL outlived the node"
        assert postmaster_pid(cluster_dir) is None, "postmaster.pid left behind"
        assert processes_in(cluster_dir) == [], "orphaned PostgreSQL processes"
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(proc)
        cleanup_cluster(data_dir, tmp_path)
