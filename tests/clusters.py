"""Looking at an embedded PostgreSQL cluster from the outside (tests only)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

from storage.embedded import LAYOUT_FILE


def cluster_layout(data_dir: Path) -> tuple[Path, Path]:
    """The embedded cluster's directory and socket directory, as the launcher recorded them."""
    layout = json.loads((data_dir / LAYOUT_FILE).read_text())
    return Path(layout["cluster_dir"]), Path(layout["socket_dir"])


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def postmaster_pid(cluster_dir: Path) -> int | None:
    """The pid recorded in ``postmaster.pid`` (alive or not), or None without the file."""
    try:
        return int((cluster_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def live_postmaster(cluster_dir: Path) -> int | None:
    pid = postmaster_pid(cluster_dir)
    return pid if pid is not None and pid_alive(pid) else None


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


def stop_leftover(data_dir: Path) -> int | None:
    """Ask a postmaster a test left running to stop (fast shutdown, by its pid)."""
    with contextlib.suppress(OSError, ValueError):
        cluster_dir, _ = cluster_layout(data_dir)
        pid = live_postmaster(cluster_dir)
        if pid is not None and pid in processes_in(cluster_dir):
            os.kill(pid, signal.SIGINT)
            return pid
    return None


def remove_cluster_outside(data_dir: Path, keep_under: Path) -> None:
    """Delete cluster files the launcher put outside ``keep_under`` (relocated
    when the server user cannot reach the data dir)."""
    with contextlib.suppress(OSError, ValueError):
        for path in cluster_layout(data_dir):
            if not path.resolve().is_relative_to(keep_under.resolve()):
                shutil.rmtree(path, ignore_errors=True)
