"""The daemon layer of node.client: frontier, deliveries, fresh sends, the reply helper.

Unit tests of the pure :class:`Frontier`, of :class:`DaemonClient` over a
scripted fake session, then end to end against a real node.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from actors import scope_state
from actors.model import MemberType
from actors.scope_sends import ChunkedSend
from actors.scope_state import SendCommand
from actors.send_rules import client_message_id_error
from node.client import (
    REPLY_ATTEMPTS,
    Backoff,
    Client,
    ClientError,
    ConnectionClosed,
    DaemonClient,
    Delivery,
    Frontier,
    ReconnectingClient,
    ReplyNotSent,
    chunk_client_message_id,
    join_chunks,
    open_daemon,
)
from node.outbox_worker import WorkerSettings
from tests.nodes import Person, World, make_channel, running_node
from tests.proc_cluster import tcp_relay

# The outbox worker re-pushes unacknowledged deliveries after a backoff; these
# tests are about redelivery on connect, so keep the worker out of the way.
QUIET_WORKER = WorkerSettings(poll_interval=3600, prune_every=3600)


# --- Frontier ----------------------------------------------------------------------


def test_frontier_starts_at_zero_and_is_a_high_water_mark() -> None:
    frontier = Frontier()
    assert (frontier.observed("a"), frontier.latest_known("a")) == (0, 0)
    frontier.advance("a", 5)
    frontier.advance("a", 3)
    assert frontier.observed("a") == 5
    frontier.advance("a", 9)
    assert frontier.observed("a") == 9
    assert frontier.observed("b") == 0  # per targetKey


def test_hints_never_advance_observed() -> None:
    frontier = Frontier()
    frontier.advance("a", 2)
    frontier.hint("a", 7)
    assert (frontier.observed("a"), frontier.latest_known("a")) == (2, 7)
    assert frontier.needs_refresh("a")
    frontier.hint("a", 4)  # an older hint does not lower the latest known
    assert frontier.latest_known("a") == 7
    frontier.advance("a", 7)
    assert not frontier.needs_refresh("a")
    frontier.advance("a", 10)  # latest known never trails observed
    assert frontier.latest_known("a") == 10


def test_stale_rule_is_target_seq_at_or_below_observed() -> None:
    frontier = Frontier()
    assert not frontier.is_stale("a", 1)
    frontier.advance("a", 3)
    assert [frontier.is_stale("a", seq) for seq in (1, 3, 4)] == [True, True, False]
    frontier.hint("a", 10)
    assert not frontier.is_stale("a", 4)  # a hint is not an observation
    assert not frontier.is_stale("b", 1)


OPS = st.lists(
    st.tuples(st.sampled_from(["advance", "hint"]), st.sampled_from("abc"), st.integers(0, 50)),
    max_size=60,
)


@given(OPS)
def test_observed_is_monotone_under_any_calls(ops: list[tuple[str, str, int]]) -> None:
    frontier = Frontier()
    advanced: dict[str, int] = {}
    for kind, key, seq in ops:
        before = {k: frontier.observed(k) for k in "abc"}
        if kind == "advance":
            frontier.advance(key, seq)
            advanced[key] = max(advanced.get(key, 0), seq)
        else:
            frontier.hint(key, seq)
        for k in "abc":
            assert frontier.observed(k) >= before[k]
            assert frontier.observed(k) == advanced.get(k, 0)  # only advance moves it
            assert frontier.latest_known(k) >= frontier.observed(k)
            assert frontier.is_stale(k, frontier.observed(k) + 1) is False


# --- DaemonClient over a scripted session --------------------------------------------


def deliver(delivery_id: str, key: str, seq: int) -> dict[str, Any]:
    return {
        "type": "deliver",
        "deliveryId": delivery_id,
        "agentId": "mem_a",
        "targetKey": key,
        "targetSeq": seq,
        "reason": "mention",
        "message": {"id": f"msg_{delivery_id}", "scopeId": key, "seq": seq},
    }


class FakeSession:
    """The parts of :class:`Client` the daemon layer uses, scripted."""

    def __init__(self, events: list[dict[str, Any]], answers: list[Any] | None = None) -> None:
        self.events = deque(events)
        self.answers = deque(answers or [])  # for request/send: a result dict or an exception
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def next_event(self) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if not self.events:
            raise ConnectionClosed(1000)
        return self.events.popleft()

    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self.requests.append((op, fields))
        answer = self.answers.popleft() if self.answers else {}
        if isinstance(answer, Exception):
            raise answer
        return cast(dict[str, Any], answer)

    async def send(self, target: str, content: str, **fields: Any) -> dict[str, Any]:
        return await self.request("send", target=target, content=content, **fields)

    async def history(self, target: str, **fields: Any) -> dict[str, Any]:
        return await self.request("history", target=target, **fields)


def daemon_over(session: FakeSession, frontier: Frontier | None = None) -> DaemonClient:
    return DaemonClient(cast(Client, session), frontier)


async def test_stale_queued_deliveries_are_acked_without_a_wake_other_events_kept() -> None:
    session = FakeSession(
        [
            deliver("d1", "scp_a", 1),
            {"type": "message", "scopeId": "scp_a", "message": {"seq": 1}},
            deliver("d2", "scp_a", 2),
            deliver("d3", "scp_b", 1),
            deliver("d2", "scp_a", 2),  # the outbox re-pushed it before the ack
            {"type": "readState", "scopeId": "scp_a", "lastReadSeq": 1},
        ]
    )
    frontier = Frontier()
    frontier.advance("scp_a", 1)
    daemon = daemon_over(session, frontier)
    with capture_logs() as logs:
        first = await daemon.next_wake()
    assert (first.delivery_id, first.target_seq) == ("d2", 2)
    assert session.requests == [("ack", {"deliveryId": "d1"})]
    assert daemon.suppressed == [
        {
            "deliveryId": "d1",
            "messageId": "msg_d1",
            "target": "scp_a",
            "targetKey": "scp_a",
            "targetSeq": 1,
            "observedSeq": 1,
            "latestKnownSeq": 1,
            "deliveryReason": "mention",
            "reason": "stale",
        }
    ]
    assert [entry["event"] for entry in logs] == ["delivery_suppressed"]
    assert (logs[0]["deliveryId"], logs[0]["reason"]) == ("d1", "stale")
    assert frontier.observed("scp_a") == 1  # returned, not yet handed to the runtime
    # The message event read on the way is still there for next_event.
    assert (await daemon.next_event())["type"] == "message"
    second = await daemon.next_wake()
    assert (second.delivery_id, second.target_key) == ("d3", "scp_b")
    # The repeat of d2 is dropped (still out with the runtime); the readState is kept.
    with pytest.raises(ConnectionClosed):
        await daemon.next_wake()
    assert (await daemon.next_event())["type"] == "readState"
    daemon.handed_to_runtime(first)
    assert frontier.observed("scp_a") == 2


async def test_a_delivery_that_goes_stale_in_the_queue_is_suppressed_at_dequeue() -> None:
    session = FakeSession([deliver("d5", "scp_a", 5), deliver("d6", "scp_a", 6)])
    daemon = daemon_over(session)
    # Both deliveries are read (queued) while looking for another event ...
    with pytest.raises(ConnectionClosed):
        await daemon.next_event()
    assert daemon.pending_deliveries() == 2
    # ... then the runtime reads history that covers the first one.
    session.answers.append({"targetKey": "scp_a", "coversThroughSeq": 5, "latestSeq": 6})
    await daemon.read_history("#a")
    assert (daemon.frontier.observed("scp_a"), daemon.frontier.latest_known("scp_a")) == (5, 6)
    assert (await daemon.next_wake()).delivery_id == "d6"
    assert [r[1] for r in session.requests if r[0] == "ack"] == [{"deliveryId": "d5"}]


async def test_one_reader_gets_wakes_and_events_in_arrival_order() -> None:
    session = FakeSession(
        [
            {"type": "message", "scopeId": "scp_a", "message": {"seq": 1}},
            deliver("d1", "scp_a", 1),
            deliver("d0", "scp_b", 1),
            {"type": "readState", "scopeId": "scp_a", "lastReadSeq": 1},
            deliver("d1", "scp_a", 1),  # a re-push while it is out with the runtime
        ]
    )
    frontier = Frontier()
    frontier.advance("scp_b", 1)
    daemon = daemon_over(session, frontier)
    got = [await daemon.next_wake_or_event() for _ in range(3)]
    assert [g.delivery_id if isinstance(g, Delivery) else g["type"] for g in got] == [
        "message",
        "d1",
        "readState",  # d0 was stale: acknowledged, never a wake
    ]
    assert session.requests == [("ack", {"deliveryId": "d0"})]
    with pytest.raises(ConnectionClosed):
        await daemon.next_wake_or_event()


async def test_a_failed_suppression_ack_keeps_the_delivery_for_the_next_call() -> None:
    overloaded = ClientError({"type": "error", "code": "overloaded", "retryable": True}, "ack")
    gone = ClientError({"type": "error", "code": "not_found"}, "ack")
    session = FakeSession([deliver("d1", "k", 1), deliver("d2", "k", 2)], [overloaded, {}, gone])
    frontier = Frontier()
    frontier.advance("k", 2)
    daemon = daemon_over(session, frontier)
    with pytest.raises(ClientError):
        await daemon.next_wake()
    assert daemon.pending_deliveries() == 1  # d1 is back in the queue
    with pytest.raises(ConnectionClosed):
        await daemon.next_wake()
    acks = [fields["deliveryId"] for op, fields in session.requests if op == "ack"]
    assert acks == ["d1", "d1", "d2"]
    assert [(r["deliveryId"], r.get("ack")) for r in daemon.suppressed] == [
        ("d1", None),
        ("d2", "not_found"),  # already consumed elsewhere: fine
    ]


def test_a_malformed_deliver_is_not_a_delivery() -> None:
    with pytest.raises(ValueError, match="malformed"):
        Delivery.from_event({"type": "deliver", "deliveryId": "d", "targetKey": "k"})


def test_chunk_ids_are_the_nodes_and_reserved_for_it() -> None:
    assert chunk_client_message_id("L", 2) == scope_state.chunk_client_message_id("L", 2) == "L#2"
    # A client never sends a row id itself: the node splits long content.
    assert client_message_id_error(chunk_client_message_id("L", 0)) is not None


def test_join_chunks_merges_rows_around_an_interloper() -> None:
    def row(seq: int, index: int, content: str) -> dict[str, Any]:
        return {"id": f"m{seq}", "seq": seq, "author": {"memberId": "a"}, "content": content,
                "metadata": {"chunk": {"index": index, "count": 3, "clientMessageId": "L"}}}  # fmt: skip

    other = {"id": "m2", "seq": 2, "author": {"memberId": "h"}, "content": "hi", "metadata": {}}
    merged = join_chunks([row(1, 0, "one "), other, row(3, 1, "two "), row(4, 2, "three")])
    assert [(m["id"], m["content"]) for m in merged] == [("m1", "one two three"), ("m2", "hi")]
    assert merged[0]["metadata"]["chunk"]["complete"] is True
    assert join_chunks([row(3, 1, "two ")])[0]["metadata"]["chunk"]["complete"] is False


async def test_partial_held_advances_observed_over_the_accepted_rows() -> None:
    partial = {"state": "partial_held", "targetKey": "k", "clientMessageId": "L", "latestSeq": 6,
               "needsRefreshUntilSeq": 6, "heldChunk": 1,
               "accepted": [{"messageId": "m5", "acceptedSeq": 5}]}  # fmt: skip
    session = FakeSession([], [partial])
    daemon = daemon_over(session)
    daemon.frontier.advance("k", 4)
    await daemon.send("#x", "long " * 10, target_key="k", client_message_id="L")
    assert (daemon.frontier.observed("k"), daemon.frontier.latest_known("k")) == (5, 6)
    (send,) = [fields for op, fields in session.requests if op == "send"]
    assert (send["clientMessageId"], send["freshness"]["seenUpToSeq"]) == ("L", 4)


# --- the reply helper over a scripted session ------------------------------------------


def held(seen: int, latest: int) -> dict[str, Any]:
    return {"state": "held", "targetKey": "k", "seenUpToSeq": seen, "latestSeq": latest,
            "needsRefreshUntilSeq": latest, "clientMessageId": "reply-d1"}  # fmt: skip


def sent(seq: int, state: str = "sent") -> dict[str, Any]:
    return {"state": state, "targetKey": "k", "messageId": f"m{seq}", "acceptedSeq": seq,
            "latestSeq": seq, "clientMessageId": "reply-d1"}  # fmt: skip


def page(*seqs: int) -> dict[str, Any]:
    return {"targetKey": "k", "messages": [{"seq": s, "content": f"#{s}"} for s in seqs],
            "coversThroughSeq": max(seqs), "latestSeq": max(seqs), "hasMore": False}  # fmt: skip


def ops(session: FakeSession) -> list[str]:
    return [op for op, _ in session.requests]


async def test_reply_held_refreshes_retries_then_acks() -> None:
    session = FakeSession([deliver("d1", "k", 3)], [held(3, 4), page(4), sent(5), {}])
    daemon = daemon_over(session)
    delivery = await daemon.next_wake()
    replied = await daemon.reply(delivery, "answer")
    assert (replied.state, replied.attempts, replied.acked, replied.message_id) == (
        "sent", 2, True, "m5",
    )  # fmt: skip
    assert ops(session) == ["send", "history", "send", "ack"]
    sends = [fields for op, fields in session.requests if op == "send"]
    assert [f["freshness"]["seenUpToSeq"] for f in sends] == [3, 4]  # observed: targetSeq, refresh
    assert {f["clientMessageId"] for f in sends} == {"reply-d1"}  # one id: retries are idempotent
    assert {f["target"] for f in sends} == {"scope:k"}
    assert session.requests[1][1]["afterSeq"] == 3
    assert daemon.frontier.observed("k") == 5


async def test_reply_gives_up_after_the_stated_attempts_without_acking() -> None:
    answers: list[Any] = []
    for i in range(REPLY_ATTEMPTS):
        answers += [held(3 + i, 4 + i), page(4 + i)]
    session = FakeSession([deliver("d1", "k", 3)], answers[:-1])
    daemon = daemon_over(session)
    delivery = await daemon.next_wake()
    with pytest.raises(ReplyNotSent) as caught:
        await daemon.reply(delivery, "answer")
    assert (caught.value.reason, caught.value.attempts) == ("held", REPLY_ATTEMPTS)
    assert caught.value.delivery is delivery
    assert "ack" not in ops(session)
    assert ops(session).count("send") == REPLY_ATTEMPTS


async def test_reply_revise_sees_the_newer_messages_and_may_withdraw() -> None:
    seen: list[list[dict[str, Any]]] = []

    async def revise(newer: list[dict[str, Any]]) -> str | None:
        seen.append(newer)
        return "revised" if len(seen) == 1 else None

    session = FakeSession([deliver("d1", "k", 3)], [held(3, 4), page(4), held(4, 5), page(5)])
    daemon = daemon_over(session)
    delivery = await daemon.next_wake()
    with pytest.raises(ReplyNotSent) as caught:
        await daemon.reply(delivery, "answer", revise=revise)
    assert caught.value.reason == "withdrawn"
    assert [[m["seq"] for m in newer] for newer in seen] == [[4], [5]]
    contents = [fields["content"] for op, fields in session.requests if op == "send"]
    assert contents == ["answer", "revised"]
    assert "ack" not in ops(session)


async def test_reply_retries_a_retryable_error_and_tolerates_a_consumed_delivery() -> None:
    limited = ClientError({"type": "error", "code": "rate_limited", "retryable": True,
                           "details": {"retryAfterMs": 1}}, "send")  # fmt: skip
    gone = ClientError({"type": "error", "code": "not_found"}, "ack")
    session = FakeSession([deliver("d1", "k", 3)], [limited, sent(4, "already_sent"), gone])
    daemon = daemon_over(session)
    delivery = await daemon.next_wake()
    replied = await daemon.reply(delivery, "answer")
    assert (replied.state, replied.attempts, replied.acked) == ("already_sent", 2, False)
    assert ops(session) == ["send", "send", "ack"]


async def test_reply_after_a_different_stored_answer_keeps_that_answer() -> None:
    conflict = ClientError({"type": "error", "code": "idempotency_conflict",
                            "details": {"messageId": "m4", "acceptedSeq": 4}}, "send")  # fmt: skip
    session = FakeSession([deliver("d1", "k", 3)], [conflict, {}])
    daemon = daemon_over(session)
    replied = await daemon.reply(await daemon.next_wake(), "second thoughts")
    assert (replied.state, replied.message_id, replied.acked) == ("already_sent", "m4", True)
    assert replied.result["differentContent"] is True
    assert ops(session) == ["send", "ack"]
    assert daemon.frontier.observed("k") == 4


async def test_reply_does_not_ack_when_the_node_refuses() -> None:
    forbidden = ClientError({"type": "error", "code": "forbidden"}, "send")
    session = FakeSession([deliver("d1", "k", 3)], [forbidden])
    daemon = daemon_over(session)
    with pytest.raises(ClientError):
        await daemon.reply(await daemon.next_wake(), "answer")
    assert ops(session) == ["send"]


# --- end to end ----------------------------------------------------------------------


def wake_rows(database_url: str, agent_id: str) -> list[tuple[int, str]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT target_seq, status FROM scope_fanout_outbox"
            " WHERE fanout_type = 'agent_wake' AND target_member_id = %s ORDER BY target_seq",
            (agent_id,),
        ).fetchall()
    return [(int(seq), str(status)) for seq, status in rows]


def daemon(world: World, person: Person, frontier: Frontier | None = None) -> Any:
    url = f"{world.node.url}?workspace={world.workspace_id}"
    return open_daemon(url, person.token, frontier=frontier)


async def test_reconnect_redelivers_exactly_the_unacked_in_order(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        async with world.client(human) as h:
            async with daemon(world, agent) as d:
                assert d.client.welcome["capabilities"] == ["ack", "freshness"]
                scope_id = await make_channel(h, "work", d.client)
                for i in range(3):
                    await h.send("#work", f"@helper task {i}")
                first = await d.next_wake(timeout=10)
                assert (first.target_key, first.target_seq, first.reason) == (
                    scope_id,
                    1,
                    "mention",
                )
                assert first.message["content"] == "@helper task 0"
                assert d.frontier.observed(scope_id) == 0  # received is not observed
                d.handed_to_runtime(first)
                await d.ack(first)
                assert d.frontier.observed(scope_id) == 1
                # The message events of the three sends were kept for next_event.
                events = await d.events_until(
                    lambda e: e["type"] == "message" and e["message"]["seq"] == 3, timeout=10
                )
                assert [e["message"]["seq"] for e in events if e["type"] == "message"] == [1, 2, 3]
            # A new DaemonClient with a fresh frontier, so that client-side
            # suppression cannot hide a redelivery of the acked one.
            async with daemon(world, agent) as again:
                redelivered = [await again.next_wake(timeout=10) for _ in range(2)]
                assert [(x.target_seq, x.message["content"]) for x in redelivered] == [
                    (2, "@helper task 1"),
                    (3, "@helper task 2"),
                ]
                # Nothing else is pending: a pong after the redelivery finds no delivery queued.
                await again.client.request("scopes")
                await again.client.send_raw('{"type":"ping","id":"after-redelivery"}')
                await again.events_until(lambda e: e["type"] == "pong", timeout=5)
                assert again.pending_deliveries() == 0
                assert again.suppressed == []
                for delivery in redelivered:
                    again.handed_to_runtime(delivery)
                    await again.ack(delivery)
            assert wake_rows(database_url, agent.id) == [(s, "delivered") for s in (1, 2, 3)]
            # Offline, one more wake queues up; redelivery is in target-seq order,
            # so it coming first proves none of the acked ones came back.
            await h.send("#work", "@helper marker")
            async with daemon(world, agent) as third:
                marker = await third.next_wake(timeout=10)
                assert (marker.target_seq, marker.message["content"]) == (4, "@helper marker")
                await third.ack(marker)


async def test_stale_redelivery_is_acked_and_dropped_without_a_wake(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        runtime = Frontier()  # the agent runtime outlives its daemon's connections
        async with world.client(human) as h:
            async with daemon(world, agent, runtime) as d:
                scope_id = await make_channel(h, "work", d.client)
                for i in range(3):
                    await h.send("#work", f"@helper task {i}")
                first = await d.next_wake(timeout=10)
                d.handed_to_runtime(first)
                await d.ack(first)
                # The runtime reads the channel: it has now seen seqs 2 and 3 too,
                # whose deliveries are still unacknowledged.
                page = await d.read_history("#work")
                assert [m["seq"] for m in page["messages"]] == [1, 2, 3]
                assert runtime.observed(scope_id) == 3
            assert wake_rows(database_url, agent.id) == [
                (1, "delivered"),
                (2, "pending"),
                (3, "pending"),
            ]
            await h.send("#work", "@helper something new")  # while offline
            async with daemon(world, agent, runtime) as again:
                with capture_logs() as logs:
                    fresh = await again.next_wake(timeout=10)
                # 2 and 3 were redelivered first (target-seq order) and suppressed.
                assert (fresh.target_seq, fresh.message["content"]) == (4, "@helper something new")
                assert [
                    (r["targetSeq"], r["observedSeq"], r["reason"]) for r in again.suppressed
                ] == [
                    (2, 3, "stale"),
                    (3, 3, "stale"),
                ]
                suppressed_logs = [e for e in logs if e["event"] == "delivery_suppressed"]
                assert [e["deliveryId"] for e in suppressed_logs] == [
                    r["deliveryId"] for r in again.suppressed
                ]
                assert {e["messageId"] for e in suppressed_logs}.isdisjoint({"", None})
                assert wake_rows(database_url, agent.id) == [
                    (1, "delivered"),
                    (2, "delivered"),
                    (3, "delivered"),
                    (4, "pending"),
                ]
                again.handed_to_runtime(fresh)
                await again.ack(fresh)
            await h.send("#work", "@helper marker")
            # A plain frontier this time: nothing of 2-4 comes back from the node.
            async with daemon(world, agent) as third:
                marker = await third.next_wake(timeout=10)
                assert marker.target_seq == 5
                assert third.suppressed == []
                await third.ack(marker)


async def test_send_uses_observed_held_records_the_hint_history_refreshes(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        async with world.client(human) as h, daemon(world, agent) as d:
            scope_id = await make_channel(h, "fresh", d.client)
            await h.send("#fresh", "some context")
            held = await d.send("#fresh", "my answer", target_key=scope_id)
            assert (held["state"], held["seenUpToSeq"], held["latestSeq"]) == ("held", 0, 1)
            assert (d.frontier.observed(scope_id), d.frontier.latest_known(scope_id)) == (0, 1)
            # Held again from the same observed frontier (a new clientMessageId).
            assert (await d.send("#fresh", "my answer", target_key=scope_id))["state"] == "held"
            page = await d.read_history("#fresh")
            assert page["coversThroughSeq"] == 1
            assert d.frontier.observed(scope_id) == 1
            sent = await d.send("#fresh", "my answer", target_key=scope_id)
            assert (sent["state"], sent["acceptedSeq"]) == ("sent", 2)
            assert d.frontier.observed(scope_id) == 2  # own acceptedSeq
            assert not d.frontier.needs_refresh(scope_id)
            replay = await d.send(
                "#fresh",
                "my answer",
                target_key=scope_id,
                client_message_id=sent["clientMessageId"],
            )
            assert (replay["state"], replay["messageId"]) == ("already_sent", sent["messageId"])
            # A message event the transport received is not runtime-visible.
            await h.send("#fresh", "more context")
            await d.events_until(
                lambda e: e["type"] == "message" and e["message"]["seq"] == 3, timeout=10
            )
            assert d.frontier.observed(scope_id) == 2
            held = await d.send("#fresh", "late answer", target_key=scope_id)
            assert (held["state"], held["seenUpToSeq"], held["latestSeq"]) == ("held", 2, 3)


async def test_reply_to_a_mention_survives_an_interjection(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        async with world.client(human) as h, daemon(world, agent) as d:
            scope_id = await make_channel(h, "work", d.client)
            await h.send("#work", "@helper what time is it?")
            delivery = await d.next_wake(timeout=10)
            await h.send("#work", "actually, never mind the time zone")
            replied = await d.reply(delivery, "noon")
            assert (replied.state, replied.attempts, replied.acked) == ("sent", 2, True)
            assert wake_rows(database_url, agent.id) == [(1, "delivered")]
            page = await h.history("#work")
            assert [m["content"] for m in page["messages"]] == [
                "@helper what time is it?",
                "actually, never mind the time zone",
                "noon",
            ]
            # The same reply again (a crash before the ack, say) is not a second answer.
            again = await d.reply(delivery, "noon")
            assert (again.state, again.message_id) == ("already_sent", replied.message_id)
            assert d.frontier.observed(scope_id) == 3


async def test_long_send_is_chunked_by_the_node_and_resumes_after_partial_hold(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER, row_limit=12) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        async with world.client(human) as h, daemon(world, agent) as d:
            scope_id = await make_channel(h, "long", d.client)
            await h.send("#long", "question")
            await d.read_history("#long")
            # Another member's send is queued just before the rest of the logical
            # send goes back to the actor's queue: row 1 is held.
            actor = node.services.registry.actor_nowait(scope_id)
            assert actor is not None

            def interleave(job: ChunkedSend) -> None:
                actor.before_requeue = None
                actor.submit_nowait(
                    SendCommand(
                        author=human.member,
                        content="interjection",
                        client_message_id="interjection",
                        reply=lambda result: None,
                    )
                )

            actor.before_requeue = interleave
            content = "one two three four five six"
            partial = await d.send("#long", content, target_key=scope_id, client_message_id="ans")
            assert (partial["state"], partial["heldChunk"], partial["latestSeq"]) == (
                "partial_held", 1, 3,
            )  # fmt: skip
            assert [row["acceptedSeq"] for row in partial["accepted"]] == [2]
            assert (d.frontier.observed(scope_id), d.frontier.latest_known(scope_id)) == (2, 3)
            newer = await d.refresh("#long", target_key=scope_id)
            assert [m["content"] for m in newer] == ["interjection"]
            done = await d.send("#long", content, target_key=scope_id, client_message_id="ans")
            assert done["state"] == "sent"
            assert [(c["acceptedSeq"], c["state"]) for c in done["chunks"]] == [
                (2, "already_sent"), (4, "sent"), (5, "sent"),
            ]  # fmt: skip
            assert d.frontier.observed(scope_id) == 5
            again = await d.send("#long", content, target_key=scope_id, client_message_id="ans")
            assert again["state"] == "already_sent"
            with psycopg.connect(database_url) as conn:
                ids = conn.execute(
                    "SELECT client_message_id FROM scope_messages WHERE scope_id = %s"
                    " AND author_member_id = %s ORDER BY seq",
                    (scope_id, agent.id),
                ).fetchall()
            assert [row[0] for row in ids] == [chunk_client_message_id("ans", i) for i in range(3)]
            history = await h.history("#long")
            assert [m["content"] for m in join_chunks(history["messages"])] == [
                "question",
                content,
                "interjection",
            ]


async def test_a_reconnecting_daemon_gets_each_unacked_delivery_back_once(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, outbox=QUIET_WORKER) as node:
        world = await World.create(node)
        human = await world.member("human")
        agent = await world.member("helper", MemberType.AGENT)
        async with world.client(human) as h, tcp_relay(node.services.port) as relay:
            url = f"{relay.url}?workspace={world.workspace_id}"
            fast = Backoff(base=0.05, cap=0.2, deadline=20)
            async with open_daemon(url, agent.token, reconnect=fast) as d:
                await make_channel(h, "work", d.client)
                for i in range(3):
                    await h.send("#work", f"@helper task {i}")
                first = await d.next_wake(timeout=10)
                d.handed_to_runtime(first)
                await d.ack(first)
                second = await d.next_wake(timeout=10)  # with the runtime, not acked
                relay.hold()
                assert relay.cut() == 1
                await h.send("#work", "@helper while away")
                relay.release()
                # Sent again on the next session, after the pending deliveries.
                d.handed_to_runtime(second)
                await d.ack(second)
                later = [await d.next_wake(timeout=10) for _ in range(2)]
                assert [x.message["content"] for x in later] == [
                    "@helper task 2",
                    "@helper while away",
                ]
                for delivery in later:
                    d.handed_to_runtime(delivery)
                    await d.ack(delivery)
                with pytest.raises(trio.TooSlowError):
                    await d.next_wake(timeout=1)
                assert isinstance(d.client, ReconnectingClient)
                assert len(d.client.welcomes) == 2
                # The node sent the unacked ones again; the runtime saw them once.
                dropped = {key for kind, key in d.client.repeats_dropped if kind == "deliver"}
                assert second.delivery_id in dropped
                assert first.delivery_id not in dropped
                assert dropped <= {second.delivery_id, later[0].delivery_id}
                assert d.suppressed == []
        assert wake_rows(database_url, agent.id) == [(s, "delivered") for s in (1, 2, 3, 4)]
