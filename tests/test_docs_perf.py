"""docs/performance.md is the current state: short, and every run it names is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "performance.md"
PERF = ROOT / "docs" / "perf"
MAX_LINES = 400
MAX_FILES = 30

# A path under docs/perf/ as the page writes it: `docs/perf/DAY/NAME.json`,
# a folder (`…/soak/`) or a brace list (`cluster-{1,2,3}.json`).
NAMED = re.compile(r"docs/perf/[\w./{},-]+")


def named_paths(text: str) -> list[Path]:
    paths: list[Path] = []
    for match in NAMED.findall(text):
        found = match.rstrip(".,")
        if braces := re.search(r"\{([^}]*)\}", found):
            head, tail = found[: braces.start()], found[braces.end() :]
            paths.extend(ROOT / (head + item + tail) for item in braces.group(1).split(","))
        else:
            paths.append(ROOT / found)
    return paths


def test_the_page_is_short() -> None:
    lines = PAGE.read_text().count("\n")
    assert lines <= MAX_LINES, f"docs/performance.md has {lines} lines"


def test_every_run_the_page_names_exists() -> None:
    paths = named_paths(PAGE.read_text())
    assert any(p.suffix == ".json" for p in paths), "the page names no run"
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert not missing, missing


def test_the_runs_kept_are_the_ones_behind_the_page() -> None:
    files = [p for p in PERF.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, f"{len(files)} files under docs/perf"
    named = named_paths(PAGE.read_text())
    unnamed = [
        str(f.relative_to(ROOT)) for f in files if not any(f == p or p in f.parents for p in named)
    ]
    assert not unnamed, f"kept but not named on the page: {unnamed}"


def test_named_paths_reads_every_form() -> None:
    text = "see `docs/perf/d/a.json`, docs/perf/d/soak/ and `docs/perf/d/c-{1,2}.json`."
    assert named_paths(text) == [
        ROOT / "docs/perf/d/a.json",
        ROOT / "docs/perf/d/soak/",
        ROOT / "docs/perf/d/c-1.json",
        ROOT / "docs/perf/d/c-2.json",
    ]
