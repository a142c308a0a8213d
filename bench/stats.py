"""Latency histograms, CPU accounting and machine description."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from hdrh.histogram import HdrHistogram

# Latencies are recorded in microseconds, 1 µs … 10 min, 3 significant digits.
_LOWEST_US = 1
_HIGHEST_US = 600_000_000
_SIG = 3


class Latency:
    """An HDR histogram of latencies recorded in nanoseconds, reported in ms."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hist = HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIG)

    def record_ns(self, ns: int) -> None:
        us = ns // 1000
        self.hist.record_value(min(max(us, _LOWEST_US), _HIGHEST_US))

    def add_encoded(self, encoded: bytes) -> None:
        """Merge a histogram produced by :meth:`encode` in another process."""
        if encoded:
            self.hist.decode_and_add(encoded)

    def encode(self) -> bytes:
        return bytes(self.hist.encode()) if self.count else b""

    @property
    def count(self) -> int:
        return int(self.hist.get_total_count())

    def percentile_ms(self, p: float) -> float:
        return round(self.hist.get_value_at_percentile(p) / 1000.0, 3) if self.count else 0.0

    def summary(self) -> dict[str, float | int]:
        """``{"count", "p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms"}``."""
        if not self.count:
            return {"count": 0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        return {
            "count": self.count,
            "p50_ms": self.percentile_ms(50),
            "p95_ms": self.percentile_ms(95),
            "p99_ms": self.percentile_ms(99),
            "max_ms": round(self.hist.get_max_value() / 1000.0, 3),
            "mean_ms": round(self.hist.get_mean_value() / 1000.0, 3),
        }


def own_cpu_s() -> float:
    """CPU time (user + system) of this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def children_cpu_s() -> float:
    """CPU time of reaped children of this process."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu_s(pid: int) -> float | None:
    """CPU time of a live process from ``/proc/<pid>/stat`` (utime + stime), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    # Fields after the parenthesised command name; utime and stime are fields 14, 15.
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class MachineCpu:
    """The whole machine's CPU use over a window, from ``/proc/stat``.

    ``busy`` is the share of all cores' time spent neither idle nor waiting for
    I/O: a point near 1.0 is bound by CPU, one well below it by waiting.
    ``cpu_s`` is that time in CPU-seconds (busy × cores × elapsed).
    """

    def __init__(self) -> None:
        self._start = _proc_stat()

    def stop(self) -> dict[str, float] | None:
        end = _proc_stat()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return None
        total = end[0] - self._start[0]
        idle = end[1] - self._start[1]
        busy = 1.0 - idle / total
        return {
            "busy": round(busy, 3),
            "cpu_s": round((total - idle) / os.sysconf("SC_CLK_TCK"), 3),
        }


def _proc_stat() -> tuple[int, int] | None:
    """All cores' jiffies so far: (total, idle + iowait)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal; guest time is inside user.
    return sum(fields[:8]), fields[3] + fields[4]


def proc_rss_kib(pid: int) -> int | None:
    """Resident set size (VmRSS) of a live process in KiB, or None."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit as far as the hard limit allows; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


T = TypeVar("T")


def rotated(items: Sequence[T], r: int) -> list[T]:
    """``items`` started at place ``r``: over ``len(items)`` rounds every item
    takes every place once (a Latin square), so a machine that speeds up or
    slows down during a run favours none of them."""
    k = r % len(items) if items else 0
    return [*items[k:], *items[:k]]


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """The median, min and max of per-round figures (rounds without one left out)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {
        "median": round(statistics.median(known), 3),
        "min": round(min(known), 3),
        "max": round(max(known), 3),
    }


def ratio_spread(
    rounds: Sequence[dict[str, Any]], numerator: str, denominator: str
) -> dict[str, float | None]:
    """The spread of ``numerator / denominator`` over the rounds that have both."""
    return spread(
        [
            r[numerator] / r[denominator] if r.get(numerator) and r.get(denominator) else None
            for r in rounds
        ]
    )
