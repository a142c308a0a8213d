"""Membership rules per scope type, as Policy decides them (pure: no node, no database)."""

from __future__ import annotations

from actors.model import Member, Membership, MemberType, ScopeInfo, ScopeType
from actors.policy import (
    can_invite,
    can_join,
    can_leave,
    can_open_dm,
    can_post,
    can_read_scope,
    can_remove,
    dm_membership,
)
from actors.visibility import VisibilityContext

WS = "ws_1"


def human(member_id: str) -> Member:
    return Member(member_id, WS, MemberType.HUMAN, member_id, member_id)


def agent(member_id: str, owner: Member | None = None, *, private: bool = False) -> Member:
    owner_id = owner.id if owner else None
    return Member(member_id, WS, MemberType.AGENT, member_id, member_id, owner_id, private)


OWNER, ANN, KIM, EVE = human("owner"), human("ann"), human("kim"), human("eve")
OWNERS_AGENT = agent("oa", OWNER, private=True)
KIMS_AGENT = agent("ka", KIM, private=True)
BOT = agent("bot", KIM)


def scope(type_: ScopeType = ScopeType.CHANNEL, visibility: str | None = "public") -> ScopeInfo:
    channel = type_ is ScopeType.CHANNEL
    return ScopeInfo(
        "scp_1",
        WS,
        type_,
        5,
        channel_visibility=visibility if channel else None,
        channel_owner_id=OWNER.id if channel else None,
    )


def roster(
    *current: Member, left: tuple[Member, ...] = (), parent_readers: frozenset[str] = frozenset()
) -> VisibilityContext:
    """Current members (private agents as private members), and members who left."""
    intervals: dict[str, tuple[Membership, ...]] = {}
    for m in current:
        private = m.is_private_agent
        visibility = "private" if private else "public"
        owner = m.owner_member_id if private else None
        intervals[m.id] = (Membership(m.id, visibility, owner, 1),)
    for m in left:
        intervals[m.id] = (Membership(m.id, "public", None, 1, 3),)
    members = {m.id: m for m in (*current, *left)}
    return VisibilityContext(intervals, members, (), parent_readers, thread=bool(parent_readers))


CHANNEL = roster(OWNER, ANN, KIM, OWNERS_AGENT, KIMS_AGENT, left=(EVE,))


def test_channel_invite() -> None:
    ok = can_invite(scope(), CHANNEL, ANN, EVE, "public")
    assert (ok.allowed, ok.reason) == (True, "public_member_invites")
    assert can_invite(scope(visibility="private"), CHANNEL, ANN, BOT, "public")
    # A private agent is added only by its owner, who must be a current public member.
    assert can_invite(scope(), CHANNEL, KIM, KIMS_AGENT, "private").reason == (
        "owner_adds_private_agent"
    )
    assert can_invite(scope(), CHANNEL, ANN, KIMS_AGENT, "private").reason == "not_agent_owner"
    away = roster(OWNER, ANN, left=(KIM,))
    assert can_invite(scope(), away, KIM, KIMS_AGENT, "private").reason == "not_public_member"
    # Private agents never invite; former members and outsiders neither.
    assert can_invite(scope(), CHANNEL, OWNERS_AGENT, EVE, "public").reason == (
        "private_agent_never_invites"
    )
    assert can_invite(scope(), CHANNEL, EVE, ANN, "public").reason == "not_public_member"
    assert can_invite(scope(), CHANNEL, BOT, EVE, "public").reason == "not_public_member"
    # Only private agents are private members.
    assert can_invite(scope(), CHANNEL, ANN, EVE, "private").reason == "not_private_agent"


