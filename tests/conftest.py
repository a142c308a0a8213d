"""Shared pytest fixtures.

PostgreSQL: one real server per test session (``pg_server_dsn``), either the
one named by ``SCOPENODE_TEST_DATABASE_URL`` or an embedded cluster started in
a temporary directory; every test that needs a database gets a fresh, empty
one (``empty_database_url``) or a clone of the session's schema template
(``database_url``), dropped afterwards. Under pytest-xdist (``pytest -n
auto``) every worker is a session of its own: its own temporary directory,
embedded server and template.

As root, the embedded clusters of data dirs the server user cannot reach
live under ``/var/lib/scopenode-pg``; ``_private_clusters_left_as_found``
removes the ones this session created and fails the session if one of them
still has a running server. A test's ``tmp_path`` is made reachable (search
permission, 0711) so that a node's cluster lives in its data dir, in memory
with the rest of the test's files; the tests of private clusters make their
own 0700 directories.

A test that needs a tool from outside the project (Chromium, HAProxy,
Node.js, ...) says so with :func:`require_tool` (or :func:`tool_missing` where
the lookup happens in a fixture): under ``CI=true`` a missing tool fails the
test, elsewhere it skips, and the terminal summary lists what was skipped for
which tool.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import NoReturn

import psycopg
import pytest
from psycopg import sql

from node.limits import RAISED_LIMITS_ENV
from storage.embedded import EmbeddedPostgres
from storage.embedded_host import PRIVATE_CLUSTER_ROOT, recorded_data_dir, remove_orphaned_clusters
from storage.pg import dsn_for_database
from tests.clusters import live_postmaster, pid_alive, processes_in

TEST_DATABASE_URL_ENV = "SCOPENODE_TEST_DATABASE_URL"

# The suite drives nodes far harder than people do (hundreds of sends per
# session within a second): every node it starts, in-process or as a
# subprocess, gets the bench's raised limits. tests/test_limits.py sets its own.
for _name, _value in RAISED_LIMITS_ENV.items():
    os.environ.setdefault(_name, _value)

# Bytecode caches even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE): the suite starts dozens of Python processes
# (workers, nodes, CLIs), and without the caches each one compiles the sources
# again (a worker's collection: 4.8 s of CPU instead of 2.0 s on a 2-core VM).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Only for the throwaway test cluster: skipping fsync survives a killed
# server process (just not an OS crash) and makes CREATE DATABASE cheap. Its
# databases live for one test each, so vacuuming and analysing them is wasted
# work, and so are JIT compiles and full-page images (in alternating runs on a
# 2-core VM the suite took 2-5 % less CPU without them).
_TEST_SERVER_SETTINGS = {
    "fsync": "off",
    "autovacuum": "off",
    "jit": "off",
    "full_page_writes": "off",
}

# The suite's files (databases, nodes' data dirs, browser profiles) live in
# memory when the machine has a tmpfs with room: on the virtual disk of a CI VM,
# writing and deleting them took some 15 % of the suite's CPU.
_RAM_TEMP = Path("/dev/shm")
_RAM_TEMP_FREE_BYTES = 2 * 1024**3


def _ram_temp_root() -> Path | None:
    try:
        stat = os.statvfs(_RAM_TEMP)
    except OSError:
        return None
    if not os.access(_RAM_TEMP, os.W_OK | os.X_OK):
        return None
    return _RAM_TEMP if stat.f_bavail * stat.f_frsize >= _RAM_TEMP_FREE_BYTES else None


if "TMPDIR" not in os.environ and (_ram := _ram_temp_root()) is not None:
    os.environ["TMPDIR"] = str(_ram)  # for the nodes, servers and browsers the tests start
    tempfile.tempdir = None  # gettempdir() looks again (pytest's tmp_path asks it lazily)


@pytest.fixture(scope="session", autouse=True)
def _private_clusters_left_as_found(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Session teardown (after every other fixture's): delete the private
    clusters of this session's data dirs and of data dirs that are gone.

    Clusters of other sessions running concurrently on the machine belong to
    data dirs that still exist outside our temporary directory and are kept.
    """
    basetemp = tmp_path_factory.getbasetemp().resolve()
    yield
    remove_orphaned_clusters(discard_under=basetemp)
    leaked = [
        cluster_dir
        for cluster_dir in _entries(PRIVATE_CLUSTER_ROOT)
        if (data_dir := recorded_data_dir(cluster_dir)) is not None
        and data_dir.is_relative_to(basetemp)
    ]
    if leaked:
        # A test left its server running: stop it (it is this session's), so
        # the next run starts clean, and report the leak.
        for cluster_dir in leaked:
            _stop_postmaster(cluster_dir)
        remove_orphaned_clusters(discard_under=basetemp)
        pytest.fail(f"servers left running by this test session: {leaked}")


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """pytest's ``tmp_path``, reachable by PostgreSQL's server user when we are
    root; afterwards no embedded server may still run in it."""
    top = Path(tempfile.gettempdir())
    if os.geteuid() == 0 and tmp_path.is_relative_to(top):
        for directory in (tmp_path, *tmp_path.parents):  # up to pytest-of-root
            if directory == top:
                break
            directory.chmod(0o711)
    yield tmp_path
    # Data dirs sit at most two levels down (<tmp>/data, <tmp>/run/node1).
    clusters = [*tmp_path.glob("pg"), *tmp_path.glob("*/pg"), *tmp_path.glob("*/*/pg")]
    leaked = [cluster for cluster in clusters if live_postmaster(cluster) is not None]
    for cluster in leaked:
        _stop_postmaster(cluster)
    if leaked:
        pytest.fail(f"servers left running by this test: {leaked}")


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, PermissionError):
        return []


