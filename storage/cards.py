"""Cards: the Applier's card statements and each viewer's view of a card.

docs/cards.md. A card's message is written by the send statement
(``storage/applier.py`` writes its sidecar row from the plan); a change of the
card afterwards is a mutation of that message, like an edit: one statement in
autocommit, fenced on the scope's ``roster_generation``, that writes the
sidecar and one ``worker_first_mutation`` outbox row (the plan's) and never
moves a seq. An app card's change is conditional on ``card_revision`` and
its UPDATE holds the card's row lock, so two actions on one revision cannot
both apply, whichever nodes they came through.

Reading a card asks again, for every viewer, whether it may see what a share
card points at: a channel it may see (a public one, or a private one it is a
member of) or a message the readable predicate lets it read. Anyone else gets
the card without its ``source``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from actors.cards import (
    APP_CARD,
    SHARE_CARD,
    AppCardState,
    CardChange,
    CardTarget,
    ShareCardState,
    app_card_view,
)
from actors.model import Member, StoredMessage
from actors.planner import MutationPlan
from actors.ports import CommittedMutation, FenceLost, MutationConflict
from storage import messages, scopes, sources
from storage.errors import map_errors
from storage.messages import STORED_COLUMNS, message_from_row
from storage.mutations import _FENCE, _OUTBOX, _params
from storage.pg import TrioConnection
from storage.reactions import STORED_OF_MESSAGE, stored_reactions

_encoder = msgspec.json.Encoder()

SELECT_TARGET = f"""
SELECT {STORED_COLUMNS},
    sc.id, sc.payload ->> 'kind', sc.source_scope_id, sc.source_message_id,
    sc.created_by_member_id, sc.revoked_at IS NOT NULL,
    coalesce(sp.owner_member_id, spp.owner_member_id),
    nc.card_revision, nc.render_payload_json, nc.action_schema_json, nc.state, nc.expires_at
