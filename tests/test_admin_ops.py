"""The workspace admin ops over the protocol: what each does, and the typed
error of each bad request. Who may call them at all is the authorization
matrix's (tests/test_authorization_matrix.py); one node here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from node.client import Client
from storage import directory
from storage.pg import connect
from tests.nodes import World, running_node
from tests.test_invites import http_post


async def make_admin(world: World, handle: str) -> Any:
    person = await world.member(handle)
    async with await connect(world.node.database_url, autocommit=True) as conn:
        await directory.set_admin(conn, person.id, True)
    return person


async def refused(client: Client, op: str, **fields: Any) -> tuple[str, str | None]:
    """The error code and ``details.path`` of a request that must fail."""
    answer = await client.request_frame({"type": op, "id": f"x-{op}", **fields})
    assert answer["type"] == "error", answer
    return answer["code"], answer.get("details", {}).get("path")


async def test_admin_ops_do_what_they_say_and_refuse_bad_input(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node, "admin ops")
            ann = await make_admin(world, "ann")
            bob = await world.member("bob")
            eve = await world.member("eve")
            async with world.client(ann) as a:
                await _members_and_tokens(node, a, ann.id, bob.id)
                await _invites_and_channels(node, a)
                await _bad_input(a, ann.id)
                # A demoted admin is refused at its next request, same session.
                async with world.client(eve) as b:
                    assert b.welcome.get("admin") is False
                    await a.request("adminSetAdmin", memberId=eve.id, admin=True)
                    await b.request("adminMembers")
                    await a.request("adminSetAdmin", memberId=eve.id, admin=False)
                    assert await refused(b, "adminMembers") == ("forbidden", None)
                assert a.welcome["admin"] is True


async def _members_and_tokens(node: Any, a: Client, ann: str, bob: str) -> None:
    made = await a.request("adminCreateMember", handle="Cara", displayName="Cara C")
    assert made["channels"] == ["#general"]  # founded by the first member that joins
    agent = await a.request(
        "adminCreateMember", handle="helper", kind="agent", private=True, ownerMemberId=ann
    )
    listed = {m["handle"]: m for m in (await a.request("adminMembers"))["members"]}
    assert listed["ann"]["admin"]
    assert not listed["bob"]["admin"]
    assert listed["cara"] == {
        "id": made["memberId"],
        "handle": "cara",
        "displayName": "Cara C",
        "type": "human",
        "private": False,
        "ownerMemberId": None,
        "active": True,
        "admin": False,
    }
    assert listed["helper"]["private"]
    assert listed["helper"]["ownerMemberId"] == ann
    assert listed["helper"]["id"] == agent["memberId"]

    issued = await a.request("adminIssueToken", memberId=made["memberId"])
    status, _, who = await _whoami(node, issued["token"])
    assert status == 200
    assert who["handle"] == "cara"
    revoked = await a.request("adminRevokeTokens", memberId=made["memberId"])
    assert revoked["tokensRevoked"] == 1
    assert (await _whoami(node, issued["token"]))[0] == 401

    gone = await a.request("adminDeactivateMember", memberId=bob)
    assert gone["memberId"] == bob
    listed = {m["handle"]: m for m in (await a.request("adminMembers"))["members"]}
    assert not listed["bob"]["active"]
    assert await refused(a, "adminIssueToken", memberId=bob) == (
        "validation_failed",
        "$.memberId",
    )


async def _whoami(node: Any, token: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        async with stream:
            await stream.send_all(
                f"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Authorization: Bearer {token}\r\n\r\n".encode()
            )
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, {}, json.loads(body) if status == 200 else {}


async def _invites_and_channels(node: Any, a: Client) -> None:
    made = await a.request("adminCreateChannel", slug="lobby", name="Lobby", default=True)
    assert made["default"]
    assert made["slug"] == "#lobby"
    await a.request("adminCreateChannel", slug="ops", name="Ops", visibility="private")
    channels = {c["slug"]: c for c in (await a.request("adminChannels"))["channels"]}
    assert channels["lobby"]["default"]
    assert channels["ops"]["visibility"] == "private"

    invite = await a.request("adminCreateInvite", expiresInS=3600, maxUses=2, join=["ops"])
    assert invite["inviteUrl"].startswith(node.http + "/#invite=sni_")
    code = invite["inviteUrl"].split("=", 1)[1]
    listed = (await a.request("adminInvites"))["invites"]
    assert [i["id"] for i in listed] == [invite["inviteId"]]
    assert listed[0]["status"] == "usable"
    assert listed[0]["channels"] == ["#ops"]
    assert code not in repr(listed)  # the code is never shown again

    status, _, joined = await http_post(node, "/v1/invites/redeem", {"code": code, "handle": "dan"})
    assert status == 200
    assert sorted(joined["channels"]) == ["#general", "#lobby", "#ops"]
    dan = {m["handle"]: m for m in (await a.request("adminMembers"))["members"]}["dan"]
    # An invite makes a plain human, whatever the admin who made it is.
    assert dan["type"] == "human"
    assert not dan["admin"]
    assert not dan["private"]

    await a.request("adminRevokeInvite", inviteId=invite["inviteId"])
    status, _, body = await http_post(node, "/v1/invites/lookup", {"code": code})
    assert status == 410
    assert body["details"]["reason"] == "revoked"
    assert (await a.request("adminInvites"))["invites"][0]["status"] == "revoked"


async def _bad_input(a: Client, ann: str) -> None:
    cases: list[tuple[str, dict[str, Any], tuple[str, str | None]]] = [
        ("adminCreateMember", {"handle": "no spaces"}, ("validation_failed", "$.handle")),
        ("adminCreateMember", {"handle": "cara"}, ("validation_failed", "$.handle")),
        ("adminCreateMember", {"handle": "x", "private": True}, ("validation_failed", "$.private")),
        (
            "adminCreateMember",
            {"handle": "x", "kind": "agent", "private": True},
            ("validation_failed", "$.ownerMemberId"),
        ),
        (
            "adminCreateMember",
            {"handle": "x", "kind": "agent", "ownerMemberId": "mem_nobody"},
            ("not_found", "$.ownerMemberId"),
        ),
        ("adminCreateMember", {"handle": "x", "join": ["nowhere"]}, ("not_found", "$.join[0]")),
        ("adminCreateMember", {"handle": "x", "kind": "robot"}, ("validation_failed", "$.kind")),
        ("adminDeactivateMember", {"memberId": ann}, ("validation_failed", "$.memberId")),
        ("adminDeactivateMember", {"memberId": "mem_nobody"}, ("not_found", "$.memberId")),
        ("adminSetAdmin", {"memberId": ann, "admin": False}, ("validation_failed", "$.memberId")),
        ("adminSetAdmin", {"memberId": "mem_x"}, ("validation_failed", "$.admin")),
        ("adminIssueToken", {"memberId": "mem_nobody"}, ("not_found", "$.memberId")),
        ("adminCreateInvite", {"expiresInS": 5}, ("validation_failed", "$.expiresInS")),
        ("adminCreateInvite", {"maxUses": 0}, ("validation_failed", "$.maxUses")),
        ("adminCreateInvite", {"join": ["nowhere"]}, ("not_found", "$.join[0]")),
        ("adminRevokeInvite", {"inviteId": "inv_nobody"}, ("not_found", "$.inviteId")),
        (
            "adminCreateChannel",
            {"slug": "x", "name": "X", "visibility": "private", "default": True},
            ("validation_failed", "$.default"),
        ),
        ("adminCreateChannel", {"slug": "lobby", "name": "L"}, ("validation_failed", "$.slug")),
        ("adminCreateChannel", {"slug": "Bad Slug", "name": "B"}, ("validation_failed", "$.slug")),
        ("adminCreateChannel", {"slug": "y", "name": "\u202e"}, ("validation_failed", "$.name")),
    ]
    got = [(op, await refused(a, op, **fields)) for op, fields, _ in cases]
    assert got == [(op, want) for op, _, want in cases]
