"""A workload's rounds against its baselines, combined (pure: no node, no database)."""

from __future__ import annotations

from typing import Any

from bench.cli import ratios
from bench.rounds import combine, order_of, round_entry, verdict


def _send_round(r: int, node_p50: float, raw_p50: float) -> dict[str, Any]:
    results = {"latency": {"p50_ms": node_p50, "p99_ms": 2 * node_p50}, "sends": 100}
    baseline = {"raw_tx": {"sequential": {"p50_ms": raw_p50}}}
    found = ratios("send-latency", results, baseline)
    measured = results | {"node_cpu_s": 0.05}
    return round_entry("send-latency", order_of(r), measured, baseline, found, 1)


def test_the_order_rotates_so_each_phase_goes_first_equally_often() -> None:
    orders = [order_of(r) for r in range(4)]
    assert orders == [["baseline", "node"], ["node", "baseline"]] * 2


def test_a_ratio_is_the_median_of_the_rounds_ratios_with_its_spread() -> None:
    rounds = [
        _send_round(0, 1.5, 1.0),  # 1.5
        _send_round(1, 3.0, 1.0),  # 3.0
        _send_round(2, 1.8, 1.0),  # 1.8
    ]
    assert [r["order"][0] for r in rounds] == ["baseline", "node", "baseline"]
    assert rounds[0]["figures"]["node_cpu_ms_per_send"] == 0.5
    last = ratios("send-latency", {"latency": {"p50_ms": 1.8}}, {"raw_tx": {}})
    out = combine("send-latency", rounds, last)
    spread = out["ratios"]["rounds_send_p50_over_raw_tx_p50"]
    # The median of the rounds' ratios, not the last round's (None here).
    assert out["ratios"]["send_p50_over_raw_tx_p50"] == 1.8
    assert spread == {"median": 1.8, "min": 1.5, "max": 3.0}
    # Target at most 2.0: the spread crosses it.
    assert out["ratios"]["verdict"] == "inside the noise"
    assert out["figures"]["node_p50_ms"] == {"median": 1.8, "min": 1.5, "max": 3.0}
    assert out["figures"]["raw_p50_ms"]["median"] == 1.0
    # Targets are carried as they are, not taken for ratios of the rounds.
    assert out["ratios"]["target_max"] == 2.0
    assert "rounds_target_max" not in out["ratios"]


def test_a_verdict_reads_the_whole_spread_against_the_target() -> None:
    s = {"median": 1.2, "min": 1.1, "max": 1.3}
    assert verdict(s, low=1.0, high=None) == "met"
    assert verdict(s, low=1.4, high=None) == "not met"
    assert verdict(s, low=1.25, high=None) == "inside the noise"
    assert verdict(s, low=None, high=1.3) == "met"
    assert verdict(s, low=None, high=1.0) == "not met"
    assert verdict(s, low=None, high=None) is None


def test_a_fanout_target_named_like_a_ratio_stays_a_target() -> None:
    results = {"deliveries_per_s": 300.0}
    baseline = {
        "ws_fanout": {"deliveries_per_s": 400.0},
        "node_ws_fanout": {"deliveries_per_s": 100.0},
    }
    found = ratios("fanout", results, baseline)
    rounds = [round_entry("fanout", order_of(0), results, baseline, found, 1)]
    out = combine("fanout", rounds, found)
    assert out["ratios"]["deliveries_over_node_ws"] == 3.0
    assert out["ratios"]["target_min_over_node_ws"] == 2.0
    assert "rounds_target_min_over_node_ws" not in out["ratios"]
    assert out["ratios"]["verdict"] == "met"
