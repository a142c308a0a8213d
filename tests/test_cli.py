"""The ``scopenode`` command line as a black box.

Every command runs as a real subprocess (``python -m node …``) against a real
PostgreSQL: either the embedded server of a fresh data dir (``serve`` and an
admin command after it) or the per-test database given by ``--database-url``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from node.client import ConnectionClosed, open_client
from storage.embedded import LAYOUT_FILE
from tests.clusters import (
    cluster_layout,
    live_postmaster,
    processes_in,
    remove_cluster_outside,
    stop_leftover,
)
from tests.nodes import running_node

REPO = Path(__file__).resolve().parents[1]
CLI_TIMEOUT = 60.0
SERVE_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        """The one JSON object a successful command prints."""
        assert self.returncode == 0, self
        lines = self.stdout.splitlines()
        assert len(lines) == 1, self
        value = json.loads(lines[0])
        assert isinstance(value, dict), self
        return value


def _env() -> dict[str, str]:
    """The test's environment without DATABASE_URL: only flags choose the database."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def scopenode(*args: str, timeout: float = CLI_TIMEOUT) -> Result:
    """Run ``scopenode ARGS`` (as ``python -m node``) and capture its output."""
    with trio.fail_after(timeout):
        done = await trio.run_process(
            [sys.executable, "-m", "node", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
            env=_env(),
        )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


async def admin(database_url: str, command: str, *args: str) -> Result:
    """An admin command as the CLI parses and runs it, in a thread of this
    process: its exit code and what it prints, without an interpreter's start
    per call (that was most of these tests' time). The process itself is
    tested through :func:`scopenode`."""
    argv = ["admin", command, *args, "--database-url", database_url]
    with trio.fail_after(CLI_TIMEOUT):
        return await trio.to_thread.run_sync(_in_process, argv)


# Standard output and error are the process's: one command prints at a time.
_ONE_AT_A_TIME = threading.Lock()


def _in_process(argv: list[str]) -> Result:
    from node.admin_commands import report
    from node.cli import build_parser

    out, err = io.StringIO(), io.StringIO()
    with _ONE_AT_A_TIME, redirect_stdout(out), redirect_stderr(err):
        try:
            code = report(build_parser().parse_args(argv))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return Result(code, out.getvalue(), err.getvalue())


def assert_failed(result: Result, what: object = None) -> None:
    """Errors: exit 2, one line in words on stderr, nothing on stdout."""
    assert result.returncode == 2, (what, result)
    assert result.stdout == "", (what, result)
    assert len(result.stderr.strip().splitlines()) == 1, (what, result)
    assert "Traceback" not in result.stderr, (what, result)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def http_get(port: int, path: str) -> tuple[int, str]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


# ------------------------------------------------------------ embedded PostgreSQL


def assert_no_server(data_dir: Path) -> None:
    cluster_dir, _ = cluster_layout(data_dir)
    assert (cluster_dir / "PG_VERSION").exists(), cluster_dir
    assert live_postmaster(cluster_dir) is None, f"postgres still runs for {cluster_dir}"
    assert processes_in(cluster_dir) == []


async def _stop_leftover_server(data_dir: Path) -> None:
    """After a failure: stop a postmaster the test's processes left behind (by pid)."""
    if stop_leftover(data_dir) is not None:
        cluster_dir, _ = cluster_layout(data_dir)
        with trio.move_on_after(STOP_TIMEOUT):
            while live_postmaster(cluster_dir) is not None:
                await trio.sleep(0.1)


@pytest.fixture
def fresh_data_dir(tmp_path: Path) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    try:
        yield data_dir
    finally:
        remove_cluster_outside(data_dir, tmp_path)


# ------------------------------------------------------------ serve


@dataclass
class Served:
    process: trio.Process
    port: int
    token: str
    ws_url: str
    stdout: list[str]


class _ExitedEarly(Exception):
    pass


async def _read_until_token(process: trio.Process, lines: list[str]) -> tuple[str, str]:
    """Read stdout lines until ``demo token: …``; return (token, ws url)."""
    assert process.stdout is not None
    buffer = b""
    ws_url = ""
    while True:
        data = await process.stdout.receive_some(65536)
        if not data:
            raise _ExitedEarly
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        for raw in complete:
            line = raw.decode()
            lines.append(line)
            for word in line.split():
                if word.startswith("ws://"):
                    ws_url = word
            if line.startswith("demo token: "):
                return line.removeprefix("demo token: ").strip(), ws_url


async def _stop(process: trio.Process) -> None:
    """SIGTERM by pid, bounded wait, then SIGKILL; close our end of its stdout."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_TIMEOUT):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        assert process.stdout is not None
        await process.stdout.aclose()


async def _start_serve(data_dir: Path, log_file: Path) -> Served:
    """Start ``scopenode serve`` on a free port and wait for its token.

    The port is free when chosen but another process may take it before the
    node binds it: then the node exits with EADDRINUSE and we pick another.
    """
    for attempt in range(3):
        port = _free_port()
        argv = [sys.executable, "-m", "node", "serve", "--port", str(port)]
        argv += ["--data-dir", str(data_dir)]
        with log_file.open("wb") as log:
            process = await trio.lowlevel.open_process(
                argv, stdout=subprocess.PIPE, stderr=log, cwd=REPO, env=_env()
            )
        lines: list[str] = []
        try:
            with trio.fail_after(SERVE_TIMEOUT):
                token, ws_url = await _read_until_token(process, lines)
        except _ExitedEarly:
            await _stop(process)
            log_text = log_file.read_text(errors="replace")
            if "Address already in use" in log_text and attempt < 2:
                continue
            raise AssertionError(
                f"serve exited ({process.returncode}) before printing a token; "
                f"stdout {lines}; log tail:\n{log_text[-3000:]}"
            ) from None
        except BaseException:
            await _stop(process)
            raise
        return Served(process, port, token, ws_url, lines)
    raise AssertionError("unreachable")


@asynccontextmanager
async def serving(data_dir: Path, log_file: Path) -> AsyncIterator[Served]:
    """``scopenode serve`` on a free port; SIGTERM'd (then killed) by pid on the way out."""
    served = await _start_serve(data_dir, log_file)
    try:
        yield served
    finally:
        await _stop(served.process)
        with trio.CancelScope(shield=True):
            await _stop_leftover_server(data_dir)


async def test_serve_starts_embedded_postgres_and_admin_reuses_the_data_dir(
    fresh_data_dir: Path, tmp_path: Path
) -> None:
    data_dir = fresh_data_dir
    log_file = tmp_path / "serve.log"
    async with serving(data_dir, log_file) as served:
        assert served.token
        assert served.ws_url == f"ws://127.0.0.1:{served.port}/v1/ws"
        assert (data_dir / LAYOUT_FILE).exists()
        assert live_postmaster(cluster_layout(data_dir)[0]) is not None

        status, body = await http_get(served.port, "/healthz")
        assert (status, body) == (200, "ok\n")

        async with open_client(served.ws_url, served.token) as client:
            assert client.welcome["member"]["handle"] == "demo"
            demo_workspace = client.welcome["workspaceId"]
            # What a new user needs is printed: the workspace and a login link.
            assert f"workspace: {demo_workspace}" in served.stdout
            login = f"login: http://127.0.0.1:{served.port}/#token={served.token}"
            assert login in served.stdout
            sent = await client.send("#general", "hello from the README")
            assert sent["state"] == "sent"
            assert sent["acceptedSeq"] == 1
            page = await client.history("#general")
            assert [m["content"] for m in page["messages"]] == ["hello from the README"]

        served.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STOP_TIMEOUT):
            await served.process.wait()
        assert served.process.returncode == 0, log_file.read_text()[-2000:]

    assert_no_server(data_dir)

    # With no node up, an admin command starts the embedded server for itself
    # and stops it again; it works on the node's database (the demo workspace).
    data = ("--data-dir", str(data_dir))
    created = await scopenode("admin", "create-workspace", "--name", "later", *data)
    assert created.json()["workspaceId"]
    assert_no_server(data_dir)
    member = await scopenode(
        "admin",
        "create-member",
        "--workspace",
        demo_workspace,
        "--type",
        "agent",
        "--handle",
        "newcomer",
        *data,
    )
    assert member.json()["channels"] == ["#general"]
    assert_no_server(data_dir)
    taken = await scopenode(
        "admin",
        "create-member",
        "--workspace",
        demo_workspace,
        "--type",
        "human",
        "--handle",
        "demo",
        *data,
    )
    assert_failed(taken)
    assert_no_server(data_dir)


