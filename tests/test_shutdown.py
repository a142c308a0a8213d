"""Graceful shutdown.

``scopenode serve`` on an empty data dir (embedded PostgreSQL) with two
sessions connected gets SIGTERM: ``/healthz`` answers 503 and new sessions
are refused while both are still open, then both are closed with 4503, the
process exits 0 within a bound, and no PostgreSQL process of its cluster is
left behind.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import trio

from bench.nodeproc import free_port, http_status, stop_process, wait_healthy
from node.client import open_client
from protocol.errors import CloseCode
from tests.clusters import (
    cluster_layout,
    pid_alive,
    postmaster_pid,
    processes_in,
    remove_cluster_outside,
    stop_leftover,
)

START_TIMEOUT = 120.0  # initdb on first start
EXIT_TIMEOUT = 30.0


def cleanup_cluster(data_dir: Path, keep_under: Path) -> None:
    """Stop a PostgreSQL the node left running and delete cluster files outside the tmp dir."""
    if (data_dir / "pg-layout.json").exists():
        stop_leftover(data_dir)
        remove_cluster_outside(data_dir, keep_under)


async def healthz_until_503(port: int) -> list[int | None]:
    """``/healthz`` statuses from SIGTERM on, up to the first 503 (a refused
    connection is None, and would fail the caller)."""
    statuses: list[int | None] = []
    with trio.fail_after(5):
        while not statuses or statuses[-1] == 200:
            statuses.append(await http_status("127.0.0.1", port, "/healthz"))
            await trio.sleep(0.02)
    return statuses


async def upgrade_status(port: int) -> int:
    """The status line's code for a WebSocket upgrade of ``/v1/ws``."""
    request = (
        f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    with trio.fail_after(5):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(request.encode())
            head = b""
            while b"\r\n" not in head:
                chunk = await stream.receive_some(4096)
                assert chunk, head
                head += chunk
    return int(head.split(b" ", 2)[1])


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
            # The drain window: health checks get a clear 503 (not a refused
            # connection) while the sessions are still open, and so does a new
            # WebSocket upgrade.
            statuses = await healthz_until_503(port)
            assert statuses[-1] == 503, statuses
            assert first.close_code is None
            assert second.close_code is None
            assert await upgrade_status(port) == 503
            assert await http_status("127.0.0.1", port, "/healthz") == 503
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
