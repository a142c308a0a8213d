"""``scopenode mcp`` over stdio, driven by the MCP SDK's own client against a real node.

One node for the module. The agent ``helper`` is reached through
``python -m node mcp`` (a real subprocess, as an MCP client starts it):
it lists its tools and conversations, reads, sends, is held when a human
wrote after its last read (shown what it missed, nothing stored), follows a
conversation resource (told when a message arrives), waits for
attention while a human mentions it (the wake arrives within a second), and
its wake survives a server that dies before answering: the next server gets
it again, answers it, and only then is it acknowledged.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPDeprecationWarning

from actors.model import MemberType
from node.client import open_client
from tests.nodes import Person, RunningNode, World, make_channel, running_node

ROOT = Path(__file__).resolve().parent.parent
TOOLS = {
    "list_conversations",
    "read_messages",
    "send_message",
    "wait_for_attention",
    "dismiss",
    "react",
    "search",
    "edit_message",
    "delete_message",
    "explain",
    "create_task",
    "update_task",
    "my_tasks",
}


@asynccontextmanager
async def mcp_session(
    node: RunningNode, token: str, updated: trio.MemorySendChannel[str] | None = None
) -> AsyncIterator[ClientSession]:
    """``python -m node mcp`` for the agent of ``token``, as an MCP client starts it, initialized;
    the URIs of ``resources/updated`` notifications go to ``updated``."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "node", "mcp", "--url", node.url],
        env={"SCOPENODE_TOKEN": token},
        cwd=ROOT,
    )

    async def notified(message: Any) -> None:
        if updated is not None and isinstance(message, types.ResourceUpdatedNotification):
            await updated.send(str(message.params.uri))

    async with (
        stdio_client(server) as (read, write),
        ClientSession(read, write, message_handler=notified) as session,
    ):
        await session.initialize()
        yield session


def kill_mcp_servers() -> int:
    """SIGKILL this test's ``node mcp`` children (a server that dies, not one
    told to stop); how many."""
    mine, killed = str(os.getpid()), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = stat.read_text().rsplit(")", 1)[1].split()[1]
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue  # gone already
        if parent == mine and b"mcp" in command and b"node" in command:
            os.kill(int(stat.parent.name), signal.SIGKILL)
            killed += 1
    return killed