# ------------------------------------------------------------ admin contract


async def test_admin_contract(database_url: str, tmp_path: Path) -> None:
    workspace = (await admin(database_url, "create-workspace", "--name", "acme")).json()
    workspace_id = workspace["workspaceId"]
    assert isinstance(workspace_id, str)
    assert set(workspace) == {"workspaceId"}

    async def member(*args: str) -> str:
        created = (
            await admin(database_url, "create-member", "--workspace", workspace_id, *args)
        ).json()
        assert set(created) == {"memberId", "channels"}
        member_id: str = created["memberId"]
        return member_id

    human = await member("--type", "human", "--handle", "alice", "--display-name", "Alice A.")
    agent = await member("--type", "agent", "--handle", "bot")
    private = await member(
        "--type", "agent", "--handle", "alice-helper", "--owner", human, "--private"
    )
    service = await member("--type", "service", "--handle", "ci")
    assert len({human, agent, private, service}) == 4

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT id, type, handle, display_name, owner_member_id, is_private"
            " FROM members WHERE workspace_id = %s",
            (workspace_id,),
        ).fetchall()
    members = {row[0]: row[1:] for row in rows}
    assert members[human] == ("human", "alice", "Alice A.", None, False)
    assert members[agent][:2] == ("agent", "bot")
    assert members[agent][3:] == (None, False)
    assert members[private][:2] == ("agent", "alice-helper")
    assert members[private][3:] == (human, True)
    assert members[service][0] == "service"

    tokens = {}
    for member_id in (human, private):
        issued = (await admin(database_url, "issue-token", "--member", member_id)).json()
        assert set(issued) == {"token"}
        tokens[member_id] = issued["token"]
    with psycopg.connect(database_url) as conn:
        stored = conn.execute("SELECT token_hash FROM credentials").fetchall()
    assert all(tokens[human].encode() not in bytes(row[0]) for row in stored)

    async with running_node(database_url, tmp_path) as node:
        url = f"{node.url}?workspace={workspace_id}"
        async with open_client(url, tokens[human]) as client:
            assert client.member_id == human
            assert client.welcome["workspaceId"] == workspace_id
            assert client.welcome["member"]["displayName"] == "Alice A."
        async with open_client(url, tokens[private], kind="daemon") as client:
            assert client.member_id == private
            assert client.welcome["member"]["type"] == "agent"

        revoked = (await admin(database_url, "revoke-token", "--token", tokens[human])).json()
        assert revoked == {"revoked": True}
        with pytest.raises(ConnectionClosed) as closed:
            async with open_client(url, tokens[human]):
                pass
        assert closed.value.code == 4401
        # The other token is untouched.
        async with open_client(url, tokens[private], kind="daemon") as client:
            assert client.member_id == private

    # Bad input: non-zero exit, a message on stderr, nothing on stdout.
    bad = [
        ("issue-token", "--member", "mem_nobody"),
        ("revoke-token", "--token", tokens[human]),
        ("revoke-token", "--token", "snt_never_issued"),
        ("create-member", "--workspace", workspace_id, "--type", "human", "--handle", "alice"),
        (
            "create-member",
            "--workspace",
            workspace_id,
            "--type",
            "agent",
            "--handle",
            "x",
            "--private",
        ),
        (
            "create-member",
            "--workspace",
            workspace_id,
            "--type",
            "agent",
            "--handle",
            "y",
            "--owner",
            "mem_nobody",
            "--private",
        ),
        (
            "create-member",
            "--workspace",
            workspace_id,
            "--type",
            "human",
            "--handle",
            "z",
            "--owner",
            human,
            "--private",
        ),
        ("create-member", "--workspace", workspace_id, "--type", "robot", "--handle", "r"),
        ("create-member", "--workspace", workspace_id, "--type", "human", "--handle", "Not Ok"),
        ("create-member", "--workspace", "wsp_nowhere", "--type", "human", "--handle", "w"),
        ("create-workspace",),
    ]
    results: dict[int, Result] = {}

    async def run_bad(index: int, args: tuple[str, ...]) -> None:
        results[index] = await admin(database_url, *args)

    async with trio.open_nursery() as nursery:
        for index, args in enumerate(bad):
            nursery.start_soon(run_bad, index, args)
    for index, args in enumerate(bad):
        assert_failed(results[index], args)

    # None of the failures created anything.
    with psycopg.connect(database_url) as conn:
        count = conn.execute("SELECT count(*) FROM members").fetchone()
    assert count == (4,)


