"""The scope actor's card path: Policy, Planner, Applier, then publish.

A card change (docs/cards.md) is a mutation of the card's message: ordered
with the scope's sends, never taking the send fence and never moving a seq.
The Applier's statement takes the card's row lock and is conditional on the
revision the change was decided on, so of two actions on one revision one
applies and the other is a ``conflict`` naming the revision that won.
"""

from __future__ import annotations

from dataclasses import replace

from actors.cards import CardCommand, conflict, decide, plan_card
from actors.ports import MutationConflict
from actors.reactions import summaries_by_reader
from actors.scope_core import ScopeCore
from actors.scope_state import ScopeState
from protocol.errors import ErrorCode, OperationError


async def mutate_card(core: ScopeCore, state: ScopeState, cmd: CardCommand) -> dict[str, object]:
    """Decide, plan, apply and publish one card change; its reply's result."""
    change = cmd.change
    target = await core._store.card_target(core.scope_id, cmd.message_id)
    if target is None or target.message.deleted_at is not None:
        path = "$.cardId" if change.op == "revoke" else "$.messageId"
        raise OperationError(ErrorCode.NOT_FOUND, "no such card", path=path)
    decide(target, cmd.actor, change, core.now())
    if target.share is not None and target.share.revoked:
        return {"cardId": target.share.id, "revoked": True}  # revoking again changes nothing
    plan = plan_card(target, cmd.actor, change, state.scope_context())
    outcome = await core._store.apply_card(plan, change)
    if isinstance(outcome, MutationConflict):
        raise conflict(outcome.revision)
    shown = summaries_by_reader(outcome.reactions, plan.readers, state.members)
    with core._publisher.batch():
        core._publisher.publish_mutation(plan, replace(outcome, reactions_shown=shown))
    if change.op == "revoke":
        return {"cardId": change.card_id, "revoked": True}
    return {"revision": change.expected_revision + 1}
