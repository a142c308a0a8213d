"""Guardrail: one mention parser, ``actors/mentions.py``; no second regex for
mentions anywhere (docs/guardrails.md#one-mention-parser)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ROOT, mention_findings, plant, scratch_copy


def test_a_python_mention_regex_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "actors", "node")
    plant(root, "node/ops/messages.py", '_MENTION = re.compile(r"@([a-z0-9_.-]+)")')
    [finding] = mention_findings(root)
    assert finding.startswith("node/ops/messages.py:")


def test_a_second_parser_function_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "actors", "node")
    plant(
        root, "actors/send_rules.py", "def parse_mentions(text: str) -> list[str]:\n    return []"
    )
    assert mention_findings(root) == ["actors/send_rules.py: a second mention parser"]


def test_a_web_client_mention_regex_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "actors", "node")
    plant(root, "node/web/format.js", "export const mentions = (t) => t.match(/@[a-z0-9_.-]+/g);")
    assert mention_findings(root) == [
        f"node/web/format.js:{len((root / 'node/web/format.js').read_text().splitlines())}: "
        "a mention regex /@[a-z0-9_.-]+/g"
    ]


def test_the_tree_passes() -> None:
    assert mention_findings(ROOT) == []
