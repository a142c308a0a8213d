"""Human table, JSON file and optional PNG plots of a bench run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from bench.stats import Latency


def flatten(d: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from flatten(value, name + ".")
        else:
            yield name, value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list):
        return "; ".join(str(v) for v in value) if value else "-"
    return "-" if value is None else str(value)


def table(title: str, d: dict[str, Any]) -> str:
    rows = list(flatten(d))
    if not rows:
        return ""
    width = max(len(k) for k, _ in rows)
    lines = [title, "-" * len(title)]
    lines += [f"  {k:<{width}}  {_fmt(v)}" for k, v in rows]
    return "\n".join(lines) + "\n"


def render(report: dict[str, Any]) -> str:
    parts = [
        table(f"results: {report['workload']}", report.get("results", {})),
        table("baseline (this machine, this run)", report.get("baseline", {})),
        table("ratios", report.get("ratios", {})),
        table(
            "cpu",
            {
                "generator_cpu_s": report.get("generator_cpu_s"),
                "node_cpu_s": report.get("node_cpu_s"),
            },
        ),
    ]
    return "\n".join(p for p in parts if p)


def write_json(path: str, report: dict[str, Any]) -> None:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=False)
        f.write("\n")


def plot(directory: str, workload: str, latencies: list[Latency]) -> list[str]:
    """One PNG per latency histogram: latency by percentile (HDR-style x axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    written = []
    for lat in latencies:
        if not lat.count:
            continue
        pcts = [50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0]
        xs = [1.0 / (1.0 - p / 100.0) if p < 100 else 1e5 for p in pcts]
        ys = [lat.percentile_ms(p) for p in pcts]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(xs, ys, marker="o")
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{p:g}%" for p in pcts], rotation=45)
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{workload}: {lat.name} (n={lat.count})")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = os.path.join(directory, f"{workload}-{lat.name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
