"""The Applier's mutation path: edits and deletes of stored messages.

docs/design.md#edits-and-deletes. Like a send, each mutation is one
statement in autocommit: the conditional write of the message row and
everything that follows from it (the revision row or the tombstone's
cleanup, the search projection, the outbox rows). Unlike a send it takes no
seq: the scope row is not updated, ``latest_seq`` never moves, and a message
keeps its id and seq for life.

Both statements are fenced like sends on the scope's ``roster_generation``
(and a thread's parent's): the readers and wakes of the plan come from the
actor's cached roster, and a roster write committed since makes the statement
write nothing, so the actor reloads and plans again. The edit is also
conditional on the revision the plan was built on: a concurrent edit from
another node turns it into a ``conflict``, never a lost update.

The outbox gets one ``worker_first_mutation`` row per edit revision or
delete: the projection (``messageUpdated``/``messageDeleted``) the node
pushes inline after commit and the outbox worker replays if the node died
first. An edit's wake rows share the send's dedupe key (``wake:<message>:
<agent>``), so an agent already woken for the message is never woken twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from actors.planner import MutationPlan
from actors.ports import CommittedMutation, FenceLost, MutationConflict, MutationTarget
from storage.applier import REPLAY_AFTER, WAKE_RETRY_AFTER
from storage.errors import map_errors
from storage.messages import STORED_COLUMNS, message_from_row
from storage.pg import TrioConnection
from storage.reactions import STORED_OF_MESSAGE, stored_reactions

# A projection not marked delivered by then (the node died between commit and
# push) is replayed by the outbox worker, on the same clock as a send's rows.
MUTATION_REPLAY_AFTER = REPLAY_AFTER
# Why the rows of a deleted message stopped (scope_fanout_outbox.suppression_reason).
DELETED = "message_deleted"

_COLUMNS = STORED_COLUMNS
# The message, and who may recall any message of its channel: the channel's
# owner, or for a thread the owner of its parent channel.
SELECT_TARGET = f"""
SELECT {_COLUMNS}, coalesce(p.owner_member_id, pp.owner_member_id)
FROM scope_messages m
JOIN members mem ON mem.id = m.author_member_id
JOIN scopes s ON s.id = m.scope_id
LEFT JOIN scope_channel_profiles p ON p.scope_id = s.id
LEFT JOIN scope_channel_profiles pp ON pp.scope_id = s.parent_scope_id
WHERE m.id = %(message_id)s AND m.scope_id = %(scope_id)s
"""

_FENCE = """
fence AS (
    SELECT 1 FROM scopes s
    WHERE s.id = %(scope_id)s AND s.roster_generation = %(expected_generation)s
      AND (%(parent_id)s::text IS NULL OR EXISTS (
          SELECT 1 FROM scopes parent
          WHERE parent.id = %(parent_id)s AND parent.roster_generation = %(parent_generation)s))
)"""

_OUTBOX = """
outbox AS (
    INSERT INTO scope_fanout_outbox (
        workspace_id, scope_id, message_id, event_ref_type, event_ref_id, fanout_type,
        delivery_policy, target_member_id, target_seq, dedupe_key, payload, next_attempt_at)
    SELECT %(workspace_id)s, %(scope_id)s, w.id,
        CASE o.fanout_type WHEN 'mutation' THEN 'mutation' ELSE 'message' END,
        CASE o.fanout_type WHEN 'mutation' THEN o.dedupe_key ELSE w.id END,
        o.fanout_type, o.policy, o.target, w.seq, o.dedupe_key,
        jsonb_build_object('reason', o.reason, 'revision', w.revision),
        w.at + CASE o.fanout_type
            WHEN 'agent_wake' THEN %(wake_retry_after)s ELSE %(replay_after)s END
    FROM written w, jsonb_to_recordset(%(outbox)s::jsonb)
        AS o(fanout_type text, policy text, target text, dedupe_key text, reason text)
    -- An agent already woken for this message keeps its one wake.
    ON CONFLICT (dedupe_key) DO NOTHING
    RETURNING fanout_type, target_member_id
)"""


def _result(*extra: str) -> str:
    """What a mutation statement answers, followed by the ``extra`` columns."""
    return f"""
SELECT EXISTS (SELECT 1 FROM fence), w.at,
    (SELECT array_agg(target_member_id) FROM outbox WHERE fanout_type = 'agent_wake'),
    cur.revision, cur.deleted_at IS NOT NULL{"".join(", " + column for column in extra)}
