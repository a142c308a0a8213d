"""examples/echo_agent.py as a subprocess against a real node.

The agent is held between its wake and its answer (its ``ECHO_AGENT_GATE_DIR``
hook) while a human posts, so its first answer is ``held`` every time: it must
refresh, answer anyway, and acknowledge the delivery only once the answer is
stored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import trio

from actors.model import MemberType
from node.client import open_daemon
from node.outbox_worker import WorkerSettings
from tests.nodes import World, make_channel, running_node

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "echo_agent.py"
# Redelivery on connect is what is checked, not the worker's re-pushes.
QUIET_WORKER = WorkerSettings(poll_interval=3600, prune_every=3600)


class Lines:
    """The agent's stdout, one JSON object per line, read in the background."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def read(self, stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        async for chunk in stream:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.events.append(json.loads(line))

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with trio.fail_after(20):
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                await trio.sleep(0.02)


def wake_row(database_url: str, agent_id: str) -> tuple[str, Any]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT status, delivered_at FROM scope_fanout_outbox"
            " WHERE fanout_type = 'agent_wake' AND target_member_id = %s",
            (agent_id,),
        ).fetchone()
    assert row is not None
    return str(row[0]), row[1]


def created_at(database_url: str, message_id: str) -> Any:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT created_at FROM scope_messages WHERE id = %s", (message_id,)
        ).fetchone()
    assert row is not None
    return row[0]


async def wait_for_file(directory: Path, suffix: str) -> Path:
    with trio.fail_after(20):
        while True:
            found = sorted(directory.glob(f"*{suffix}"))
            if found:
                return found[0]
            await trio.sleep(0.02)


async def test_echo_agent_answers_through_held_and_acks_after_the_reply_is_stored(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER) as node:
        world = await World.create(node)
        human = await world.member("ann")
        agent = await world.member("echo", MemberType.AGENT)
        url = f"{node.url}?workspace={world.workspace_id}"
        gate = tmp_path / "gate"
        gate.mkdir()
        env = {**os.environ, "ECHO_AGENT_GATE_DIR": str(gate), "PYTHONPATH": str(ROOT)}
        async with world.client(human) as h:
            async with world.client(agent) as a:
                await make_channel(h, "work", a)
            lines = Lines()
            async with trio.open_nursery() as nursery:
                command = [sys.executable, str(EXAMPLE), url, agent.token]
                process = await nursery.start(
                    partial(
                        trio.run_process,
                        command,
                        env=env,
                        cwd=str(ROOT),
                        stdout=subprocess.PIPE,
                        check=False,
                    )
                )
                nursery.start_soon(lines.read, process.stdout)
                await lines.wait_for(lambda e: e["event"] == "ready")

                await h.send("#work", "@echo hello there")
                woken = await wait_for_file(gate, ".woken")
                delivery_id = woken.name.removesuffix(".woken")
                # Woken, not answered: the delivery is still unacknowledged.
                assert wake_row(database_url, agent.id) == ("pending", None)
                await h.send("#work", "an interjection")
                (gate / f"{delivery_id}.go").touch()

                replied = await lines.wait_for(lambda e: e["event"] == "replied")
                assert replied["deliveryId"] == delivery_id
                # The first answer was held by the interjection; the second was stored.
                assert (replied["state"], replied["attempts"], replied["acked"]) == (
                    "sent",
                    2,
                    True,
                )
                page = await h.history("#work")
                assert [m["content"] for m in page["messages"]] == [
                    "@echo hello there",
                    "an interjection",
                    "echo: hello there",
                ]
                status, acked_at = wake_row(database_url, agent.id)
                assert status == "delivered"
                assert acked_at >= created_at(database_url, replied["messageId"])
                nursery.cancel_scope.cancel()  # ends the agent (SIGTERM, then SIGKILL)

        # A daemon connecting as the agent now gets no delivery: none is pending.
        async with open_daemon(url, agent.token) as again:
            await again.client.send_raw('{"type":"ping","id":"after-connect"}')
            await again.events_until(lambda e: e["type"] == "pong", timeout=5)
            assert again.pending_deliveries() == 0
