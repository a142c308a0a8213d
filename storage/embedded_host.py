"""Embedded PostgreSQL on this machine: who runs it, what it owns, who uses it.

The account that runs the server (``postgres``, or a system user created on
demand when scopenode runs as root) and the directories it owns, the
``flock``s that serialise starts and count a server's users, the processes
found using a cluster, and the clusters kept under ``/var/lib/scopenode-pg``
outside their data dir, removed once that data dir is gone. The launcher that
uses them, and why, is ``storage/embedded.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog

from storage.errors import EmbeddedPostgresError

SERVER_USER_FALLBACK = "scopenode-pg"
PRIVATE_CLUSTER_ROOT = Path("/var/lib/scopenode-pg")
CLUSTER_RECORD = "scopenode-data-dir.json"
# A cluster being deleted is first renamed to this prefix so that no other
# process can start it half-deleted, and a removal cut short is finished later.
_REMOVING_PREFIX = ".removing-"

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ServerUser:
    """The account that runs initdb, pg_ctl and the server."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @property
    def is_self(self) -> bool:
        return self.uid == os.geteuid()


def server_user() -> ServerUser:
    """The account that runs PostgreSQL (which refuses to run as root)."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return ServerUser(entry.pw_name, entry.pw_uid, entry.pw_gid, ())
    for name in ("postgres", SERVER_USER_FALLBACK):
        with contextlib.suppress(KeyError):
            return _user_entry(name)
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    argv = [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    created = subprocess.run(
        [*argv, SERVER_USER_FALLBACK],
        capture_output=True,
        text=True,
        check=False,
    )
    if created.returncode != 0:
        raise EmbeddedPostgresError(
            f"cannot create the system user {SERVER_USER_FALLBACK!r} to run PostgreSQL "
            f"(which refuses to run as root): {created.stderr.strip()}"
        )
    _log.info("embedded_pg.user_created", user=SERVER_USER_FALLBACK)
    return _user_entry(SERVER_USER_FALLBACK)


def _user_entry(name: str) -> ServerUser:
    entry = pwd.getpwnam(name)
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return ServerUser(name, entry.pw_uid, entry.pw_gid, groups)


def can_access(user: ServerUser, path: Path) -> bool:
    """Whether ``user`` can search (directory) or execute (file) ``path``,
    which needs search permission on all its ancestors too.

    Asked of the kernel (``test -x`` run as that user), so ACLs and group
    memberships count exactly as they will for the server.
    """
    test = shutil.which("test") or "/usr/bin/test"
    result = subprocess.run(
        [test, "-x", str(path)],
        user=user.uid,
        group=user.gid,
        extra_groups=list(user.groups),
        cwd="/",
        check=False,
    )
    return result.returncode == 0


def make_private_dir(path: Path, user: ServerUser) -> None:
    """Create ``path`` 0700 owned by ``user``; an existing one must be theirs."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = path.lstat()
        if not path.is_dir() or path.is_symlink() or info.st_uid != user.uid:
            raise EmbeddedPostgresError(
                f"{path} exists but is not a directory owned by {user.name!r}; "
                "remove it or fix its owner"
            ) from None
        return
    if not user.is_self:
        os.chown(path, user.uid, user.gid)


# --- locks --------------------------------------------------------------------


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def try_flock(handle: IO[str], operation: int) -> bool:
    try:
        fcntl.flock(handle.fileno(), operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# --- processes ----------------------------------------------------------------


def pid_from_file(pid_file: Path) -> int | None:
    try:
        first_line = pid_file.read_text().split("\n", 1)[0].strip()
        return int(first_line)
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill()
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def process_cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).resolve()
    except OSError:
        return None


def process_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def processes_in(directory: Path) -> set[int]:
    """Live processes whose working directory is ``directory`` (postgres
    processes chdir to their PGDATA)."""
    target = directory.resolve()
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                pid = int(entry.name)
                if process_cwd(pid) == target and pid_alive(pid):
                    found.add(pid)
    return found


# --- clusters outside their data dir ------------------------------------------


def recorded_data_dir(cluster_dir: Path) -> Path | None:
    """The data dir a private cluster recorded as its own, or None without a record."""
    try:
        recorded = json.loads((cluster_dir / CLUSTER_RECORD).read_text())["data_dir"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return Path(recorded) if isinstance(recorded, str) else None


def remove_orphaned_clusters(
    *,
    root: Path = PRIVATE_CLUSTER_ROOT,
    discard_under: Path | None = None,
    log: Any | None = None,
) -> list[Path]:
    """Delete the clusters under ``root`` whose data dir no longer exists and
    whose server is not running; log and return them.

    With ``discard_under``, clusters of data dirs inside that directory go as
    well even though it still exists (a test session cleaning up after
    itself). Clusters without a record are left alone.
    """
    log = log if log is not None else _log
    discard = discard_under.resolve() if discard_under is not None else None
    try:
        entries = sorted(root.iterdir())
    except (FileNotFoundError, PermissionError):  # none yet, or not root: none of ours
        return []
    removed: list[Path] = []
    for cluster_dir in entries:
        if cluster_dir.name.startswith(_REMOVING_PREFIX):
            shutil.rmtree(cluster_dir, ignore_errors=True)
            continue
        data_dir = recorded_data_dir(cluster_dir)
        if data_dir is None or cluster_dir.is_symlink():
            continue
        if data_dir.exists() and not (discard is not None and data_dir.is_relative_to(discard)):
            continue
        if _server_runs_in(cluster_dir):
            continue
        doomed = root / f"{_REMOVING_PREFIX}{cluster_dir.name}.{os.getpid()}"
        try:
            cluster_dir.rename(doomed)
        except OSError:  # another process removed it first
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        # A warning, so that admin commands (which log only warnings) say it too.
        log.warning(
            "embedded_pg.orphaned_cluster_removed",
            cluster_dir=str(cluster_dir),
            data_dir=str(data_dir),
        )
        removed.append(cluster_dir)
    return removed


def _server_runs_in(cluster_dir: Path) -> bool:
    """Whether a postmaster or any backend still uses ``cluster_dir``."""
    pid = pid_from_file(cluster_dir / "postmaster.pid")
    if pid is not None and pid_alive(pid) and process_name(pid) in ("postgres", "postmaster"):
        return True
    return bool(processes_in(cluster_dir))
