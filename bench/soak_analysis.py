"""What a soak's samples say: slopes, verdicts and acceptance figures (pure, no I/O).

A sample is one report interval of ``bench/soak.py``: a dict with ``t_s`` (the
interval's end, seconds since the load started), ``interval_s`` and one value
per figure (``None`` when the interval had nothing to measure).

Slopes are least squares over the post-warm-up samples, in units per 10 minutes.

Verdicts, per figure, over the post-warm-up samples (at least three):

* the *first* and *last window* are the first and last third of those samples
  (at least one each), compared by their medians; ``base`` is the first
  window's median, or the figure's floor when that is larger (a rise from
  0.3 ms to 0.6 ms, or from 0 to 4 pending outbox rows, is no trend);
* ``at_cap`` (RSS only, with a memory cap: ``--memory-cap-mb`` or the node's
  reported ceiling): every sample of the last window is
  within 5% of the cap and the last window itself rises by at most 5% of the
  cap — the node reached its ceiling and holds there;
* ``growing``: the least-squares rise over the measured span (slope × span)
  is more than ``band`` × base, and the last window's median exceeds the
  first's by more than ``band`` × base; both, so one spike or a slow drift
  inside the noise does not count;
* ``flat`` otherwise; ``unknown`` with fewer than three samples.

``band`` is 10% for resources (RSS, CPU per send, outbox, database size) and
50% for latencies, which are noisy at the scale of one interval.

Acceptance figures, scaled from the 30-minute definition: RSS at the end is at
most RSS at one third of the run (the sample nearest to it) + 15%, or RSS is
``at_cap``; CPU per send (node CPU over acked sends, summed) in the last
window of ``min(5 min, run / 6)`` is at most 1.15 × the same-length window
right after the warm-up; send and delivery p99 (median of the intervals' p99
in each window) last ≤ 1.5 × first; search p99 ≤ 300 ms and history p99 ≤
150 ms in every post-warm-up interval; acked sends reach 95% of the offered
sends (rate × run length). An interval belongs to a window when its midpoint
does.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Sample = dict[str, Any]

RESOURCE_BAND = 0.10
LATENCY_BAND = 0.50
CAP_NEAR = 0.05
RSS_GROWTH_MAX = 1.15
CPU_GROWTH_MAX = 1.15
P99_GROWTH_MAX = 1.5
SEARCH_P99_MAX_MS = 300.0
HISTORY_P99_MAX_MS = 150.0
MESSAGES_REACHED_MIN = 0.95
CPU_WINDOW_MAX_S = 300.0


@dataclass(frozen=True)
class Figure:
    key: str
    band: float
    floor: float


FIGURES: tuple[Figure, ...] = (
    Figure("rss_mib", RESOURCE_BAND, 1.0),
    Figure("cpu_per_send_ms", RESOURCE_BAND, 0.05),
    Figure("send_p50_ms", LATENCY_BAND, 2.0),
    Figure("send_p99_ms", LATENCY_BAND, 5.0),
    Figure("delivery_p50_ms", LATENCY_BAND, 2.0),
    Figure("delivery_p99_ms", LATENCY_BAND, 5.0),
    Figure("wake_p50_ms", LATENCY_BAND, 2.0),
    Figure("wake_p99_ms", LATENCY_BAND, 5.0),
    Figure("search_p50_ms", LATENCY_BAND, 2.0),
    Figure("search_p99_ms", LATENCY_BAND, 5.0),
    Figure("history_p50_ms", LATENCY_BAND, 2.0),
    Figure("history_p99_ms", LATENCY_BAND, 5.0),
    Figure("outbox_pending", RESOURCE_BAND, 20.0),
    Figure("db_size_mib", RESOURCE_BAND, 1.0),
)


@dataclass(frozen=True)
class Windows:
    """The run's acceptance points, in seconds since the load started."""

    third_s: float
    first: tuple[float, float]
    last: tuple[float, float]


def windows(run_s: float, warmup_s: float) -> Windows:
    length = min(CPU_WINDOW_MAX_S, run_s / 6)
    return Windows(run_s / 3, (warmup_s, warmup_s + length), (run_s - length, run_s))


def post_warmup(samples: Sequence[Sample], warmup_s: float) -> list[Sample]:
    return [s for s in samples if _mid(s) >= warmup_s]


def _mid(sample: Sample) -> float:
    return float(sample["t_s"]) - float(sample.get("interval_s", 0.0)) / 2


def _series(samples: Sequence[Sample], key: str) -> tuple[list[float], list[float]]:
    pairs = [(float(s["t_s"]), float(s[key])) for s in samples if s.get(key) is not None]
    return [t for t, _ in pairs], [v for _, v in pairs]


