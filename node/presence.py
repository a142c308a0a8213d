"""Who is online, away or offline, told to the members who may see them
(docs/presence.md). Nothing here is stored: the board is this node's view of
its own sessions, rebuilt by every session that opens.

A member is ``online`` while one of its sessions here is active, ``away``
while every one is idle (the client said so with ``setPresence``, or sent no
request for ``Settings.presence_idle_s``), ``offline`` when the last closes.
A change is pushed as ``presence`` to the sessions that asked to follow that
member with the ``presence`` op (by id, or everyone they may see) and may see
it: same workspace, a private agent's to its owner alone; the member's own
sessions are not told. A session that never asks gets no ``presence`` event,
so a node full of daemons and bench clients pays nothing for presence.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import structlog

from actors.model import Member
from node.hub import Hub
from protocol.codec import encode
from protocol.presence import PresenceEvent, PresenceState

log = structlog.get_logger(__name__)
# One forwarded ``typing`` per member and scope in this long; the others are
# coalesced (answered, not forwarded). Readers clear after 5 s without one.
TYPING_EVERY_S = 2.0
TYPING_REMEMBERED = 10_000


def member_of_session(session: object) -> Member | None:
    member = getattr(session, "member", None)
    return member if isinstance(member, Member) else None


def may_see(viewer: Member, member: Member) -> bool:
    """The people rule: one workspace; a private agent only to its owner (and itself)."""
    if viewer.workspace_id != member.workspace_id:
        return False
    return not member.is_private_agent or viewer.id in (member.id, member.owner_member_id)


class PresenceBoard:
    def __init__(self, hub: Hub, idle_after: float) -> None:
        self._hub = hub
        self._idle_after = idle_after
        # Sessions whose client said it is idle, and each session's last request.
        self._reported_idle: set[object] = set()
        self._active_at: dict[object, float] = {}
        self._idle: set[object] = set()
        # The state last told for each member seen here (absent: offline).
        self._state: dict[str, PresenceState] = {}
        self.events_sent = 0
        # (member id, scope id) → when its last ``typing`` was forwarded.
        self._typing: dict[tuple[str, str], float] = {}
        # Who follows whom: by member id, or everyone of a workspace.
        self._followers: dict[str, set[Any]] = {}
        self._workspace_followers: dict[str, set[Any]] = {}
        self._following: dict[Any, tuple[str, ...] | str] = {}

    # ------------------------------------------------------------ typing

    def typing_coalesced(self, member_id: str, scope_id: str, now: float) -> bool:
        """True when the member's last ``typing`` in the scope went out too recently."""
        at = self._typing.get((member_id, scope_id))
        return at is not None and now - at < TYPING_EVERY_S

    def typing_forwarded(self, member_id: str, scope_id: str, now: float) -> None:
        typing = self._typing
        typing[(member_id, scope_id)] = now
        if len(typing) > TYPING_REMEMBERED:
            # Only the last window matters: what is older coalesces nothing.
            self._typing = {k: at for k, at in typing.items() if now - at < TYPING_EVERY_S}

    # ------------------------------------------------------------ sessions

    def opened(self, session: object, now: float) -> None:
        self._active_at[session] = now
        self._settle(session)

    def closed(self, session: object) -> None:
        self._unfollow(session)
        self._reported_idle.discard(session)
        self._idle.discard(session)
        self._active_at.pop(session, None)
        self._settle(session)

    def touched(self, session: object, now: float) -> None:
        """A request arrived: the session is active unless its client said idle."""
        self._active_at[session] = now
        if session in self._idle and session not in self._reported_idle:
            self._idle.discard(session)
            self._settle(session)

    def report(self, session: object, idle: bool, now: float) -> None:
        """The client's own word (``setPresence``): stands until it says otherwise."""
        if idle:
            self._reported_idle.add(session)
            self._idle.add(session)
        else:
            self._reported_idle.discard(session)
            self._idle.discard(session)
            self._active_at[session] = now
        self._settle(session)

    def check(self, session: object, now: float) -> None:
        """The idle timer, run by the node's session sweeper."""
        at = self._active_at.get(session)
        if at is not None and session not in self._idle and now - at >= self._idle_after:
            self._idle.add(session)
            self._settle(session)

    # ------------------------------------------------------------ state

    def state_of(self, member_id: str) -> PresenceState:
        return self._state.get(member_id, "offline")

    def _current(self, member_id: str) -> PresenceState:
        sessions = [s for s in self._hub.sessions_of(member_id) if s in self._active_at]
        if not sessions:
            return "offline"
        return "away" if all(s in self._idle for s in sessions) else "online"

    def _settle(self, session: object) -> None:
        member = member_of_session(session)
        if member is None:
            return
        state = self._current(member.id)
        if state == self.state_of(member.id):
            return
        if state == "offline":
            del self._state[member.id]
        else:
            self._state[member.id] = state
        payload = encode(PresenceEvent(member_id=member.id, state=state))
        for viewer_session in self._viewers(member):
            viewer_session.push(payload)
            self.events_sent += 1

    def _viewers(self, member: Member) -> Iterator[Any]:
        """The sessions following ``member`` that may see it, not its own."""
        followers = (
            *self._followers.get(member.id, ()),
            *self._workspace_followers.get(member.workspace_id, ()),
        )
        for session in followers:
            viewer = member_of_session(session)
            if viewer is not None and viewer.id != member.id and may_see(viewer, member):
                yield session

    def _member(self, member_id: str) -> Member | None:
        for session in self._hub.sessions_of(member_id):
            if (member := member_of_session(session)) is not None:
                return member
        return None

    def _shown(self, viewer: Member, member_id: str) -> PresenceState:
        """The member's state as ``viewer`` may know it: offline when it may not."""
        state = self._state.get(member_id)
        if state is None:
            return "offline"
        member = self._member(member_id)
        return state if member is not None and may_see(viewer, member) else "offline"

    # ------------------------------------------------------------ following

    def follow(
        self, session: object, viewer: Member, member_ids: list[str] | None
    ) -> list[dict[str, str]]:
        """Follow ``member_ids`` (None: everyone ``viewer`` may see), replacing what the
        session followed; ``[{memberId, state}]`` now: each id asked for, or
        everyone followed who is not offline."""
        self._unfollow(session)
        if member_ids is None:
            self._workspace_followers.setdefault(viewer.workspace_id, set()).add(session)
            self._following[session] = viewer.workspace_id
            states = (
                (m, self._shown(viewer, m)) for m in self._hub.member_ids(viewer.workspace_id)
            )
            shown = [{"memberId": m, "state": st} for m, st in states if st != "offline"]
            shown.sort(key=lambda entry: entry["memberId"])
            return shown
        ids = tuple(dict.fromkeys(member_ids))
        for member_id in ids:
            self._followers.setdefault(member_id, set()).add(session)
        self._following[session] = ids
        return [{"memberId": m, "state": self._shown(viewer, m)} for m in ids]

    def _unfollow(self, session: object) -> None:
        followed = self._following.pop(session, None)
        if followed is None:
            return
        if isinstance(followed, str):
            _drop(self._workspace_followers, followed, session)
        else:
            for member_id in followed:
                _drop(self._followers, member_id, session)


def _drop(index: dict[str, set[Any]], key: str, session: object) -> None:
    sessions = index.get(key)
    if sessions is not None:
        sessions.discard(session)
        if not sessions:
            del index[key]
