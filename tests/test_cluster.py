"""Several nodes on one database: cross-node events (docs/cluster.md).

Sessions are connected to different nodes directly, as a routing proxy
could never guarantee; what one node commits reaches the others' sessions
through NOTIFY/LISTEN (``node/relay.py``) exactly once, in seq order, with
visibility applied there by the one SQL predicate.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from actors.model import MemberType
from node import relay
from node.client import Client, open_client
from node.cluster_cli import HAPROXY_MISSING, find_haproxy, free_ports, haproxy_config
from node.http import HEALTH_TIMEOUT
from storage import directory, scopes
from storage.pg import connect
from tests.conftest import require_tool
from tests.nodes import Person, RunningNode, World, make_channel, running_node

WAIT = 5.0
QUIET = 0.5  # long enough for a relayed event that should not come to arrive


@asynccontextmanager
async def nodes(database_url: str, tmp_path: Path, count: int) -> AsyncIterator[list[RunningNode]]:
    async with AsyncExitStack() as stack:
        started = []
        for i in range(count):
            data_dir = tmp_path / f"n{i}"
            started.append(
                await stack.enter_async_context(
                    running_node(database_url, data_dir, node_id=f"n{i}")
                )
            )
        yield started


def connect_to(node: RunningNode, world: World, person: Person, **kwargs: Any) -> Any:
    return open_client(f"{node.url}?workspace={world.workspace_id}", person.token, **kwargs)


async def messages_until(client: Client, scope_id: str, seq: int) -> list[dict[str, Any]]:
    """The scope's ``message`` events up to ``seq``, in the order they came."""
    got: list[dict[str, Any]] = []
    with trio.fail_after(WAIT):
        while not got or got[-1]["message"]["seq"] < seq:
            event = await client.next_event()
            if event["type"] == "message" and event["scopeId"] == scope_id:
                got.append(event)
    return got


async def event_of(client: Client, type_: str, timeout: float = WAIT) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while True:
            event = await client.next_event()
            if event["type"] == type_:
                return event


async def membership_of(client: Client, member_id: str) -> list[dict[str, Any]]:
    """Membership events up to the first about ``member_id``."""
    return await client.events_until(
        lambda e: e["type"] == "membership" and e["memberId"] == member_id, WAIT
    )


async def nothing_more(client: Client, scope_id: str) -> None:
    with trio.move_on_after(QUIET):
        while True:
            event = await client.next_event()
            assert event.get("scopeId") != scope_id or event["type"] not in (
                "message",
                "reaction",
            ), event


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["message"]["seq"] for e in events]