FROM scope_messages m
JOIN members mem ON mem.id = m.author_member_id
LEFT JOIN scope_share_cards sc ON sc.message_id = m.id
LEFT JOIN scopes src ON src.id = sc.source_scope_id
LEFT JOIN scope_channel_profiles sp ON sp.scope_id = src.id
LEFT JOIN scope_channel_profiles spp ON spp.scope_id = src.parent_scope_id
LEFT JOIN service_notification_cards nc ON nc.message_id = m.id
WHERE m.id = %(message_id)s AND m.scope_id = %(scope_id)s
"""

# What every card statement answers: whether the fence held, when the change
# was written (NULL: nothing was) and the message's reactions for its projection.
_RESULT = f"""
SELECT EXISTS (SELECT 1 FROM fence), w.at, {STORED_OF_MESSAGE}
FROM scope_messages cur
LEFT JOIN written w ON true
WHERE cur.id = %(message_id)s
"""

REVOKE_SHARE = f"""
WITH {_FENCE}, revoked AS (
    UPDATE scope_share_cards c
    SET revoked_at = clock_timestamp(), revoked_by_member_id = %(actor_id)s,
        updated_at = clock_timestamp()
    WHERE c.message_id = %(message_id)s AND c.revoked_at IS NULL
      AND EXISTS (SELECT 1 FROM fence)
    RETURNING c.revoked_at AS at
), written AS (
    SELECT m.id, m.seq, m.revision, r.at FROM revoked r, scope_messages m
    WHERE m.id = %(message_id)s
), {_OUTBOX}
{_RESULT}
"""

# A human's action: recorded with the revision it was taken on, and the card
# one revision on. Refused once the card expired (database time).
ACT_ON_CARD = f"""
WITH {_FENCE}, moved AS (
    UPDATE service_notification_cards c
    SET card_revision = c.card_revision + 1, updated_at = clock_timestamp()
    WHERE c.message_id = %(message_id)s AND c.card_revision = %(expected_card_revision)s
      AND c.state = 'active' AND (c.expires_at IS NULL OR c.expires_at > clock_timestamp())
      AND EXISTS (SELECT 1 FROM fence)
    RETURNING c.message_id, c.updated_at AS at
), written AS (
    SELECT m.id, m.seq, m.revision, mv.at, m.author_member_id
    FROM moved mv JOIN scope_messages m ON m.id = mv.message_id
), action AS (
    INSERT INTO service_card_actions
        (message_id, revision, action_id, value, member_id, service_member_id, created_at)
    SELECT w.id, %(expected_card_revision)s, %(action_id)s, %(value)s, %(actor_id)s,
        w.author_member_id, w.at
    FROM written w
), {_OUTBOX}
{_RESULT}
"""

# The service's update: the new render and actions, and (when given) the
# message's fallback content and its search document; seq and revision stay.
UPDATE_CARD = f"""
WITH {_FENCE}, moved AS (
    UPDATE service_notification_cards c
    SET card_revision = c.card_revision + 1, render_payload_json = %(render)s::jsonb,
        action_schema_json = %(actions)s::jsonb, updated_at = clock_timestamp()
    WHERE c.message_id = %(message_id)s AND c.card_revision = %(expected_card_revision)s
      AND EXISTS (SELECT 1 FROM fence)
    RETURNING c.message_id, c.updated_at AS at
), written AS (
    SELECT m.id, m.seq, m.revision, mv.at FROM moved mv JOIN scope_messages m ON m.id = mv.message_id
), content AS (
    UPDATE scope_messages m SET content = %(content)s, updated_at = w.at
    FROM written w WHERE m.id = w.id AND %(content)s::text IS NOT NULL
), search AS (
    UPDATE scope_message_search_docs d SET body = %(content)s
    FROM written w WHERE d.message_id = w.id AND %(content)s::text IS NOT NULL
), {_OUTBOX}
{_RESULT}
"""

CARD_REVISION = "SELECT card_revision FROM service_notification_cards WHERE message_id = %s"

SELECT_SHARE_CARD = """
SELECT c.scope_id, c.message_id FROM scope_share_cards c
JOIN scopes s ON s.id = c.scope_id
WHERE c.id = %s AND s.workspace_id = %s
"""
SELECT_SHARE_BY_MESSAGE = "SELECT id FROM scope_share_cards WHERE message_id = %s"

# Share cards of the given messages, with what a channel card shows of its
# channel and whether the viewer is a current member of it.
SELECT_SHARES = """
SELECT c.message_id, c.id, c.payload ->> 'kind', c.revoked_at IS NOT NULL, c.source_scope_id,
    c.source_message_id, p.slug, p.display_name, p.description, p.visibility,
    (SELECT count(*) FROM scope_memberships n
     WHERE n.scope_id = c.source_scope_id AND n.effective_to_seq IS NULL
       AND n.visibility = 'public'),
    EXISTS (SELECT 1 FROM scope_memberships j
            WHERE j.scope_id = c.source_scope_id AND j.member_id = %(member_id)s
              AND j.effective_to_seq IS NULL)
