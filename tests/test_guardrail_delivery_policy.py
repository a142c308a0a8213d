"""Guardrail: every producer names its delivery policy, and every direct/no-outbox
exception is on one allowlist with a line of why, ``docs/direct-no-outbox.md``
(docs/guardrails.md#delivery-policies)."""

from __future__ import annotations

from pathlib import Path

from tests.guardrails import ALLOWLIST, ROOT, plant, policy_findings, scratch_copy

PARTS = ("protocol", "actors", "storage", "node", "bench", ALLOWLIST)


def test_an_unlisted_direct_event_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, *PARTS)
    plant(
        root,
        "node/ops/presence.py",
        "def announce(hub, scope_id: str) -> bytes:\n"
        "    return encode(TypingEvent(scope_id=scope_id, member_id='x'))",
    )
    assert policy_findings(root) == [
        f"node/ops/presence.py:announce: an event with no outbox row and not on {ALLOWLIST}"
    ]


def test_an_entry_without_why_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, *PARTS)
    plant(root, ALLOWLIST, "| `node/hub.py` | `publish_messages` |  |")
    assert policy_findings(root) == [
        f"{ALLOWLIST}: node/hub.py:publish_messages has no line of why"
    ]


def test_an_outbox_row_without_a_policy_is_reported(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path, *PARTS)
    plant(
        root,
        "actors/planner.py",
        "def replay_row(policy: DeliveryPolicy) -> OutboxEvent:\n"
        "    return OutboxEvent('realtime', 'rt:x', policy)",
    )
    [finding] = policy_findings(root)
    assert finding.endswith("OutboxEvent without a named policy")


def test_the_tree_passes() -> None:
    assert policy_findings(ROOT) == []