def _stop_postmaster(cluster_dir: Path, timeout: float = 30.0) -> None:
    pid = live_postmaster(cluster_dir)
    if pid is None or pid not in processes_in(cluster_dir):
        return  # not running, or the pid names another process now
    os.kill(pid, signal.SIGINT)  # fast shutdown
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """A DSN to a maintenance database (``postgres``) on a real server."""
    if url := os.environ.get(TEST_DATABASE_URL_ENV):
        yield url
        return
    # Its own directory the server user can reach (pytest's are private to
    # us): the cluster then lives in it, in memory when the temp dir is.
    data_dir = Path(tempfile.mkdtemp(prefix="scopenode-test-pg-"))
    data_dir.chmod(0o755)
    server = EmbeddedPostgres(
        data_dir,
        database="postgres",
        server_settings=_TEST_SERVER_SETTINGS,
    )
    dsn = server.start()
    try:
        yield dsn
    finally:
        server.stop()
        _remove_cluster_outside(server, data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


class _Maintenance:
    """One autocommit connection to the maintenance database for the session's
    CREATE and DROP DATABASE: a connection per statement cost each test two
    backend start-ups (some 8 ms of CPU each). Reopened when a test broke it."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection | None = None

    def execute(self, statement: sql.Composable) -> None:
        if self._conn is None or self._conn.broken or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
        try:
            self._conn.execute(statement)
        except psycopg.OperationalError:
            if not self._conn.broken:
                raise
            self._conn = None
            self.execute(statement)

    def create(self, name: str, template: str | None = None) -> None:
        if template is None:
            self.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return
        # A file copy, not PostgreSQL's default of every page through the WAL:
        # 21 ms of server CPU per database instead of 27 with this schema.
        self.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )

    def drop(self, name: str) -> None:
        self.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@pytest.fixture(scope="session")
def _maintenance(pg_server_dsn: str) -> Iterator[_Maintenance]:
    maintenance = _Maintenance(pg_server_dsn)
    try:
        yield maintenance
    finally:
        maintenance.close()


@pytest.fixture
def empty_database_url(pg_server_dsn: str, _maintenance: _Maintenance) -> Iterator[str]:
    """A DSN to a new, empty database with a unique name; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex}"
    _maintenance.create(name)
    try:
        yield dsn_for_database(pg_server_dsn, name)
    finally:
        _maintenance.drop(name)


def _remove_cluster_outside(server: EmbeddedPostgres, keep_under: Path) -> None:
    """Delete a stopped embedded cluster's files that live outside
    ``keep_under`` (the private cluster dir or /tmp socket dir used when the
    data dir is unreachable or too deep); files inside it are the caller's."""
    for path in (server.cluster_dir, server.socket_dir):
        if not path.resolve().is_relative_to(keep_under.resolve()):
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- schema and nodes


