"""The durable outbox: marking inline deliveries done, agent deliveries and acks."""

from __future__ import annotations

from collections.abc import Sequence

from storage.errors import map_errors
from storage.pg import TrioConnection

MARK_DELIVERED = """
UPDATE scope_fanout_outbox
SET status = 'delivered', delivered_at = now(), lease_owner = NULL, lease_expires_at = NULL
WHERE dedupe_key = ANY(%s) AND status IN ('pending', 'leased')
"""


async def mark_delivered(conn: TrioConnection, dedupe_keys: Sequence[str]) -> int:
    with map_errors():
        cur = await conn.execute(MARK_DELIVERED, (list(dedupe_keys),))
    return cur.rowcount
