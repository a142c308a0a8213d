"""The scope actor's roster path: join, leave, invite, remove and setNotification.

Roster changes are serialised with the scope's sends. Each is decided on a
fresh roster: a thread's roster also changes outside its actor, and any
scope's on other nodes, so one read of the roster generation (or a reload)
comes first. Who may do what is :mod:`actors.policy`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
import trio

from actors.model import Member, NotificationState
from actors.policy import Decision, can_invite, can_join, can_leave, can_remove
from actors.scope_core import Reply, ScopeCore, unavailable
from actors.scope_state import ScopeState
from protocol.errors import ErrorCode, OperationError

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class RosterCommand:
    """join / leave / invite / remove / setNotification, serialised with the scope's sends.

    ``actor`` asks; ``member`` is the one whose membership changes. Who may do
    what is :mod:`actors.policy`'s, decided on the actor's own roster.
    """

    op: str
    actor: Member
    member: Member
    reply: Reply
    visibility: str = "public"
    state: NotificationState = NotificationState.ACTIVE


class RosterPath(ScopeCore):
    """Membership changes of this scope."""

    async def _process_roster(self, cmd: RosterCommand) -> bool:
        current = self.state
        assert current is not None
        # A thread's roster also changes outside its actor (the parent's roster,
        # and a leave of the parent ends thread memberships), and any scope's
        # roster changes on other nodes: decide on a fresh snapshot whenever
        # the cache may be behind. Roster requests are rare; one read checks.
        if not await self._fresh_for_roster(current):
            cmd.reply(unavailable("scope state could not be loaded; retry"))
            return False
        state = self.state
        assert state is not None
        try:
            result = await self._apply_roster(state, cmd)
        except OperationError as exc:
            cmd.reply(exc)
            return True
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            log.warning("scope_roster_failed", op=cmd.op, error=repr(exc))
            cmd.reply(unavailable("membership change was not stored; retry"))
            return False
        cmd.reply(result)
        return True

    async def _apply_roster(self, state: ScopeState, cmd: RosterCommand) -> dict[str, object]:
        member = cmd.member
        decision = _roster_decision(state, cmd)
        if decision is not None and not decision:
            raise OperationError(
                ErrorCode.FORBIDDEN,
                f"{cmd.op} is not allowed here ({decision.reason.replace('_', ' ')})",
                details={"reason": decision.reason},
            )
        if cmd.op in ("join", "invite"):
            if state.is_current_member(member.id):
                return {}
            owner = member.owner_member_id if cmd.visibility == "private" else None
            change = await self._store.join(
                self.scope_id,
                member,
                visibility=cmd.visibility,
                owner_member_id=owner,
                state=NotificationState.ACTIVE,
            )
            assert change.membership is not None
            state.apply_membership(member, change.membership)
            state.roster_changed(change.generation)
            op = "joined" if cmd.op == "join" else "invited"
            self._publish_roster(state, member.id, op, cmd.visibility)
            return {}
        if cmd.op in ("leave", "remove"):
            # Removing is leaving on someone else's word: the same interval end,
            # the same thread memberships ended with it, the same event.
            if not state.is_current_member(member.id):
                return {}
            visibility = next(m.visibility for m in state.intervals[member.id] if m.is_current)
            audience = self._roster_audience(state, member.id, visibility)
            closed = await self._store.leave(self.scope_id, member.id)
            if closed.membership is not None:
                state.apply_membership(member, closed.membership)
            state.roster_changed(closed.generation)
            self._publisher.publish_membership(
                self.scope_id, member.id, "left", visibility, audience
            )
            return {}
        if cmd.op == "setNotification":
            if not state.is_current_member(member.id):
                raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
            generation = await self._store.set_notification(self.scope_id, member.id, cmd.state)
            state.notification[member.id] = cmd.state
            state.roster_changed(generation)
            return {"state": cmd.state.value}
        raise OperationError(ErrorCode.VALIDATION_FAILED, f"unknown roster op {cmd.op}")


def _roster_decision(state: ScopeState, cmd: RosterCommand) -> Decision | None:
    """Policy's word on a roster request (None: the op needs no authority check)."""
    if cmd.op == "join":
        return can_join(state.scope, cmd.member)
    if cmd.op == "leave":
        return can_leave(state.scope)
    if cmd.op == "invite":
        return can_invite(state.scope, state.visibility, cmd.actor, cmd.member, cmd.visibility)
    if cmd.op == "remove":
        return can_remove(state.scope, state.visibility, cmd.actor, cmd.member)
    return None
