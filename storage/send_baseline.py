"""The raw send statement the bench times against the node: the Applier's
single-send writes, through the node's own call, with no node around them.

The bench measures "the same writes the Applier makes, through the same call,
no node": the single-send statement with server-made ids and the fence
comparing the row with itself (each worker owns its scope), prepared and bound
as the node binds a send (``TrioConnection.run_prepared``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.planner import SEND_REALTIME_POLICY
from storage.applier import (
    REPLAY_AFTER,
    SEND_TYPES,
    WAKE_RETRY_AFTER,
    json_text,
    single_send_statement,
)
from storage.errors import map_errors
from storage.pg import Prepared, TrioConnection, text_param

RAW_SEND_BASELINE_SQL = single_send_statement(
    message_id="'msg_' || replace(gen_random_uuid()::text, '-', '')",
    created_at="now()",
    expected_seq="s.latest_seq",
    expected_generation="s.roster_generation",
    outbox_key="'rt:' || message.id",
)
_BASELINE, _BASELINE_NAMES = Prepared.from_named(
    "scopenode_send_baseline_v1", RAW_SEND_BASELINE_SQL, SEND_TYPES
)


def baseline_statement_values(params: dict[str, Any]) -> list[bytes | None]:
    """The baseline statement's parameters (``prepare_baseline_params``) as the
    node binds a send's: encoded once, in the prepared statement's order."""
    return [text_param(params[name]) for name in _BASELINE_NAMES]


async def run_baseline(conn: TrioConnection, values: Sequence[bytes | None]) -> list[Any]:
    """The raw send statement, committed through the call the node's sends
    take (``run_prepared``): the bench's raw phase and bare relay time the
    statement, not a slower driver path."""
    with map_errors():
        return await conn.run_prepared(_BASELINE, values)


# The node marks a realtime row delivered after fan-out; the raw statement has
# no node behind it, so its rows would stay pending and the node's outbox
# worker would replay them ten seconds later, in the middle of the next
# measured phase. The bench settles them right after each baseline phase.
BASELINE_SETTLE_SQL = (
    "UPDATE scope_fanout_outbox SET status = 'delivered', delivered_at = now()"
    " WHERE workspace_id = %s AND status = 'pending'"
)


def baseline_settle_params(params: dict[str, Any]) -> tuple[Any, ...]:
    """Parameters of ``BASELINE_SETTLE_SQL`` for one worker's baseline parameters."""
    return (params["workspace_id"],)


async def prepare_baseline(conn: TrioConnection) -> dict[str, Any]:
    """Parameters for one baseline worker: its own workspace, member and scope."""
    return prepare_baseline_params(await baseline_values(conn))


def prepare_baseline_params(values: dict[str, Any]) -> dict[str, Any]:
    """The baseline statement's parameters, by name, out of ``baseline_values``."""
    return {name: values[name] for name in _BASELINE_NAMES}


async def baseline_values(conn: TrioConnection) -> dict[str, Any]:
    """The baseline statement's parameters by name, on a new workspace,
    member and scope of their own (the schema created first if missing)."""
    from actors.model import MemberType
    from storage import directory, schema, scopes

    cur = await conn.execute("SELECT to_regclass('scope_messages') IS NOT NULL")
    row = await cur.fetchone()
    if not (row and row[0]):
        for migration in schema.migrations():
            await conn.execute(migration.sql.encode())
        await conn.execute(schema.CREATE_BOOKKEEPING)
    workspace_id = await directory.create_workspace(conn, "bench-baseline")
    author = await directory.create_member(
        conn, workspace_id=workspace_id, type_=MemberType.AGENT, handle="baseline"
    )
    scope_id = await scopes.create_channel(
        conn, creator=author, slug="baseline", name="baseline", visibility="public", description=""
    )
    values = {
        "scope_id": scope_id,
        "workspace_id": workspace_id,
        "author_id": author.id,
        "author_type": "agent",
        "client_message_id": None,
        "digest": None,
        "message_type": "text",
        "content": "x" * 200,
        "metadata": json_text({}),
        "outbox": json_text(
            [
                {
                    "fanout_type": "realtime",
                    "policy": SEND_REALTIME_POLICY.value,
                    "target": None,
                    "dedupe_key": None,
                    "reason": None,
                }
            ]
        ),
        "wake_retry_after": WAKE_RETRY_AFTER,
        "replay_after": REPLAY_AFTER,
        "roster_bump": 0,
        "parent_id": None,
        "parent_generation": None,
        "joins": "[]",
        "sources": "[]",
    }
    return values
