"""``scopenode bench noisy-neighbour --quick``: a flooder at the default limits,
a neighbour's sends timed with and without it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main
from bench.noisy import documented_limits
from node.limits import SEND_RATE_ENV


def test_the_documented_limits_ignore_the_raised_environment() -> None:
    # The suite's environment raises every limit (tests/conftest.py).
    assert os.environ[SEND_RATE_ENV] == "1000000"
    limits = documented_limits()
    assert limits["send_rate"] < 1000
    assert limits["read_rate"] < limits["request_rate"]
    assert limits["workspace_send_rate"] > limits["send_rate"]
    assert os.environ[SEND_RATE_ENV] == "1000000"


@pytest.mark.slow  # starts a node and floods it for a dozen seconds
@pytest.mark.runs_for(24)
def test_quick_noisy_neighbour_holds_the_flooder_to_the_default_limits(tmp_path: Path) -> None:
    out = tmp_path / "noisy.json"
    started = time.monotonic()
    assert main(["noisy-neighbour", "--quick", "--json", str(out)]) == 0
    assert time.monotonic() - started < 150  # a bound on a hang, on a shared machine
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["node_started_by_bench"]
    assert report["limits"] == documented_limits()
    neighbour = report["neighbour"]
    assert neighbour["never_refused"] == {"ok": True}
    assert len(neighbour["rounds"]) == report["params"]["rounds"] == 2
    assert [r["first"] for r in neighbour["rounds"]] == ["quiet", "flood"]
    for condition in ("quiet", "flood"):
        figures = neighbour[condition]
        # Two rounds of two seconds at two sends a second.
        assert 5 <= figures["count"] <= 11, figures
        assert 0 < figures["p50_ms"] <= figures["p99_ms"], figures
    assert neighbour["p50_ratio"] > 0
    spread = neighbour["rounds_p99_ratio"]
    assert spread["min"] <= spread["median"] <= spread["max"]
    flooder = report["flooder"]
    assert flooder["sessions_open"] == {"ok": True, "at_end": 4}
    for kind, rate in (("sends", "send_rate"), ("searches", "read_rate")):
        figures = flooder[kind]
        assert figures["within_bucket"]["ok"], figures
        assert figures["limit_per_s"] == report["limits"][rate]
        assert figures["refused"] > 0, figures
        assert figures["errors"] == {}, figures
        # Held to the bucket's rate once it is empty (a loaded machine may
        # answer a little late, never more).
        assert 0.8 <= figures["sustained_over_limit"] <= 1.05, figures
