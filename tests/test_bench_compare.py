"""Smoke run of ``scopenode bench compare`` (counts only, no timing).

Two nodes of its own per run, so it sits in a file apart from
``tests/test_bench_own_nodes.py``: files run whole on one worker each, and the
two together were the slow set's longest stretch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main

pytestmark = pytest.mark.slow


@pytest.mark.runs_for(25)
@pytest.mark.parametrize("op", ["react", "send", "throughput"])
def test_compare_measures_both_nodes_in_alternating_blocks(op: str, tmp_path: Path) -> None:
    """``scopenode bench compare``: two nodes (B with another setting), every
    block counted on both sides, CPU per op and the per-block ratio reported."""
    out = tmp_path / "compare.json"
    argv = ["compare", "--op", op, "--blocks", "2", "--per", "20", "--readers", "2"]
    argv += ["--duration", "0.5", "--b-env", "SCOPENODE_COMMIT_LANES=1", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["blocks"] == 2
    for side in ("a", "b"):
        assert report[side]["ops"] > 0
        assert report[side]["node_cpu_ms_per_op"] is not None
    cpu = report["b_over_a_cpu_per_op_spread"]
    assert cpu["min"] <= report["b_over_a_cpu_per_op_median"] <= cpu["max"]
    if op == "throughput":
        assert report["b_over_a_sends_per_s_median"] > 0
        rate = report["b_over_a_sends_per_s_spread"]
        assert rate["min"] <= report["b_over_a_sends_per_s_median"] <= rate["max"]
    else:
        assert report["a"]["ops"] == report["b"]["ops"] == 40
        assert report["a"]["p50_ms"] > 0
