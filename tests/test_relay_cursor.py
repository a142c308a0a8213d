"""The relay's per-scope cursor: bounded on a node that has no peers, and
holding a local commit behind another node's earlier seqs."""

from __future__ import annotations

from typing import Any

from node.relay_delivery import UNANCHORED_KEPT, Delivery, _Cursor


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


def test_a_local_commit_after_another_nodes_waits_for_it() -> None:
    """Two nodes write one scope: this node handed out 1–7 itself, another node
    committed 8 (its notification still on the way), this node commits 9. The
    9 waits for 8, so sessions here get 8 before 9."""
    jobs: list[tuple[Any, ...]] = []
    delivery = Delivery(None, None, jobs.append)  # type: ignore[arg-type]
    for seq in range(1, 8):
        assert delivery.committed_here("scp_a", [seq], alone=False)
    assert not delivery.committed_here("scp_a", [9], alone=False)
    assert jobs == [("flush", "scp_a")]
