"""Guardrail: ``scope_messages`` is the only message fact table; no parallel
``space_*``-style tables (docs/guardrails.md#one-message-table)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ROOT, parallel_table_findings, plant, scratch_copy


def test_a_space_table_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    plant(root, "storage/schema_v18_services.sql", "CREATE TABLE space_events (\n    id text\n);")
    assert parallel_table_findings(root) == ["schema: space_events is a parallel space_* table"]


def test_a_second_message_table_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage")
    plant(
        root,
        "storage/schema_v17_tasks.sql",
        "CREATE TABLE task_comments (\n    id text PRIMARY KEY,\n    seq bigint NOT NULL,\n"
        "    author_member_id text NOT NULL,\n    content text NOT NULL\n);",
    )
    assert parallel_table_findings(root) == [
        "schema: task_comments holds messages beside scope_messages"
    ]


def test_the_tree_passes() -> None:
    assert parallel_table_findings(ROOT) == []
