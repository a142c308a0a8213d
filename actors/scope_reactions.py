"""The scope actor's reaction path (docs/design.md#reactions).

Reactions run after a batch's sends, roster changes, edits and deletes, and
never split a send group: a reaction takes no send fence and moves no seq.
They are decided on the cached roster and written in as few fenced statements
as keep each message to one row per statement; each statement checks the
roster generation, so a miss reloads and the rest is tried again. Who is told
of a change (and whom it wakes) is computed once per reactor and roster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
import trio

from actors.model import Member, NotificationState
from actors.policy import can_react, reaction_wakes, sees_reaction
from actors.ports import ReactionActivity, ReactionOutcome, ReactionWrite
from actors.scope_core import COMMIT_ATTEMPTS, Reply, ScopeCore, unavailable
from actors.scope_state import ScopeState
from actors.visibility import readers
from protocol.errors import ErrorCode, OperationError

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class ReactCommand:
    """``react`` add/remove on a message of this scope (docs/design.md#reactions).

    Serialised with the scope's other commands but never part of a send
    group: a reaction takes no send fence and moves no seq. The node has
    checked the message is in this scope's workspace and the emoji's form.
    """

    reactor: Member
    message_id: str
    emoji: str
    op: str
    reply: Reply


class ReactionPath(ScopeCore):
    """Reactions; the cache is set by ``ScopeActor.__init__``."""

    # What the cached roster says about each reactor, for the state and
    # roster generation it was read from (see _reactor).
    _reactors: dict[str, _Reactor]
    _reactors_of: tuple[int, int]

    async def _process_reacts(self, cmds: list[ReactCommand]) -> bool:
        """Decide on the cached roster, write in fenced group statements, then push.

        Each statement checks the scope's ``roster_generation`` is still the
        cache's (the viewer parameters come from it) and the SQL readable
        predicate on each message; a generation miss reloads and tries the
        rest again. The queued reactions go in as few statements as keep each
        message to one row per statement, in arrival order, so every answer
        is the one a statement per reaction would give. False only when the
        scope could not be loaded.
        """
        pending = cmds
        for attempt in range(COMMIT_ATTEMPTS):
            if self.stale and not await self._reload():
                return _fail_reacts(pending, "scope state could not be loaded; retry")
            state = self.state
            assert state is not None
            if attempt == 0 and any(not can_react(state.visibility, c.reactor) for c in pending):
                # The cache may be behind a join on another node: a refusal is
                # decided on the database's roster.
                if not await self._fresh_for_roster(state):
                    return _fail_reacts(pending, "scope state could not be loaded; retry")
                state = self.state
                assert state is not None
            allowed: list[ReactCommand] = []
            for cmd in pending:
                decision = can_react(state.visibility, cmd.reactor)
                if decision:
                    allowed.append(cmd)
                else:
                    cmd.reply(_react_forbidden(decision.reason))
            pending = []
            groups = _one_per_message(allowed)
            for index, group in enumerate(groups):
                outcomes = await self._write_reacts(state, group)
                if outcomes is None:
                    continue
                if not outcomes[0].fenced:
                    # One fence for the scope: this group and the later ones retry.
                    pending = [cmd for rest in groups[index:] for cmd in rest]
                    break
                with self._publisher.batch():
                    for cmd, outcome in zip(group, outcomes, strict=True):
                        self._answer_react(state, cmd, outcome)
            if not pending:
                return True
            if not await self._reload():
                return _fail_reacts(pending, "scope state could not be loaded; retry")
        for cmd in pending:
            cmd.reply(unavailable("could not react after concurrent roster changes; retry"))
        return True

    async def _write_reacts(
        self, state: ScopeState, group: list[ReactCommand]
    ) -> list[ReactionOutcome] | None:
        """One statement for ``group``; None (each told to retry) when it failed."""
        writes = [
            ReactionWrite(
                op=cmd.op,
                reactor=cmd.reactor,
                message_id=cmd.message_id,
                emoji=cmd.emoji,
                public_reader=self._reactor(state, cmd.reactor).public_reader,
                wake=self._reactor(state, cmd.reactor).wake,
            )
            for cmd in group
        ]
        try:
            return await self._store.react_many(
                self.scope_id,
                state.roster_generation,
                writes,
                grant_scopes=_grant_scopes(state),
                in_thread=state.thread is not None,
            )
        except Exception as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            log.warning("scope_reaction_failed", count=len(group), error=repr(exc))
            for cmd in group:
                cmd.reply(unavailable("the reaction was not stored; retry"))
            return None

    def _reactor(self, state: ScopeState, reactor: Member) -> _Reactor:
        """What the roster says about ``reactor``, computed once per roster.

        Kept for the state object and roster generation it was read from: a
        roster change this actor applies bumps the generation or replaces the
        state (a reload), and one it could not adopt makes the next
        statement miss the fence and reload before anything is published.
        """
        key = (id(state), state.roster_generation)
        if key != self._reactors_of:
            self._reactors, self._reactors_of = {}, key
        known = self._reactors.get(reactor.id)
        if known is None:
            known = self._reactors[reactor.id] = _reactor_view(state, reactor)
        return known

    def _answer_react(self, state: ScopeState, cmd: ReactCommand, outcome: ReactionOutcome) -> None:
        if not outcome.found:
            cmd.reply(OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId"))
        elif not outcome.readable:
            cmd.reply(_react_forbidden("message_not_readable"))
        elif not outcome.room:
            cmd.reply(
                OperationError(
                    ErrorCode.VALIDATION_FAILED,
                    "a message carries at most 20 distinct reactions",
                    path="$.emoji",
                    details={"reason": "too_many_distinct_emoji"},
                )
            )
        else:
            cmd.reply({"changed": outcome.changed})
            if outcome.changed:
                self._publisher.publish_reaction(self._reaction_activity(state, cmd, outcome))

    def _reaction_activity(
        self, state: ScopeState, cmd: ReactCommand, outcome: ReactionOutcome
    ) -> ReactionActivity:
        """Who hears of the change: the message's readers shown this reactor's
        reactions; the author too when the reaction wakes it."""
        assert outcome.author_id is not None
        assert outcome.seq is not None
        assert outcome.created_at is not None
        reactor = cmd.reactor
        known = self._reactor(state, reactor)
        shown = known.audience
        if known.per_message:
            shown |= readers(
                state.visibility,
                known.per_message,
                outcome.author_id,
                outcome.seq,
                outcome.created_at,
            )
        author = state.members.get(outcome.author_id)
        woken = (
            frozenset({outcome.author_id})
            if cmd.op == "add"
            and outcome.author_id in shown
            and reaction_wakes(state.notification.get(outcome.author_id), author, reactor)
            else frozenset()
        )
        return ReactionActivity(
            scope_id=self.scope_id,
            message_id=cmd.message_id,
            member_id=reactor.id,
            emoji=cmd.emoji,
            op=cmd.op,
            audience=shown,
            wakes=woken,
        )


def _react_forbidden(reason: str) -> OperationError:
    return OperationError(
        ErrorCode.FORBIDDEN,
        "you cannot react to this message",
        details={"reason": reason},
    )


def _one_per_message(cmds: list[ReactCommand]) -> list[list[ReactCommand]]:
    """Consecutive runs of ``cmds`` naming each message at most once."""
    groups: list[list[ReactCommand]] = []
    seen: set[str] = set()
    for cmd in cmds:
        if not groups or cmd.message_id in seen:
            groups.append([])
            seen = set()
        groups[-1].append(cmd)
        seen.add(cmd.message_id)
    return groups


def _fail_reacts(cmds: list[ReactCommand], message: str) -> bool:
    for cmd in cmds:
        cmd.reply(unavailable(message))
    return False


def _public_reader(state: ScopeState, member: Member) -> bool:
    """The reactor holds a current public membership (the SQL predicate's ``viewer_public``)."""
    return not member.is_private_agent and any(
        m.is_current and not m.is_private for m in state.intervals.get(member.id, ())
    )


def _grant_scopes(state: ScopeState) -> tuple[str, ...]:
    parent = state.thread.parent_scope_id if state.thread is not None else None
    return (state.scope.id, parent) if parent else (state.scope.id,)


def _wake_candidates(state: ScopeState, reactor: Member) -> frozenset[str]:
    """Agents a reaction by ``reactor`` would wake were it on their own message."""
    return frozenset(
        member_id
        for member_id, setting in state.notification.items()
        if setting is NotificationState.AUTO_WAKE
        and reaction_wakes(setting, state.members.get(member_id), reactor)
    )


@dataclass(frozen=True, slots=True)
class _Reactor:
    """A reactor as the cached roster sees it, whatever the message."""

    public_reader: bool
    wake: frozenset[str]
    # Readers shown its reactions on every message: humans and public agents
    # read every message of a scope they read (actors/visibility.py).
    audience: frozenset[str]
    # Private agents shown its reactions that read message by message.
    per_message: tuple[str, ...]


def _reactor_view(state: ScopeState, reactor: Member) -> _Reactor:
    candidates = state.current_readers() | state.parent_readers | {reactor.id}
    shown = [
        member
        for member_id in candidates
        if (member := state.members.get(member_id)) is not None and sees_reaction(member, reactor)
    ]
    public = [m.id for m in shown if not m.is_private_agent]
    # Any message will do for them: their readability does not depend on it.
    anything = datetime.fromtimestamp(0, UTC)
    return _Reactor(
        public_reader=_public_reader(state, reactor),
        wake=_wake_candidates(state, reactor),
        audience=readers(state.visibility, public, "", 0, anything),
        per_message=tuple(m.id for m in shown if m.is_private_agent),
    )
