"""Smoke runs of the bench workloads that start nodes of their own (counts only, no timing).

Each runs through ``bench.cli.main`` (or the workload's own ``main``) exactly as
``scopenode bench`` does; they sit apart from ``tests/test_bench_workloads.py``
so that they run next to its shared node, not after it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main

pytestmark = pytest.mark.slow


def test_bench_starts_and_stops_its_own_node(tmp_path: Path) -> None:
    out = tmp_path / "own.json"
    argv = ["send-latency", "--quick", "--no-progress", "--no-baseline", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["node_started_by_bench"] is True
    assert report["node_cpu_s"] is not None
    assert report["results"]["sends"] == 20
    assert 0.0 < report["machine_cpu"]["busy"] <= 1.0
    assert report["machine_cpu"]["cpu_s"] >= report["node_cpu_s"]


@pytest.mark.runs_for(55)
def test_curve_reports_every_point_with_its_raw_statement_and_machine_cpu(
    tmp_path: Path,
) -> None:
    """``throughput --curve``: both series, each point against the raw statement
    at its concurrency, with the machine's CPU for both phases, in two rounds
    (the node first in the second), and through the bare send relay (one
    sender alone: the raw statement; two on one scope: the group statement);
    the table renders every point."""
    from bench.curve import render

    out = tmp_path / "curve.json"
    argv = ["throughput", "--curve", "1,2", "--duration", "1", "--db-duration", "1"]
    argv += ["--rounds", "2", "--members", "2", "--relay-floor", "--no-progress"]
    assert main([*argv, "--json", str(out)]) == 0
    curve = json.loads(out.read_text())["results"]["curve"]
    shapes = [(p["senders_per_scope"], p["senders"]) for p in curve["points"]]
    assert shapes == [(1, 1), (1, 2), (2, 2)]
    for point in curve["points"]:
        assert point["sends"] > 0
        assert point["errors"] == {}
        assert point["ratio"] is not None
        assert 0.0 < point["machine_busy"] <= 1.0
        assert 0.0 < point["raw_machine_busy"] <= 1.0
        assert point["machine_cpu_ms_per_send"] >= point["node_cpu_ms_per_send"] > 0
        assert point["raw_machine_cpu_ms_per_tx"] > 0
        assert len(point["rounds"]) == 2
        assert point["sends"] == sum(r["sends"] for r in point["rounds"])
        assert point["floor_sends_per_s"] > 0
        assert point["floor_ratio"] is not None
        assert point["node_over_floor"] is not None
        assert [r["order"][0] for r in point["rounds"]] == ["raw", "node"]
        assert point["ratio_spread"]["min"] <= point["ratio"] <= point["ratio_spread"]["max"]
        assert point["floor_sends_per_statement"] >= 1.0
    table = render(curve)
    assert len(table.splitlines()) == 2 + len(curve["points"])
    assert "machine busy" in table


def test_search_bench_runs_every_class_and_both_send_phases(tmp_path: Path) -> None:
    """``scopenode bench search`` on a tiny corpus: every query of every class
    answered through the node and raw, and sends timed with and without the
    text indexes."""
    from bench import search

    out = tmp_path / "search.json"
    argv = ["--messages", "3000", "--scopes", "10", "--members", "8", "--queries", "3"]
    argv += ["--sends", "16", "--data-dir", str(tmp_path / "data"), "--json", str(out)]
    assert search.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["viewer_has_scopes"]
    assert set(report["search"]) == {"rare", "common", "phrase", "cjk"}
    assert all(c["queries"] == 3 and c["node_p50_ms"] > 0 for c in report["search"].values())
    assert all(c["raw_in_viewer_scopes_p50_ms"] > 0 for c in report["search"].values())
    for timed in report["search"].values():
        # Three queries: three rounds of one, each phase first once.
        assert [r["order"][0] for r in timed["rounds"]] == ["raw", "kept", "node"]
        spread = timed["rounds_node_over_kept_p50"]
        assert spread["min"] <= spread["median"] <= spread["max"]
    assert len(report["sends_per_s"]["with_index"]) == search.SEND_ROUNDS
    assert len(report["sends_per_s"]["without_index"]) == search.SEND_ROUNDS
    sends = report["sends_per_s"]
    assert sends["ratio"] == sends["rounds_ratio"]["median"]
    assert sends["rounds_ratio"]["min"] <= sends["ratio"] <= sends["rounds_ratio"]["max"]