def slope_per_s(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope, or None with fewer than two distinct x."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def slope_per_10min(samples: Sequence[Sample], key: str) -> float | None:
    slope = slope_per_s(*_series(samples, key))
    return None if slope is None else round(slope * 600, 4)


def verdict(samples: Sequence[Sample], figure: Figure, cap: float | None = None) -> str:
    """``flat``, ``growing``, ``at_cap`` or ``unknown`` (module docstring)."""
    xs, ys = _series(samples, figure.key)
    if len(ys) < 3:
        return "unknown"
    w = max(1, len(ys) // 3)
    first, last = statistics.median(ys[:w]), statistics.median(ys[-w:])
    if cap is not None and _holds_at_cap(xs[-w:], ys[-w:], cap):
        return "at_cap"
    base = max(first, figure.floor)
    slope = slope_per_s(xs, ys) or 0.0
    rise = slope * (xs[-1] - xs[0])
    growing = rise > figure.band * base and last - first > figure.band * base
    return "growing" if growing else "flat"


def _holds_at_cap(xs: Sequence[float], ys: Sequence[float], cap: float) -> bool:
    if not all(y >= (1 - CAP_NEAR) * cap for y in ys):
        return False
    slope = slope_per_s(xs, ys) or 0.0
    return slope * (xs[-1] - xs[0]) <= CAP_NEAR * cap


def slopes_and_verdicts(
    samples: Sequence[Sample], warmup_s: float, rss_cap_mib: float | None
) -> tuple[dict[str, float | None], dict[str, str]]:
    measured = post_warmup(samples, warmup_s)
    slopes = {f.key: slope_per_10min(measured, f.key) for f in FIGURES}
    verdicts = {
        f.key: verdict(measured, f, rss_cap_mib if f.key == "rss_mib" else None) for f in FIGURES
    }
    return slopes, verdicts


def in_window(samples: Sequence[Sample], window: tuple[float, float]) -> list[Sample]:
    """The samples whose midpoint lies in ``[start, end)``; else the nearest one."""
    start, end = window
    inside = [s for s in samples if start <= _mid(s) < end]
    if inside or not samples:
        return inside
    centre = (start + end) / 2
    return [min(samples, key=lambda s: abs(_mid(s) - centre))]


def nearest(samples: Sequence[Sample], t_s: float) -> Sample | None:
    return min(samples, key=lambda s: abs(float(s["t_s"]) - t_s)) if samples else None


def cpu_per_send(samples: Sequence[Sample]) -> float | None:
    cpu = sum(float(s["node_cpu_s"]) for s in samples if s.get("node_cpu_s") is not None)
    sends = sum(int(s.get("sends", 0)) for s in samples)
    if not sends or not any(s.get("node_cpu_s") is not None for s in samples):
        return None
    return cpu * 1000 / sends


def median_of(samples: Sequence[Sample], key: str) -> float | None:
    values = [float(s[key]) for s in samples if s.get(key) is not None]
    return statistics.median(values) if values else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def _value(sample: Sample | None, key: str) -> float | None:
    value = None if sample is None else sample.get(key)
    return None if value is None else float(value)


def _check(name: str, value: float | None, limit: float, ok: bool | None) -> dict[str, Any]:
    return {"name": name, "value": value, "limit": limit, "pass": bool(ok)}


@dataclass(frozen=True)
class RunFacts:
    run_s: float
    warmup_s: float
    rss_cap_mib: float | None
    offered_sends: int
    acked_sends: int


def acceptance(
    samples: Sequence[Sample], facts: RunFacts, rss_verdict: str
) -> list[dict[str, Any]]:
    """The acceptance figures with pass/fail (module docstring)."""
    win = windows(facts.run_s, facts.warmup_s)
    first, last = in_window(samples, win.first), in_window(samples, win.last)
    third, end = nearest(samples, win.third_s), samples[-1] if samples else None
    rss = _ratio(_value(end, "rss_mib"), _value(third, "rss_mib"))
    cpu = _ratio(cpu_per_send(last), cpu_per_send(first))
    measured = post_warmup(samples, facts.warmup_s)
    checks = [
        _check(
            "rss_end_over_third",
            rss,
            RSS_GROWTH_MAX,
            rss_verdict == "at_cap" or (rss is not None and rss <= RSS_GROWTH_MAX),
        ),
        _check(
            "cpu_per_send_last_over_first",
            cpu,
            CPU_GROWTH_MAX,
            cpu is None or cpu <= CPU_GROWTH_MAX,
        ),
    ]
    for key in ("send_p99_ms", "delivery_p99_ms"):
        r = _ratio(median_of(last, key), median_of(first, key))
        checks.append(
            _check(f"{key}_last_over_first", r, P99_GROWTH_MAX, r is None or r <= P99_GROWTH_MAX)
        )
    for key, limit in (
        ("search_p99_ms", SEARCH_P99_MAX_MS),
        ("history_p99_ms", HISTORY_P99_MAX_MS),
    ):
        worst = max((float(s[key]) for s in measured if s.get(key) is not None), default=None)
        checks.append(_check(f"{key}_max", worst, limit, worst is None or worst <= limit))
    reached = _ratio(facts.acked_sends, facts.offered_sends)
    checks.append(
        _check(
            "sends_reached",
            reached,
            MESSAGES_REACHED_MIN,
            reached is not None and reached >= MESSAGES_REACHED_MIN,
        )
    )
    return checks


def analyse(samples: Sequence[Sample], facts: RunFacts) -> dict[str, Any]:
    """``{"slopes_per_10min", "verdicts", "acceptance"}`` of a finished run."""
    slopes, verdicts = slopes_and_verdicts(samples, facts.warmup_s, facts.rss_cap_mib)
    return {
        "windows": dataclasses.asdict(windows(facts.run_s, facts.warmup_s)),
        "slopes_per_10min": slopes,
        "verdicts": verdicts,
        "acceptance": acceptance(samples, facts, verdicts["rss_mib"]),
    }
