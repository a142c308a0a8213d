"""Who may revoke, act on and update a card, and what its live form shows (actors/cards.py).

Pure: no node, no database. The end-to-end answers are in
tests/test_cards.py and the authorization rows in
tests/test_authorization_cards.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors.cards import (
    APP_CARD,
    APP_KEY,
    SHARE_CARD,
    SHARE_KEY,
    AppCardState,
    CardChange,
    CardTarget,
    ShareCardState,
    decide,
    public_card,
)
from actors.model import Member, MemberType, StoredMessage
from protocol.errors import ErrorCode, OperationError

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def member(mid: str, type_: MemberType = MemberType.HUMAN) -> Member:
    return Member(mid, "ws", type_, mid, mid)


def message(author: Member, message_type: str, metadata: dict[str, object]) -> StoredMessage:
    return StoredMessage("msg_1", "scp_1", 1, 1, author, message_type, "x", NOW, metadata=metadata)


def share(revoked: bool = False) -> CardTarget:
    state = ShareCardState("shc_1", "channel", "scp_src", None, "ann", revoked, "own")
    return CardTarget(message(member("ann"), SHARE_CARD, {}), share=state)


def app(revision: int = 3, expires_at: datetime | None = None) -> CardTarget:
    state = AppCardState(
        revision, {"title": "t"}, [{"id": "ok", "label": "OK"}], "active", expires_at
    )
    return CardTarget(message(member("svc", MemberType.SERVICE), APP_CARD, {}), app=state)


def refusal(target: CardTarget, actor: Member, change: CardChange) -> OperationError:
    with pytest.raises(OperationError) as refused:
        decide(target, actor, change, NOW)
    return refused.value


def test_a_share_card_is_revoked_by_its_creator_or_the_channel_owner_only() -> None:
    revoke = CardChange("revoke", "shc_1")
    decide(share(), member("ann"), revoke, NOW)
    decide(share(), member("own"), revoke, NOW)
    assert refusal(share(), member("bob"), revoke).code is ErrorCode.FORBIDDEN
    assert refusal(app(), member("ann"), revoke).code is ErrorCode.NOT_FOUND


def test_actions_are_for_people_on_the_current_revision_before_expiry() -> None:
    act = CardChange("act", "msg_1", expected_revision=3, action_id="ok")
    decide(app(), member("ann"), act, NOW)
    stale = refusal(app(revision=4), member("ann"), act)
    assert stale.code is ErrorCode.CONFLICT
    assert stale.details["revision"] == 4
    late = refusal(app(expires_at=NOW - timedelta(seconds=1)), member("ann"), act)
    assert late.details == {"revision": 3, "expired": True, "path": "$.revision"}
    for who in (member("bot", MemberType.AGENT), member("svc", MemberType.SERVICE)):
        assert refusal(app(), who, act).code is ErrorCode.FORBIDDEN
    unknown = CardChange("act", "msg_1", expected_revision=3, action_id="nope")
    assert refusal(app(), member("ann"), unknown).code is ErrorCode.VALIDATION_FAILED


def test_only_the_posting_service_updates_its_card() -> None:
    update = CardChange("update", "msg_1", expected_revision=3)
    decide(app(), member("svc", MemberType.SERVICE), update, NOW)
    other = refusal(app(), member("alerts", MemberType.SERVICE), update)
    assert other.code is ErrorCode.FORBIDDEN
    stale = CardChange("update", "msg_1", expected_revision=2)
    assert refusal(app(), member("svc", MemberType.SERVICE), stale).code is ErrorCode.CONFLICT


def test_the_live_form_of_a_share_card_never_names_its_source() -> None:
    sidecar = {"id": "shc_1", "kind": "channel", "source_scope_id": "scp_src"}
    live = public_card(message(member("ann"), SHARE_CARD, {SHARE_KEY: sidecar}))
    assert live == {"cardId": "shc_1", "kind": "channel", "revoked": False, "pending": True}
    revoked = public_card(
        message(member("ann"), SHARE_CARD, {SHARE_KEY: {**sidecar, "revoked": True}})
    )
    assert revoked == {"cardId": "shc_1", "kind": "channel", "revoked": True}
    assert public_card(message(member("ann"), "text", {})) is None


def test_a_posted_app_card_shows_its_expiry_live() -> None:
    sidecar = {"render": {"title": "t"}, "actions": [], "expires_at": "2020-01-01T00:00:00+00:00"}
    live = public_card(message(member("svc", MemberType.SERVICE), APP_CARD, {APP_KEY: sidecar}))
    assert live is not None
    assert live["expiresAt"] == "2020-01-01T00:00:00.000000Z"
    assert live["revision"] == 1