async def test_message_membership_read_state_reaction_and_edit_events_cross_nodes_once_in_order(
    database_url: str, tmp_path: Path
) -> None:
    async with nodes(database_url, tmp_path, 3) as (a, b, c):
        world = await World.create(a)
        ann = await world.member("ann")
        bob = await world.member("bob")
        carl = await world.member("carl")
        bot = await world.member("annbot", MemberType.AGENT, owner=ann, private=True)
        async with (
            connect_to(a, world, ann) as ann_a,
            connect_to(b, world, ann) as ann_b,
            connect_to(b, world, bob) as bob_b,
            connect_to(c, world, carl) as carl_c,
            connect_to(b, world, bot) as bot_b,
        ):
            scope = await make_channel(ann_a, "team", bob_b)
            await ann_a.request("invite", scopeId=scope, memberId=bot.id, visibility="private")
            # ann's session on node B hears of annbot, added on node A.
            await membership_of(ann_b, bot.id)
            await carl_c.request("join", scopeId=scope)
            # bob (node B) hears carl join on node C, and never of annbot's
            # private membership.
            heard = await membership_of(bob_b, carl.id)
            assert bot.id not in {e["memberId"] for e in heard}

            sent = []
            for i in range(4):
                sent.append(await ann_a.send("#team", f"from ann {i}"))
                sent.append(await bob_b.send("#team", f"from bob {i}"))
            sent.append(await carl_c.send("#team", "from carl"))
            last = max(s["acceptedSeq"] for s in sent)
            for name, client in (
                ("ann_a", ann_a),
                ("ann_b", ann_b),
                ("bob_b", bob_b),
                ("carl_c", carl_c),
            ):
                got = await messages_until(client, scope, last)
                assert (name, seqs(got)) == (name, list(range(1, last + 1)))
            # The private agent reads only its owner's messages (no grant).
            ann_seqs = [s["acceptedSeq"] for s in sent[0:8:2]]
            got = await messages_until(bot_b, scope, ann_seqs[-1])
            assert seqs(got) == ann_seqs
            assert {e["message"]["author"]["memberId"] for e in got} == {ann.id}
            await nothing_more(bot_b, scope)

            # readState reaches the member's session on another node.
            await ann_a.request("markRead", scopeId=scope, seq=last)
            state = await event_of(ann_b, "readState")
            assert state == {"type": "readState", "scopeId": scope, "lastReadSeq": last}

            # A reaction made on node A reaches readers on B and C.
            await ann_a.react(sent[1]["messageId"], "👍")
            for client in (bob_b, carl_c):
                reaction = await event_of(client, "reaction")
                assert reaction["messageId"] == sent[1]["messageId"]
                assert reaction["memberId"] == ann.id

            # An edit and a delete made on node A reach readers on B and C.
            await ann_a.edit(sent[0]["messageId"], "from ann, edited")
            await ann_a.delete(sent[2]["messageId"])
            for client in (bob_b, carl_c):
                updated = await event_of(client, "messageUpdated")
                assert updated["message"]["content"] == "from ann, edited"
                deleted = await event_of(client, "messageDeleted")
                assert deleted["messageId"] == sent[2]["messageId"]

            # bob is removed on node A: his session on B hears it, then nothing more.
            await ann_a.remove(scope, bob.id)
            left = await event_of(bob_b, "membership")
            assert (left["memberId"], left["op"]) == (bob.id, "left")
            after = await ann_a.send("#team", "bob is gone")
            got = await messages_until(carl_c, scope, after["acceptedSeq"])
            assert seqs(got)[-1] == after["acceptedSeq"]
            await nothing_more(bob_b, scope)
        assert b.services.hub.relay is not None
        relay_b = b.services.hub.relay
        assert isinstance(relay_b, relay.ClusterRelay)
        assert relay_b.delivery.events_relayed > 0


async def test_relayed_readers_follow_every_roster_change_on_the_lean_read(
    database_url: str, tmp_path: Path
) -> None:
    """Node B answers repeat relays of a scope with the lean read (humans read
    by the roster alone); a join, a removal and a new session on B each
    change who gets the next message there, exactly as the full predicate says."""
    async with nodes(database_url, tmp_path, 2) as (a, b):
        world = await World.create(a)
        ann = await world.member("ann")
        bob = await world.member("bob")
        carl = await world.member("carl")
        dora = await world.member("dora")
        async with (
            connect_to(a, world, ann) as ann_a,
            connect_to(b, world, bob) as bob_b,
            connect_to(b, world, carl) as carl_b,
        ):
            scope = await make_channel(ann_a, "lean", bob_b)
            relay_b = b.services.hub.relay
            assert isinstance(relay_b, relay.ClusterRelay)
            for i in range(4):  # one at a time: each is a relay read of its own
                sent = await ann_a.send("#lean", f"one {i}")
                got = await messages_until(bob_b, scope, sent["acceptedSeq"])
                assert seqs(got)[-1] == sent["acceptedSeq"]
            assert relay_b.delivery.lean_reads >= 2
            await nothing_more(carl_b, scope)

            # carl joins on node A: his session on B gets what follows.
            await ann_a.request("invite", scopeId=scope, memberId=carl.id)
            joined = await ann_a.send("#lean", "carl is in")
            got = await messages_until(carl_b, scope, joined["acceptedSeq"])
            assert seqs(got)[-1] == joined["acceptedSeq"]
            got = await messages_until(bob_b, scope, joined["acceptedSeq"])
            assert seqs(got)[-1] == joined["acceptedSeq"]

            # bob is removed on node A: nothing more reaches him on B, while
            # carl, on the same node, keeps getting every message.
            await ann_a.remove(scope, bob.id)
            before = relay_b.delivery.lean_reads
            for i in range(3):
                sent = await ann_a.send("#lean", f"two {i}")
                got = await messages_until(carl_b, scope, sent["acceptedSeq"])
                assert seqs(got)[-1] == sent["acceptedSeq"]
            await nothing_more(bob_b, scope)
            assert relay_b.delivery.lean_reads > before

            # A member whose first session on B opens now is decided afresh.
            await ann_a.request("invite", scopeId=scope, memberId=dora.id)
            async with connect_to(b, world, dora) as dora_b:
                sent = await ann_a.send("#lean", "hello dora")
                got = await messages_until(dora_b, scope, sent["acceptedSeq"])
                assert seqs(got)[-1] == sent["acceptedSeq"]
            await nothing_more(bob_b, scope)


