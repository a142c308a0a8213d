"""Revocations reach live sessions: LISTEN on the database, close with 4401.

``scopenode admin revoke-token`` runs in another process and cannot reach the
node; the revoking statement notifies ``directory.REVOCATION_CHANNEL`` with
the credential id, and PostgreSQL delivers that at commit to every node that
listens, this one and any other on the same database. LISTEN/NOTIFY was
chosen over polling: the close follows the commit within milliseconds instead
of a poll period, an idle node issues no queries, and no index on
``revoked_at`` is needed. What notifications cannot promise (one sent while
this listener was reconnecting) is covered by re-checking the credentials of
live sessions by primary key after every (re)connect and every
:data:`RECHECK_INTERVAL` seconds.
"""

from __future__ import annotations

from contextlib import aclosing

import psycopg
import structlog
import trio

from node.hub import Hub
from storage import directory
from storage.errors import StorageError
from storage.pg import TrioConnection, connect

log = structlog.get_logger(__name__)
RECHECK_INTERVAL = 30.0
RECONNECT_DELAY = 1.0


async def watch_revocations(
    dsn: str, hub: Hub, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Close sessions of revoked credentials until cancelled; started once LISTEN is active."""
    started = False
    while True:
        try:
            conn = await connect(dsn, autocommit=True)
            try:
                await directory.listen_for_revocations(conn)
                if not started:
                    started = True
                    task_status.started()
                while True:
                    # Listening first, then re-checking, leaves no gap between them.
                    await _recheck(conn, hub)
                    async with aclosing(conn.notifies(timeout=RECHECK_INTERVAL)) as notifies:
                        async for notify in notifies:
                            _revoked(hub, notify.payload)
            finally:
                # Not `async with conn`: its exit awaits a rollback first, which a
                # cancellation (node shutdown) interrupts before the close.
                with trio.CancelScope(shield=True):
                    await conn.close()
        except (psycopg.Error, StorageError, OSError) as exc:
            log.warning("revocation_listener_failed", error=repr(exc))
        if not started:
            started = True
            task_status.started()
        await trio.sleep(RECONNECT_DELAY)


async def _recheck(conn: TrioConnection, hub: Hub) -> None:
    ids = hub.credential_ids()
    if not ids:
        return
    for credential_id in await directory.revoked_among(conn, ids):
        hub.close_credential_sessions(credential_id)


def _revoked(hub: Hub, payload: str) -> None:
    try:
        credential_id = int(payload)
    except ValueError:
        log.warning("revocation_payload_invalid")
        return
    hub.close_credential_sessions(credential_id)
