"""The relay's per-scope cursor: bounded on a node that has no peers,
holding a local commit behind another node's earlier seqs (even the first one
to a scope, whose notification may still be on its way), and not skipping
this node's own commit whose publish comes after another node's next seq."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
import trio

from actors.model import Member, MemberType, StoredMessage
from node.relay_delivery import IN_FLIGHT_S, UNANCHORED_KEPT, Delivery, _Cursor
from storage import relay as relay_sql


def test_a_cursor_without_a_frontier_keeps_only_the_newest_local_seqs() -> None:
    cursor = _Cursor(None)
    for seq in range(1, 25_001):
        cursor.add((seq,))
    assert len(cursor.above) <= UNANCHORED_KEPT
    assert cursor.has(25_000)
    assert cursor.has(25_000 - UNANCHORED_KEPT // 2 + 1)
    assert not cursor.has(1)


def test_another_nodes_range_anchors_the_cursor_above_its_local_seqs() -> None:
    cursor = _Cursor(None)
    for seq in range(1, 1001):
        cursor.add((seq,))
    cursor.add((1003,))  # this node's commit after another node's 1001-1002
    cursor.start_at(1000)
    assert cursor.missing(1003) == [1001, 1002]
    cursor.add((1001, 1002))
    assert cursor.frontier == 1003
    assert not cursor.above


class _Hub:
    def member_ids(self, workspace_id: str | None = None) -> list[str]:
        return ["mem_reader"]


@asynccontextmanager
async def _reading() -> AsyncIterator[Any]:
    yield None


def _delivery(jobs: list[tuple[Any, ...]], flushed: list[str]) -> Delivery:
    delivery = Delivery(_Hub(), _reading, jobs.append)  # type: ignore[arg-type]

    async def messages(scope_id: str, first: int, last: int, *, force: bool) -> None:
        assert (first, last, force) == (0, 0, True)
        flushed.append(scope_id)

    delivery.messages = messages  # type: ignore[method-assign]
    return delivery


async def test_a_first_local_commit_waits_for_another_nodes_recent_seqs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another node committed 2 (its notification still on the way) just before
    this node's first commit to the scope, 3. The 3 is held; the anchor starts
    the cursor below 2, so sessions here get 2 and then 3."""
    jobs: list[tuple[Any, ...]] = []
    flushed: list[str] = []
    delivery = _delivery(jobs, flushed)
    assert not delivery.committed_here("scp_a", [3], alone=False)
    assert jobs == [("anchor", "scp_a", 3)]

    async def first_recent_seq(conn: Any, scope_id: str, below: int, **_: Any) -> int | None:
        return 2 if (scope_id, below) == ("scp_a", 3) else None

    monkeypatch.setattr(relay_sql, "first_recent_seq", first_recent_seq)
    await delivery.anchor("scp_a", 3)
    assert flushed == ["scp_a"]
    cursor = delivery._cursors["scp_a"]
    assert cursor.missing(3) == [2, 3]