FROM scope_share_cards c
LEFT JOIN scope_channel_profiles p ON p.scope_id = c.source_scope_id
WHERE c.message_id = ANY(%(ids)s)
"""
SELECT_APP_CARDS = """
SELECT message_id, card_revision, render_payload_json, action_schema_json, state, expires_at
FROM service_notification_cards WHERE message_id = ANY(%s)
"""


def _share_state(row: Sequence[Any]) -> ShareCardState | None:
    if row[0] is None:
        return None
    card_id, kind, scope_id, message_id, created_by, revoked, owner = row
    return ShareCardState(card_id, kind, scope_id, message_id, created_by, revoked, owner)


def _app_state(row: Sequence[Any]) -> AppCardState | None:
    if row[0] is None:
        return None
    revision, render, actions, state, expires_at = row
    return AppCardState(revision, dict(render or {}), list(actions or []), state, expires_at)


async def target(conn: TrioConnection, scope_id: str, message_id: str) -> CardTarget | None:
    """The card message ``message_id`` of ``scope_id`` and its card as stored, or None."""
    with map_errors():
        cur = await conn.execute(SELECT_TARGET, {"scope_id": scope_id, "message_id": message_id})
        row = await cur.fetchone()
    if row is None:
        return None
    return CardTarget(message_from_row(row[:20]), _share_state(row[20:27]), _app_state(row[27:]))


async def apply(
    conn: TrioConnection, plan: MutationPlan, change: CardChange
) -> CommittedMutation | MutationConflict:
    """Write one card change in one statement (``conn`` in autocommit).

    Raises :class:`FenceLost` when the roster moved since the plan; answers
    :class:`MutationConflict` with the card's current revision when another
    change of the card came first.
    """
    params = _params(plan)
    params["expected_card_revision"] = change.expected_revision
    if change.op == "revoke":
        sql = REVOKE_SHARE
    elif change.op == "act":
        sql = ACT_ON_CARD
        params |= {"action_id": change.action_id, "value": change.value}
    else:
        sql = UPDATE_CARD
        params |= {
            "render": _encoder.encode(change.render).decode(),
            "actions": _encoder.encode(change.actions).decode(),
            "content": change.content,
        }
    with map_errors():
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    if row is None:
        return MutationConflict(revision=change.expected_revision, deleted=True)
    fenced, at, reactions = row
    written: datetime | None = at
    if written is None:
        if not fenced:
            raise FenceLost(plan.message.scope_id)
        # A new statement: the revision that won, as committed now.
        with map_errors():
            cur = await conn.execute(CARD_REVISION, (plan.message.id,))
            current = await cur.fetchone()
        return MutationConflict(revision=current[0] if current else 0, deleted=False)
    return CommittedMutation(at=written, woken=frozenset(), reactions=stored_reactions(reactions))


async def share_card(
    conn: TrioConnection, card_id: str, workspace_id: str
) -> tuple[str, str] | None:
    """The scope and message of share card ``card_id`` of the workspace, or None."""
    with map_errors():
        cur = await conn.execute(SELECT_SHARE_CARD, (card_id, workspace_id))
        row = await cur.fetchone()
    return (row[0], row[1]) if row else None


async def share_card_of(conn: TrioConnection, message_id: str) -> str | None:
    """The id of the share card whose message is ``message_id``."""
    with map_errors():
        cur = await conn.execute(SELECT_SHARE_BY_MESSAGE, (message_id,))
        row = await cur.fetchone()
    return row[0] if row else None


async def cards_for(
    conn: TrioConnection, shown: Sequence[StoredMessage], member: Member
) -> dict[str, dict[str, Any]]:
    """Message id → its ``card`` as ``member`` may see it, for the card messages
    of ``shown``; no query when there is none."""
    out: dict[str, dict[str, Any]] = {}
    shares = [m.id for m in shown if m.message_type == SHARE_CARD and m.deleted_at is None]
    apps = [m.id for m in shown if m.message_type == APP_CARD and m.deleted_at is None]
    if shares:
        with map_errors():
            cur = await conn.execute(SELECT_SHARES, {"ids": shares, "member_id": member.id})
            rows = await cur.fetchall()
        for row in rows:
            out[row[0]] = await _share_view(conn, row, member)
    if apps:
        with map_errors():
            cur = await conn.execute(SELECT_APP_CARDS, (apps,))
            rows = await cur.fetchall()
        for row in rows:
            app = _app_state(row[1:])
            assert app is not None
            out[row[0]] = app_card_view(row[0], app)
    return out


async def _share_view(conn: TrioConnection, row: Sequence[Any], member: Member) -> dict[str, Any]:
    (_, card_id, kind, revoked, scope_id, message_id) = row[:6]
    slug, name, description, visibility, member_count, joined = row[6:]
    card: dict[str, Any] = {"cardId": card_id, "kind": kind, "revoked": bool(revoked)}
    if revoked:
        return card
    source: dict[str, Any] | None = None
    if kind == "channel":
        if visibility == "public" or joined:
            source = {
                "scopeId": scope_id,
                "slug": slug,
                "name": name,
                "description": description,
                "visibility": visibility,
                "memberCount": member_count,
                "joined": bool(joined),
            }
    elif message_id is not None:
        source = await _message_source(conn, scope_id, message_id, member)
    if source is None:
        return card | {"unavailable": True}
    return card | {"source": source}


async def _message_source(
    conn: TrioConnection, scope_id: str, message_id: str, member: Member
) -> dict[str, Any] | None:
    """What a message card previews, when ``member`` may read the message."""
    info = await scopes.get_scope(conn, scope_id)
    if info is None or info.workspace_id != member.workspace_id:
        return None
    viewer = await sources.any_viewer(conn, info, member)
    if viewer is None:
        return None
    found = await messages.readable_message(conn, scope_id, message_id, viewer)
    if found is None:
        return None
    cited = found.message
    return {
        "scopeId": scope_id,
        "messageId": cited.id,
        "seq": cited.seq,
        "author": {
            "memberId": cited.author.id,
            "handle": cited.author.handle,
            "displayName": cited.author.display_name,
        },
        "content": cited.content,
        "createdAt": f"{cited.created_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}",
        "deleted": cited.deleted_at is not None,
    }
