"""Guardrail: no eager inherited membership or notification rows for child
scopes (threads) of members who did not take part (docs/guardrails.md#threads)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ROOT, inherited_row_findings, plant, scratch_copy


def test_copying_the_parents_roster_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    plant(
        root,
        "storage/scopes.py",
        'SEED_THREAD = """\n'
        "INSERT INTO scope_memberships (scope_id, member_id, visibility, effective_from_seq)\n"
        "SELECT t.id, m.member_id, m.visibility, 1 FROM scopes t\n"
        "JOIN scope_memberships m ON m.scope_id = t.parent_scope_id\n"
        '"""',
    )
    [finding] = inherited_row_findings(root)
    assert finding.endswith("scope_memberships rows copied from another scope")


def test_copying_notification_settings_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    plant(
        root,
        "storage/scopes.py",
        'SEED_SETTINGS = """\n'
        "INSERT INTO scope_notification_settings (scope_id, member_id, state)\n"
        "SELECT %s, n.member_id, n.state FROM scope_notification_settings n\n"
        '"""',
    )
    [finding] = inherited_row_findings(root)
    assert finding.endswith("scope_notification_settings rows copied from another scope")


def test_the_tree_passes() -> None:
    assert inherited_row_findings(ROOT) == []