async def test_a_node_alone_publishes_nothing_and_a_joining_node_is_published_to_first(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path / "a", node_id="a") as a:
        relay_a = a.services.hub.relay
        assert isinstance(relay_a, relay.ClusterRelay)
        assert relay_a.alone
        world = await World.create(a)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with connect_to(a, world, ann) as ann_a, connect_to(a, world, bob) as bob_a:
            scope = await make_channel(ann_a, "ops", bob_a)
            await ann_a.send("#ops", "nobody else listens")
            await trio.sleep(QUIET)
            assert relay_a.notifications_received == 0
            async with running_node(database_url, tmp_path / "b", node_id="b") as b:
                relay_b = b.services.hub.relay
                assert isinstance(relay_b, relay.ClusterRelay)
                # B serves only once A publishes to it.
                assert not relay_a.alone
                assert not relay_b.alone
                assert relay_b.listener_pid in (relay_a.peer_pids or ())
                assert relay_b.acknowledged_by == {relay_a.listener_pid}
                async with connect_to(b, world, bob) as bob_b:
                    sent = await ann_a.send("#ops", "now B listens")
                    got = await messages_until(bob_b, scope, sent["acceptedSeq"])
                    assert seqs(got) == [sent["acceptedSeq"]]
            with trio.fail_after(WAIT):
                while not relay_a.alone:
                    await trio.sleep(0.05)


async def test_a_killed_listener_catches_up_from_the_database(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that every send below commits while node B is not listening.
    monkeypatch.setattr(relay, "RECONNECT_DELAY", 1.5)
    async with nodes(database_url, tmp_path, 2) as (a, b):
        world = await World.create(a)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with connect_to(a, world, ann) as ann_a, connect_to(b, world, bob) as bob_b:
            scope = await make_channel(ann_a, "ops", bob_b)
            first = await ann_a.send("#ops", "before")
            assert seqs(await messages_until(bob_b, scope, first["acceptedSeq"])) == [1]
            relay_b = b.services.hub.relay
            assert isinstance(relay_b, relay.ClusterRelay)
            pid = relay_b.listener_pid
            with psycopg.connect(database_url, autocommit=True) as conn:
                found = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid = %s",
                    (relay.APPLICATION_NAME, pid),
                ).fetchone()
                assert found is not None
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with trio.fail_after(WAIT):
                while relay_b.listener_pid == pid:
                    await trio.sleep(0.01)
            catchups = relay_b.delivery.catchups
            missed = [await ann_a.send("#ops", f"during the gap {i}") for i in range(5)]
            last = missed[-1]["acceptedSeq"]
            got = await messages_until(bob_b, scope, last)
            assert seqs(got) == list(range(2, last + 1))
            assert relay_b.delivery.catchups == catchups + 1
            assert relay_b.listener_pid not in (None, pid)
            # And live relaying goes on after the catch-up, without duplicates.
            later = await ann_a.send("#ops", "after")
            assert seqs(await messages_until(bob_b, scope, later["acceptedSeq"])) == [last + 1]


