"""A missing tool is loud: under ``CI=true`` the test needing it fails and names
it; elsewhere it skips and the terminal summary names it.

Each case runs pytest in a subprocess on a generated test file that uses
:func:`tests.conftest.require_tool`, with a PATH that holds nothing at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The suite's conftest as the only plugin, wherever the generated file lives.
PYTEST = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider"]

NEEDS_CHROMIUM = """
import shutil

from tests.conftest import require_tool

needs_chromium = require_tool(
    "chromium", None if shutil.which("chromium") else "no chromium on PATH"
)
needs_nothing = require_tool("python", None)


@needs_chromium
def test_one_page() -> None:
    pass


@needs_chromium
def test_another_page() -> None:
    pass


@needs_nothing
def test_without_a_browser() -> None:
    pass
"""


def run_pytest(tmp_path: Path, *, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_generated.py").write_text(NEEDS_CHROMIUM)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PATH"] = str(empty_bin)
    env["PYTHONPATH"] = str(ROOT)
    # Only the plugin under test: the installed ones would just cost startup.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [*PYTEST, "-ra", "test_generated.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_missing_tool_fails_under_ci_and_names_it(tmp_path: Path) -> None:
    run = run_pytest(tmp_path, ci=True)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 passed, 2 errors" in out, out
    assert out.count("chromium is required under CI=true: no chromium on PATH") >= 2, out
    assert "skipped" not in out, out


def test_a_missing_tool_skips_elsewhere_and_the_summary_names_it(tmp_path: Path) -> None:
    run = run_pytest(tmp_path, ci=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "1 passed, 2 skipped" in out, out
    assert "skipped because a tool is missing: chromium (2 tests)" in out, out
