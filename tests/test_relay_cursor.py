"""The relay's per-scope cursor stays bounded on a node that has no peers."""

from __future__ import annotations

from node.relay_delivery import UNANCHORED_KEPT, _Cursor


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
