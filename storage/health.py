"""Is the database answering?"""

from __future__ import annotations

import trio

from storage.pool import Pool

PING = "SELECT 1"


async def ping(pool: Pool, *, timeout: float) -> bool:
    """True when a pooled connection answers a trivial query within ``timeout``."""
    try:
        with trio.fail_after(timeout):
            async with pool.connection() as conn:
                await conn.execute(PING)
    except Exception as exc:
        if isinstance(exc, trio.Cancelled):
            raise
        return False
    return True
