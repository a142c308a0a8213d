"""The curve's point from its rounds (pure: no node, no database)."""

from __future__ import annotations

from typing import Any

from bench.curve import _combine


def _round(sends_per_s: float, raw: float, *, sends: int, load: list[float]) -> dict[str, Any]:
    return {
        "senders_per_scope": 1,
        "senders": 4,
        "scopes": 4,
        "sends": sends,
        "sends_per_s": sends_per_s,
        "raw_tx_per_s": raw,
        "ratio": round(sends_per_s / raw, 3),
        "p50_ms": 1000 * 4 / sends_per_s,
        "node_cpu_ms_per_send": None,
        "statements": sends // 2,
        "errors": {"unavailable": 1} if sends == 300 else {},
        "load_avg_1m": load,
        "at": "00:00:00",
    }


def test_a_point_reports_the_median_round_ratio_and_summed_counts() -> None:
    rounds = [
        _round(1000.0, 2000.0, sends=100, load=[0.5, 0.6]),  # 0.5
        _round(1500.0, 1000.0, sends=200, load=[0.6, 0.7]),  # 1.5
        _round(900.0, 1000.0, sends=300, load=[0.7, 0.9]),  # 0.9
    ]
    point = _combine(rounds)
    # The median of the rounds' ratios, not the ratio of the medians
    # (1000 / 1000 = 1.0).
    assert point["ratio"] == 0.9
    assert point["sends_per_s"] == 1000.0
    assert point["raw_tx_per_s"] == 1000.0
    assert point["sends"] == 600
    assert point["statements"] == 300
    assert point["errors"] == {"unavailable": 1}
    assert point["load_avg_1m"] == [0.5, 0.9]
    assert point["node_cpu_ms_per_send"] is None
    assert (point["senders"], point["scopes"]) == (4, 4)
    assert point["rounds"] == rounds


def test_one_round_is_the_point_itself() -> None:
    only = _round(1000.0, 2000.0, sends=100, load=[0.5, 0.6])
    assert _combine([only]) == only


def test_the_send_relay_takes_only_scopes_without_a_statement_in_flight() -> None:
    """A lane of the bare relay takes every queued request of a free scope and
    leaves those of a scope with a statement in flight for later."""
    from bench.relayfloor import SendRelay

    relay = SendRelay([], [{"latest_seq": 0}] * 3)
    relay.queue = [(0, 10), (1, 11), (0, 12)]
    assert relay._take() == [(0, 10), (1, 11), (0, 12)]
    relay.queue = [(0, 13), (2, 14)]
    assert relay._take() == [(2, 14)]
    assert relay.queue == [(0, 13)]
    relay.busy.discard(0)
    assert relay._take() == [(0, 13)]
