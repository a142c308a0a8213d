"""The relay's per-scope cursor: bounded on a node that has no peers, and
holding a local commit behind another node's earlier seqs (even the first one
to a scope, whose notification may still be on its way)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from node.relay_delivery import UNANCHORED_KEPT, Delivery, _Cursor
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
