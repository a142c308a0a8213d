"""Baselines (b) and (c): run a fan-out server process, count with reader processes.

The server (``python -m bench.rawfanout`` or ``node bench/peers/ws-fanout.js``)
waits for every reader to connect, then broadcasts on its own; the readers
count ``@bt:`` markers and sample latencies. Deliveries/s is measured from the
server's first broadcast to the last delivery any reader saw.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.readers import ReaderPlan, ReaderPool, ReaderSummary, ReaderTarget

PEERS_DIR = Path(__file__).parent / "peers"


@dataclass(frozen=True)
class FanoutPlan:
    clients: int = 1000
    messages: int = 200
    size: int = 230
    burst: int = 8
    reader_processes: int = 2
    sample_every: int = 50
    timeout_s: float = 60.0


def python_server_cmd() -> list[str]:
    return [sys.executable, "-m", "bench.rawfanout"]


def ensure_node_peer() -> tuple[list[str] | None, str | None]:
    """The command for baseline (c), or ``(None, why it is skipped)``."""
    node = shutil.which("node")
    if node is None:
        return None, "node (Node.js) not on PATH"
    if not (PEERS_DIR / "node_modules" / "ws").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            return None, "npm not on PATH and bench/peers/node_modules missing"
        try:
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--silent"],
                cwd=PEERS_DIR,
                check=True,
                timeout=300,
                capture_output=True,
            )
        except (subprocess.SubprocessError, OSError) as e:
            return None, f"npm install failed: {e}"
    return [node, str(PEERS_DIR / "ws-fanout.js")], None


def summarize(plan: FanoutPlan, readers: ReaderSummary, t_first_ns: int | None) -> dict[str, Any]:
    """Figures common to every fan-out run (baselines and the node workload)."""
    expected = readers.connections * plan.messages
    duration_s = 0.0
    if t_first_ns is not None and readers.last_ns is not None:
        duration_s = (readers.last_ns - t_first_ns) / 1e9
    return {
        "readers": readers.connections,
        "readers_failed": readers.failed,
        "messages": plan.messages,
        "expected_deliveries": expected,
        "deliveries": readers.events,
        "complete": readers.failed == 0
        and readers.min_events == plan.messages
        and readers.max_events == plan.messages,
        "duration_s": round(duration_s, 4),
        "deliveries_per_s": round(readers.events / duration_s, 1) if duration_s > 0 else 0.0,
        "latency": readers.latency.summary(),
        "reader_cpu_s": round(readers.cpu_s, 3),
        "errors": readers.errors[:5],
    }


def run_fanout_server(cmd: list[str], plan: FanoutPlan) -> dict[str, Any]:
    """Start the server ``cmd``, connect ``plan.clients`` readers, return figures."""
    args = [
        *cmd,
        *("--clients", str(plan.clients)),
        *("--messages", str(plan.messages)),
        *("--size", str(plan.size)),
        *("--burst", str(plan.burst)),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    pool: ReaderPool | None = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"fan-out server did not start: {line!r}")
        port = int(line.split()[1])
        targets = [ReaderTarget("127.0.0.1", port, "/") for _ in range(plan.clients)]
        pool = ReaderPool(
            targets,
            ReaderPlan(
                expected_events=plan.messages,
                sample_every=plan.sample_every,
                setup_timeout_s=plan.timeout_s,
                timeout_s=plan.timeout_s,
                keepalive_s=None,
            ),
            processes=plan.reader_processes,
        )
        pool.start()
        pool.wait_ready(plan.timeout_s + 30)
        readers = pool.wait_result(plan.timeout_s + 30)
        server = json.loads(proc.stdout.readline() or "{}")
        proc.wait(timeout=30)
    finally:
        if pool is not None:
            pool.stop()
            pool.close()
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    t_first = int(server["t_first_ns"]) if server.get("t_first_ns") else None
    out = summarize(plan, readers, t_first)
    out["server_cpu_s"] = round(float(server.get("cpu_s", 0.0)), 3)
    out["frame_bytes"] = server.get("frame_bytes")
    out["server_errors"] = server.get("errors", [])[:5]
    return out
