"""Smoke run of ``scopenode bench cluster`` with tiny counts (counts only, no timing).

One node, then two nodes behind the real HAProxy on the test database, run
through ``bench.cli.main`` exactly as ``scopenode bench cluster`` does; the
JSON report is checked for complete deliveries, where the sessions went and a
failover in which every dropped session came back on the surviving node.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.cli import main
from storage.pg import dsn_for_database

# The module's tests share one bench run (or node): under ``--dist loadgroup``
# (the slow set in CI) they stay in one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench_cluster")]

SENDS = 8
SESSIONS = 6
SENDERS = 2


@pytest.fixture(scope="module")
def module_database_url(pg_server_dsn: str, schema_template: str) -> Iterator[str]:
    """One database with the schema for the module's one bench run; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex}"
    create = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(create.format(sql.Identifier(name), sql.Identifier(schema_template)))
    try:
        yield dsn_for_database(pg_server_dsn, name)
    finally:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(drop.format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def report(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    database_url = module_database_url
    out = tmp_path_factory.mktemp("bench-cluster") / "cluster.json"
    argv = ["cluster", "--nodes", "1,2", "--quick", "--no-progress", "--json", str(out)]
    argv += ["--database-url", database_url, "--messages", str(SENDS)]
    argv += ["--sessions", str(SESSIONS), "--senders", str(SENDERS), "--notify-samples", "10"]
    assert main(argv) == 0
    loaded: dict[str, Any] = json.loads(out.read_text())
    assert loaded["workload"] == "cluster"
    assert loaded["results"]["sizes"] == [1, 2]
    return loaded


def test_cluster_bench_measures_every_phase_at_each_size(report: dict[str, Any]) -> None:
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


def test_cluster_bench_counts_sessions_per_node(report: dict[str, Any]) -> None:
    for n, size in report["results"]["by_nodes"].items():
        sessions = size["sessions"]
        assert sessions["connected"] == SESSIONS
        assert len(sessions["per_node_welcome"]) == int(n)
        assert sum(sessions["per_node_welcome"].values()) == SESSIONS
        assert sessions["per_node_metrics"] == sessions["per_node_welcome"]


def test_cluster_bench_failover_brings_every_dropped_session_back(report: dict[str, Any]) -> None:
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