async def test_a_revoked_tokens_sessions_close_on_every_node_within_a_second(
    database_url: str, tmp_path: Path
) -> None:
    async with nodes(database_url, tmp_path, 2) as (a, b):
        world = await World.create(a)
        ann = await world.member("ann")
        async with connect_to(a, world, ann) as on_a, connect_to(b, world, ann) as on_b:
            async with await connect(database_url, autocommit=True) as conn:
                assert await directory.revoke_token(conn, ann.token)
            revoked_at = trio.current_time()
            assert await on_a.wait_closed(1.0) == 4401
            assert await on_b.wait_closed(1.0) == 4401
            assert trio.current_time() - revoked_at < 1.0


async def _read_until(stream: Any, marker: str, timeout: float) -> list[str]:
    """Lines of a child's stdout up to the one starting with ``marker``."""
    lines: list[str] = []
    with trio.fail_after(timeout):
        while not lines or not lines[-1].startswith(marker):
            line = await trio.to_thread.run_sync(stream.readline, abandon_on_cancel=True)
            if not line:
                raise AssertionError(f"stdout ended before {marker!r}: {lines}")
            lines.append(line.rstrip("\n"))
    return lines


@require_tool("haproxy", None if find_haproxy() else HAPROXY_MISSING)
async def test_cluster_up_two_nodes_chat_through_haproxy(database_url: str, tmp_path: Path) -> None:
    port = free_ports(1)[0]
    command = [sys.executable, "-m", "node", "cluster", "up", "--nodes", "2", "--port", str(port)]
    command += ["--database-url", database_url, "--data-dir", str(tmp_path)]
    cluster = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        lines = await _read_until(cluster.stdout, "demo token:", 90)
        token = lines[-1].split()[-1]
        nodes_line = next(line for line in lines if line.startswith("nodes: "))
        node_ports = [int(part.rsplit(":", 1)[1]) for part in nodes_line.split()[1:]]
        assert len(node_ports) == 2
        async with await connect(database_url, autocommit=True) as conn:
            found = await directory.authenticate(conn, token)
            assert found is not None
            workspace = found.workspace_id
            bob = await directory.create_member(
                conn, workspace_id=workspace, type_=MemberType.HUMAN, handle="bob"
            )
            bob_token = await directory.issue_token(conn, bob.id)
            general = await scopes.channel_by_slug(conn, workspace, "general")
            assert general is not None
        public = f"ws://127.0.0.1:{port}/v1/ws?workspace={workspace}"
        direct = [f"ws://127.0.0.1:{p}/v1/ws?workspace={workspace}" for p in node_ports]
        async with (
            open_client(public, token) as demo,
            open_client(public, bob_token) as bob_proxied,
            open_client(direct[0], bob_token) as bob_0,
            open_client(direct[1], bob_token) as bob_1,
        ):
            await bob_proxied.request("join", scopeId=general)
            sent = await demo.send("#general", "hello through haproxy")
            for client in (bob_proxied, bob_0, bob_1):
                event = await event_of(client, "message")
                assert event["message"]["id"] == sent["messageId"]
            reply = await bob_proxied.send("#general", "hi demo")
            # demo's own message comes first, then bob's reply.
            got = await messages_until(demo, general, reply["acceptedSeq"])
            assert [e["message"]["id"] for e in got] == [sent["messageId"], reply["messageId"]]
    finally:
        cluster.send_signal(signal.SIGINT)
        assert cluster.wait(timeout=30) == 0
        assert cluster.stdout is not None
        cluster.stdout.close()
    # Everything it started is gone: its port answers no more.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_a_health_check_waits_for_the_nodes_own_verdict() -> None:
    """HAProxy waits longer for /healthz than the node waits for its database:
    a node marked down loses every session, so a pause must not mark it down."""
    deployed = Path(__file__).parent.parent / "deploy" / "haproxy.cfg"
    for config in (haproxy_config("127.0.0.1", 8765, [8801, 8802]), deployed.read_text()):
        waits = re.findall(r"^\s*timeout check (\d+)s$", config, re.MULTILINE)
        assert len(waits) == 1, waits
        assert float(waits[0]) > HEALTH_TIMEOUT


_INSERT_MESSAGES = (
    "INSERT INTO scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
    " author_member_id, author_type, notify_principal_member_id,"
    " idempotency_subject_member_id, message_type, content)"
    " SELECT %(prefix)s || g, %(w)s, %(s)s, g, %(g0)s + g, %(a)s, 'human', %(a)s, %(a)s,"
    " 'text', 'x' FROM generate_series(1, %(n)s) g"
)


