"""Policy, Planner and the ScopeState decisions, pure (no I/O, no trio)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors.model import (
    IdempotencyRecord,
    Member,
    Membership,
    MemberType,
    NotificationState,
    PrivateGrant,
    ScopeInfo,
    ScopeSnapshot,
    ScopeType,
)
from actors.planner import MessageIntent, ScopeContext, plan_message
from actors.policy import private_authority
from actors.scope_state import (
    Append,
    Immediate,
    NeedsLookup,
    NeedsReload,
    ScopeState,
    SendCommand,
    payload_digest,
)
from protocol.errors import ErrorCode, OperationError
from protocol.frames import FreshnessIn, SendResult

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WS = "ws_1"


def member(mid: str, type_: MemberType = MemberType.HUMAN, owner: str | None = None) -> Member:
    return Member(mid, WS, type_, mid, mid, owner, owner is not None)


OWNER = member("owner")
HUMAN = member("human")
PRIVATE = member("private", MemberType.AGENT, owner="owner")
PUBLIC_AGENT = member("bot", MemberType.AGENT)
LEFT = member("left")
MEMBERS = {m.id: m for m in (OWNER, HUMAN, PRIVATE, PUBLIC_AGENT, LEFT)}


def snapshot(
    *,
    latest: int = 3,
    grants: tuple[PrivateGrant, ...] = (),
    notification: dict[str, NotificationState] | None = None,
    idempotency: dict[tuple[str, str], IdempotencyRecord] | None = None,
) -> ScopeSnapshot:
    memberships = (
        Membership("owner", "public", None, 1),
        Membership("human", "public", None, 1),
        Membership("bot", "public", None, 1),
        Membership("private", "private", "owner", 1),
        Membership("left", "public", None, 1, 2),
    )
    return ScopeSnapshot(
        scope=ScopeInfo("scp_1", WS, ScopeType.CHANNEL, latest),
        memberships=memberships,
        members=MEMBERS,
        notification=notification or {},
        grants=grants,
        recent=(),
        idempotency=idempotency or {},
    )


def intent(content: str, recipients: tuple[str, ...] = ()) -> MessageIntent:
    return MessageIntent(
        scope_id="scp_1",
        workspace_id=WS,
        message_id="msg_1",
        content=content,
        message_type="text",
        client_message_id="c",
        digest=b"d",
        created_at=NOW,
        recipients=recipients,
    )


def context(state: ScopeState) -> ScopeContext:
    return state.scope_context()


def explain_of(plan: object, member_id: str) -> str:
    return next(r.reason for r in plan.explain.recipients if r.member_id == member_id)  # type: ignore[attr-defined]


def test_readers_are_current_members_and_private_agents_only_with_authority() -> None:
    state = ScopeState(snapshot())
    by_human = plan_message(intent("hi @private @bot"), HUMAN, context(state), expected_seq=3)
    assert by_human.seq == 4
    assert by_human.readers == {"owner", "human", "bot"}
    assert dict(by_human.wakes) == {"bot": "mention"}
    assert explain_of(by_human, "private") == "no_private_authority"
    by_owner = plan_message(intent("@private go"), OWNER, context(state), expected_seq=3)
    assert "private" in by_owner.readers
    assert dict(by_owner.wakes) == {"private": "mention"}


def test_grant_gives_authority_only_inside_its_interval() -> None:
    grant = PrivateGrant("grt_1", "scp_1", "owner", "human", NOW - timedelta(hours=1), None, NOW)
    state = ScopeState(snapshot(grants=(grant,)))
    ctx = state.visibility
    assert private_authority(ctx, HUMAN, PRIVATE, NOW - timedelta(minutes=1)).reason == "grant"
    assert not private_authority(ctx, HUMAN, PRIVATE, NOW)
    assert not private_authority(ctx, PUBLIC_AGENT, PRIVATE, NOW - timedelta(minutes=1))


@pytest.mark.parametrize(
    ("state", "content", "recipients", "reason"),
    [
        (NotificationState.ACTIVE, "plain", (), "not_addressed"),
        (NotificationState.AUTO_WAKE, "plain", (), "wake:auto_wake"),
        (NotificationState.MUTE, "@bot", (), "muted"),
        (NotificationState.QUIET, "@bot", (), "muted"),
        (NotificationState.NO_WAKE, "@bot", (), "no_wake"),
        (NotificationState.ACTIVE, "plain", ("bot",), "wake:explicit_recipient"),
        (NotificationState.ACTIVE, "`@bot` in code", (), "not_addressed"),
    ],
)
def test_agent_wake_follows_notification_state(
    state: NotificationState, content: str, recipients: tuple[str, ...], reason: str
) -> None:
    scope = ScopeState(snapshot(notification={"bot": state}))
    plan = plan_message(intent(content, recipients), HUMAN, context(scope), expected_seq=3)
    woken = dict(plan.wakes)
    if reason.startswith("wake:"):
        assert woken == {"bot": reason.removeprefix("wake:")}
    else:
        assert woken == {}
        assert explain_of(plan, "bot") == reason


def test_author_explain_names_only_what_members_shows_the_author() -> None:
    grant = PrivateGrant("grt_1", "scp_1", "owner", "human", NOW - timedelta(hours=1))
    state = ScopeState(snapshot(grants=(grant,)))
    by_human = plan_message(intent("hi @private"), HUMAN, context(state), expected_seq=3)
    # The operator's Explain (debug log) keeps everyone, with reasons.
    assert {r.member_id for r in by_human.explain.recipients} == {
        "owner",
        "bot",
        "private",
        "left",
    }
    shown = by_human.explain.for_author()
    # Even a grantee sees another owner's private agent only as a count, and
    # former members not at all.
    assert {r["memberId"] for r in shown["recipients"]} == {"owner", "bot"}
    assert shown["hiddenPrivate"] == 1
    by_owner = plan_message(intent("@private go"), OWNER, context(state), expected_seq=3)
    own = by_owner.explain.for_author()
    assert {r["memberId"] for r in own["recipients"]} == {"human", "bot", "private"}
    assert own["hiddenPrivate"] == 0
    by_agent = plan_message(intent("done"), PRIVATE, context(state), expected_seq=3)
    assert {r["memberId"] for r in by_agent.explain.for_author()["recipients"]} == {
        "owner",
        "human",
        "bot",
    }


def command(
    author: Member, *, seen: int | None = None, key: str = "scp_1", **kw: object
) -> SendCommand:
    replies: list[SendResult | OperationError] = []
    freshness = FreshnessIn(target_key=key, seen_up_to_seq=seen) if seen is not None else None
    return SendCommand(
        author=author,
        content=str(kw.pop("content", "hello")),
        client_message_id=str(kw.pop("cmid", "c-1")),
        reply=replies.append,
        freshness=freshness,
        freshness_declared=bool(kw.pop("declared", seen is not None)),
    )


def test_fresh_send_appends_and_stale_send_needs_lookup_then_holds() -> None:
    state = ScopeState(snapshot(latest=3))
    decision = state.decide(command(PUBLIC_AGENT, seen=3), NOW)
    assert isinstance(decision, Append)
    assert decision.plan.seq == 4
    assert state.latest_seq == 4
    stale = command(PUBLIC_AGENT, seen=3, cmid="c-2")
    assert isinstance(state.decide(stale, NOW), NeedsLookup)
    held = state.decide(stale, NOW, looked_up=True)
    assert isinstance(held, Immediate)
    assert isinstance(held.result, SendResult)
    assert (held.result.state, held.result.latest_seq) == ("held", 4)


def test_idempotency_wins_over_freshness() -> None:
    cmd = command(PUBLIC_AGENT, seen=1)
    record = IdempotencyRecord("msg_9", 2, payload_digest("scp_1", cmd))
    state = ScopeState(snapshot(latest=3, idempotency={("bot", "c-1"): record}))
    decision = state.decide(cmd, NOW)
    assert isinstance(decision, Immediate)
    assert isinstance(decision.result, SendResult)
    assert (decision.result.state, decision.result.message_id) == ("already_sent", "msg_9")
    conflict = state.decide(command(PUBLIC_AGENT, seen=3, content="other"), NOW)
    assert isinstance(conflict, Immediate)
    assert isinstance(conflict.result, OperationError)
    assert conflict.result.code is ErrorCode.IDEMPOTENCY_CONFLICT


def test_frontier_errors_and_compat_path() -> None:
    state = ScopeState(snapshot(latest=3))
    with pytest.raises(OperationError) as mismatch:
        state.decide(command(PUBLIC_AGENT, seen=3, key="scp_other"), NOW)
    assert mismatch.value.code is ErrorCode.TARGET_KEY_MISMATCH
    assert isinstance(state.decide(command(PUBLIC_AGENT, seen=9), NOW), NeedsReload)
    with pytest.raises(OperationError) as ahead:
        state.decide(command(PUBLIC_AGENT, seen=9), NOW, reloaded=True)
    assert ahead.value.code is ErrorCode.INVALID_FRONTIER
    required = state.decide(command(PUBLIC_AGENT, declared=True), NOW)
    assert isinstance(required, Immediate)
    assert isinstance(required.result, OperationError)
    assert required.result.code is ErrorCode.VALIDATION_FAILED
    compat = state.decide(command(PUBLIC_AGENT, cmid="c-3"), NOW)
    assert isinstance(compat, Append)
    assert compat.compat


def test_non_member_is_forbidden() -> None:
    state = ScopeState(snapshot())
    # The cached roster may predate a join written elsewhere (another node,
    # the admin CLI): the actor reloads once, and only then says forbidden.
    assert isinstance(state.decide(command(LEFT), NOW), NeedsReload)
    decision = state.decide(command(LEFT), NOW, reloaded=True)
    assert isinstance(decision, Immediate)
    assert isinstance(decision.result, OperationError)
    assert decision.result.code is ErrorCode.FORBIDDEN


def test_private_agent_is_held_only_by_messages_it_can_see() -> None:
    state = ScopeState(snapshot(latest=0))
    for author in (HUMAN, HUMAN):
        assert isinstance(state.decide(command(author, cmid=f"h{state.latest_seq}"), NOW), Append)
    # Two messages P cannot see: P's stale send is not held.
    stale = command(PRIVATE, seen=0, cmid="p1")
    assert isinstance(state.decide(stale, NOW, looked_up=True), Append)
    # The owner writes: visible to P, so a stale send is held at that seq.
    assert isinstance(state.decide(command(OWNER, cmid="o1"), NOW), Append)
    owner_seq = state.latest_seq
    assert isinstance(state.decide(command(HUMAN, cmid="h9"), NOW), Append)
    held = state.decide(command(PRIVATE, seen=3, cmid="p2"), NOW, looked_up=True)
    assert isinstance(held, Immediate)
    assert isinstance(held.result, SendResult)
    assert held.result.state == "held"
    assert held.result.latest_seq == owner_seq


def dm_snapshot(notification: dict[str, NotificationState] | None = None) -> ScopeSnapshot:
    return ScopeSnapshot(
        scope=ScopeInfo("scp_dm", WS, ScopeType.DM, 3),
        memberships=(
            Membership("human", "public", None, 1),
            Membership("bot", "public", None, 1),
        ),
        members=MEMBERS,
        notification=notification or {},
        grants=(),
        recent=(),
        idempotency={},
    )


@pytest.mark.parametrize(
    ("state", "content", "woken"),
    [
        (NotificationState.ACTIVE, "plain", {"bot": "dm"}),
        (NotificationState.ACTIVE, "hi @bot", {"bot": "mention"}),
        (NotificationState.MUTE, "plain", {}),
        (NotificationState.NO_WAKE, "plain", {}),
    ],
)
def test_a_dm_message_wakes_the_other_member_without_a_mention(
    state: NotificationState, content: str, woken: dict[str, str]
) -> None:
    scope = ScopeState(dm_snapshot({"bot": state}))
    plan = plan_message(intent(content), HUMAN, context(scope), expected_seq=3)
    assert dict(plan.wakes) == woken


def test_an_agent_never_wakes_itself_in_a_dm() -> None:
    scope = ScopeState(dm_snapshot())
    plan = plan_message(intent("plain"), PUBLIC_AGENT, context(scope), expected_seq=3)
    assert plan.wakes == ()


def test_a_channel_message_without_a_mention_still_does_not_wake() -> None:
    scope = ScopeState(snapshot())
    plan = plan_message(intent("plain"), HUMAN, context(scope), expected_seq=3)
    assert plan.wakes == ()
