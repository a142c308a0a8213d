"""Onboarding a team: default channels, the admin CLI's lists and errors, a
login that needs only the token (``GET /v1/whoami``), and a busy port.

Admin commands run as real subprocesses (``python -m node``) against the
per-test database; the node runs in-process and is reached over real sockets.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from actors.model import MemberType
from node.client import open_client
from storage import directory, schema, scopes
from storage.pg import connect
from tests.nodes import RunningNode, running_node
from tests.test_cli import REPO, Result, _env, admin, assert_failed, scopenode

LIVE_TIMEOUT = 10.0


async def http_request(port: int, path: str, headers: dict[str, str] | None = None) -> Any:
    """(status, JSON body) of a GET on the node's port."""
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def whoami(node: RunningNode, token: str) -> dict[str, Any]:
    status, body = await http_request(
        node.services.port, "/v1/whoami", {"Authorization": f"Bearer {token}"}
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def one_line_error(result: Result, argument: str) -> str:
    """The failure contract: exit 2, one line naming ``argument``, no database words."""
    assert_failed(result, argument)
    line = result.stderr.strip()
    assert argument in line, result
    for database_words in ("violates", "constraint", "psycopg", "DETAIL", "ERROR:"):
        assert database_words not in line, result
    return line


async def test_member_created_after_start_joins_general_and_reads_its_history(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        demo_token = (tmp_path / "demo-token").read_text().strip()
        demo = await whoami(node, demo_token)
        workspace = demo["workspaceId"]
        assert demo["handle"] == "demo"
        url = f"{node.url}?workspace={workspace}"

        async with open_client(url, demo_token) as alice:
            for text in ("welcome, team", "the plan is in #general"):
                assert (await alice.send("#general", text))["state"] == "sent"

            created = (
                await admin(
                    database_url, "create-member", "--workspace", workspace,
                    "--type", "human", "--handle", "ann", "--display-name", "Ann",
                )
            ).json()  # fmt: skip
            assert created["channels"] == ["#general"]
            token = await admin(database_url, "issue-token", "--member", created["memberId"])
            ann_token = token.json()["token"]

            # Only the token: the node says which workspace it belongs to.
            ann_who = await whoami(node, ann_token)
            assert ann_who["workspaceId"] == workspace
            assert ann_who["memberId"] == created["memberId"]
            ann_url = f"{node.url}?workspace={ann_who['workspaceId']}"
            async with open_client(ann_url, ann_token) as ann:
                listed = (await ann.request("scopes"))["scopes"]
                assert [s["slug"] for s in listed] == ["general"]
                page = await ann.history("#general")
                assert [m["content"] for m in page["messages"]] == [
                    "welcome, team",
                    "the plan is in #general",
                ]
                # Live both ways: the node's #general actor learns the new roster.
                await ann.send("#general", "hi, I am new")
                events = await alice.events_until(
                    lambda e: (
                        e.get("type") == "message" and e["message"]["content"] == "hi, I am new"
                    ),
                    LIVE_TIMEOUT,
                )
                assert events[-1]["message"]["author"]["memberId"] == created["memberId"]
                await alice.send("#general", "welcome, Ann")
                await ann.events_until(
                    lambda e: (
                        e.get("type") == "message" and e["message"]["content"] == "welcome, Ann"
                    ),
                    LIVE_TIMEOUT,
                )


async def test_defaults_join_and_lists(database_url: str, tmp_path: Path) -> None:
    workspace = (await admin(database_url, "create-workspace", "--name", "acme")).json()[
        "workspaceId"
    ]

    async def create(*args: str) -> dict[str, Any]:
        result = await admin(database_url, "create-member", "--workspace", workspace, *args)
        created: dict[str, Any] = result.json()
        return created

    # A workspace's first human or public agent founds #general, its default.
    lead = await create("--type", "human", "--handle", "lead")
    assert lead["channels"] == ["#general"]
    lead_token = (await admin(database_url, "issue-token", "--member", lead["memberId"])).json()
    async with running_node(database_url, tmp_path) as node:
        url = f"{node.url}?workspace={workspace}"
        async with open_client(url, lead_token["token"]) as client:
            await client.request("createChannel", slug="ops", name="Ops")
            await client.request(
                "createChannel", slug="secret", name="Secret", visibility="private"
            )

    helper = await create("--type", "agent", "--handle", "helper", "--join", "#ops")
    assert helper["channels"] == ["#general", "#ops"]
    both = await create(
        "--type", "human", "--handle", "bea", "--join", "#ops", "secret", "--join", "#general"
    )
    assert both["channels"] == ["#general", "#ops", "#secret"]
    private = await create(
        "--type", "agent", "--handle", "lead-bot", "--owner", lead["memberId"], "--private"
    )
    assert private["channels"] == []
    service = await create("--type", "service", "--handle", "ci")
    assert service["channels"] == []

    workspaces = (await admin(database_url, "list-workspaces")).json()["workspaces"]
    assert [(w["workspaceId"], w["name"], w["memberCount"]) for w in workspaces] == [
        (workspace, "acme", 5)
    ]

    members = (await admin(database_url, "list-members", "--workspace", workspace)).json()
    assert members["workspaceId"] == workspace
    by_handle = {m["handle"]: m for m in members["members"]}
    assert list(by_handle) == ["lead", "helper", "bea", "lead-bot", "ci"]
    assert by_handle["lead-bot"]["private"] is True
    assert by_handle["lead-bot"]["ownerMemberId"] == lead["memberId"]
    assert {m["type"] for m in members["members"]} == {"human", "agent", "service"}
    assert all(m["status"] == "active" for m in members["members"])

    channels = (await admin(database_url, "list-channels", "--workspace", workspace)).json()
    summary = {
        c["slug"]: (c["visibility"], c["default"], c["memberCount"]) for c in channels["channels"]
    }
    assert summary == {
        "general": ("public", True, 3),
        "ops": ("public", False, 3),
        "secret": ("private", False, 2),
    }

    # The private agent is in no channel; the public members are in #general.
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT m.handle, count(sm.id) FROM members m"
            " LEFT JOIN scope_memberships sm ON sm.member_id = m.id"
            " AND sm.effective_to_seq IS NULL WHERE m.workspace_id = %s GROUP BY m.handle",
            (workspace,),
        ).fetchall()
    assert dict(rows) == {"lead": 3, "helper": 2, "bea": 3, "lead-bot": 0, "ci": 0}


async def test_admin_errors_are_one_line_naming_the_argument(database_url: str) -> None:
    workspace = (await admin(database_url, "create-workspace", "--name", "acme")).json()[
        "workspaceId"
    ]
    lead = (
        await admin(
            database_url, "create-member", "--workspace", workspace,
            "--type", "human", "--handle", "lead",
        )
    ).json()  # fmt: skip

    def member(*args: str) -> tuple[str, ...]:
        return ("create-member", "--workspace", workspace, *args)

    cases: list[tuple[tuple[str, ...], str, str]] = [
        (
            ("create-member", "--workspace", "demo", "--type", "human", "--handle", "w"),
            "--workspace",
            "no workspace demo",
        ),
        (member("--type", "human", "--handle", "Not Ok"), "--handle", "must match"),
        (member("--type", "human", "--handle=-dash"), "--handle", "[a-z0-9][a-z0-9_.-]{0,63}"),
        (member("--type", "human", "--handle", "lead"), "--handle", "taken"),
        (member("--type", "robot", "--handle", "r"), "--type", "invalid choice"),
        (member("--type", "human"), "--handle", "required"),
        (member("--type", "agent", "--handle", "x", "--private"), "--private", "--owner"),
        (
            member("--type", "agent", "--handle", "y", "--owner", "mem_nobody", "--private"),
            "--owner",
            "no member mem_nobody",
        ),
        (member("--type", "human", "--handle", "z", "--join", "#nowhere"), "--join", "#nowhere"),
        (member("--type", "human", "--handle", "z", "--join", "#Bad Slug"), "--join", "not a"),
        (
            member(
                "--type",
                "agent",
                "--handle",
                "p",
                "--owner",
                lead["memberId"],
                "--private",
                "--join",
                "#general",
            ),
            "--join",
            "owner",
        ),
        (("list-members", "--workspace", "ws_missing"), "--workspace", "no workspace"),
        (("list-channels", "--workspace", "ws_missing"), "--workspace", "no workspace"),
        (("issue-token", "--member", "mem_nobody"), "--member", "no member"),
        (("revoke-token", "--token", "snt_never"), "--token", "no such"),
        (("create-workspace", "--name", ""), "--name", "characters"),
        (("create-workspace",), "--name", "required"),
    ]
    results: dict[int, Result] = {}

    async def run(index: int, args: tuple[str, ...]) -> None:
        results[index] = await admin(database_url, *args)

    async with trio.open_nursery() as nursery:
        for index, (args, _, _) in enumerate(cases):
            nursery.start_soon(run, index, args)
    for index, (args, argument, words) in enumerate(cases):
        line = one_line_error(results[index], argument)
        assert words in line, (args, line)

    # An unreachable database is named as the argument too, with no driver text.
    unreachable = await scopenode(
        "admin", "list-workspaces", "--database-url", "postgresql://nobody@127.0.0.1:1/none"
    )
    one_line_error(unreachable, "--database-url")

    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM members").fetchone() == (1,)


async def test_serve_on_a_busy_port_says_so_and_creates_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with trio.fail_after(60):
            done = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "node",
                    "serve",
                    "--port",
                    str(port),
                    "--data-dir",
                    data_dir,
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=REPO,
                env=_env(),
            )
    assert done.returncode == 2, done
    assert done.stdout == b""
    assert done.stderr.decode().splitlines() == [f"scopenode: port {port} is in use; pass --port"]
    assert not data_dir.exists()


