"""Reactions: the Applier's reaction path and the summaries read surfaces show.

A reaction is non-message activity (docs/design.md#reactions): it never takes
the send fence, never moves ``latest_seq`` and never writes an outbox row.
``add`` and ``remove`` are each ONE statement: the readable predicate of
``storage/visibility.py`` decides whether the reactor may read the message,
the scope's ``roster_generation`` must still be the one the actor decided on
(the viewer parameters come from its cached roster), and the write happens
only when both hold. ``add`` also writes the ``reaction_add`` row of
``scope_activity_events``; ``remove`` deletes the reaction and suppresses its
activity rows that are still live. The actor writes the reactions queued on
it with :data:`REACT_GROUP`, the same writes for many messages at once; a
batch of one takes the single statement (no rows to build and unpack).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import msgspec

from actors.ids import new_id
from actors.model import Member
from actors.ports import ReactionOutcome, ReactionWrite
from actors.reactions import SHOWN_MEMBERS, ReactionSummary, StoredReaction
from storage.errors import map_errors
from storage.pg import Prepared, TrioConnection, text_param
from storage.visibility import BOUND, Viewer, ViewerTerms, readable_join

# Distinct emoji one message may carry (the 21st is refused).
MAX_DISTINCT_EMOJI = 20

# The reaction statements — one reaction's add, its remove, and the reactions
# queued on one scope's actor as ONE statement (one bind, one round trip, one
# commit for all of them) — are composed from the fragments below. Each form
# says where the reactions come from (``target``: the statement's parameters,
# or one row per reaction); the writes read only ``target`` and are one text.

_FENCE = """fence AS (
    SELECT 1 FROM scopes WHERE id = %(scope_id)s AND roster_generation = %(generation)s
)"""


def _target(*, carried: str, source: str, viewer: ViewerTerms, where: str = "true") -> str:
    """Each reaction asked for (ord, op, reactor, emoji, activity ids, whether
    its message's author is to be woken) with the message it names, if that
    is in the scope and the fence holds, and the readable predicate's answer
    for the reactor."""
    return f"""target AS (
    SELECT {carried},
           m.id, m.workspace_id, m.scope_id, m.author_member_id, m.seq, m.created_at, v.reason
    FROM {source}
    {readable_join(viewer)}
    WHERE {where} AND EXISTS (SELECT 1 FROM fence)
)"""


# Unique per (message, member, emoji): a second add conflicts and changes
# nothing. The cap counts distinct emoji already on the message; an emoji
# already there is always room. Adds of one scope are serialised by its
# actor, so the count cannot race on one node; the group statement gets at
# most one reaction per message, so every row's count and write are
# independent of the others'.
_ROOM = f"""room AS (
    SELECT t.ord, EXISTS (
        SELECT 1 FROM scope_message_reactions x WHERE x.message_id = t.id AND x.emoji = t.emoji
    ) OR (
        SELECT count(DISTINCT x.emoji) FROM scope_message_reactions x WHERE x.message_id = t.id
    ) < {MAX_DISTINCT_EMOJI} AS ok
    FROM target t WHERE t.op = 'add'
)"""

# ``add`` also writes the ``reaction_add`` row of ``scope_activity_events``.
_ADDED = """added AS (
    INSERT INTO scope_message_reactions (scope_id, message_id, member_id, emoji)
    SELECT t.scope_id, t.id, t.member_id, t.emoji FROM target t JOIN room USING (ord)
    WHERE t.reason IS NOT NULL AND room.ok
    ON CONFLICT DO NOTHING
    RETURNING message_id
),
activity AS (
    INSERT INTO scope_activity_events (
        id, workspace_id, scope_id, activity_type, activity_ref_type, activity_ref_id,
        activity_global_seq, source_message_id, actor_member_id, reason, payload
    )
    SELECT t.event_id, t.workspace_id, t.scope_id, 'reaction_add', 'reaction', t.ref_id,
           nextval('scope_activity_global_seq'), t.id, t.member_id,
           CASE WHEN t.wakes_author THEN 'author_auto_wake' ELSE 'reaction' END,
           jsonb_build_object('emoji', t.emoji)
    FROM added a JOIN target t ON t.id = a.message_id
)"""

# ``remove`` deletes the reaction and suppresses its activity rows still live.
_REMOVED = """removed AS (
    DELETE FROM scope_message_reactions x USING target t
    WHERE t.op = 'remove' AND t.reason IS NOT NULL AND x.message_id = t.id
      AND x.member_id = t.member_id AND x.emoji = t.emoji
    RETURNING x.message_id
),
suppressed AS (
    UPDATE scope_activity_events e SET suppressed_at = now()
    FROM removed x JOIN target t ON t.id = x.message_id
    WHERE e.activity_ref_type = 'reaction' AND e.activity_ref_id = t.ref_id
      AND e.suppressed_at IS NULL
)"""

_WRITES = {"add": (_ADDED, "added"), "remove": (_REMOVED, "removed")}

# What each reaction came to: fenced, found, readable (the reason), the
# message's author, seq and time, room for its emoji, and whether it changed
# anything.
_OUTCOME_COLUMNS = """EXISTS (SELECT 1 FROM fence), t.id IS NOT NULL, t.reason, t.author_member_id,
       t.seq, t.created_at, COALESCE(room.ok, true)"""


def _react_one(op: str) -> str:
    """One reaction of the viewer the parameters name, in one statement."""
    writes, changed = _WRITES[op]
    target = _target(
        carried=f"""0 AS ord, '{op}' AS op, %(member_id)s::text AS member_id,
           %(emoji)s::text AS emoji, %(event_id)s::text AS event_id,
           %(ref_id)s::text AS ref_id,
           m.author_member_id = ANY(%(wake)s::text[]) AS wakes_author""",
        source="scope_messages m",
        viewer=BOUND,
        where="m.id = %(message_id)s AND m.scope_id = %(scope_id)s",
    )
    return f"""
WITH {_FENCE},
{target},
{_ROOM},
{writes}
SELECT {_OUTCOME_COLUMNS}, EXISTS (SELECT 1 FROM {changed})
FROM (SELECT 1) one LEFT JOIN target t ON true LEFT JOIN room ON room.ord = t.ord
"""


def _react_group() -> str:
    """The reactions of many messages of one scope, each row with its own
    reactor: the readable predicate reads the viewer from the row (the grant
    scopes and the thread flag are the scope's, parameters). The outcomes are
    exactly those of the single statements run one after another."""
    target = _target(
        carried="""q.ord, q.op, q.member_id, q.emoji, q.event_id, q.ref_id,
           q.wake ? m.author_member_id AS wakes_author""",
        source="q JOIN scope_messages m ON m.id = q.message_id AND m.scope_id = %(scope_id)s",
        viewer=ViewerTerms(
            viewer_id="q.member_id",
            viewer_public="q.viewer_public",
            viewer_private="q.viewer_private",
            owner_id="q.owner_id",
        ),
    )
    changed = " OR ".join(
        f"EXISTS (SELECT 1 FROM {cte} c WHERE c.message_id = q.message_id)"
        for _writes, cte in _WRITES.values()
    )
    return f"""
WITH q AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS q(
        ord integer, op text, message_id text, member_id text, emoji text,
        viewer_public boolean, viewer_private boolean, owner_id text,
        event_id text, ref_id text, wake jsonb)
),
{_FENCE},
{target},
{_ROOM},
{_ADDED},
{_REMOVED}
SELECT q.ord, {_OUTCOME_COLUMNS},
       {changed}
FROM q LEFT JOIN target t ON t.ord = q.ord LEFT JOIN room ON room.ord = q.ord
ORDER BY q.ord
"""


REACT_ADD = _react_one("add")
REACT_REMOVE = _react_one("remove")
REACT_GROUP = _react_group()

# Parameter types (OIDs) of the prepared statements; text is left to the
# server's inference (0), as psycopg sends it.
_UNKNOWN, _BOOL, _INT8, _TEXT_ARRAY = 0, 16, 20, 1009
_TYPES = {
    "in_thread": _BOOL,
    "viewer_id": _UNKNOWN,
    "viewer_public": _BOOL,
    "viewer_private": _BOOL,
    "owner_id": _UNKNOWN,
    "grant_scopes": _TEXT_ARRAY,
    "scope_id": _UNKNOWN,
    "generation": _INT8,
    "message_id": _UNKNOWN,
    "member_id": _UNKNOWN,
    "emoji": _UNKNOWN,
    "event_id": _UNKNOWN,
    "ref_id": _UNKNOWN,
    "wake": _TEXT_ARRAY,
    "rows": _UNKNOWN,
}
_ADD, _ADD_NAMES = Prepared.from_named("scopenode_react_add_v1", REACT_ADD, _TYPES)
_REMOVE, _REMOVE_NAMES = Prepared.from_named("scopenode_react_remove_v1", REACT_REMOVE, _TYPES)
_GROUP, _GROUP_NAMES = Prepared.from_named("scopenode_react_group_v1", REACT_GROUP, _TYPES)
_encoder = msgspec.json.Encoder()


def _outcome(row: Sequence[Any]) -> ReactionOutcome:
    fenced, found, reason, author_id, seq, created_at, room, changed = row
    return ReactionOutcome(
        fenced=bool(fenced),
        found=bool(found),
        readable=reason is not None,
        room=bool(room),
        changed=bool(changed),
        author_id=author_id,
        seq=seq,
        created_at=created_at,
    )


# Summaries of many messages in one round trip, ordered by first reaction.
# Who may see whose reaction is the rule of actors.policy.sees_reaction: a
# private agent's reaction only by itself and its owner; a private agent
# sees only its own, its owner's and its owner's other private agents'.
SUMMARIES = """
SELECT r.message_id, r.emoji, count(*),
       (array_agg(r.member_id ORDER BY r.created_at, r.member_id COLLATE "C"))[1:%(shown)s]
FROM scope_message_reactions r
JOIN members rm ON rm.id = r.member_id
WHERE r.message_id = ANY(%(ids)s)
  AND CASE WHEN %(viewer_private)s
           THEN r.member_id = %(viewer_id)s OR r.member_id = %(owner_id)s
                OR (rm.is_private AND rm.owner_member_id = %(owner_id)s)
           ELSE NOT rm.is_private OR r.member_id = %(viewer_id)s
                OR rm.owner_member_id = %(viewer_id)s
      END
GROUP BY r.message_id, r.emoji
ORDER BY r.message_id, min(r.created_at), r.emoji COLLATE "C"
"""


def reaction_ref(message_id: str, member_id: str, emoji: str) -> str:
    """``activity_ref_id`` of a reaction: the reaction table's key, as one text."""
    return f"{message_id}/{member_id}/{emoji}"


def react_params(
    viewer: Viewer,
    scope_id: str,
    generation: int,
    message_id: str,
    emoji: str,
    wake: Collection[str] = (),
) -> dict[str, Any]:
    member_id = viewer.member.id
    return {
        **viewer.params(),
        "scope_id": scope_id,
        "generation": generation,
        "message_id": message_id,
        "member_id": member_id,
        "emoji": emoji,
        "event_id": new_id("act"),
        "ref_id": reaction_ref(message_id, member_id, emoji),
        "wake": list(wake),
    }


async def react(
    conn: TrioConnection,
    op: str,
    viewer: Viewer,
    scope_id: str,
    generation: int,
    message_id: str,
    emoji: str,
    wake: Collection[str] = (),
) -> ReactionOutcome:
    """Add or remove one reaction of ``viewer.member`` in one statement (autocommit).

    ``wake``: the agents whose own message, if it is this one, makes the
    activity row target them (``reason`` ``author_auto_wake``).
    """
    params = react_params(viewer, scope_id, generation, message_id, emoji, wake)
    stmt, names = (_ADD, _ADD_NAMES) if op == "add" else (_REMOVE, _REMOVE_NAMES)
    with map_errors():
        rows = await conn.run_prepared(stmt, [text_param(params[name]) for name in names])
    return _outcome(rows[0])


async def react_many(
    conn: TrioConnection,
    scope_id: str,
    generation: int,
    writes: Sequence[ReactionWrite],
    *,
    grant_scopes: tuple[str, ...],
    in_thread: bool,
) -> list[ReactionOutcome]:
    """Write reactions on distinct messages of one scope in one statement
    (autocommit); one outcome per write, in order."""
    if len({w.message_id for w in writes}) != len(writes):
        raise ValueError("react_many: at most one reaction per message")
    if len(writes) == 1:
        # One reaction: its own statement, with no rows to encode and unpack.
        w = writes[0]
        viewer = Viewer(w.reactor, w.public_reader, grant_scopes, in_thread)
        return [
            await react(conn, w.op, viewer, scope_id, generation, w.message_id, w.emoji, w.wake)
        ]
    rows = []
    for ord_, w in enumerate(writes):
        member = w.reactor
        rows.append(
            {
                "ord": ord_,
                "op": w.op,
                "message_id": w.message_id,
                "member_id": member.id,
                "emoji": w.emoji,
                "viewer_public": w.public_reader,
                "viewer_private": member.is_private_agent,
                "owner_id": member.owner_member_id if member.is_private_agent else None,
                "event_id": new_id("act"),
                "ref_id": reaction_ref(w.message_id, member.id, w.emoji),
                "wake": sorted(w.wake),
            }
        )
    params = {
        "rows": _encoder.encode(rows),
        "scope_id": scope_id,
        "generation": generation,
        "in_thread": in_thread,
        "grant_scopes": grant_scopes,
    }
    encoded = [text_param(params[name]) for name in _GROUP_NAMES]
    with map_errors():
        found = await conn.run_prepared(_GROUP, encoded)
    assert [row[0] for row in found] == list(range(len(writes)))
    return [_outcome(row[1:]) for row in found]


async def summaries(
    conn: TrioConnection, message_ids: Sequence[str], viewer: Member
) -> dict[str, list[ReactionSummary]]:
    """Message id → its reactions as ``viewer`` may see them, by first reaction."""
    if not message_ids:
        return {}
    params = {
        "ids": list(message_ids),
        "shown": SHOWN_MEMBERS,
        "viewer_id": viewer.id,
        "viewer_private": viewer.is_private_agent,
        "owner_id": viewer.owner_member_id if viewer.is_private_agent else None,
    }
    with map_errors():
        cur = await conn.execute(SUMMARIES, params)
        rows = await cur.fetchall()
    out: dict[str, list[ReactionSummary]] = {}
    for message_id, emoji, count, member_ids in rows:
        out.setdefault(message_id, []).append(ReactionSummary(emoji, count, tuple(member_ids)))
    return out


# Every reaction of the message ``%(message_id)s`` as one jsonb value, for
# statements that return it with their result (an edit's, for the
# projection): ``actors.reactions`` decides from it who is shown what.
STORED_OF_MESSAGE = """(
    SELECT coalesce(jsonb_agg(jsonb_build_array(x.member_id, x.emoji, x.rank, x.owner)), '[]')
    FROM (
        SELECT r.member_id, r.emoji, dense_rank() OVER (ORDER BY r.created_at) AS rank,
               CASE WHEN rm.is_private THEN rm.owner_member_id END AS owner
        FROM scope_message_reactions r JOIN members rm ON rm.id = r.member_id
        WHERE r.message_id = %(message_id)s
    ) x
)"""


def stored_reactions(value: Sequence[Sequence[Any]] | None) -> tuple[StoredReaction, ...]:
    """The value of :data:`STORED_OF_MESSAGE`, decoded."""
    return tuple(
        StoredReaction(str(member_id), str(emoji), int(rank), owner)
        for member_id, emoji, rank, owner in value or ()
    )
