"""``scopenode bench search-team --quick``: a team's corpus built through sends,
searched by two viewers while a writer keeps sending."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main
from bench.search_team import CLASSES


@pytest.mark.slow  # builds a corpus through a node: with the other bench runs
@pytest.mark.runs_for(20)
def test_quick_search_team_reports_every_class_over_a_threaded_corpus(tmp_path: Path) -> None:
    out = tmp_path / "search-team.json"
    started = time.monotonic()
    assert main(["search-team", "--quick", "--json", str(out)]) == 0
    assert time.monotonic() - started < 120  # a bound on a hang, on a shared machine
    report: dict[str, Any] = json.loads(out.read_text())
    corpus = report["corpus"]
    assert corpus["complete"]
    assert corpus["acked_sends"] == report["params"]["messages"]
    # A team's shape: threads (more thread scopes than channels) and DMs.
    assert corpus["thread_scopes"] > corpus["channels"] == 20
    assert corpus["thread_messages"] > 0
    assert corpus["dm_messages"] > 0
    assert all(v["readable_threads"] > 0 for v in report["viewers"])
    measurement = report["measurement"]
    assert measurement["complete"]
    assert measurement["messages_at_end"] >= measurement["messages_at_start"] >= corpus["messages"]
    assert measurement["writer"]["acked_sends"] > 0
    assert set(report["classes"]) == set(CLASSES)
    for cls, per_viewer in report["classes"].items():
        assert len(per_viewer) == 2, cls
        for figures in per_viewer.values():
            assert figures["count"] > 0, cls
            assert 0 < figures["p50_ms"] <= figures["p99_ms"], cls
            assert figures["round_p50_min_ms"] <= figures["round_p50_max_ms"], cls
    # Common words and the placed ones are found; a word that occurs nowhere is not.
    for cls in ("common", "cjk", "emoji", "history"):
        assert all(f["hits_median"] > 0 for f in report["classes"][cls].values()), cls
    assert all(f["hits_median"] == 0 for f in report["classes"]["nowhere"].values())
