"""The scope actor's edit and delete path: Policy, Planner, Applier, then publish.

An edit or a delete is ordered with the scope's sends (after the sends queued
before it, since it may name one of them) but never takes the send fence: it
keeps the message's seq and moves no ``latest_seq``. An edit of a stale
revision or of a tombstone answers ``conflict`` (a delete of a tombstone
succeeds, changing nothing); a refusal is checked again on the database's
roster, and a fence loss reloads and tries again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

import msgspec
import structlog
import trio

from actors.cards import CardCommand
from actors.model import Member
from actors.planner import MutationPlan, plan_delete, plan_edit
from actors.policy import Decision, can_delete, can_edit
from actors.ports import FenceLost, MutationConflict, MutationTarget
from actors.reactions import summaries_by_reader
from actors.scope_cards import mutate_card
from actors.scope_core import COMMIT_ATTEMPTS, Reply, ScopeCore, unavailable
from actors.scope_state import ScopeState
from protocol.errors import ErrorCode, OperationError

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class EditCommand:
    """``edit`` of a message of this scope (docs/design.md#edits-and-deletes).

    Ordered with the scope's sends but never takes the send fence: an edit
    keeps the message's seq and moves no ``latest_seq``. ``revision`` is the
    one the client edited (None: whatever is stored).
    """

    actor: Member
    message_id: str
    content: str
    reply: Reply
    revision: int | None = None


@dataclass(slots=True)
class DeleteCommand:
    """``delete`` of a message of this scope: a tombstone in its place."""

    actor: Member
    message_id: str
    reply: Reply


MutationCommand = EditCommand | DeleteCommand | CardCommand


class MutationPath(ScopeCore):
    """Edits and deletes of this scope's messages, and changes of its cards."""

    async def _process_mutation(self, cmd: MutationCommand) -> bool:
        """Policy, Planner, Applier, then publish; False when the actor must stop."""
        for attempt in range(COMMIT_ATTEMPTS):
            if self.stale and not await self._reload():
                cmd.reply(unavailable("scope state could not be loaded; retry"))
                return False
            state = self.state
            assert state is not None
            try:
                result = await self._mutate(state, cmd)
            except FenceLost:
                log.info("scope_mutation_fence_retry")
                if not await self._reload():
                    cmd.reply(unavailable("scope state could not be loaded; retry"))
                    return False
                continue
            except OperationError as exc:
                if exc.code is ErrorCode.FORBIDDEN and attempt == 0 and not self.stale:
                    # The cache may be behind a join on another node: a refusal
                    # is decided on the database's roster.
                    if not await self._fresh_for_roster(state):
                        cmd.reply(unavailable("scope state could not be loaded; retry"))
                        return False
                    if self.state is not state:
                        continue
                cmd.reply(exc)
                return True
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("scope_mutation_failed", error=repr(exc))
                cmd.reply(unavailable("the change was not stored; retry"))
                return False
            cmd.reply(result)
            return True
        cmd.reply(unavailable("could not commit after concurrent writers; retry"))
        return False

    async def _mutate(self, state: ScopeState, cmd: MutationCommand) -> dict[str, object]:
        if isinstance(cmd, CardCommand):
            return await mutate_card(self, state, cmd)
        target = await self._store.mutation_target(self.scope_id, cmd.message_id)
        if target is None:
            raise OperationError(ErrorCode.NOT_FOUND, "no such message", path="$.messageId")
        stored = target.message
        if isinstance(cmd, DeleteCommand):
            author_id, owner_id = stored.author.id, target.channel_owner_id
            _require(can_delete(state.visibility, cmd.actor, author_id, owner_id), "delete")
            if stored.deleted_at is not None:
                return {}  # idempotent: the tombstone is already there
            plan = plan_delete(stored, cmd.actor, state.scope_context(), self.now())
        else:
            decision = can_edit(state.visibility, cmd.actor, stored.author.id, stored.message_type)
            _require(decision, "edit")
            same = _unchanged(target, cmd)
            if same is not None:
                return same
            if cmd.revision is not None and cmd.revision != stored.revision:
                raise _conflict(stored.revision, deleted=False)
            plan = plan_edit(stored, cmd.actor, cmd.content, state.scope_context(), self.now())
        outcome = await self._store.apply_mutation(plan)
        if isinstance(outcome, MutationConflict):
            raise _conflict(outcome.revision, deleted=outcome.deleted)
        # The database's time of the write is what readers are shown.
        if plan.kind == "edit":
            plan = replace(
                plan, message=msgspec.structs.replace(plan.message, edited_at=outcome.at)
            )
            shown = summaries_by_reader(outcome.reactions, plan.readers, state.members)
            outcome = replace(outcome, reactions_shown=shown)
        else:
            plan = replace(
                plan, message=msgspec.structs.replace(plan.message, deleted_at=outcome.at)
            )
        with self._publisher.batch():
            self._publisher.publish_mutation(plan, outcome)
        log.debug(
            "mutation_explain",
            kind=plan.kind,
            message_id=stored.id,
            readers=len(plan.readers),
            woken=sorted(outcome.woken),
        )
        return {} if plan.kind == "delete" else _edit_result(plan)


def _require(decision: Decision, op: str) -> None:
    if not decision:
        raise OperationError(
            ErrorCode.FORBIDDEN,
            f"{op} is not allowed here ({decision.reason.replace('_', ' ')})",
            details={"reason": decision.reason},
        )


def _conflict(revision: int, *, deleted: bool) -> OperationError:
    if deleted:
        return OperationError(
            ErrorCode.CONFLICT,
            "the message was deleted",
            details={"revision": revision, "deleted": True},
        )
    return OperationError(
        ErrorCode.CONFLICT,
        "the message was edited since that revision; read it again",
        path="$.revision",
        details={"revision": revision},
    )


def _unchanged(target: MutationTarget, cmd: EditCommand) -> dict[str, object] | None:
    """The answer to an edit that changes nothing, or None.

    The content already stored writes nothing, so a retried edit whose reply
    was lost succeeds instead of reading as a conflict; a tombstone is never
    edited.
    """
    stored = target.message
    if stored.deleted_at is not None:
        raise _conflict(stored.revision, deleted=True)
    if stored.content != cmd.content:
        return None
    edited = stored.edited_at
    return {"messageId": stored.id, "revision": stored.revision, "editedAt": _rfc3339(edited)}


def _rfc3339(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _edit_result(plan: MutationPlan) -> dict[str, object]:
    message = plan.message
    return {
        "messageId": message.id,
        "revision": message.revision,
        "editedAt": _rfc3339(message.edited_at),
    }