async def test_whoami_answers_only_a_valid_bearer_token(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        port = node.services.port
        token = (tmp_path / "demo-token").read_text().strip()
        me = await whoami(node, token)
        assert set(me) >= {"workspaceId", "memberId"}
        assert me["workspaceId"].startswith("ws_")
        assert me["memberId"].startswith("mem_")

        for headers in (
            {},
            {"Authorization": "Bearer snt_not_a_token"},
            {"Authorization": f"Basic {token}"},
            {"Authorization": "Bearer "},
        ):
            status, body = await http_request(port, "/v1/whoami", headers)
            assert status == 401, (headers, body)
            assert body["error"] == "unauthorized"

        revoked = await admin(database_url, "revoke-token", "--token", token)
        assert revoked.json() == {"revoked": True}
        status, _ = await http_request(port, "/v1/whoami", {"Authorization": f"Bearer {token}"})
        assert status == 401


async def test_a_database_from_before_default_channels_is_migrated(
    empty_database_url: str,
) -> None:
    """Migration 2 on a database made by migration 1: #general becomes the default."""
    first, second = schema.migrations()[:2]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(first.sql.encode())
        conn.execute(schema.CREATE_BOOKKEEPING)
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            (first.version, first.name, first.checksum),
        )
        conn.execute("INSERT INTO workspaces (id, name) VALUES ('ws_old', 'old')")
        conn.execute(
            "INSERT INTO members (id, workspace_id, type, handle, display_name)"
            " VALUES ('mem_old', 'ws_old', 'human', 'old', 'Old')"
        )
        for scope_id, slug, visibility in (
            ("scp_general", "general", "public"),
            ("scp_other", "other", "public"),
        ):
            conn.execute(
                "INSERT INTO scopes (id, workspace_id, type) VALUES (%s, 'ws_old', 'channel')",
                (scope_id,),
            )
            conn.execute(
                "INSERT INTO scope_channel_profiles (scope_id, workspace_id, slug,"
                " display_name, visibility, owner_member_id)"
                " VALUES (%s, 'ws_old', %s, %s, %s, 'mem_old')",
                (scope_id, slug, slug, visibility),
            )
    with psycopg.connect(empty_database_url) as conn:
        applied = schema.migrate(conn)
        assert applied[0] == second.version  # and every later migration after it
        assert applied == [m.version for m in schema.migrations()[1:]]
        assert schema.verify(conn) == []
        defaults = conn.execute(
            "SELECT slug FROM scope_channel_profiles WHERE is_default"
        ).fetchall()
    assert defaults == [("general",)]

    created = await admin(
        empty_database_url, "create-member", "--workspace", "ws_old",
        "--type", "human", "--handle", "new",
    )  # fmt: skip
    assert created.json()["channels"] == ["#general"]


