"""Guardrail: every message write goes through the Applier; no other module
inserts into ``scope_messages`` or the outbox (docs/guardrails.md#applier)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ROOT, applier_findings, plant, scratch_copy


def test_a_second_message_writer_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage", "node")
    plant(
        root,
        "storage/scopes.py",
        'POST_NOTICE = """\nINSERT INTO scope_messages (id, scope_id, seq) VALUES (%s, %s, %s)\n"""',
    )
    [finding] = applier_findings(root)
    assert finding.startswith("storage/scopes.py:")
    assert finding.endswith("INSERT INTO scope_messages outside the Applier")


def test_a_second_outbox_writer_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage", "node")
    plant(root, "storage/outbox.py", 'REQUEUE = "INSERT INTO scope_fanout_outbox (id) VALUES (1)"')
    [finding] = applier_findings(root)
    assert finding.endswith("INSERT INTO scope_fanout_outbox outside the Applier")


def test_the_tree_passes() -> None:
    assert applier_findings(ROOT) == []
