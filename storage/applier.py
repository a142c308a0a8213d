"""The Applier: the only writer of messages (sends here; edits and deletes in
``storage/mutations.py``, its mutation path, on the same outbox clock).

One send is one statement: idempotency probe, the fenced bump of
``scopes.latest_seq`` (and of ``roster_generation`` when memberships change),
the global seq, the message row, its search document, the plan's membership
and notification mutations (thread posters and admitted private agents, from
the message's seq on) and its outbox rows, all in one CTE (half the cost of
separate statements, measured).

The fence is one conditional UPDATE of the scope row. It holds when the row
still has the ``latest_seq`` and the ``roster_generation`` the plan was built
on (a thread send also checks the parent's generation), and the message's
``created_at`` is not ahead of the database clock. Every roster and grant
write bumps the generation in its own transaction, so a join, leave, grant,
revoke or notification change made anywhere since the actor loaded turns the
send into a fence miss, and the actor reloads and plans again instead of
fanning out to readers the database no longer has. ``created_at`` is database
time carried by the actor (``actors/clock.py``); each statement returns
``clock_timestamp()`` to re-anchor it. The conditions ride on the primary-key
update that already locks the row, so they cost nothing measurable.

A batch from one actor runs its statements in one transaction; a fence miss or
an idempotency hit anywhere rolls the whole batch back and tells the actor to
reload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

import msgspec

from actors.model import IdempotencyRecord
from actors.planner import MessagePlan
from actors.ports import CommittedSend, FenceLost, IdempotencyRace
from actors.sources import source_rows
from storage.errors import map_errors
from storage.pg import Prepared, TrioConnection

# The first delivery is inline after commit; the outbox worker only touches a
# row once it is due: a wake not acknowledged by then, or a realtime row that
# was never marked delivered (the node died between commit and fan-out).
WAKE_RETRY_AFTER = timedelta(seconds=30)
REPLAY_AFTER = timedelta(seconds=10)

_encoder = msgspec.json.Encoder()


def json_text(value: Any) -> str:
    """``value`` as JSON text (the form the statements' JSON parameters take)."""
    return _encoder.encode(value).decode()


# ------------------------------------------------------------- the statements
# The single-send statement, the group statement and the bench's raw baseline
# are composed from the fragments below: one text per write (the fenced bump
# of the scope row, the message, its search document, its claims, memberships,
# notification settings, outbox rows and sources), into which each form puts
# where it takes the values — its parameters, or the columns of its rows.


@dataclass(frozen=True, slots=True)
class _Values:
    """Where one form of the statement takes each value of the messages it
    writes: SQL expressions over ``rows``, one row per message."""

    rows: str
    message_id: str
    seq: str
    global_seq: str
    workspace_id: str
    scope_id: str
    author_id: str
    author_type: str
    client_message_id: str
    digest: str
    message_type: str
    content: str
    metadata: str
    created_at: str
    joins: str
    outbox: str
    sources: str


# Values that travel as JSON text and are read as jsonb.
_JSONB = ("metadata", "joins", "outbox", "sources")


def _bound(**given: str) -> _Values:
    """Values from the statement's parameters of the same names, except ``given``."""
    names = [f.name for f in fields(_Values)]
    params = {n: f"%({n})s::jsonb" if n in _JSONB else f"%({n})s" for n in names}
    return _Values(**(params | given))


def _columns_of(alias: str, **given: str) -> _Values:
    """Values from the columns of ``alias`` of the same names, except ``given``."""
    return _Values(**({f.name: f"{alias}.{f.name}" for f in fields(_Values)} | given))


def _bump(
    *,
    chains: str | None,
    scope_id: str,
    count: str,
    last_global_seq: str,
    last_at: str,
    roster_bump: str,
    expected_seq: str,
    expected_generation: str,
    held: str,
    returning: str,
) -> str:
    """The fence: one conditional UPDATE of the scope row (module docstring),
    per chain of ``chains`` if given; ``held``: the form's own conditions."""
    using = "" if chains is None else f"\n    FROM {chains}"
    return f"""bump AS (
    UPDATE scopes s
    SET latest_seq = s.latest_seq + {count},
        latest_global_seq = {last_global_seq},
        latest_message_at = {last_at},
        updated_at = {last_at},
        roster_generation = s.roster_generation + {roster_bump}{using}
    WHERE s.id = {scope_id}
      AND s.latest_seq = {expected_seq}
      AND s.roster_generation = {expected_generation}
      AND {last_at} <= clock_timestamp()
      AND {held}
    RETURNING {returning}
)"""


def _parent_fence(parent_id: str, parent_generation: str) -> str:
    """A thread's send also holds only while its parent's roster is unchanged."""
    return f"""({parent_id} IS NULL OR EXISTS (
          SELECT 1 FROM scopes parent
          WHERE parent.id = {parent_id} AND parent.roster_generation = {parent_generation}))"""


def _message(v: _Values) -> str:
    return f"""message AS (
    INSERT INTO scope_messages (
        id, workspace_id, scope_id, seq, workspace_global_seq, author_member_id, author_type,
        notify_principal_member_id, idempotency_subject_member_id, client_message_id,
        idempotency_payload_digest, message_type, content, metadata, created_at, updated_at)
    SELECT {v.message_id}, {v.workspace_id}, {v.scope_id}, {v.seq}, {v.global_seq},
        {v.author_id}, {v.author_type}, {v.author_id}, {v.author_id}, {v.client_message_id},
        {v.digest}, {v.message_type}, {v.content}, {v.metadata} - 'shareCard' - 'appCard',
        {v.created_at}, {v.created_at}
    FROM {v.rows}
    RETURNING id, seq, workspace_global_seq
)"""


_JOINS = "j(member_id text, visibility text, owner_id text, read_own boolean, state text)"


def _writes(v: _Values, *, dedupe_key: str = "o.dedupe_key") -> str:
    """Everything a written message brings along, for the messages ``v`` reads."""
    return f"""search_doc AS (
    INSERT INTO scope_message_search_docs
        (message_id, workspace_id, scope_id, seq, author_member_id, body, created_at)
    SELECT {v.message_id}, {v.workspace_id}, {v.scope_id}, {v.seq}, {v.author_id},
        {v.content}, {v.created_at}
    FROM {v.rows}
), claim AS (
    -- The uploads the message names (reserved for this send beforehand,
    -- storage/attachments.py): only the author's own, only while unclaimed.
    UPDATE attachments a SET message_id = {v.message_id}, scope_id = {v.scope_id}
    FROM {v.rows}, jsonb_array_elements_text({v.metadata} -> 'attachmentIds') AS x(id)
    WHERE a.id = x.id AND a.uploaded_by_member_id = {v.author_id} AND a.message_id IS NULL
), memberships AS (
    INSERT INTO scope_memberships
        (scope_id, member_id, visibility, owner_member_id, effective_from_seq, last_read_seq)
    SELECT {v.scope_id}, j.member_id, j.visibility, j.owner_id, {v.seq},
        CASE WHEN j.read_own THEN {v.seq} ELSE {v.seq} - 1 END
    FROM {v.rows}, jsonb_to_recordset({v.joins})
        AS {_JOINS}
), notifications AS (
    -- A member a chain admits twice keeps the later message's state.
    INSERT INTO scope_notification_settings (scope_id, member_id, state)
    SELECT DISTINCT ON ({v.scope_id}, j.member_id) {v.scope_id}, j.member_id, j.state
    FROM {v.rows}, jsonb_to_recordset({v.joins})
        AS {_JOINS}
    ORDER BY {v.scope_id}, j.member_id, {v.seq} DESC
    ON CONFLICT (scope_id, member_id) DO UPDATE SET state = excluded.state, updated_at = now()
), outbox AS (
    INSERT INTO scope_fanout_outbox (
        workspace_id, scope_id, message_id, event_ref_type, event_ref_id, fanout_type,
        delivery_policy, target_member_id, target_seq, dedupe_key, payload, next_attempt_at)
    SELECT {v.workspace_id}, {v.scope_id}, {v.message_id}, 'message', {v.message_id},
        o.fanout_type, o.policy, o.target, {v.seq}, {dedupe_key},
        jsonb_strip_nulls(jsonb_build_object('reason', o.reason, 'recipients', o.recipients)),
        {v.created_at} + CASE o.fanout_type
            WHEN 'agent_wake' THEN %(wake_retry_after)s ELSE %(replay_after)s END
    FROM {v.rows}, jsonb_to_recordset({v.outbox})
        AS o(fanout_type text, policy text, target text, dedupe_key text, reason text,
             recipients jsonb)
), sources AS (
    INSERT INTO scope_message_sources (
        target_scope_id, message_id, ordinal, source_scope_id, source_seq, source_message_id,
        source_kind, source_dedupe_key, context_member_id, created_at)
    SELECT {v.scope_id}, {v.message_id}, s.ordinal, src.scope_id, src.seq, src.id, s.kind,
        s.dedupe_key, s.member_id, {v.created_at}
    FROM {v.rows} CROSS JOIN LATERAL jsonb_to_recordset({v.sources})
        AS s(ordinal integer, message_id text, kind text, member_id text, dedupe_key text)
    JOIN scope_messages src ON src.id = s.message_id
), {_cards(v)}"""


def _cards(v: _Values) -> str:
    """A card message's sidecar row (docs/cards.md), from the planned metadata's
    ``shareCard`` or ``appCard``, which the message row itself does not keep."""
    return f"""share_card AS (
    INSERT INTO scope_share_cards (
        id, workspace_id, scope_id, message_id, source_scope_id, source_message_id,
        target_scope_id, created_by_member_id, payload, created_at, updated_at)
    SELECT c.id, {v.workspace_id}, {v.scope_id}, {v.message_id}, c.source_scope_id,
        c.source_message_id, {v.scope_id}, {v.author_id}, jsonb_build_object('kind', c.kind),
        {v.created_at}, {v.created_at}
    FROM {v.rows} CROSS JOIN LATERAL jsonb_to_record({v.metadata} -> 'shareCard')
        AS c(id text, kind text, source_scope_id text, source_message_id text)
    WHERE {v.metadata} ? 'shareCard'
), app_card AS (
    INSERT INTO service_notification_cards (
        scope_id, message_id, app_notification_id, schema_version, card_revision,
        render_payload_json, action_schema_json, expires_at, created_at, updated_at)
    SELECT {v.scope_id}, {v.message_id}, {v.client_message_id}, 1, 1, a.render, a.actions,
        a.expires_at, {v.created_at}, {v.created_at}
    FROM {v.rows} CROSS JOIN LATERAL jsonb_to_record({v.metadata} -> 'appCard')
        AS a(render jsonb, actions jsonb, expires_at timestamptz)
    WHERE {v.metadata} ? 'appCard'
)"""


def single_send_statement(
    *,
    message_id: str = "%(message_id)s",
    created_at: str = "%(created_at)s",
    expected_seq: str = "%(expected_seq)s",
    expected_generation: str = "%(expected_generation)s",
    outbox_key: str = "o.dedupe_key",
) -> str:
    """One send as one statement. A lone send takes it rather than the group
    statement with one row, which costs more (node CPU per send and reply
    latency, measured in alternating pairs). The keywords are for the bench's
    baseline, which makes the same writes with server-made ids and an
    unfenced bump."""
    # Only the scope row is locked (by the fenced UPDATE); the global seq
    # comes from a sequence, so sends to different scopes never wait for each
    # other.
    planned = _bound(
        rows="bump",
        message_id=message_id,
        seq="bump.seq",
        global_seq="bump.global_seq",
        created_at=created_at,
    )
    written = _bound(
        rows="message",
        message_id="message.id",
        seq="message.seq",
        global_seq="message.workspace_global_seq",
        created_at=created_at,
    )
    bump = _bump(
        chains=None,
        scope_id="%(scope_id)s",
        count="1",
        last_global_seq="nextval('message_global_seq')",
        last_at=created_at,
        roster_bump="%(roster_bump)s",
        expected_seq=expected_seq,
        expected_generation=expected_generation,
        held="NOT EXISTS (SELECT 1 FROM existing)\n      AND "
        + _parent_fence("%(parent_id)s::text", "%(parent_generation)s"),
        returning="s.latest_seq AS seq, s.latest_global_seq AS global_seq",
    )
    return f"""
WITH existing AS (
    SELECT id, seq, idempotency_payload_digest AS digest
    FROM scope_messages
    WHERE scope_id = %(scope_id)s
      AND author_member_id = %(author_id)s
      AND idempotency_subject_member_id = %(author_id)s
      AND client_message_id = %(client_message_id)s
), {bump}, {_message(planned)}, {_writes(written, dedupe_key=outbox_key)}
SELECT 'sent', id, seq, workspace_global_seq, NULL::bytea, clock_timestamp() FROM message
UNION ALL
SELECT 'existing', id, seq, NULL, digest, NULL FROM existing
"""


def _group_send() -> str:
    """The next sends of many scopes as ONE statement — one bind, one round
    trip, one commit for all of them. Each scope's chain (one actor's batch:
    consecutive appends) stands alone: a fence miss or an idempotency hit
    writes nothing for that scope and does not disturb the others. A chain
    bumps its scope row once (``latest_seq + n``), fenced on its first plan;
    its global seqs are allocated in chain order before the fence (a miss
    leaves a gap, which the sequence allows anyway)."""
    planned = _columns_of(
        "p",
        rows="bump b JOIN p ON p.scope_id = b.scope_id",
        seq="p.expected_seq + 1",
        global_seq="b.gseqs[p.k + 1]",
        digest="decode(p.digest, 'hex')",
    )
    written = _columns_of("sent", rows="sent")
    bump = _bump(
        chains="chain c",
        scope_id="c.scope_id",
        count="c.n",
        last_global_seq="c.gseqs[c.n]",
        last_at="c.last_at",
        roster_bump="c.roster_bump",
        expected_seq="c.expected_seq",
        expected_generation="c.expected_generation",
        held="c.parent_ok",
        returning="c.scope_id, c.gseqs",
    )
    return f"""
WITH p AS (
    SELECT * FROM jsonb_to_recordset(%(plans)s::jsonb) AS p(
        ord integer, k integer, scope_id text, workspace_id text, message_id text,
        author_id text, author_type text, client_message_id text, digest text,
        message_type text, content text, metadata jsonb, created_at timestamptz,
        expected_seq bigint, expected_generation bigint, roster_bump integer,
        parent_id text, parent_generation bigint, joins jsonb, outbox jsonb, sources jsonb)
), existing AS (
    -- LATERAL ... LIMIT 1: one index probe per row. As a plain join the
    -- planner, told 100 rows by jsonb_to_recordset, hashes p and scans every
    -- message of the table (measured: the statement's cost grew with it).
    SELECT p.ord, p.scope_id, m.id, m.seq, m.digest
    FROM p CROSS JOIN LATERAL (
        SELECT m.id, m.seq, m.idempotency_payload_digest AS digest
        FROM scope_messages m
        WHERE m.scope_id = p.scope_id AND m.author_member_id = p.author_id
          AND m.idempotency_subject_member_id = p.author_id
          AND m.client_message_id = p.client_message_id
        LIMIT 1) m
), chain0 AS (
    SELECT p.scope_id, count(*)::integer AS n, min(p.expected_seq) AS expected_seq,
        min(p.expected_generation) AS expected_generation,
        sum(p.roster_bump)::integer AS roster_bump, max(p.created_at) AS last_at,
        bool_and({_parent_fence("p.parent_id", "p.parent_generation")}) AS parent_ok
    FROM p GROUP BY p.scope_id
), chain AS MATERIALIZED (
    SELECT c.*, ARRAY(
        SELECT nextval('message_global_seq') FROM generate_series(1, c.n)) AS gseqs
    FROM chain0 c
    WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.scope_id = c.scope_id)
), {bump}, {_message(planned)}, sent AS (
    SELECT p.*, m.seq AS seq, m.workspace_global_seq AS global_seq
    FROM message m JOIN p ON p.message_id = m.id
), {_writes(written)}
SELECT 'sent', ord, message_id, seq, global_seq, NULL::bytea, clock_timestamp() FROM sent
UNION ALL
SELECT 'existing', ord, id, seq, NULL, digest, NULL FROM existing
"""


SEND_MESSAGE = single_send_statement()
SEND_GROUP = _group_send()

# Parameter types of the prepared statements (OIDs); strings are left to the
# server's inference (0, as psycopg sends them), so text and enum-like columns
# bind alike.
_UNKNOWN, _BYTEA, _INT8, _TIMESTAMPTZ, _INTERVAL = 0, 17, 20, 1184, 1186
SEND_TYPES = {
    "scope_id": _UNKNOWN,
    "workspace_id": _UNKNOWN,
    "message_id": _UNKNOWN,
    "author_id": _UNKNOWN,
    "author_type": _UNKNOWN,
    "client_message_id": _UNKNOWN,
    "digest": _BYTEA,
    "message_type": _UNKNOWN,
    "content": _UNKNOWN,
    "metadata": _UNKNOWN,
    "created_at": _TIMESTAMPTZ,
    "expected_seq": _INT8,
    "outbox": _UNKNOWN,
    "wake_retry_after": _INTERVAL,
    "replay_after": _INTERVAL,
    "expected_generation": _INT8,
    "roster_bump": _INT8,
    "parent_id": _UNKNOWN,
    "parent_generation": _INT8,
    "joins": _UNKNOWN,
    "plans": _UNKNOWN,
    "sources": _UNKNOWN,
}
_SEND, _SEND_NAMES = Prepared.from_named("scopenode_send_v2", SEND_MESSAGE, SEND_TYPES)
_GROUP, _GROUP_NAMES = Prepared.from_named("scopenode_send_group_v2", SEND_GROUP, SEND_TYPES)
_WAKE_RETRY_TEXT = f"{WAKE_RETRY_AFTER.total_seconds()} seconds".encode()
_REPLAY_TEXT = f"{REPLAY_AFTER.total_seconds()} seconds".encode()
assert _GROUP_NAMES == ("plans", "wake_retry_after", "replay_after")


def _group_row(ord_: int, k: int, plan: MessagePlan) -> dict[str, Any]:
    intent = plan.intent
    return {
        "ord": ord_,
        "k": k,
        "scope_id": intent.scope_id,
        "workspace_id": intent.workspace_id,
        "message_id": intent.message_id,
        "author_id": plan.author.id,
        "author_type": plan.author.type.value,
        "client_message_id": intent.client_message_id,
        "digest": intent.digest.hex(),
        "message_type": intent.message_type,
        "content": intent.content,
        "metadata": message_metadata(plan),
        "created_at": intent.created_at,
        "expected_seq": plan.expected_seq,
        "expected_generation": plan.expected_generation,
        "roster_bump": plan.roster_bump,
        "parent_id": plan.parent_fence[0] if plan.parent_fence else None,
        "parent_generation": plan.parent_fence[1] if plan.parent_fence else None,
        "joins": _joins(plan),
        "outbox": _outbox(plan),
        "sources": source_rows(intent.sources),
    }


ChainOutcome = list[CommittedSend] | FenceLost | IdempotencyRace


def group_rows(chains: Sequence[Sequence[MessagePlan]]) -> list[dict[str, Any]]:
    """One row per plan, numbered in chain order (``ord``) and within its chain (``k``)."""
    rows: list[dict[str, Any]] = []
    for chain in chains:
        for k, plan in enumerate(chain):
            rows.append(_group_row(len(rows), k, plan))
    return rows


def group_values(chains: Sequence[Sequence[MessagePlan]]) -> list[bytes | None]:
    """The group statement's parameters, text-encoded: one JSON row per plan."""
    return group_rows_values(group_rows(chains))


def group_rows_values(rows: Sequence[dict[str, Any]]) -> list[bytes | None]:
    return [_encoder.encode(rows), _WAKE_RETRY_TEXT, _REPLAY_TEXT]


async def run_group_rows(conn: TrioConnection, rows: Sequence[dict[str, Any]]) -> list[Any]:
    """The group statement over ready-made rows (the bench's bare relay
    commits with it exactly as :func:`apply_chains` does)."""
    with map_errors():
        return await conn.run_prepared(_GROUP, group_rows_values(rows))


async def apply_chains(
    conn: TrioConnection, chains: Sequence[Sequence[MessagePlan]]
) -> list[ChainOutcome]:
    """Commit each chain (consecutive appends to one scope; distinct scopes)
    in one autocommitted statement.

    Returns per chain its results, or the idempotency hit / fence miss that
    made it write nothing. ``conn`` must be in autocommit mode.
    """
    found = {row[1]: row for row in await run_group_rows(conn, group_rows(chains))}
    out: list[ChainOutcome] = []
    base = 0
    for chain in chains:
        results: list[CommittedSend] = []
        miss: FenceLost | IdempotencyRace | None = None
        for i, plan in enumerate(chain, base):
            row = found.get(i)
            try:
                results.append(committed(plan, None if row is None else (row[0], *row[2:])))
            except FenceLost as lost:
                miss = miss or lost
            except IdempotencyRace as race:
                # The more useful miss: the actor learns the existing record.
                miss = race if not isinstance(miss, IdempotencyRace) else miss
        base += len(chain)
        out.append(miss if miss is not None else results)
    return out


async def apply_group(
    conn: TrioConnection, plans: Sequence[MessagePlan]
) -> list[CommittedSend | FenceLost | IdempotencyRace]:
    """``apply_chains`` for one plan per scope: per plan its result or miss."""
    return [
        outcome[0] if isinstance(outcome, list) else outcome
        for outcome in await apply_chains(conn, [[plan] for plan in plans])
    ]


def message_metadata(plan: MessagePlan) -> dict[str, Any]:
    """The ``metadata`` column of a planned message, as stored."""
    intent = plan.intent
    metadata = dict(intent.metadata)
    if plan.mentions:
        metadata["mentions"] = list(plan.mentions)
    if intent.recipients:
        metadata["recipients"] = list(intent.recipients)
    if intent.attachment_ids:
        metadata["attachmentIds"] = list(intent.attachment_ids)
    return metadata


def _outbox(plan: MessagePlan) -> list[dict[str, Any]]:
    return [
        {
            "fanout_type": o.fanout_type,
            "policy": o.delivery_policy.value,
            "target": o.target_member_id,
            "dedupe_key": o.dedupe_key,
            "reason": o.reason,
            "recipients": [list(r) for r in o.recipients] if o.recipients is not None else None,
        }
        for o in plan.outbox
    ]


def _joins(plan: MessagePlan) -> list[dict[str, Any]]:
    return [
        {
            "member_id": m.member.id,
            "visibility": m.visibility,
            "owner_id": m.owner_member_id,
            "read_own": m.read_through_message,
            "state": m.state.value,
        }
        for m in plan.memberships
    ]


# The single statement's parameters in their ``$n`` order (checked at import).
_SEND_ORDER = (
    "scope_id",
    "author_id",
    "client_message_id",
    "created_at",
    "roster_bump",
    "expected_seq",
    "expected_generation",
    "parent_id",
    "parent_generation",
    "message_id",
    "workspace_id",
    "author_type",
    "digest",
    "message_type",
    "content",
    "metadata",
    "joins",
    "wake_retry_after",
    "replay_after",
    "outbox",
    "sources",
)
assert _SEND_NAMES == _SEND_ORDER


def send_values(plan: MessagePlan) -> list[bytes | None]:
    """The single statement's parameters in PostgreSQL's text format, in
    ``_SEND_ORDER``: built in place, the hot path of a lone sender (a dict of
    values and a type test per value cost twice as much)."""
    intent = plan.intent
    author = plan.author
    fence = plan.parent_fence
    return [
        intent.scope_id.encode(),
        author.id.encode(),
        intent.client_message_id.encode(),
        intent.created_at.isoformat().encode(),
        b"%d" % plan.roster_bump,
        b"%d" % plan.expected_seq,
        b"%d" % plan.expected_generation,
        None if fence is None else fence[0].encode(),
        None if fence is None else b"%d" % fence[1],
        intent.message_id.encode(),
        intent.workspace_id.encode(),
        author.type.value.encode(),
        b"\\x" + intent.digest.hex().encode(),
        intent.message_type.encode(),
        intent.content.encode(),
        # Row sets travel as one JSON text each: far cheaper to adapt than arrays.
        _encoder.encode(message_metadata(plan)),
        _encoder.encode(_joins(plan)),
        _WAKE_RETRY_TEXT,
        _REPLAY_TEXT,
        _encoder.encode(_outbox(plan)),
        _encoder.encode(source_rows(intent.sources)),
    ]


async def _send_one(conn: TrioConnection, plan: MessagePlan) -> CommittedSend:
    rows = await conn.run_prepared(_SEND, send_values(plan))
    return committed(plan, rows[0] if rows else None)


def committed(plan: MessagePlan, row: tuple[Any, ...] | None) -> CommittedSend:
    """The result row of SEND_MESSAGE for ``plan``, or the typed reason it wrote nothing."""
    if row is None:
        raise FenceLost(plan.intent.scope_id)
    kind, message_id, seq, global_seq, digest, db_now = row
    if kind == "existing":
        raise IdempotencyRace(
            IdempotencyRecord(message_id, seq, bytes(digest)),
            plan.author.id,
            plan.intent.client_message_id,
        )
    return CommittedSend(message_id, seq, global_seq, plan.intent.created_at, db_now)


async def apply_sends(conn: TrioConnection, plans: Sequence[MessagePlan]) -> list[CommittedSend]:
    """Commit ``plans`` (consecutive appends to one scope) atomically.

    ``conn`` must be in autocommit mode: a single plan is then one statement
    and one round trip; several share an explicit transaction.
    """
    with map_errors():
        if len(plans) == 1:
            return [await _send_one(conn, plans[0])]
        async with conn.transaction():
            return [await _send_one(conn, plan) for plan in plans]