async def call(session: ClientSession, tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    """A tool call that must succeed: its text and structured content."""
    result = await session.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, text
    return text, dict(result.structured_content or {})


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """A tool call the node refuses: the error code it carries."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return str((result.structured_content or {})["error"]["code"])


async def test_tools_read_send_held_wake_and_redelivery(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            ann = await world.member("ann")
            helper = await world.member("helper", MemberType.AGENT)
            async with world.client(ann) as human:
                async with world.client(helper) as plain:
                    await make_channel(human, "general", plain)
                await human.send("#general", "hello team")

                updated_in, updated_out = trio.open_memory_channel[str](10)
                async with mcp_session(node, helper.token, updated_in) as mcp:
                    listed = await mcp.list_tools()
                    assert {t.name for t in listed.tools} == TOOLS
                    assert all(t.description and t.input_schema for t in listed.tools)

                    text, found = await call(mcp, "list_conversations")
                    general = next(c for c in found["conversations"] if c["name"] == "#general")
                    assert general["unread"] == 1
                    assert "#general" in text

                    text, page = await call(mcp, "read_messages", conversation="#general")
                    assert "@ann: hello team" in text
                    assert [m["text"] for m in page["messages"]] == ["hello team"]

                    text, sent = await call(
                        mcp, "send_message", conversation="#general", text="hi, I am here"
                    )
                    assert sent["state"] == "sent", text

                    uri = f"scopenode://conversation/{general['id']}"
                    with warnings.catch_warnings():
                        # The handshake era's subscribe; the server serves subscriptions/listen too.
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await mcp.subscribe_resource(uri)
                    await human.send("#general", "anyone around?")
                    with trio.fail_after(5):
                        assert await updated_out.receive() == uri
                    read = await mcp.read_resource(uri)
                    assert "@ann: anyone around?" in read.contents[0].text  # type: ignore[union-attr]

                    await held_then_sent(mcp, human)
                    await the_other_tools(mcp)
                    wake_id = await woken_within_a_second(mcp, human)
                    assert kill_mcp_servers() == 1

                # The server died between the wake and the answer: the next one
                # is handed the same wake, and its reply acknowledges it.
                async with mcp_session(node, helper.token) as mcp:
                    text, woken = await call(mcp, "wait_for_attention", timeout_s=10)
                    assert woken["wake"]["wakeId"] == wake_id, text
                    text, _explained = await call(
                        mcp, "explain", message_id=woken["wake"]["message"]["id"]
                    )
                    assert "@ann mentioned you in #general" in text
                    text, sent = await call(
                        mcp, "send_message", conversation="#general", text="on it, ann"
                    )
                    assert sent["state"] == "sent"
                    assert sent["wakesAcknowledged"] == [wake_id]
                    await human.events_until(
                        lambda e: (
                            e["type"] == "message" and e["message"]["content"] == "on it, ann"
                        ),
                        timeout=5,
                    )
                    await answered_before_the_ack(mcp, human, world.client(helper))

            await no_pending_wake(node, helper)


async def answered_before_the_ack(mcp: ClientSession, human: Any, agent_session: Any) -> None:
    """A reply stored under the wake's reply id (by a server that died before its ack)
    stands: answering the wake again acknowledges it and stores nothing more."""
    async with trio.open_nursery() as nursery:
        woken: dict[str, Any] = {}

        async def wait() -> None:
            _, woken["wake"] = await call(mcp, "wait_for_attention", timeout_s=10)

        nursery.start_soon(wait)
        await human.send("#general", "@helper and the tests?")
    wake_id = woken["wake"]["wake"]["wakeId"]
    async with agent_session as earlier:
        stored = await earlier.send(
            "#general", "tests are green", clientMessageId=f"reply-{wake_id}"
        )
    text, sent = await call(mcp, "send_message", conversation="#general", text="all green")
    assert sent["state"] == "already_sent", text
    assert sent["messageId"] == stored["messageId"]
    assert sent["wakesAcknowledged"] == [wake_id]
    latest = await human.history("#general", limit=1)
    assert latest["messages"][-1]["content"] == "tests are green"


async def held_then_sent(mcp: ClientSession, human: Any) -> None:
    """A send after someone wrote unseen is held: shown the message, nothing stored."""
    await call(mcp, "read_messages", conversation="#general")
    await human.send("#general", "wait, the deploy moved to friday")
    text, held = await call(mcp, "send_message", conversation="#general", text="deploy is today")
    assert held["state"] == "held", text
    assert "1 new message arrived" in text
    assert "send again if your reply still stands" in text
    assert [m["text"] for m in held["missed"]] == ["wait, the deploy moved to friday"]
    latest = await human.history("#general", limit=1)
    assert latest["messages"][-1]["content"] == "wait, the deploy moved to friday"
    text, sent = await call(mcp, "send_message", conversation="#general", text="noted: friday")
    assert sent["state"] == "sent", text


async def the_other_tools(mcp: ClientSession) -> None:
    """DMs by handle, threads, reactions, edits, search, tasks; refusals carry the node's code."""
    text, sent = await call(mcp, "send_message", conversation="@ann", text="a word in private")
    assert sent["state"] == "sent", text
    _, found = await call(mcp, "list_conversations")
    assert {"@ann", "#general"} <= {c["name"] for c in found["conversations"]}

    _, page = await call(mcp, "read_messages", conversation="#general", limit=2)
    root = page["messages"][0]
    text, sent = await call(
        mcp, "send_message", conversation="#general", thread=root["id"], text="in the thread"
    )
    assert sent["state"] == "sent", text
    _, page = await call(mcp, "read_messages", conversation="#general", since=root["seq"] - 1)
    assert page["messages"][0]["thread"]["replies"] == 1

    text, reacted = await call(mcp, "react", message_id=root["id"], emoji=":+1:")
    assert reacted["changed"], text
    mine = sent["messageId"]
    _, edited = await call(mcp, "edit_message", message_id=mine, text="in the thread, edited")
    assert edited["revision"] == 1
    await call(mcp, "delete_message", message_id=mine)
    assert await refused(mcp, "edit_message", message_id=root["id"], text="not mine") in (
        "forbidden"
    )
    text, hits = await call(mcp, "search", query="deploy moved", conversation="#general")
    assert [h["text"] for h in hits["hits"]] == ["wait, the deploy moved to friday"], text

    text, task = await call(mcp, "create_task", title="Check the build", assignees=["@ann"])
    _, mine_now = await call(mcp, "my_tasks")
    assert [t["taskId"] for t in mine_now["tasks"]] == [task["taskId"]], text
    _, updated = await call(mcp, "update_task", task_id=task["taskId"], status="done")
    assert updated["task"]["status"] == "done"

    assert await refused(mcp, "read_messages", conversation="#nowhere") == "not_found"
    assert await refused(mcp, "send_message", conversation="#general") == "validation_failed"
    assert await refused(mcp, "read_messages", conversation="#general", limit=0) == (
        "validation_failed"
    )
    text, _ = await call(mcp, "dismiss")
    assert text == "No wake was open."


async def woken_within_a_second(mcp: ClientSession, human: Any) -> str:
    """A mention wakes the waiting agent within a second; returns the wake id."""
    outcome: dict[str, Any] = {}

    async def wait() -> None:
        outcome["text"], outcome["wake"] = await call(mcp, "wait_for_attention", timeout_s=10)
        outcome["at"] = time.monotonic()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        mentioned = time.monotonic()
        await human.send("#general", "@helper can you check the build?")
    assert outcome["at"] - mentioned < 1.0, outcome["at"] - mentioned
    wake = outcome["wake"]["wake"]
    assert wake["reason"] == "mention"
    assert wake["conversation"] == "#general"
    assert wake["message"]["text"] == "@helper can you check the build?"
    assert "can you check the build?" in outcome["text"]
    return str(wake["wakeId"])


async def no_pending_wake(node: RunningNode, agent: Person) -> None:
    """The node hands a daemon its pending wakes before answering anything: none is left."""
    async with open_client(
        node.url, agent.token, kind="daemon", capabilities=("freshness", "ack")
    ) as daemon:
        await daemon.request("scopes")
        assert daemon.pending_events() == 0