async def test_concurrent_first_members_share_one_general(database_url: str) -> None:
    """Members created at once in a new workspace (as the bench provisions)
    found one #general between them and all join it."""
    workspace = (await admin(database_url, "create-workspace", "--name", "rush")).json()[
        "workspaceId"
    ]
    results: dict[str, Result] = {}

    async def create(handle: str) -> None:
        results[handle] = await admin(
            database_url, "create-member", "--workspace", workspace,
            "--type", "agent", "--handle", handle,
        )  # fmt: skip

    async with trio.open_nursery() as nursery:
        for index in range(4):
            nursery.start_soon(create, f"a{index}")
    assert all(result.json()["channels"] == ["#general"] for result in results.values())
    channels = (await admin(database_url, "list-channels", "--workspace", workspace)).json()
    assert [(c["slug"], c["default"], c["memberCount"]) for c in channels["channels"]] == [
        ("general", True, 4)
    ]


async def test_a_general_founded_between_two_reads_is_joined(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the concurrent test hits by chance, forced: a first member's
    #general commits after the second member found no default but before it
    looks the slug up. The second member joins that #general."""
    async with (
        await connect(database_url) as first_conn,  # one open transaction until commit()
        await connect(database_url, autocommit=True) as second_conn,
    ):
        workspace = await directory.create_workspace(second_conn, "race")
        first = await directory.create_member(
            first_conn, workspace_id=workspace, type_=MemberType.HUMAN, handle="first"
        )
        assert len(await scopes.join_on_creation(first_conn, first)) == 1
        default_channels = scopes._default_channels
        reads = 0

        async def commit_the_first_after_one_read(conn: Any, workspace_id: str) -> list[str]:
            nonlocal reads
            found = await default_channels(conn, workspace_id)
            reads += 1
            if reads == 1:
                await first_conn.commit()
            return found

        monkeypatch.setattr(scopes, "_default_channels", commit_the_first_after_one_read)
        async with second_conn.transaction():
            second = await directory.create_member(
                second_conn, workspace_id=workspace, type_=MemberType.HUMAN, handle="second"
            )
            joined = await scopes.join_on_creation(second_conn, second)
        general = await scopes.channel_by_slug(second_conn, workspace, "general")
    assert reads == 2
    assert joined == [general]
