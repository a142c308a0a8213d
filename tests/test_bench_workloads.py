"""Smoke runs of every bench workload against a real node (counts only, no timing).

One node with an embedded database serves the module; each workload runs
with ``--quick`` through ``bench.cli.main`` exactly as ``scopenode bench``
does, and the JSON report is checked for correct counts.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main
from bench.nodeproc import free_port
from bench.provision import scopenode_cmd
from bench.workloads import reactions

pytestmark = pytest.mark.slow


class NodeInfo:
    def __init__(self, url: str, data_dir: Path, pid: int) -> None:
        self.url = url
        self.data_dir = data_dir
        self.pid = pid


def _healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeInfo]:
    data_dir = tmp_path_factory.mktemp("bench-node")
    port = free_port()
    cmd = [*scopenode_cmd(), "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--data-dir", str(data_dir / "data")]
    with open(data_dir / "node.log", "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while not _healthy(port):
                assert proc.poll() is None, (data_dir / "node.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "node never became healthy"
                time.sleep(0.2)
            yield NodeInfo(f"ws://127.0.0.1:{port}", data_dir / "data", proc.pid)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def run_bench(node: NodeInfo, tmp_path: Path, workload: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / f"{workload}.json"
    argv = [workload, "--quick", "--no-progress", "--json", str(out)]
    argv += ["--url", node.url, "--data-dir", str(node.data_dir), "--node-pid", str(node.pid)]
    assert main([*argv, *extra]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["workload"] == workload
    assert report["generator_cpu_s"] is not None
    return report


def test_send_latency_sends_every_message_with_freshness(node: NodeInfo, tmp_path: Path) -> None:
    report = run_bench(node, tmp_path, "send-latency")
    results = report["results"]
    assert results["sends"] == 20
    assert results["states"] == {"sent": 20}
    assert results["latency"]["count"] == 20
    assert report["baseline"]["raw_tx"]["sequential"]["count"] > 0
    assert report["ratios"]["send_p50_over_raw_tx_p50"] is not None
    # --quick: two rounds, the baselines first in one and the node in the other.
    assert [r["order"][0] for r in report["rounds"]] == ["baseline", "node"]
    assert report["ratios"]["rounds_send_p50_over_raw_tx_p50"]["min"] is not None
    assert report["figures"]["node_p50_ms"]["max"] >= report["figures"]["node_p50_ms"]["min"]


def test_throughput_sends_without_errors(node: NodeInfo, tmp_path: Path) -> None:
    report = run_bench(node, tmp_path, "throughput")
    results = report["results"]
    assert results["sends"] > 0
    assert results["errors"] == {}
    assert results["states"] == {"sent": results["sends"]}
    assert report["ratios"]["sends_per_s_over_raw_tx_per_s"] is not None
    assert [r["order"][0] for r in report["rounds"]] == ["baseline", "node"]
    assert all(r["figures"]["raw_tx_per_s"] for r in report["rounds"])
    assert report["ratios"]["verdict"] in ("met", "not met", "inside the noise")


def test_throughput_with_a_pace_pauses_between_sends(node: NodeInfo, tmp_path: Path) -> None:
    # --quick: 4 senders, 400 sends at most, 2 s. Back to back they reach the
    # bound; with pauses of 100 ms on average each sends about 20.
    report = run_bench(node, tmp_path, "throughput", "--pace", "100", "--no-baseline")
    results = report["results"]
    assert results["pace_ms"] == 100
    assert results["errors"] == {}
    assert 0 < results["sends"] < 200


def test_fanout_delivers_every_message_to_every_reader(node: NodeInfo, tmp_path: Path) -> None:
    report = run_bench(node, tmp_path, "fanout")
    results = report["results"]
    assert results["complete"], results
    assert results["deliveries"] == results["expected_deliveries"] == 5 * 10
    assert report["baseline"]["ws_fanout"]["complete"]
    assert [r["order"][0] for r in report["rounds"]] == ["baseline", "node"]
    assert all(r["figures"]["wsproto_deliveries_per_s"] for r in report["rounds"])
    assert report["ratios"]["rounds_deliveries_over_wsproto_baseline"]["median"] is not None


def test_contention_keeps_seqs_gap_free_and_unique(node: NodeInfo, tmp_path: Path) -> None:
    report = run_bench(node, tmp_path, "contention")
    results = report["results"]
    assert results["verify"]["ok"], results["verify"]
    assert results["states"]["sent"] == 3 * 5
    assert results["verify"]["latest_seq"] >= 15


def test_reconnect_storm_resumes_every_session_without_gaps(node: NodeInfo, tmp_path: Path) -> None:
    report = run_bench(node, tmp_path, "reconnect-storm")
    results = report["results"]
    assert results["ok"], results
    assert results["resumed"] == 5


def test_idle_sessions_report_rss(node: NodeInfo, tmp_path: Path) -> None:
    report = run_bench(node, tmp_path, "idle")
    results = report["results"]
    assert results["connected"] == 10
    assert results["failed"] == 0
    assert results["kib_per_session"] is not None


def test_reactions_reach_every_reader_and_time_the_raw_statement(
    node: NodeInfo, tmp_path: Path
) -> None:
    report = run_bench(node, tmp_path, "reactions")
    results = report["results"]
    assert results["complete"], results
    assert results["errors"] == {}
    assert results["reactions"] > 0
    assert results["changed"] == {"True": results["reactions"]}
    assert results["deliveries"] == results["expected_deliveries"] == 3 * results["reactions"]
    assert results["delivery_latency"]["count"] == results["deliveries"]
    assert results["ping_round_trip"]["count"] == reactions.ROUNDS * reactions.PINGS
    # The phases take turns, the order rotated each round.
    orders = [r["order"] for r in results["rounds"]]
    assert orders[:2] == [["raw", "node"], ["node", "raw"]]
    assert results["rounds_node_over_raw_p50"]["median"] is not None
    raw = results["raw_statement"]
    assert raw["ok"]
    assert raw["count"] > 0
    assert raw["outcomes"] == {"changed": raw["count"]}
    assert report["ratios"]["reaction_p50_over_raw_statement_p50"] is not None


@pytest.mark.parametrize("events", ["inline", "thread"])
def test_the_relay_floor_answers_every_reaction_and_reaches_every_reader(
    node: NodeInfo, tmp_path: Path, events: str
) -> None:
    """``--relay-floor``: the same reactions through the bare relay, in every
    round, each change's event at every reader of the relay."""
    report = run_bench(node, tmp_path, "reactions", "--relay-floor", events)
    floor = report["results"]["relay_floor"]
    assert floor["events"] == events
    assert floor["count"] > 0
    # Every op of a sequence changes something (add, then remove, in turn).
    assert floor["changed"] == floor["count"]
    assert floor["deliveries"] == floor["expected_deliveries"] == 3 * floor["count"]
    assert report["ratios"]["relay_floor_p50_over_raw_statement_p50"] is not None
    assert {r["order"][0] for r in report["results"]["rounds"]} == {"raw", "node", "floor"}
    assert report["results"]["rounds_node_over_floor_p50"]["median"] is not None
