"""Guardrail: an ordinary message writes its own row, its projections and its
outbox rows; never one row per recipient, never a message-backed activity row
(docs/guardrails.md#dense-rows)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ROOT, dense_row_findings, plant, scratch_copy


def test_a_per_recipient_table_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    plant(
        root,
        "storage/schema_v1.sql",
        "CREATE TABLE scope_message_deliveries (\n"
        "    message_id text NOT NULL REFERENCES scope_messages (id),\n"
        "    recipient_member_id text NOT NULL REFERENCES members (id)\n"
        ");",
    )
    assert dense_row_findings(root) == [
        "schema: scope_message_deliveries.recipient_member_id keys a message row by member"
    ]


def test_a_message_backed_activity_kind_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    schema = root / "storage" / "schema_v1.sql"
    schema.write_text(schema.read_text().replace("'reaction_add', ", "'direct_mention', ", 1))
    assert dense_row_findings(root) == [
        "schema: scope_activity_events.activity_type allows 'direct_mention'"
    ]


def test_an_applier_activity_insert_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    plant(
        root,
        "storage/applier.py",
        'MENTIONED = "INSERT INTO scope_activity_events (id) VALUES (1)"',
    )
    [finding] = dense_row_findings(root)
    assert finding.endswith("a message write also inserts into scope_activity_events")


def test_the_tree_passes() -> None:
    assert dense_row_findings(ROOT) == []
