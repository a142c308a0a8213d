"""Rounds of a workload against its baselines, the order rotated each round.

``send-latency``, ``throughput`` and ``fanout`` compare the node with the
machine's baselines (the raw send statement; the wsproto and Node.js ``ws``
fan-out servers). They run ``--rounds`` rounds, the baselines first in one
round and the node first in the next, so a machine whose speed drifts during
a run favours neither. A ratio is the median of the rounds' own ratios,
reported with its spread (min–max), and a verdict against its target:
``met`` (every round), ``not met`` (no round) or ``inside the noise``.

This module is pure: it combines the rounds' figures, it runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.stats import rotated, spread

PHASES = ("baseline", "node")

Figure = Callable[[dict[str, Any], dict[str, Any], int], float | None]


def _at(d: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return float(d) if isinstance(d, int | float) and not isinstance(d, bool) else None


def _per_ms(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(1000 * numerator / denominator, 3)


# Per workload, the figures each round reports: (results, baseline, senders) -> value.
FIGURES: dict[str, dict[str, Figure]] = {
    "send-latency": {
        "node_p50_ms": lambda res, base, n: _at(res, "latency", "p50_ms"),
        "node_p99_ms": lambda res, base, n: _at(res, "latency", "p99_ms"),
        "raw_p50_ms": lambda res, base, n: _at(base, "raw_tx", "sequential", "p50_ms"),
        "node_cpu_ms_per_send": lambda res, base, n: _per_ms(
            _at(res, "node_cpu_s"), _at(res, "sends")
        ),
    },
    "throughput": {
        "sends_per_s": lambda res, base, n: _at(res, "sends_per_s"),
        "raw_tx_per_s": lambda res, base, n: _at(base, "raw_tx", "concurrent", str(n), "tx_per_s"),
        "node_p50_ms": lambda res, base, n: _at(res, "latency", "p50_ms"),
        "node_cpu_ms_per_send": lambda res, base, n: _per_ms(
            _at(res, "node_cpu_s"), _at(res, "sends")
        ),
    },
    "fanout": {
        "deliveries_per_s": lambda res, base, n: _at(res, "deliveries_per_s"),
        "wsproto_deliveries_per_s": lambda res, base, n: _at(base, "ws_fanout", "deliveries_per_s"),
        "node_ws_deliveries_per_s": lambda res, base, n: _at(
            base, "node_ws_fanout", "deliveries_per_s"
        ),
        "delivery_p50_ms": lambda res, base, n: _at(res, "latency", "p50_ms"),
    },
}


def order_of(r: int) -> list[str]:
    """Round ``r``'s phase order: the baselines first in even rounds."""
    return rotated(list(PHASES), r)


def round_entry(
    workload: str,
    order: list[str],
    results: dict[str, Any],
    baseline: dict[str, Any],
    ratios: dict[str, Any],
    senders: int,
) -> dict[str, Any]:
    """One round's order, figures and ratios (``results`` carries ``node_cpu_s``)."""
    figures = {name: get(results, baseline, senders) for name, get in FIGURES[workload].items()}
    kept = {k: v for k, v in ratios.items() if is_ratio(k, v)}
    return {"order": order, "figures": figures, "ratios": kept}


def is_ratio(key: str, value: Any) -> bool:
    """A measured ratio (``target_…`` and ``stretch_…`` are the targets it is read against)."""
    if key.startswith(("target_", "stretch_")):
        return False
    return "_over_" in key and (value is None or isinstance(value, int | float))


def verdict(s: dict[str, float | None], *, low: float | None, high: float | None) -> str | None:
    """Where a ratio's spread lies against its target (``low``: at least, ``high``: at most)."""
    lo, hi = s["min"], s["max"]
    if lo is None or hi is None or (low is None and high is None):
        return None
    if low is not None:
        return "met" if lo >= low else "not met" if hi < low else "inside the noise"
    assert high is not None
    return "met" if hi <= high else "not met" if lo > high else "inside the noise"


# The target each headline ratio is read against: (ratio, key of its minimum, key of its maximum).
TARGETS: dict[str, tuple[str, str | None, str | None]] = {
    "send-latency": ("send_p50_over_raw_tx_p50", None, "target_max"),
    "throughput": ("sends_per_s_over_raw_tx_per_s", "target_min", None),
    "fanout": ("deliveries_over_node_ws", "target_min_over_node_ws", None),
}


def combine(
    workload: str, rounds: list[dict[str, Any]], last_ratios: dict[str, Any]
) -> dict[str, Any]:
    """The report's ``figures`` and ``ratios`` from its rounds: the median of
    every round's figure and ratio with its spread, and the headline ratio's
    verdict."""
    figures = {name: spread([r["figures"].get(name) for r in rounds]) for name in FIGURES[workload]}
    ratios: dict[str, Any] = {}
    for key, value in last_ratios.items():
        if is_ratio(key, value):
            s = spread([r["ratios"].get(key) for r in rounds])
            ratios[key] = s["median"]
            ratios[f"rounds_{key}"] = s
        else:
            ratios[key] = value
    headline, low_key, high_key = TARGETS[workload]
    if f"rounds_{headline}" in ratios:
        ratios["verdict"] = verdict(
            ratios[f"rounds_{headline}"],
            low=last_ratios.get(low_key) if low_key else None,
            high=last_ratios.get(high_key) if high_key else None,
        )
    return {"figures": figures, "ratios": ratios}
