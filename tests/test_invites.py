"""Workspace roles and invite links: storage, the admin commands, the HTTP endpoints.

The storage test needs only a database; the command and endpoint tests each
run one node against it (the commands as real subprocesses, several at once
where they do not depend on each other).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from actors.model import MemberType
from node.app import login_link, web_origin
from node.cli import build_parser
from node.client import ConnectionClosed, open_client
from node.limits import AddressLimiter, Rate
from storage import directory, invites, scopes
from storage.errors import UniqueViolation
from storage.pg import connect
from tests.nodes import RunningNode, World, running_node
from tests.test_cli import Result, admin, assert_failed

CLOSE_WITHIN = 1.0


async def http_post(
    node: RunningNode, path: str, body: bytes | dict[str, Any], method: str = "POST"
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One request on its own connection: (status, headers, JSON body or {})."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        async with stream:
            await stream.send_all(
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, raw = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    answer = json.loads(raw) if headers.get("content-type") == "application/json" else {}
    return int(status_line.split(" ", 2)[1]), headers, answer


def member_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM members").fetchone()
    assert row is not None
    return int(row[0])


def member_row(database_url: str, member_id: str) -> tuple[Any, ...]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT type, is_admin, is_private, owner_member_id, status FROM members WHERE id = %s",
            (member_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


# ------------------------------------------------------------ storage


async def test_invites_in_storage(database_url: str) -> None:
    async with await connect(database_url, autocommit=True) as conn:
        workspace_id = await directory.create_workspace(conn, "acme")
        lead = await directory.create_member(
            conn, workspace_id=workspace_id, type_=MemberType.HUMAN, handle="lead", admin=True
        )
        general = await scopes.create_general(conn, lead)
        ops = await scopes.create_channel(
            conn, creator=lead, slug="ops", name="Ops", visibility="private", description=""
        )
        invite = await invites.create_invite(
            conn, workspace_id, expires_in_s=3600, max_uses=2, join_scope_ids=[ops]
        )
        assert invite.id.startswith("inv_")
        with psycopg.connect(database_url) as raw:
            stored = raw.execute("SELECT code_hash FROM workspace_invites").fetchone()
        assert stored is not None
        assert invite.code.encode() not in bytes(stored[0])

        state = await invites.lookup(conn, invite.code)
        assert state is not None
        assert (state.workspace_id, state.workspace_name) == (workspace_id, "acme")
        assert state.status is invites.InviteStatus.USABLE

        first = await invites.redeem(conn, invite.code, handle="ann", display_name="Ann A.")
        assert first.joined == [general, ops]
        assert await invites.channel_slugs(conn, first.joined) == ["#general", "#ops"]
        assert first.member.type is MemberType.HUMAN
        assert not first.member.is_private
        assert first.member.owner_member_id is None
        assert member_row(database_url, first.member.id)[:3] == ("human", False, False)
        assert await directory.authenticate(conn, first.token) == first.member

        # A taken handle claims nothing: the invite still has its second use.
        with pytest.raises(UniqueViolation):
            await invites.redeem(conn, invite.code, handle="lead", display_name=None)
        second = await invites.redeem(conn, invite.code, handle="bob", display_name=None)
        assert second.member.display_name == "bob"
        before = member_count(database_url)
        with pytest.raises(invites.InviteUnusable) as used_up:
            await invites.redeem(conn, invite.code, handle="cy", display_name=None)
        assert used_up.value.status is invites.InviteStatus.USED_UP

        expired = await invites.create_invite(conn, workspace_id, expires_in_s=0, max_uses=None)
        revoked = await invites.create_invite(conn, workspace_id, expires_in_s=60, max_uses=None)
        assert await invites.revoke_invite(conn, revoked.id)
        assert await invites.revoke_invite(conn, revoked.id)  # again: still revoked
        assert not await invites.revoke_invite(conn, "inv_nothing")
        for code, status in (
            (expired.code, invites.InviteStatus.EXPIRED),
            (revoked.code, invites.InviteStatus.REVOKED),
            ("sni_never_issued", None),
        ):
            with pytest.raises(invites.InviteUnusable) as refused:
                await invites.redeem(conn, code, handle="dee", display_name=None)
            assert refused.value.status is status
        assert member_count(database_url) == before

        # With no node ever started here, admin commands fall back to the default address.
        assert await invites.web_origin(conn) is None
        await invites.record_web_origin(conn, "http://10.0.0.1:9000", "node-a")
        await invites.record_web_origin(conn, "https://chat.example.com", "node-b")
        assert await invites.web_origin(conn) == "https://chat.example.com"
        await invites.record_web_origin(conn, "http://10.0.0.1:9000", "node-a")
        assert await invites.web_origin(conn) == "http://10.0.0.1:9000"

        # Roles: only a human is an admin.
        agent = await directory.create_member(
            conn, workspace_id=workspace_id, type_=MemberType.AGENT, handle="bot"
        )
        assert await directory.set_admin(conn, second.member.id, True)
        assert not await directory.set_admin(conn, agent.id, True)
        listed = {
            m.handle: admin for m, _, admin in await directory.list_members(conn, workspace_id)
        }
        assert listed == {"lead": True, "ann": False, "bob": True, "bot": False}


def test_web_origin_and_public_url() -> None:
    assert web_origin("0.0.0.0", 8765) == "http://127.0.0.1:8765"
    assert web_origin("::1", 80) == "http://[::1]:80"
    assert web_origin("0.0.0.0", 8765, "https://chat.example.com/") == "https://chat.example.com"
    assert login_link("127.0.0.1", 1, "T", "https://c.example") == "https://c.example/#token=T"
    parser = build_parser()
    served = parser.parse_args(["serve", "--public-url", "https://chat.example.com/team/"])
    assert served.public_url == "https://chat.example.com/team"
    for bad in ("ftp://x", "chat.example.com", "https://x/?a=1", "https://x/#f"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--public-url", bad])


# ------------------------------------------------------------ admin commands


async def test_admin_commands_for_roles_channels_invites_and_deactivation(
    database_url: str, tmp_path: Path
) -> None:
    public = "https://chat.example.com/team"
    results: dict[str, Result] = {}

    async def run(name: str, *args: str) -> None:
        results[name] = await admin(database_url, *args)

    async with running_node(database_url, tmp_path, public_url=public) as node:
        async with await connect(database_url, autocommit=True) as conn:
            demo = await directory.first_human(conn)
            workspace_id = await directory.create_workspace(conn, "acme")
        assert demo is not None
        ws = ("--workspace", workspace_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "demo", "list-members", "--workspace", demo.workspace_id)
            # No human yet: nobody could own a channel.
            nursery.start_soon(run, "ownerless", "create-channel", *ws, "--slug", "ops")
        # The demo user the first start creates runs its workspace.
        listed = results["demo"].json()["members"]
        assert [(m["handle"], m["admin"]) for m in listed] == [("demo", True)]
        assert_failed(results["ownerless"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                run, "lead", "create-member", *ws, "--type", "human", "--handle", "lead"
            )
            nursery.start_soon(
                run, "bot", "create-member", *ws, "--type", "agent", "--handle", "bot"
            )
        lead = results["lead"].json()["memberId"]
        bot = results["bot"].json()["memberId"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "ops", "create-channel", *ws, "--slug", "#ops")
            nursery.start_soon(
                run, "news", "create-channel", *ws, "--slug", "news", "--name", "News", "--default"
            )
            nursery.start_soon(run, "vault", "create-channel", *ws, "--slug", "vault", "--private")
            nursery.start_soon(
                run, "both", "create-channel", *ws, "--slug", "x", "--private", "--default"
            )
            nursery.start_soon(run, "badslug", "create-channel", *ws, "--slug", "Not Ok")
            nursery.start_soon(run, "promote", "promote", "--member", lead)
            nursery.start_soon(run, "agent-admin", "promote", "--member", bot)
            nursery.start_soon(run, "nobody", "promote", "--member", "mem_nobody")
        ops = results["ops"].json()
        assert ops["scopeId"].startswith("scp_")
        assert (ops["slug"], ops["visibility"], ops["default"]) == ("#ops", "public", False)
        assert ops["ownerMemberId"] == lead
        assert results["vault"].json()["visibility"] == "private"
        assert results["news"].json()["default"] is True
        assert results["promote"].json() == {"memberId": lead, "admin": True}
        for name in ("both", "badslug", "agent-admin", "nobody"):
            assert_failed(results[name], name)

        # The README's example works once #ops exists; a new member joins the defaults.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                run, "helper", "create-member", *ws, "--type", "agent", "--handle", "helper",
                "--join", "#ops",
            )  # fmt: skip
            nursery.start_soon(run, "duplicate", "create-channel", *ws, "--slug", "ops")
            nursery.start_soon(
                run, "invite", "create-invite", *ws, "--expires", "15m", "--uses", "3",
                "--join", "#ops", "#vault",
            )  # fmt: skip
            nursery.start_soon(run, "demote", "demote", "--member", lead)
            nursery.start_soon(run, "badexpiry", "create-invite", *ws, "--expires", "7x")
            nursery.start_soon(run, "toolong", "create-invite", *ws, "--expires", "400d")
            nursery.start_soon(run, "nouses", "create-invite", *ws, "--uses", "0")
            nursery.start_soon(run, "nochannel", "create-invite", *ws, "--join", "#nowhere")
            nursery.start_soon(run, "noworkspace", "create-invite", "--workspace", "ws_nowhere")
            nursery.start_soon(run, "norevoke", "revoke-invite", "--invite", "inv_nothing")
        assert results["helper"].json()["channels"] == ["#general", "#news", "#ops"]
        assert_failed(results["duplicate"])
        assert results["demote"].json() == {"memberId": lead, "admin": False}
        for name in ("badexpiry", "toolong", "nouses", "nochannel", "noworkspace", "norevoke"):
            assert_failed(results[name], name)
        invite = results["invite"].json()
        assert invite["inviteId"].startswith("inv_")
        assert invite["channels"] == ["#ops", "#vault"]
        assert invite["maxUses"] == 3
        # Built from serve --public-url: the link opens the web client there.
        prefix = public + "/#invite="
        assert invite["inviteUrl"].startswith(prefix)
        code = invite["inviteUrl"].removeprefix(prefix)

        status, _, joined = await http_post(
            node, "/v1/invites/redeem", {"code": code, "handle": "Dee", "displayName": "Dee D."}
        )
        assert status == 200, joined
        assert joined["workspace"] == workspace_id
        assert joined["channels"] == ["#general", "#news", "#ops", "#vault"]
        assert member_row(database_url, joined["memberId"]) == (
            "human",
            False,
            False,
            None,
            "active",
        )

        # Deactivation: every token revoked, live sessions closed, no new hello.
        url = f"{node.url}?workspace={workspace_id}"
        async with await connect(database_url, autocommit=True) as conn:
            second_token = await directory.issue_token(conn, joined["memberId"])
        async with open_client(url, joined["token"]) as one, open_client(url, second_token) as two:
            assert one.member_id == joined["memberId"]
            deactivated = await admin(
                database_url, "deactivate-member", "--member", joined["memberId"]
            )
            assert deactivated.json() == {
                "memberId": joined["memberId"],
                "deactivated": True,
                "tokensRevoked": 2,
            }
            assert await one.wait_closed(CLOSE_WITHIN) == 4401
            assert await two.wait_closed(CLOSE_WITHIN) == 4401
        with pytest.raises(ConnectionClosed) as refused:
            async with open_client(url, joined["token"]):
                pass
        assert refused.value.code == 4401
        assert member_row(database_url, joined["memberId"])[4] == "deactivated"
        async with await connect(database_url, autocommit=True) as conn:
            assert await directory.authenticate(conn, second_token) is None

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "revoke", "revoke-invite", "--invite", invite["inviteId"])
            nursery.start_soon(run, "ghost", "deactivate-member", "--member", "mem_nobody")
        assert results["revoke"].json() == {"inviteId": invite["inviteId"], "revoked": True}
        assert_failed(results["ghost"])
        status, _, gone = await http_post(
            node, "/v1/invites/redeem", {"code": code, "handle": "eve"}
        )
        assert (status, gone["code"], gone["details"]) == (410, "gone", {"reason": "revoked"})


# ------------------------------------------------------------ the HTTP endpoints


async def test_redeem_endpoint_answers_and_every_refusal(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node, "Acme Rockets")
        lead = await world.member("lead")
        async with await connect(database_url, autocommit=True) as conn:
            await scopes.create_general(conn, lead.member)
            usable = await invites.create_invite(
                conn, world.workspace_id, expires_in_s=3600, max_uses=1
            )
            expired = await invites.create_invite(
                conn, world.workspace_id, expires_in_s=0, max_uses=None
            )
            revoked = await invites.create_invite(
                conn, world.workspace_id, expires_in_s=3600, max_uses=None
            )
            await invites.revoke_invite(conn, revoked.id)
            spare = await invites.create_invite(
                conn, world.workspace_id, expires_in_s=3600, max_uses=None
            )

        status, headers, found = await http_post(node, "/v1/invites/lookup", {"code": usable.code})
        assert status == 200, found
        assert found["workspace"] == world.workspace_id
        assert found["workspaceName"] == "Acme Rockets"
        assert headers["cache-control"] == "no-store"
        assert headers["x-content-type-options"] == "nosniff"

        before = member_count(database_url)
        ok = {"code": usable.code, "handle": "newbie", "displayName": "New B."}
        refusals: list[tuple[str, bytes | dict[str, Any], int, str, str | None]] = [
            ("redeem", b"not json", 400, "bad_frame", None),
            ("redeem", b"", 400, "bad_frame", None),
            ("redeem", {"handle": "x"}, 400, "validation_failed", "$"),
            ("redeem", {**ok, "handle": 7}, 400, "validation_failed", "$.handle"),
            ("redeem", {**ok, "handle": "no spaces"}, 400, "validation_failed", "$.handle"),
            ("redeem", {**ok, "handle": "-dash"}, 400, "validation_failed", "$.handle"),
            (
                "redeem",
                {**ok, "displayName": "a\u202eb"},
                400,
                "validation_failed",
                "$.displayName",
            ),
            ("redeem", {**ok, "displayName": "x" * 300}, 400, "validation_failed", "$.displayName"),
            # What an invite makes is fixed: no field asks for more.
            ("redeem", {**ok, "admin": True}, 400, "validation_failed", None),
            ("redeem", {**ok, "type": "agent"}, 400, "validation_failed", None),
            ("redeem", {**ok, "private": True}, 400, "validation_failed", None),
            ("redeem", {**ok, "handle": "lead"}, 409, "conflict", "$.handle"),
            ("redeem", {**ok, "code": "sni_never_issued"}, 404, "not_found", None),
            ("redeem", {**ok, "code": "bad\u0000code"}, 404, "not_found", None),
            ("redeem", {**ok, "code": expired.code}, 410, "gone", None),
            ("redeem", {**ok, "code": revoked.code}, 410, "gone", None),
            ("redeem", b"{" + b" " * 9000 + b"}", 413, "payload_too_large", None),
            ("lookup", {"code": "sni_never_issued"}, 404, "not_found", None),
            ("lookup", {"code": expired.code}, 410, "gone", None),
            ("lookup", {"code": revoked.code}, 410, "gone", None),
            ("lookup", {}, 400, "validation_failed", "$"),
        ]
        for where, body, want_status, want_code, want_path in refusals:
            status, _, error = await http_post(node, f"/v1/invites/{where}", body)
            what = (where, body if isinstance(body, dict) else body[:20])
            assert (status, error.get("code")) == (want_status, want_code), (what, error)
            assert error["message"], what
            if want_path is not None:
                assert error["details"]["path"] == want_path, (what, error)
        status, _, error = await http_post(node, "/v1/invites/redeem", {**ok, "code": expired.code})
        assert error["details"] == {"reason": "expired"}
        status, _, error = await http_post(node, "/v1/invites/redeem", b"", method="GET")
        assert status == 405
        assert member_count(database_url) == before

        # The one use, then nothing more.
        status, _, joined = await http_post(node, "/v1/invites/redeem", ok)
        assert status == 200, joined
        assert set(joined) == {
            "token",
            "workspace",
            "memberId",
            "handle",
            "displayName",
            "channels",
        }
        assert (joined["handle"], joined["displayName"]) == ("newbie", "New B.")
        assert joined["channels"] == ["#general"]
        assert member_row(database_url, joined["memberId"]) == (
            "human",
            False,
            False,
            None,
            "active",
        )
        url = f"{node.url}?workspace={world.workspace_id}"
        async with open_client(url, joined["token"]) as client:
            page = await client.history("#general")
            assert page["messages"] == []
        status, _, error = await http_post(node, "/v1/invites/redeem", {**ok, "handle": "again"})
        assert (status, error["code"], error["details"]) == (410, "gone", {"reason": "used_up"})
        status, _, error = await http_post(node, "/v1/invites/lookup", {"code": usable.code})
        assert (status, error["details"]) == (410, {"reason": "used_up"})

        # Per client address: a small bucket, then 429 with when to come back.
        node.services.invite_limiter = AddressLimiter(Rate(0.5, 2))
        for _ in range(2):
            status, _, _ = await http_post(node, "/v1/invites/lookup", {"code": spare.code})
            assert status == 200
        before = member_count(database_url)
        status, headers, error = await http_post(
            node, "/v1/invites/redeem", {"code": spare.code, "handle": "flood"}
        )
        assert (status, error["code"]) == (429, "rate_limited"), error
        assert error["details"]["bucket"] == "invite"
        assert error["details"]["per"] == "address"
        assert 0 < error["details"]["retryAfterMs"] <= 2000
        assert int(headers["retry-after"]) >= 1
        assert member_count(database_url) == before