FROM scope_messages cur
LEFT JOIN written w ON true
WHERE cur.id = %(message_id)s
"""


_RESULT = _result()
# An edit also returns the message's reactions, for its projection.
_EDIT_RESULT = _result(STORED_OF_MESSAGE)

# The new content replaces the old, which moves to a revision row; the search
# document follows. Conditional on the revision the plan saw and on the
# message not being deleted.
EDIT_MESSAGE = f"""
WITH {_FENCE}, written AS (
    UPDATE scope_messages m
    SET content = %(content)s, metadata = %(metadata)s::jsonb, revision = m.revision + 1,
        edited_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE m.id = %(message_id)s AND m.scope_id = %(scope_id)s
      AND m.revision = %(expected_revision)s AND m.deleted_at IS NULL
      AND EXISTS (SELECT 1 FROM fence)
    RETURNING m.id, m.seq, m.revision, m.edited_at AS at
), previous AS (
    INSERT INTO scope_message_revisions
        (message_id, revision, scope_id, content, metadata, edited_by_member_id, replaced_at)
    SELECT old.id, old.revision, old.scope_id, old.content, old.metadata, %(actor_id)s, w.at
    FROM written w JOIN scope_messages old ON old.id = w.id
), search AS (
    UPDATE scope_message_search_docs d SET body = %(content)s
    FROM written w WHERE d.message_id = w.id
), {_OUTBOX}
{_EDIT_RESULT}
"""

# A tombstone keeps id, seq and author; its words, reactions, sources, search
# document, uploads and earlier revisions go, and whatever was still to be delivered
# about it (wakes not yet acknowledged, replays, earlier projections) and its
# activity are suppressed.
DELETE_MESSAGE = f"""
WITH {_FENCE}, written AS (
    UPDATE scope_messages m
    SET content = '', metadata = '{{}}'::jsonb, deleted_at = clock_timestamp(),
        deleted_by_member_id = %(actor_id)s, updated_at = clock_timestamp()
    WHERE m.id = %(message_id)s AND m.scope_id = %(scope_id)s AND m.deleted_at IS NULL
      AND EXISTS (SELECT 1 FROM fence)
    RETURNING m.id, m.seq, m.revision, m.deleted_at AS at
), revisions AS (
    DELETE FROM scope_message_revisions r USING written w WHERE r.message_id = w.id
), reactions AS (
    DELETE FROM scope_message_reactions r USING written w WHERE r.message_id = w.id
), sources AS (
    DELETE FROM scope_message_sources s USING written w WHERE s.message_id = w.id
), search AS (
    DELETE FROM scope_message_search_docs d USING written w WHERE d.message_id = w.id
), released AS (
    -- Its uploads are released with it (the sweeper removes them and, once no
    -- other upload has the same content, their bytes): storage.attachments.
    UPDATE attachments a SET released_at = w.at
    FROM written w WHERE a.message_id = w.id AND a.released_at IS NULL
), activity AS (
    UPDATE scope_activity_events a SET suppressed_at = w.at
    FROM written w WHERE a.source_message_id = w.id AND a.suppressed_at IS NULL
), suppressed AS (
    UPDATE scope_fanout_outbox o
    SET status = 'suppressed', suppressed_at = w.at, suppression_reason = %(deleted)s,
        lease_owner = NULL, lease_expires_at = NULL
    FROM written w
    WHERE o.message_id = w.id
      AND (o.status IN ('pending', 'leased')
           OR (o.status = 'failed' AND o.fanout_type = 'agent_wake'))
), {_OUTBOX}
{_RESULT}
"""

_encoder = msgspec.json.Encoder()


async def target(conn: TrioConnection, scope_id: str, message_id: str) -> MutationTarget | None:
    """The message of ``scope_id`` as stored now (with its channel's owner), or None."""
    with map_errors():
        cur = await conn.execute(SELECT_TARGET, {"scope_id": scope_id, "message_id": message_id})
        row = await cur.fetchone()
    if row is None:
        return None
    return MutationTarget(message_from_row(row[:20]), row[20])


def _params(plan: MutationPlan) -> dict[str, Any]:
    message = plan.message
    return {
        "scope_id": message.scope_id,
        "workspace_id": message.author.workspace_id,
        "message_id": message.id,
        "actor_id": plan.actor.id,
        "expected_generation": plan.expected_generation,
        "parent_id": plan.parent_fence[0] if plan.parent_fence else None,
        "parent_generation": plan.parent_fence[1] if plan.parent_fence else None,
        "outbox": _encoder.encode(
            [
                {
                    "fanout_type": o.fanout_type,
                    "policy": o.delivery_policy.value,
                    "target": o.target_member_id,
                    "dedupe_key": o.dedupe_key,
                    "reason": o.reason,
                }
                for o in plan.outbox
            ]
        ).decode(),
        "wake_retry_after": WAKE_RETRY_AFTER,
        "replay_after": MUTATION_REPLAY_AFTER,
    }


async def apply(conn: TrioConnection, plan: MutationPlan) -> CommittedMutation | MutationConflict:
    """Write one edit or delete in one statement (``conn`` in autocommit).

    Raises :class:`FenceLost` when the roster moved since the plan; answers
    :class:`MutationConflict` when the message did (edited, deleted or gone).
    """
    params = _params(plan)
    if plan.kind == "edit":
        params |= {
            "content": plan.message.content,
            "metadata": _encoder.encode(plan.message.metadata).decode(),
            "expected_revision": plan.expected_revision,
        }
        sql = EDIT_MESSAGE
    else:
        params["deleted"] = DELETED
        sql = DELETE_MESSAGE
    with map_errors():
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    if row is None:
        return MutationConflict(revision=plan.expected_revision, deleted=True)
    fenced, at, woken, revision, deleted = row[:5]
    at_: datetime | None = at
    if at_ is None:
        if not fenced:
            raise FenceLost(plan.message.scope_id)
        return MutationConflict(revision=revision, deleted=deleted)
    return CommittedMutation(
        at=at_,
        woken=frozenset(w for w in woken or () if w is not None),
        # An edit's projection shows the message's reactions (a delete removed them).
        reactions=stored_reactions(row[5]) if len(row) > 5 else (),
    )