@pytest.fixture(scope="session")
def schema_template(pg_server_dsn: str, _maintenance: _Maintenance) -> Iterator[str]:
    """A database with the schema applied, used as a template for per-test databases.

    Its name is this session's own: sessions and xdist workers sharing the
    server of ``SCOPENODE_TEST_DATABASE_URL`` never clone or drop each other's.
    """
    from storage import schema

    name = f"template_{uuid.uuid4().hex}"
    _maintenance.create(name)
    try:
        with psycopg.connect(dsn_for_database(pg_server_dsn, name)) as conn:
            schema.migrate(conn)
        yield name
    finally:
        _maintenance.drop(name)


@pytest.fixture
def database_url(
    pg_server_dsn: str, schema_template: str, _maintenance: _Maintenance
) -> Iterator[str]:
    """A fresh database that already has the schema; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex}"
    _maintenance.create(name, template=schema_template)
    try:
        yield dsn_for_database(pg_server_dsn, name)
    finally:
        _maintenance.drop(name)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per CPU. A test mostly waits on its node,
    PostgreSQL or a subprocess, so on two cores four workers finish sooner
    than two."""
    return 2 * (os.cpu_count() or 1)


@pytest.fixture(scope="session", autouse=True)
def _quiet_logs() -> None:
    """Info-level logs in tests: per-send debug lines would drown every failure."""
    from node import logs

    logs.configure("info", json=False)


# ---------------------------------------------------------------- tools from outside

_MISSING_TOOL = "missing_tool"  # the attribute of a tool skip, and its report's user property


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def tool_missing(name: str, reason: str, *, optional_in_ci: bool = False) -> NoReturn:
    """End the current test for want of ``name``: a failure under ``CI=true``,
    where every tool the suite uses is installed (``.ci/run``), else a skip.

    ``optional_in_ci`` is for what CI cannot promise (running as root).
    """
    if in_ci() and not optional_in_ci:
        pytest.fail(f"{name} is required under CI=true: {reason}", pytrace=False)
    # Reported at the test (as skipif marks are), not at this line.
    skip = pytest.skip.Exception(f"{name} is missing: {reason}", _use_item_location=True)
    setattr(skip, _MISSING_TOOL, name)
    raise skip


def require_tool(
    name: str, missing: str | None, *, optional_in_ci: bool = False
) -> pytest.MarkDecorator:
    """Mark a test (or a module, in ``pytestmark``) as needing ``name``.

    ``missing`` is the tool lookup's answer: why it cannot be used here, or
    None when it is found. Acted on at setup by :func:`tool_missing`.
    """
    return pytest.mark.requires_tool(name, missing, optional_in_ci=optional_in_ci)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires_tool(name, missing): needs a tool from outside the project "
        "(failed under CI=true when missing, else skipped); see require_tool",
    )
    config.addinivalue_line(
        "markers",
        "runs_for(seconds): about how long a long test runs here; the longest start first",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first (``runs_for``), the rest in file order: a long
    test handed out last leaves its worker running alone at the end. The slow
    set is handed out test by test; the default run file by file, a file in
    the place of its first test."""
    items.sort(key=_runs_for, reverse=True)  # stable: equal keys keep their order


def _runs_for(item: pytest.Item) -> float:
    mark = item.get_closest_marker("runs_for")
    return float(mark.args[0]) if mark else 0.0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture: a test whose tool is missing neither starts servers
    nor runs."""
    for mark in item.iter_markers("requires_tool"):
        name, missing = mark.args
        if missing is not None:
            tool_missing(name, missing, optional_in_ci=mark.kwargs["optional_in_ci"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.excinfo is not None and (tool := getattr(call.excinfo.value, _MISSING_TOOL, None)):
        report.user_properties.append((_MISSING_TOOL, tool))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = Counter(
        value
        for report in terminalreporter.stats.get("skipped", [])
        for key, value in getattr(report, "user_properties", ())
        if key == _MISSING_TOOL
    )
    if not skipped:
        return
    counts = ", ".join(
        f"{tool} ({n} test{'s' if n != 1 else ''})" for tool, n in sorted(skipped.items())
    )
    terminalreporter.write_sep("-", "tools missing", yellow=True)
    terminalreporter.write_line(f"skipped because a tool is missing: {counts}")
