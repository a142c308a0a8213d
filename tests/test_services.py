"""Service accounts over the admin commands and the protocol (docs/services.md):
the audience is every active human, kept on a human's creation and
deactivation; managers post as the service; nobody else does. Who may call
``servicePost`` at all is also the authorization matrix's; one node here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import MemberType
from node import admin_commands
from node.cli import build_parser
from node.client import Client, ConnectionClosed
from tests.nodes import Person, World, running_node

HOOK_POSTS = 9  # webhook requests with the service's token in _webhooks, before the 429


async def admin(database_url: str, *argv: str) -> dict[str, Any]:
    """``scopenode admin ARGV`` in this process (the CLI's contract is test_cli's)."""
    args = build_parser().parse_args(["admin", *argv, "--database-url", database_url])
    return await admin_commands.execute(args)


async def make_service(
    world: World, handle: str, *managers: Person, display_name: str | None = None
) -> dict[str, Any]:
    argv = ["create-service", "--workspace", world.workspace_id, "--handle", handle]
    if display_name:
        argv += ["--display-name", display_name]
    for manager in managers:
        argv += ["--manager", manager.id]
    return await admin(world.node.database_url, *argv)


async def refused(client: Client, op: str, **fields: Any) -> str:
    answer = await client.request_frame({"type": op, "id": f"x-{op}", **fields})
    assert answer["type"] == "error", answer
    return str(answer["code"])


async def post_hook(
    node: Any, handle: str, body: bytes | dict[str, Any], token: str | None, **headers: str
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/services/<handle>/messages`` as curl would: (status, JSON body)."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    extra = "".join(f"{name.replace('_', '-')}: {value}\r\n" for name, value in headers.items())
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        async with stream:
            await stream.send_all(
                f"POST /v1/services/{handle}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Connection: close\r\nContent-Type: application/json\r\n{extra}"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, raw = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(raw)


async def scope_ids(client: Client) -> set[str]:
    return {s["id"] for s in (await client.request("scopes"))["scopes"]}


async def test_service_audience_managers_and_posts(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(30):
        words = tmp_path / "moderation.txt"
        words.write_text("forbidden phrase\n")
        # A service's send bucket holds the webhook posts below and no more.
        limits = {"send_rate": 0.001, "send_burst": HOOK_POSTS}
        async with running_node(database_url, tmp_path, moderation_file=words, **limits) as node:
            world = await World.create(node, "services")
            ann, bob, cid = await world.members("ann", "bob", "cid")
            bot = await world.member("bot", MemberType.AGENT)
            made = await make_service(world, "deploys", ann, cid, display_name="Deploys")
            assert made["handle"] == "deploys"
            scope = made["scopeId"]
            await make_service(world, "alerts")
            token = (await admin(node.database_url, "issue-service-token", "--service", "deploys"))[
                "token"
            ]
            async with (
                world.client(ann) as a,
                world.client(bob) as b,
                world.client(cid) as c,
                world.client(bot) as g,
                world.client(Person(bot.member, token)) as svc,
            ):
                assert scope in await scope_ids(a)
                assert scope in await scope_ids(b)
                assert scope not in await scope_ids(g)  # agents are never in the audience
                assert svc.welcome["member"]["type"] == "service"
                posted = await a.request(
                    "servicePost",
                    service="deploys",
                    content="Deploy **ok**",
                    clientMessageId="d-1",
                    explain=True,
                )
                assert posted["state"] == "sent"
                assert posted["explain"]["authorisedBy"] == ann.id
                events = await b.events_until(lambda e: e.get("type") == "message", 5)
                event = events[-1]
                assert event["message"]["author"]["handle"] == "deploys"
                assert event["message"]["author"]["type"] == "service"
                # Who posted it is for the service and its managers, not for readers.
                assert "authorisedBy" not in event["message"]["metadata"]
                assert "managers" not in event["message"]["metadata"]
                for manager in (a, c):
                    seen = await manager.events_until(lambda e: e.get("type") == "message", 5)
                    assert seen[-1]["message"]["metadata"]["authorisedBy"] == ann.id
                for client, shown in ((a, True), (b, False), (c, True), (svc, True)):
                    page = await client.history(f"scope:{scope}")
                    metadata = page["messages"][-1]["metadata"]
                    assert ("authorisedBy" in metadata) is shown
                    assert ("managers" in metadata) is shown
                again = await a.request(
                    "servicePost",
                    service="deploys",
                    content="Deploy **ok**",
                    clientMessageId="d-1",
                )
                assert again["state"] == "already_sent"
                assert again["messageId"] == posted["messageId"]
                # A manager's post passes the keyword list as a human's send does.
                blocked = {"service": "deploys", "content": "a forbidden phrase"}
                assert await refused(a, "servicePost", **blocked, clientMessageId="m-1") == (
                    "moderation_blocked"
                )
                # Nobody but a manager, and no agent or service, posts as it.
                post = {"service": "deploys", "content": "x", "clientMessageId": "x-1"}
                assert await refused(b, "servicePost", **post) == "forbidden"
                assert await refused(g, "servicePost", **post) == "forbidden"
                assert await refused(svc, "servicePost", **post) == "forbidden"
                assert await refused(a, "servicePost", **{**post, "service": "alerts"}) == (
                    "forbidden"
                )
                assert await refused(a, "servicePost", **{**post, "service": "nope"}) == (
                    "not_found"
                )
                # Its conversation is the service's alone, and nobody leaves it.
                send = {"target": f"scope:{scope}", "content": "hi", "clientMessageId": "h-1"}
                assert await refused(a, "send", **send) == "forbidden"
                assert await refused(b, "leave", scopeId=scope) == "forbidden"
                # Managers kept by admins.
                await admin(
                    node.database_url,
                    "service-managers",
                    "add",
                    "--service",
                    "deploys",
                    "--member",
                    bob.id,
                )
                assert (await b.service_post("deploys", "b"))["state"] == "sent"
                await admin(
                    node.database_url,
                    "service-managers",
                    "remove",
                    "--service",
                    "deploys",
                    "--member",
                    bob.id,
                )
                assert await refused(b, "servicePost", **post) == "forbidden"
                # A human created later is in the audience at once and reads the history.
                url = node.database_url
                cara = await admin(
                    url,
                    "create-member",
                    "--workspace",
                    world.workspace_id,
                    "--handle",
                    "cara",
                    "--type",
                    "human",
                )
                cara_token = (await admin(url, "issue-token", "--member", cara["memberId"]))[
                    "token"
                ]
                cara_client = world.client(Person(bob.member, cara_token))
                async with cara_client as c:
                    assert scope in await scope_ids(c)
                    history = await c.request("history", target=f"scope:{scope}")
                    assert [m["content"] for m in history["messages"]] == ["Deploy **ok**", "b"]
                    # Deactivation closes its sessions, fails its tokens, ends its memberships.
                    await admin(url, "deactivate-member", "--member", cara["memberId"])
                    assert await c.wait_closed(5) == 4401
                with pytest.raises(ConnectionClosed):
                    async with world.client(Person(bob.member, cara_token)):
                        pass
                # A service invited into a channel posts there too, as itself.
                ops = await a.request("createChannel", slug="ops", name="Ops")
                await a.request("invite", scopeId=ops["scopeId"], memberId=made["memberId"])
                there = await a.service_post("deploys", "to ops", target="#ops")
                assert there["state"] == "sent"
                status, hooked = await post_hook(
                    node, "deploys", {"content": "hook to ops", "target": "#ops"}, token
                )
                assert (status, hooked["scopeId"]) == (201, ops["scopeId"])
                await _webhooks(node, b, scope, token)
                members = await a.request("members", scopeId=scope)
                assert cara["memberId"] not in {m["id"] for m in members["members"]}
                assert bot.id not in {m["id"] for m in members["members"]}


async def _webhooks(node: Any, reader: Client, scope: str, token: str) -> None:
    """Slack's payload and ours, idempotent, live to a human; errors store nothing."""
    slack = {"text": "Deploy <https://ci.example/42|#42> *succeeded*"}
    status, made = await post_hook(node, "deploys", slack, token, Idempotency_Key="run-42")
    assert status == 201, made
    assert made["scopeId"] == scope
    events = await reader.events_until(
        lambda e: e.get("type") == "message" and "ci.example" in e["message"]["content"], 5
    )
    message = events[-1]["message"]
    assert message["content"] == "Deploy [#42](https://ci.example/42) **succeeded**"
    assert message["author"]["handle"] == "deploys"
    assert message["metadata"]["source"]["kind"] == "service_direct_post"
    assert await post_hook(node, "deploys", slack, token, Idempotency_Key="run-42") == (200, made)
    ours = {"content": "plain", "clientMessageId": "p-1"}
    status, plain = await post_hook(node, "deploys", ours, token)
    assert status == 201
    assert plain["seq"] == made["seq"] + 1
    assert (await post_hook(node, "deploys", ours, token))[0] == 200
    blocks = {"blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "_quiet_"}}]}
    assert (await post_hook(node, "deploys", blocks, token))[0] == 201
    # Refused: a bad or another service's token, a malformed body; nothing stored.
    assert (await post_hook(node, "deploys", ours, "snt_nope"))[0] == 401
    assert (await post_hook(node, "deploys", ours, None))[0] == 401
    assert (await post_hook(node, "alerts", {"content": "x"}, token))[0] == 401
    assert await post_hook(node, "deploys", {"content": 5}, token) == (
        400,
        {
            "code": "validation_failed",
            "message": "$.content: must be a string",
            "details": {"path": "$.content"},
        },
    )
    status, error = await post_hook(node, "deploys", {"username": "ci"}, token)
    assert (status, error["details"]["path"]) == (400, "$.content")
    assert (await post_hook(node, "deploys", b"{not json", token))[0] == 400
    # Over the service's send bucket: 429, and nothing stored.
    status, error = await post_hook(node, "deploys", {"content": "one more"}, token)
    assert (status, error["code"]) == (429, "rate_limited")
    history = await reader.history(f"scope:{scope}")
    assert [m["content"] for m in history["messages"]][-3:] == [
        "Deploy [#42](https://ci.example/42) **succeeded**",
        "plain",
        "*quiet*",
    ]
