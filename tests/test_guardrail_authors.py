"""Guardrail: authors are only human, agent or service; schedules, workflows and
providers appear only as source refs (docs/guardrails.md#authors)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ROOT, author_findings, plant, scratch_copy


def test_a_schedule_author_type_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage", "actors")
    schema = root / "storage" / "schema_v1.sql"
    schema.write_text(
        schema.read_text().replace(
            "CHECK (author_type IN ('human', 'agent', 'service'))",
            "CHECK (author_type IN ('human', 'agent', 'service', 'schedule'))",
        )
    )
    assert author_findings(root) == [
        "schema: scope_messages.author_type allows ['agent', 'human', 'schedule', 'service']"
    ]


def test_a_workflow_member_type_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage", "actors")
    plant(root, "actors/model.py", '    WORKFLOW = "workflow"', after='SERVICE = "service"')
    assert author_findings(root) == [
        "actors/model.py: MemberType is ['agent', 'human', 'service', 'workflow']"
    ]


def test_a_provider_authored_row_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, "storage", "actors")
    plant(root, "storage/sources.py", "IMPORTED = \"SELECT author_type = 'provider' FROM x\"")
    [finding] = author_findings(root)
    assert finding.endswith("author_type 'provider'")


def test_the_tree_passes() -> None:
    assert author_findings(ROOT) == []