async def _relay_world(conn: Any, members: int) -> tuple[str, str, list[str], str]:
    """A workspace whose ``members`` humans are in #general with 8 messages by
    the first, and one human in no channel: (workspace, #general, inside, outsider)."""
    workspace_id = await directory.create_workspace(conn, "relay-read")
    inside = []
    for i in range(members):
        member = await directory.create_member(
            conn, workspace_id=workspace_id, type_=MemberType.HUMAN, handle=f"in{i}"
        )
        await scopes.join_on_creation(conn, member)
        inside.append(member.id)
    outsider = await directory.create_member(
        conn, workspace_id=workspace_id, type_=MemberType.HUMAN, handle="out"
    )
    general = await scopes.channel_by_slug(conn, workspace_id, "general")
    assert general is not None
    await conn.execute(
        _INSERT_MESSAGES,
        {
            "prefix": f"msg_{general}_",
            "w": workspace_id,
            "s": general,
            "g0": 0,
            "n": 8,
            "a": inside[0],
        },
    )
    await conn.execute("UPDATE scopes SET latest_seq = 8 WHERE id = %s", (general,))
    return workspace_id, general, inside, outsider.id


async def test_the_relay_read_is_one_prepared_statement_that_keeps_its_generic_plan(
    database_url: str,
) -> None:
    """The receiving node's read of a relayed range: the members of the channel
    among the candidates read each message, an outsider does not, and from the
    sixth call on PostgreSQL runs the prepared statement's generic plan (no
    planning per notification)."""
    from storage import relay as relay_sql

    async with await connect(database_url, autocommit=True) as conn:
        _, general, inside, outsider = await _relay_world(conn, 12)
        candidates = [*inside[1:], outsider]
        for seq in range(1, 8):
            rows = await relay_sql.readers_in_range(conn, general, seq, seq, candidates)
            assert [row.message.seq for row in rows] == [seq]
            assert sorted(rows[0].readers) == sorted(inside[1:])
        rows = await relay_sql.readers_in_range(conn, general, 2, 8, candidates)
        assert [row.message.seq for row in rows] == list(range(2, 9))
        cur = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s",
            (relay_sql.READERS_IN_RANGE_NAME,),
        )
        generic, custom = (await cur.fetchall())[0]
        assert custom <= 5, custom
        assert generic >= 3, generic


async def test_the_relay_read_of_a_thread_follows_the_parents_current_public_members(
    database_url: str,
) -> None:
    """In a reply thread the parent's current public members read every message
    without joining it; one who left the parent no longer reads the thread."""
    from storage import relay as relay_sql

    async with await connect(database_url, autocommit=True) as conn:
        workspace_id, general, inside, outsider = await _relay_world(conn, 4)
        thread = f"scp_thread_{general}"
        await conn.execute(
            "INSERT INTO scopes (id, workspace_id, type, parent_scope_id, root_message_id,"
            " latest_seq) VALUES (%s, %s, 'thread', %s, %s, 2)",
            (thread, workspace_id, general, f"msg_{general}_1"),
        )
        await conn.execute(
            _INSERT_MESSAGES,
            {
                "prefix": f"msg_{thread}_",
                "w": workspace_id,
                "s": thread,
                "g0": 8,
                "n": 2,
                "a": inside[0],
            },
        )
        candidates = [*inside[1:], outsider]
        rows = await relay_sql.readers_in_range(conn, thread, 1, 2, candidates)
        assert [sorted(row.readers) for row in rows] == [sorted(inside[1:])] * 2
        await conn.execute(
            "UPDATE scope_memberships SET effective_to_seq = 9"
            " WHERE scope_id = %s AND member_id = %s",
            (general, inside[1]),
        )
        rows = await relay_sql.readers_in_range(conn, thread, 1, 2, candidates)
        assert [sorted(row.readers) for row in rows] == [sorted(inside[2:])] * 2
        assert await relay_sql.current_readers(conn, thread, candidates) == set(inside[2:])
