"""``scopenode bench soak``: the pure analysis, a short smoke run, and a planted leak.

The smoke run starts its own node (as ``scopenode bench soak`` does without
``--url``); the slow test starts ``tests/leaky_node.py``, a node that keeps
~20 KB per send forever, and expects the soak to call its RSS ``growing``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import soak_analysis as sa
from bench.cli import main
from bench.nodeproc import free_port
from node.limits import RAISED_LIMITS_ENV

ROOT = Path(__file__).resolve().parent.parent
LEAK_BYTES = 20 * 1024  # tests/leaky_node.py (not imported: importing it patches the node)
LEAK_RUN_S = 30  # sampled every 2.5 s: the leak's slope is some 25 % over its own rate


def series(values: list[float], every_s: float = 30.0, key: str = "rss_mib") -> list[sa.Sample]:
    return [{"t_s": (i + 1) * every_s, "interval_s": every_s, key: v} for i, v in enumerate(values)]


def figure(key: str) -> sa.Figure:
    return next(f for f in sa.FIGURES if f.key == key)


def test_a_steadily_growing_series_is_growing() -> None:
    rng = random.Random(1)
    samples = series([200 + 3 * i + rng.gauss(0, 2) for i in range(60)])
    assert sa.verdict(samples, figure("rss_mib")) == "growing"
    slope = sa.slope_per_10min(samples, "rss_mib")
    assert slope is not None
    assert 55 < slope < 65  # 3 MiB per 30 s


def test_a_flat_noisy_series_is_flat() -> None:
    rng = random.Random(2)
    samples = series([200 + rng.gauss(0, 4) for _ in range(60)])
    assert sa.verdict(samples, figure("rss_mib")) == "flat"


def test_noisy_latencies_use_the_looser_band() -> None:
    rng = random.Random(3)
    samples = series([max(1.0, 40 + rng.gauss(0, 12)) for _ in range(60)], key="send_p99_ms")
    assert sa.verdict(samples, figure("send_p99_ms")) == "flat"
    doubled = series([40 + 1.5 * i for i in range(60)], key="send_p99_ms")
    assert sa.verdict(doubled, figure("send_p99_ms")) == "growing"


def test_a_series_that_reaches_the_cap_and_holds_is_at_cap() -> None:
    rng = random.Random(4)
    values = [min(500.0, 200 + 15 * i) + rng.gauss(0, 2) for i in range(60)]
    samples = series([min(v, 500.0) for v in values])
    assert sa.verdict(samples, figure("rss_mib"), cap=500.0) == "at_cap"
    assert sa.verdict(samples, figure("rss_mib")) == "growing"
    # Far below the cap, the same rise is growth.
    assert sa.verdict(samples, figure("rss_mib"), cap=2000.0) == "growing"


def test_too_few_samples_are_unknown() -> None:
    assert sa.verdict(series([1.0, 2.0]), figure("rss_mib")) == "unknown"


def test_acceptance_windows_of_a_30_minute_run() -> None:
    w = sa.windows(1800, 120)
    assert w.third_s == 600
    assert w.first == (120, 420)
    assert w.last == (1500, 1800)
    samples = series([100.0] * 60)
    assert [s["t_s"] for s in sa.in_window(samples, w.first)] == [150 + 30 * i for i in range(10)]
    assert [s["t_s"] for s in sa.in_window(samples, w.last)] == [1530 + 30 * i for i in range(10)]


def test_acceptance_windows_of_a_3_minute_run() -> None:
    w = sa.windows(180, 18)
    assert w.third_s == 60
    assert w.first == (18, 48)
    assert w.last == (150, 180)
    samples = series([100.0] * 18, every_s=10)
    assert [s["t_s"] for s in sa.in_window(samples, w.first)] == [30, 40, 50]
    assert [s["t_s"] for s in sa.in_window(samples, w.last)] == [160, 170, 180]
    assert sa.nearest(samples, w.third_s) == samples[5]


def _run_samples(rss: list[float], cpu_last: float) -> list[sa.Sample]:
    samples = series(rss, every_s=10)
    for i, s in enumerate(samples):
        s.update(sends=400, node_cpu_s=cpu_last if i >= 15 else 1.0)
        s.update(send_p99_ms=20.0, delivery_p99_ms=30.0, search_p99_ms=50.0, history_p99_ms=20.0)
    return samples


def _accepted(samples: list[sa.Sample], verdict: str = "flat") -> dict[str, bool]:
    facts = sa.RunFacts(180, 18, None, offered_sends=7000, acked_sends=7020)
    return {a["name"]: a["pass"] for a in sa.acceptance(samples, facts, verdict)}


def test_acceptance_passes_a_steady_run_and_fails_growth() -> None:
    assert all(_accepted(_run_samples([300.0] * 18, 1.0)).values())
    grown = _accepted(_run_samples([300.0 + 10 * i for i in range(18)], 1.3))
    assert not grown["rss_end_over_third"]
    assert not grown["cpu_per_send_last_over_first"]
    assert grown["send_p99_ms_last_over_first"]
    # At the cap, growth up to it is accepted.
    capped = _accepted(_run_samples([300.0 + 10 * i for i in range(18)], 1.0), "at_cap")
    assert capped["rss_end_over_third"]


def test_acceptance_checks_every_interval_for_search_and_history() -> None:
    samples = _run_samples([300.0] * 18, 1.0)
    samples[9]["search_p99_ms"] = 301.0
    assert not _accepted(samples)["search_p99_ms_max"]
    assert _accepted(samples)["history_p99_ms_max"]


@pytest.mark.slow  # a real half-minute run: with the other bench runs, not in the default suite
@pytest.mark.runs_for(35)
def test_smoke_soak_against_a_node_it_starts(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    started = time.monotonic()
    assert main(["soak", "--minutes", "0.4", "--report-every", "5", "--json", str(out)]) == 0
    # A bound on a hang, not a timing: setting up the team takes 10 s alone
    # when the slow set's other benches share the machine.
    assert time.monotonic() - started < 120
    report: dict[str, Any] = json.loads(out.read_text())
    assert len(report["samples"]) >= 4
    assert all(check["ok"] for check in report["checks"].values()), report["checks"]
    assert report["checks"]["acked_stored_once"]["acked"] > 300
    assert report["totals"]["resumes"] > 0
    assert set(report["verdicts"]) == {f.key for f in sa.FIGURES}
    assert report["samples"][-1]["rss_mib"] is not None


@pytest.fixture
def leaky_node(tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    port = free_port()
    data_dir = tmp_path / "data"
    cmd = [sys.executable, "-m", "tests.leaky_node", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--data-dir", str(data_dir), "--log-level", "warning"]
    env = {**RAISED_LIMITS_ENV, **os.environ}
    with open(tmp_path / "node.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(port, proc, tmp_path / "node.log")
            yield f"ws://127.0.0.1:{port}", proc.pid, data_dir
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    import http.client

    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "leaky node never became healthy"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.runs_for(35)
def test_soak_calls_a_planted_leak_growing(
    leaky_node: tuple[str, int, Path], tmp_path: Path
) -> None:
    url, pid, data_dir = leaky_node
    out = tmp_path / "soak.json"
    argv = ["soak", "--minutes", str(LEAK_RUN_S / 60), "--report-every", "2.5", "--strict"]
    argv += ["--json", str(out)]
    argv += ["--url", url, "--node-pid", str(pid), "--data-dir", str(data_dir)]
    assert main(argv) == 1
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["verdicts"]["rss_mib"] == "growing"
    # The node grows by itself too (scope actors); the leak alone must show in the slope.
    sends_per_s = report["totals"]["acked_sends"] / LEAK_RUN_S
    leak_mib_per_10min = sends_per_s * 600 * LEAK_BYTES / 2**20
    assert report["slopes_per_10min"]["rss_mib"] > 0.8 * leak_mib_per_10min, report["samples"]
    rss = next(a for a in report["acceptance"] if a["name"] == "rss_end_over_third")
    assert rss["pass"] is False, rss
    assert all(check["ok"] for check in report["checks"].values()), report["checks"]
