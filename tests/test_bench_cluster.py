"""Smoke run of ``scopenode bench cluster`` with tiny counts (counts only, no timing).

One node, then two nodes behind the real HAProxy on the test database, run
through ``bench.cli.main`` exactly as ``scopenode bench cluster`` does; the
JSON report is checked for complete deliveries, where the sessions went and a
failover in which every dropped session came back on the surviving node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main

pytestmark = pytest.mark.slow

SENDS = 8
SESSIONS = 6
SENDERS = 2


def test_cluster_bench_phases_sessions_and_failover(database_url: str, tmp_path: Path) -> None:
    """One bench run (the slow set hands tests out one by one: a run shared
    through a module fixture would be repeated on every worker), checked for
    its phases, its sessions per node and its failover."""
    report = _run(database_url, tmp_path)
    _check_phases(report)
    _check_sessions_per_node(report)
    _check_failover(report)


def _run(database_url: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "cluster.json"
    argv = ["cluster", "--nodes", "1,2", "--quick", "--no-progress", "--json", str(out)]
    argv += ["--database-url", database_url, "--messages", str(SENDS)]
    argv += ["--sessions", str(SESSIONS), "--senders", str(SENDERS), "--notify-samples", "10"]
    assert main(argv) == 0
    loaded: dict[str, Any] = json.loads(out.read_text())
    assert loaded["workload"] == "cluster"
    assert loaded["results"]["sizes"] == [1, 2]
    return loaded


def _check_phases(report: dict[str, Any]) -> None:
    by_nodes = report["results"]["by_nodes"]
    one, two = by_nodes["1"], by_nodes["2"]
    for size in (one, two):
        assert size["raw_notify"]["count"] == size["raw_notify_paced"]["count"] == 10
        delivery = size["delivery"]
        assert delivery["complete"], delivery
        assert delivery["sends"] == delivery["same_node"]["count"] == SENDS
        throughput = size["throughput"]
        assert throughput["errors"] == {}
        assert throughput["proxy"]["sends"] > 0
        assert throughput["direct"]["sends"] > 0
        assert sum(throughput["senders_per_node"].values()) == SENDERS
    assert one["delivery"]["cross_node"] is None
    assert one["target"] is None
    assert two["delivery"]["cross_node"]["count"] == SENDS
    assert two["delivery"]["relay_read"]["count"] == SENDS
    assert two["delivery"]["relay_read_lean"]["count"] == SENDS
    assert isinstance(two["target"]["met"], bool)
    assert report["ratios"] == {"2": two["target"]}


def _check_sessions_per_node(report: dict[str, Any]) -> None:
    for n, size in report["results"]["by_nodes"].items():
        sessions = size["sessions"]
        assert sessions["connected"] == SESSIONS
        assert len(sessions["per_node_welcome"]) == int(n)
        assert sum(sessions["per_node_welcome"].values()) == SESSIONS
        assert sessions["per_node_metrics"] == sessions["per_node_welcome"]


def _check_failover(report: dict[str, Any]) -> None:
    by_nodes = report["results"]["by_nodes"]
    assert by_nodes["1"]["failover"] is None
    failover = by_nodes["2"]["failover"]
    assert failover["ok"], failover
    dropped = failover["sessions_dropped"]
    assert dropped == by_nodes["2"]["sessions"]["per_node_welcome"][failover["killed"]] > 0
    assert failover["sessions_back"] == failover["per_session"]["count"] == dropped
    assert failover["killed"] not in failover["moved_to"]
    assert sum(failover["moved_to"].values()) == dropped
    assert failover["all_back_ms"] > 0
