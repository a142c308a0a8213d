"""RFC 6455 conformance of the node's WebSocket stack, judged by the Autobahn testsuite.

The suite's fuzzing client (``wstest -m fuzzingclient``, Python 2.7) runs its
framing, ping/pong, reserved bits and opcodes, fragmentation, UTF-8, closing
handshake, limits and auto-fragmentation cases against the echo application
of :mod:`tests.ws_echo_server`, which is the node's stack with an echo in
place of the request dispatch. The test reads the suite's JSON report and
fails on any case whose behaviour is not OK, NON-STRICT or INFORMATIONAL, or
whose close was not OK.

Left out, because the node never echoes them by contract: binary messages
(the protocol is JSON text; a binary message is answered with ``bad_frame``)
and messages over the node's frame limit (answered with ``payload_too_large``).

``wstest`` is found through ``WSTEST`` or under pyenv's Python 2.7
(``.ci/run`` installs it there). Without it the test is skipped with the
reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from fnmatch import fnmatch
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from node.config import Settings
from tests.conftest import tool_missing
from tests.ws_echo_server import PATH, serve_echo

AGENT = "scopenode"
RUN_TIMEOUT = 900.0
CASES = [
    "1.*",
    "2.*",
    "3.*",
    "4.*",
    "5.*",
    "6.*",
    "7.*",
    "9.1.*",
    "9.2.*",
    "9.3.*",
    "9.4.*",
    "10.*",
]
BINARY_CASES = ["1.2.*", "9.2.*", "9.4.*"]
# Message sizes of the limits cases (the suite's DATALEN of each).
MESSAGE_SIZES = {
    **{
        f"9.1.{i}": size
        for i, size in enumerate((64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20), 1)
    },
    **{f"9.3.{i}": 4 << 20 for i in range(1, 10)},
}
PASSING = {"OK", "NON-STRICT", "INFORMATIONAL"}
CLOSE_PASSING = {"OK", "INFORMATIONAL"}


def find_wstest() -> str | None:
    """``WSTEST``, the one under pyenv's Python 2.7 (where ``.ci/run`` installs it),
    or a ``wstest`` on the PATH (a pyenv shim there may point at no 2.7)."""
    if explicit := os.environ.get("WSTEST"):
        return explicit if os.access(explicit, os.X_OK) else None
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    if candidates := sorted(root.glob("versions/2.7*/bin/wstest")):
        return str(candidates[-1])
    return shutil.which("wstest")


def oversized_cases(limit: int) -> list[str]:
    return sorted(case for case, size in MESSAGE_SIZES.items() if size > limit)


def fuzzing_spec(url: str, outdir: Path, limit: int) -> dict[str, Any]:
    return {
        "outdir": str(outdir),
        "servers": [{"agent": AGENT, "url": url}],
        "cases": CASES,
        "exclude-cases": BINARY_CASES + oversized_cases(limit),
        "exclude-agent-cases": {},
    }


def judge(report: dict[str, dict[str, Any]]) -> list[str]:
    """The cases that did not pass, with the suite's verdicts."""
    return [
        f"{case}: behavior {result['behavior']}, close {result['behaviorClose']}"
        for case, result in sorted(report.items(), key=lambda item: case_key(item[0]))
        if result["behavior"] not in PASSING or result["behaviorClose"] not in CLOSE_PASSING
    ]


def case_key(case: str) -> tuple[int, ...]:
    return tuple(int(part) for part in case.split("."))


def test_judge_fails_every_verdict_but_the_passing_ones() -> None:
    report = {
        "1.1.1": {"behavior": "OK", "behaviorClose": "OK"},
        "6.4.3": {"behavior": "NON-STRICT", "behaviorClose": "OK"},
        "7.1.6": {"behavior": "INFORMATIONAL", "behaviorClose": "INFORMATIONAL"},
        "2.10": {"behavior": "FAILED", "behaviorClose": "OK"},
        "7.9.1": {"behavior": "OK", "behaviorClose": "WRONG CODE"},
        "5.1": {"behavior": "OK", "behaviorClose": "UNCLEAN"},
    }
    assert judge(report) == [
        "2.10: behavior FAILED, close OK",
        "5.1: behavior OK, close UNCLEAN",
        "7.9.1: behavior OK, close WRONG CODE",
    ]


def test_the_node_limit_excludes_only_larger_messages() -> None:
    assert oversized_cases(256 << 10) == [
        *(f"9.1.{i}" for i in range(3, 7)),
        *(f"9.3.{i}" for i in range(1, 10)),
    ]


@pytest.fixture
def wstest() -> str:
    """The suite's ``wstest``; skipped with the reason when absent, failed under CI."""
    found = find_wstest()
    if found is None:
        reason = (
            "the Autobahn testsuite (wstest, Python 2.7) is not installed: "
            "python2.7 -m pip install autobahntestsuite, or set WSTEST"
        )
        tool_missing("wstest", reason)
    return found


@pytest.mark.slow
async def test_autobahn_fuzzingclient_against_the_node_stack(wstest: str, tmp_path: Path) -> None:
    limit = Settings().max_frame_bytes
    outdir = tmp_path / "reports"
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_echo, 0))
        spec = fuzzing_spec(f"ws://127.0.0.1:{port}{PATH}", outdir, limit)
        (tmp_path / "fuzzingclient.json").write_text(json.dumps(spec))
        with trio.fail_after(RUN_TIMEOUT):
            run = await trio.run_process(
                [wstest, "-m", "fuzzingclient", "-s", "fuzzingclient.json"],
                cwd=tmp_path,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        nursery.cancel_scope.cancel()
    index = outdir / "index.json"
    assert index.exists(), run.stderr.decode(errors="replace")[-4000:]
    report: dict[str, dict[str, Any]] = json.loads(index.read_text())[AGENT]
    verdicts = Counter(result["behavior"] for result in report.values())
    print(f"autobahn: {len(report)} cases, {dict(verdicts)}")

    groups = {case.split(".")[0] for case in report}
    assert groups == {"1", "2", "3", "4", "5", "6", "7", "9", "10"}
    left_out = spec["exclude-cases"]
    assert not [case for case in report if any(fnmatch(case, out) for out in left_out)]
    assert judge(report) == []