async def batch(database_url: str, lines: list[Any]) -> tuple[int, list[dict[str, Any]]]:
    """``scopenode admin batch`` with ``lines`` on stdin (strings as they are,
    anything else as JSON): its exit code and its results."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    with trio.fail_after(CLI_TIMEOUT):
        done = await trio.run_process(
            [sys.executable, "-m", "node", "admin", "batch", "--database-url", database_url],
            stdin=text.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
            env=_env(),
        )
    assert done.stderr == b"", done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.decode().splitlines()]


async def test_admin_batch_answers_every_line_in_order(database_url: str) -> None:
    """One result per line, in order; a bad line gets its one-line error and the
    lines after it still run; exit 1 when any line failed, 0 when none did."""
    code, results = await batch(
        database_url,
        [
            ["create-workspace", "--name", "acme"],
            "not json",
            '{"create-workspace": "acme"}',
            ["create-member", "--workspace", "ws_missing", "--type", "human", "--handle", "ann"],
            ["create-member", "--workspace", "ws_missing"],
            ["batch"],
            ["create-workspace", "--help"],
            "",
            ["list-workspaces"],
        ],
    )
    assert code == 1
    assert len(results) == 8, results
    workspace_id = results[0]["workspaceId"]
    array = "scopenode admin batch: a line is a JSON array of strings"
    assert results[1:7] == [
        {"error": array},
        {"error": array},
        {"error": "scopenode: --workspace: no workspace ws_missing"},
        {
            "error": "scopenode admin create-member: the following arguments are "
            "required: --type, --handle"
        },
        {"error": "scopenode admin: batch cannot run inside a batch"},
        {"error": "scopenode admin create-workspace: --help is not an admin command"},
    ]
    assert [w["workspaceId"] for w in results[7]["workspaces"]] == [workspace_id]

    code, results = await batch(
        database_url,
        [
            ["create-member", "--workspace", workspace_id, "--type", "human", "--handle", h]
            for h in ("ann", "bob")
        ],
    )
    assert code == 0
    ann, bob = (r["memberId"] for r in results)
    code, results = await batch(database_url, [["issue-token", "--member", m] for m in (ann, bob)])
    assert code == 0
    assert [set(r) for r in results] == [{"token"}, {"token"}]
    listed = (await admin(database_url, "list-members", "--workspace", workspace_id)).json()
    assert sorted(m["handle"] for m in listed["members"]) == ["ann", "bob"]


# ------------------------------------------------------------ db verify


async def test_db_verify_detects_drift(database_url: str) -> None:
    verified = await scopenode("db", "verify", "--database-url", database_url)
    assert verified.json() == {"ok": True}

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE scopes ALTER COLUMN status TYPE varchar(20)")

    drifted = await scopenode("db", "verify", "--database-url", database_url)
    assert drifted.returncode == 1, drifted
    report = json.loads(drifted.stdout)
    assert report["ok"] is False
    drift = report["drift"]
    assert drift, report
    assert any("scopes" in item and "status" in item for item in drift), drift

    # An index of the same name over other keys, and one made unique, are drift too.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE scopes ALTER COLUMN status TYPE text")
        conn.execute("DROP INDEX scopes_workspace_idx")
        conn.execute("CREATE INDEX scopes_workspace_idx ON scopes (workspace_id)")
        conn.execute("DROP INDEX credentials_member_idx")
        conn.execute("CREATE UNIQUE INDEX credentials_member_idx ON credentials (member_id)")
    drifted = await scopenode("db", "verify", "--database-url", database_url)
    assert drifted.returncode == 1, drifted
    drift = json.loads(drifted.stdout)["drift"]
    assert sorted(item.split(":")[0] for item in drift) == ["missing"] * 2 + ["unexpected"] * 2
    assert any("scopes_workspace_idx" in item and "workspace_id, type" in item for item in drift)
    assert any("credentials_member_idx unique=True" in item for item in drift), drift