def test_dm_and_thread_rosters_are_not_requested() -> None:
    for op_scope, reason in (
        (scope(ScopeType.DM), "dm_fixed_membership"),
        (scope(ScopeType.THREAD), "thread_through_parent"),
        (scope(ScopeType.TASK), "not_a_channel"),
    ):
        assert can_invite(op_scope, CHANNEL, OWNER, EVE, "public").reason == reason
        assert can_invite(op_scope, CHANNEL, OWNER, OWNERS_AGENT, "private").reason == reason
        assert can_join(op_scope, EVE).reason == reason
        assert can_remove(op_scope, CHANNEL, OWNER, ANN).reason == reason
        assert not can_invite(op_scope, CHANNEL, OWNER, EVE, "public")
    assert not can_leave(scope(ScopeType.DM))
    assert can_leave(scope(ScopeType.THREAD))
    assert can_leave(scope())


def test_join() -> None:
    assert can_join(scope(), EVE)
    assert can_join(scope(), BOT)
    assert can_join(scope(visibility="private"), EVE).reason == ("private_channel_needs_invitation")
    assert can_join(scope(), KIMS_AGENT).reason == "private_agent_added_by_owner"


def test_remove() -> None:
    assert can_remove(scope(), CHANNEL, OWNER, ANN).reason == "channel_owner"
    assert can_remove(scope(), CHANNEL, OWNER, KIMS_AGENT).reason == "channel_owner"
    assert can_remove(scope(), CHANNEL, KIM, KIMS_AGENT).reason == "agent_owner"
    # An owner removes its agent even after leaving the channel itself.
    assert can_remove(scope(), roster(OWNER, KIMS_AGENT, left=(KIM,)), KIM, KIMS_AGENT)
    # Nobody removes the channel's owner, not even the owner.
    assert can_remove(scope(), CHANNEL, OWNER, OWNER).reason == "channel_owner_stays"
    assert can_remove(scope(), CHANNEL, ANN, OWNER).reason == "channel_owner_stays"
    assert can_remove(scope(), CHANNEL, ANN, KIM).reason == "not_channel_owner"
    assert can_remove(scope(), CHANNEL, ANN, ANN).reason == "not_channel_owner"
    assert can_remove(scope(), CHANNEL, OWNERS_AGENT, ANN).reason == "not_channel_owner"
    gone = roster(ANN, left=(OWNER,))
    assert can_remove(scope(), gone, OWNER, ANN).reason == "owner_not_member"


def test_dm_participants() -> None:
    assert can_open_dm(ANN, KIM).reason == "members"
    assert can_open_dm(ANN, BOT).reason == "members"
    assert can_open_dm(KIM, KIMS_AGENT).reason == "owner_private"
    assert can_open_dm(KIMS_AGENT, KIM).reason == "owner_private"
    assert can_open_dm(ANN, KIMS_AGENT).reason == "other_owners_private_agent"
    assert can_open_dm(OWNERS_AGENT, KIMS_AGENT).reason == "other_owners_private_agent"
    assert can_open_dm(KIMS_AGENT, ANN).reason == "private_agent_dms_owner_only"
    assert dm_membership(KIMS_AGENT) == ("private", KIM.id)
    assert dm_membership(BOT) == ("public", None)
    assert dm_membership(KIM) == ("public", None)


def test_threads_are_read_and_written_through_the_parent() -> None:
    # ANN holds a thread membership (she posted); KIM reads through the parent.
    thread = roster(ANN, KIMS_AGENT, parent_readers=frozenset({ANN.id, KIM.id}))
    assert can_post(thread, ANN).reason == "member"
    assert can_post(thread, KIM).reason == "parent_member"
    assert can_read_scope(thread, KIM).reason == "parent_member"
    # A private agent posts by its (private) thread membership, never through the parent.
    assert can_post(thread, KIMS_AGENT).reason == "member"
    # Left the parent: her thread membership alone grants nothing.
    left_parent = roster(ANN, parent_readers=frozenset({KIM.id}))
    assert can_post(left_parent, ANN).reason == "not_parent_member"
    assert can_read_scope(left_parent, ANN).reason == "not_parent_member"
    assert not can_read_scope(left_parent, EVE)
