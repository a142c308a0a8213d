"""The node under test: a running one (``--url``) or one the bench starts.

:func:`open_node` starts ``scopenode serve`` on a free loopback port with its
embedded database in a temporary data dir, waits for ``GET /healthz`` 200,
and on exit stops it with SIGTERM (by pid; SIGKILL only after a grace
period) and waits for it. A node started here runs with raised per-session
rate limits and session cap (``node.limits.RAISED_LIMITS_ENV``; values already
in the environment win); a ``--url`` node keeps whatever it was started with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urlsplit

import trio

from bench.provision import scopenode_cmd
from node.limits import RAISED_LIMITS_ENV

HEALTH_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class NodeUnderTest:
    base_url: str  # ws://HOST:PORT
    pid: int | None  # known when the bench started the node or --node-pid was given
    data_dir: str
    database_url: str | None
    started_here: bool


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def http_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """Status code of ``GET path`` over a fresh loopback connection, or None."""
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                req = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
                await stream.send_all(req.encode("ascii"))
                head = b""
                while b"\r\n" not in head:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return None
                    head += chunk
    except (OSError, trio.TooSlowError, trio.BrokenResourceError):
        return None
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


async def wait_healthy(base_url: str, proc: trio.Process | None, timeout: float) -> None:
    u = urlsplit(base_url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    with trio.fail_after(timeout):
        while True:
            if proc is not None and proc.returncode is not None:
                raise RuntimeError(f"node exited with {proc.returncode} before /healthz was 200")
            if await http_status(host, port, "/healthz") == 200:
                return
            await trio.sleep(0.2)


@asynccontextmanager
async def open_node(
    url: str | None,
    *,
    data_dir: str | None,
    database_url: str | None,
    node_pid: int | None = None,
    log_path: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[NodeUnderTest]:
    """Yield the node to bench: ``url`` if given, else a node started here, with
    ``extra_env`` over this process's environment."""
    if url is not None:
        await wait_healthy(url, None, 10.0)
        yield NodeUnderTest(url, node_pid, data_dir or "./.scopenode", database_url, False)
        return
    with tempfile.TemporaryDirectory(prefix="scopenode-bench-") as tmp:
        ddir = data_dir or os.path.join(tmp, "data")
        port = free_port()
        cmd = [*scopenode_cmd(), "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--data-dir", ddir, "--log-level", "warning"]
        if database_url:
            cmd += ["--database-url", database_url]
        log = _open_log(log_path or os.path.join(tmp, "node.log"))
        env = {**RAISED_LIMITS_ENV, **os.environ, **(extra_env or {})}
        proc = await trio.lowlevel.open_process(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            base = f"ws://127.0.0.1:{port}"
            try:
                await wait_healthy(base, proc, HEALTH_TIMEOUT_S)
            except (RuntimeError, trio.TooSlowError) as e:
                log.flush()
                tail = _tail(log.name)
                raise RuntimeError(f"node did not become healthy: {e}\n{tail}") from e
            yield NodeUnderTest(base, proc.pid, ddir, database_url, True)
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(proc)
                log.close()


def _open_log(path: str) -> BinaryIO:
    return open(path, "wb")


def _tail(path: str, size: int = 2000) -> str:
    with open(path, "rb") as f:
        return f.read()[-size:].decode(errors="replace")


async def stop_process(proc: trio.Process) -> None:
    """SIGTERM our own child by pid, wait; SIGKILL after the grace period."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE_S):
            await proc.wait()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