async def test_a_local_commit_after_another_nodes_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two nodes write one scope: this node handed out 1–7 itself, another node
    committed 8 (its notification still on the way), this node commits 9. The
    9 waits for 8, so sessions here get 8 before 9."""
    jobs: list[tuple[Any, ...]] = []
    delivery = _delivery(jobs, [])

    async def nothing_recent(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(relay_sql, "first_recent_seq", nothing_recent)
    assert not delivery.committed_here("scp_a", [1], alone=False)
    await delivery.anchor("scp_a", 1)
    delivery._cursors["scp_a"].add((1,))  # what the anchor's flush pushes
    for seq in range(2, 8):
        assert delivery.committed_here("scp_a", [seq], alone=False)
    assert not delivery.committed_here("scp_a", [9], alone=False)
    assert jobs == [("anchor", "scp_a", 1), ("flush", "scp_a")]


_NOW = datetime(2026, 1, 1, tzinfo=UTC)
_AUTHOR = Member("mem_r1", "wks_a", MemberType.HUMAN, "r1", "r1")


class _Session:
    member_id = "mem_r1"
    is_daemon = False

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def deliver_events(self, scope_id: str, events: list[tuple[int, bytes]]) -> None:
        self.seqs.extend(seq for seq, _ in events)


class _ReaderHub(_Hub):
    def __init__(self, session: _Session) -> None:
        self.session = session
        self.events_published = 0

    def member_ids(self, workspace_id: str | None = None) -> list[str]:
        return [self.session.member_id]

    def sessions_of(self, member_id: str) -> set[_Session]:
        return {self.session} if member_id == self.session.member_id else set()

    def observe_delivery(self, created: Any) -> None:
        list(created)


def _rows(first: int, last: int, readers: Sequence[str]) -> list[relay_sql.RelayedMessage]:
    return [
        relay_sql.RelayedMessage(
            StoredMessage(f"msg_{seq}", "scp_a", seq, seq, _AUTHOR, "text", "x", _NOW),
            tuple(readers),
            (),
            "1:",
        )
        for seq in range(first, last + 1)
        if seq in (1, 2)  # what the scope holds
    ]


class _Node:
    """One node's delivery over a scope holding seqs 1 and 2 (``recent``: the
    first the database calls recent), with a session of a reader. ``publish``
    is what Hub.publish_messages does with this node's own commit of 1, run at
    the ``publish_at``-th read of the database (every read is a point where the
    actor's task, woken by the commit's reply, may run it), or by the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, recent: int | None) -> None:
        self.session = _Session()
        self.jobs: list[tuple[Any, ...]] = []
        self.reads = 0
        self.publish_at: int | None = None
        self.published = False
        self.margins: list[float] = []
        self.delivery = Delivery(_ReaderHub(self.session), self._reading, self.jobs.append)  # type: ignore[arg-type]

        async def first_recent_seq(
            conn: Any, scope_id: str, below: int, *, margin_s: float, **_: Any
        ) -> int | None:
            self.margins.append(margin_s)
            return recent if recent is not None and recent < below else None

        async def readers_in_range(
            conn: Any, scope_id: str, first: int, last: int, candidates: Sequence[str]
        ) -> list[relay_sql.RelayedMessage]:
            return _rows(first, last, candidates)

        async def messages_in_range(
            conn: Any, scope_id: str, first: int, last: int
        ) -> list[relay_sql.RelayedMessage]:
            return _rows(first, last, ())

        monkeypatch.setattr(relay_sql, "first_recent_seq", first_recent_seq)
        monkeypatch.setattr(relay_sql, "readers_in_range", readers_in_range)
        monkeypatch.setattr(relay_sql, "messages_in_range", messages_in_range)

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[Any]:
        self.reads += 1
        if self.reads == self.publish_at and not self.published:
            self.publish()
        await trio.lowlevel.checkpoint()
        yield None

    def publish(self) -> None:
        self.published = True
        if self.delivery.committed_here("scp_a", [1], alone=False):
            self.session.deliver_events("scp_a", [(1, b"")])

    async def drain(self) -> None:
        """The relay's process loop: one job after the other, in order."""
        while self.jobs:
            kind, scope_id, *args = self.jobs.pop(0)
            if kind == "msg":
                await self.delivery.messages(scope_id, args[0], args[1], force=False)
            elif kind == "flush":
                await self.delivery.messages(scope_id, 0, 0, force=True)
            else:
                assert kind == "anchor"
                await self.delivery.anchor(scope_id, args[0])

    async def hear_then_publish(self) -> list[int]:
        """Another node's notification of 2, and this node's publish of 1 when
        ``publish_at`` says; the seqs the session got. The nursery (gap timers)
        is cancelled as soon as the jobs are done: nothing waits for one."""
        async with trio.open_nursery() as nursery:
            self.delivery.nursery = nursery
            if self.publish_at == 0:
                self.publish()
            self.jobs.append(("msg", "scp_a", 2, 2))
            await self.drain()
            if not self.published:
                self.publish()
                await self.drain()
            nursery.cancel_scope.cancel()
        return self.session.seqs


@pytest.mark.parametrize(
    "publish_at", [0, 1, 2, None], ids=["before", "at_read_1", "at_read_2", "after"]
)
async def test_a_local_commit_below_another_nodes_first_relayed_seq_reaches_sessions_once_in_order(
    monkeypatch: pytest.MonkeyPatch, publish_at: int | None
) -> None:
    """This node committed 1, then another node 2, and 2's notification is the
    first this node hears of the scope; this node's hub publishes 1 when the
    commit's reply is back: before 2 is handled, while the relay waits for its
    first or second read of the database, or after it pushed 2. Sessions here
    get 1 and then 2, each once."""
    node = _Node(monkeypatch, recent=1)
    node.publish_at = publish_at
    assert await node.hear_then_publish() == [1, 2]


async def test_a_local_commit_below_where_the_cursor_started_is_pushed_late_not_never(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The database found nothing recent below 2 (this node's publish of 1 came
    later than the in-flight margin): 1 is taken for handed, and when its
    publish does come the hub pushes it, out of order rather than never."""
    node = _Node(monkeypatch, recent=None)
    assert await node.hear_then_publish() == [2, 1]


async def test_a_new_cursor_looks_back_no_further_than_the_node_has_tracked_every_seq(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seqs written before the node joined (or while it was alone) were in the
    sessions' first reads or pushed by the hub: the in-flight margin stops at
    that moment, so they are not pushed again."""
    node = _Node(monkeypatch, recent=1)
    node.delivery.tracked_since = trio.current_time() - 2.0
    await node.hear_then_publish()
    (margin,) = node.margins
    assert 2.0 <= margin < 3.0 < IN_FLIGHT_S
