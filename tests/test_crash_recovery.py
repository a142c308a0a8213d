"""Crash safety.

``scopenode serve`` runs as a subprocess on the test database; several
sessions send concurrently; the node is killed with SIGKILL mid-load and
restarted on the same data dir and database. Then: every acknowledged send
is in ``history`` with its seq; seqs are 1..n with no gap or duplicate; a send
whose reply was lost, retried with its ``clientMessageId``, is stored once;
realtime outbox rows the crash left pending are replayed by the worker, and
agent wakes are delivered to the agent's daemon when it connects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.model import MemberType
from bench.nodeproc import free_port, stop_process, wait_healthy
from node.client import Client, ConnectionClosed
from storage.pg import connect
from tests.nodes import Person, World, make_channel

SENDERS = 5
TASKS_PER_SENDER = 4
KILL_AFTER_ACKED = 300
MENTION_EVERY = 5
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
# Realtime rows are due REPLAY_AFTER (10 s) after their message; the worker polls every 1 s.
OUTBOX_TIMEOUT = 30.0


@dataclass
class NodeProcess:
    """What ``World`` needs of a node: its WebSocket URL and database."""

    proc: trio.Process
    port: int
    database_url: str

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"


@contextlib.asynccontextmanager
async def serve_subprocess(
    data_dir: Path, database_url: str, log_path: Path, *, module: str = "node"
) -> AsyncIterator[NodeProcess]:
    """``scopenode serve`` on a free port (``module``: a test wrapper of it);
    stopped by pid on exit (SIGTERM, then SIGKILL)."""
    port = free_port()
    cmd = [sys.executable, "-m", module, "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--data-dir", str(data_dir), "--database-url", database_url, "--log-level", "warning"]
    with log_path.open("ab") as log:
        proc = await trio.lowlevel.open_process(cmd, stdout=log, stderr=log)
        try:
            try:
                await wait_healthy(f"ws://127.0.0.1:{port}", proc, START_TIMEOUT)
            except (RuntimeError, trio.TooSlowError) as exc:
                raise AssertionError(f"node did not start: {log_path.read_text()[-3000:]}") from exc
            yield NodeProcess(proc, port, database_url)
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(proc)


@dataclass
class Ledger:
    """What the senders know: acknowledged sends, and sends whose reply never came."""

    acked: dict[str, dict[str, Any]] = field(default_factory=dict)  # clientMessageId → reply
    unknown: dict[str, tuple[Person, str]] = field(default_factory=dict)  # → (author, content)
    enough: trio.Event = field(default_factory=trio.Event)


async def send_until_killed(client: Client, person: Person, ledger: Ledger, task: int) -> None:
    for n in range(100_000):  # bounded; the node is killed long before
        client_message_id = f"c-{person.member.handle}-{task}-{n}"
        content = f"{person.member.handle} {task}/{n}"
        if n % MENTION_EVERY == 0:
            content += " @bot"
        ledger.unknown[client_message_id] = (person, content)
        try:
            reply = await client.send("#load", content, clientMessageId=client_message_id)
        except ConnectionClosed:
            return
        assert reply["state"] == "sent", reply
        del ledger.unknown[client_message_id]
        ledger.acked[client_message_id] = reply | {"content": content}
        if len(ledger.acked) >= KILL_AFTER_ACKED:
            ledger.enough.set()


async def run_sender(world: World, person: Person, ledger: Ledger) -> None:
    async with world.client(person) as client, trio.open_nursery() as nursery:
        for task in range(TASKS_PER_SENDER):
            nursery.start_soon(send_until_killed, client, person, ledger, task)


async def outbox_rows(database_url: str) -> dict[tuple[str, str], int]:
    """Row counts of ``scope_fanout_outbox`` by (fanout_type, status)."""
    async with await connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT fanout_type, status, count(*) FROM scope_fanout_outbox GROUP BY 1, 2"
        )
        return {(kind, status): count for kind, status, count in await cur.fetchall()}


def unfinished(rows: dict[tuple[str, str], int], kind: str) -> int:
    return rows.get((kind, "pending"), 0) + rows.get((kind, "leased"), 0)


async def all_messages(client: Client, target: str) -> list[dict[str, Any]]:
    collected: list[dict[str, Any]] = []
    after = 0
    for _ in range(1_000):  # bounded paging
        page = await client.history(target, afterSeq=after, limit=200)
        collected += page["messages"]
        if not page["hasMore"]:
            return collected
        after = page["messages"][-1]["seq"]
    raise AssertionError("history kept answering hasMore")


@pytest.mark.runs_for(14)
async def test_sigkill_mid_load_loses_nothing_acknowledged(
    database_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    log_path = tmp_path / "node.log"
    ledger = Ledger()

    async with serve_subprocess(data_dir, database_url, log_path) as node:
        world = await World.create(node)  # type: ignore[arg-type]
        owner = await world.member("owner")
        bot = await world.member("bot", MemberType.AGENT)
        senders = [await world.member(f"sender{i}") for i in range(SENDERS)]
        async with world.client(owner) as o, world.client(bot) as b:
            joiners = [b]
            async with contextlib.AsyncExitStack() as stack:
                joiners += [await stack.enter_async_context(world.client(p)) for p in senders]
                scope_id = await make_channel(o, "load", *joiners)
        async with trio.open_nursery() as nursery:
            for person in senders:
                nursery.start_soon(run_sender, world, person, ledger)
            with trio.fail_after(60):
                await ledger.enough.wait()
            os.kill(node.proc.pid, signal.SIGKILL)
            with trio.fail_after(STOP_TIMEOUT):
                await node.proc.wait()
        assert node.proc.returncode == -signal.SIGKILL

    at_crash = await outbox_rows(database_url)
    print(
        f"\ncrash: {len(ledger.acked)} sends acknowledged, {len(ledger.unknown)} in flight; "
        f"outbox at the crash: {dict(sorted(at_crash.items()))}"
    )
    assert len(ledger.acked) >= KILL_AFTER_ACKED
    assert unfinished(at_crash, "agent_wake") > 0

    async with serve_subprocess(data_dir, database_url, log_path) as node:
        world = World(node, world.workspace_id)  # type: ignore[arg-type]
        async with world.client(owner) as o:
            stored = await all_messages(o, "#load")
            seqs = [m["seq"] for m in stored]
            assert seqs == list(range(1, len(stored) + 1)), "seq gap or duplicate"
            by_seq = {m["seq"]: m for m in stored}
            for reply in ledger.acked.values():
                message = by_seq[reply["acceptedSeq"]]
                assert message["id"] == reply["messageId"]
                assert message["content"] == reply["content"]
            committed_unacked = len(stored) - len(ledger.acked)
            assert 0 <= committed_unacked <= len(ledger.unknown)

            # Sends whose reply the crash swallowed are retried: stored exactly once.
            retried = {"sent": 0, "already_sent": 0}
            for client_message_id, (person, content) in ledger.unknown.items():
                async with world.client(person) as again:
                    reply = await again.send("#load", content, clientMessageId=client_message_id)
                retried[reply["state"]] += 1
            assert retried["already_sent"] == committed_unacked
            after_retry = await all_messages(o, "#load")
            assert [m["seq"] for m in after_retry] == list(range(1, len(after_retry) + 1))
            assert len(after_retry) == len(ledger.acked) + len(ledger.unknown)
            assert len({m["id"] for m in after_retry}) == len(after_retry)
            print(f"after restart: {len(stored)} stored, retries {retried}")

        # Realtime rows the crash left pending are replayed by the worker.
        with trio.fail_after(OUTBOX_TIMEOUT):
            while unfinished(rows := await outbox_rows(database_url), "realtime"):
                await trio.sleep(0.5)  # an external process: poll the database
        assert rows.get(("realtime", "failed"), 0) == 0

        # Agent wakes wait for the agent's daemon: it gets each once, in seq order.
        expected_wakes = unfinished(rows, "agent_wake")
        mentioned = [m for m in after_retry if "@bot" in m["content"]]
        assert expected_wakes == len(mentioned)
        async with world.client(bot, kind="daemon", capabilities=["ack"]) as daemon:
            delivered: dict[str, int] = {}
            with trio.fail_after(30):
                while len(delivered) < expected_wakes:
                    event = await daemon.next_event()
                    if event["type"] == "deliver" and event["deliveryId"] not in delivered:
                        delivered[event["deliveryId"]] = event["targetSeq"]
                        await daemon.request("ack", deliveryId=event["deliveryId"])
            # (the worker may push a row too once it is due: order is checked elsewhere)
            assert sorted(delivered.values()) == [m["seq"] for m in mentioned]
        rows = await outbox_rows(database_url)
        assert unfinished(rows, "agent_wake") == 0
        assert rows.get(("agent_wake", "delivered"), 0) == expected_wakes
        print(f"outbox after restart: {dict(sorted(rows.items()))}")
        assert scope_id == stored[0]["scopeId"]
