"""Cross-node events: what another node committed reaches this node's sessions.

Every node of a cluster shares one PostgreSQL. After a commit the hub hands
the event to :class:`ClusterRelay`, which NOTIFYs it on :data:`CHANNEL`;
every node LISTENs there on one dedicated connection (``application_name``
:data:`APPLICATION_NAME`), ignores its own notifications and hands the rest
to its :class:`~node.relay_delivery.Delivery`, which pushes them to the
sessions. Payloads are ids and seqs, never message bodies (PostgreSQL caps a
payload below 8,000 bytes): a ``message`` relay is ``{"n": origin, "k":
"msg", "s": scopeId, "f": fromSeq, "t": toSeq}``, and the receiving node
fetches the messages with their readers among its own session members
(``node/relay_delivery.py``).

One channel for the whole database rather than one per workspace: a node
never has to LISTEN/UNLISTEN as sessions of new workspaces come and go, and
the listener connection is never busy with anything but notifications. The
cost is that every node parses every node's notifications, including those of
workspaces it has no session in (a JSON parse and a dict lookup each, no
query: a node with no reader of the scope issues no statement). Per-workspace
channels would cut that at the price of LISTEN bookkeeping; at the rates one
database sustains, parsing is not what limits a node.

When the LISTEN connection drops, the node reconnects and, before relaying
anything newer, has the delivery read every scope with messages since the
last moment it knew it was listening (minus :data:`CATCHUP_MARGIN` for
transactions in flight), so its sessions still get every seq in order.

A node alone does not NOTIFY. Every :data:`PEER_POLL` seconds the relay looks
up the other nodes' listeners (``pg_stat_activity`` by application name);
while there are none, publishing is skipped — the round trip, and the node
hearing its own notification, were the largest cost of a send after its
statement. A node that starts listening while others run announces itself
(``hello`` with its listener's pid) and each peer answers ``ack`` *after* it
has turned its own publishing on; the new node serves only once every peer
acknowledged (or after :data:`JOIN_WAIT`, then reading what it may have
missed, as after a dropped listener). So anything a peer committed without
telling it was committed before the new node's sessions existed and is in
their first read. A lookup that fails counts as "peers present".
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import structlog
import trio

from node.hub import Hub
from node.relay_delivery import Delivery
from protocol.codec import encode
from protocol.frames import ReadStateEvent
from storage import relay as relay_sql
from storage.errors import StorageError
from storage.pg import TrioConnection
from storage.pool import Pool, reusable

log = structlog.get_logger(__name__)

CHANNEL = "scopenode_events"
APPLICATION_NAME = "scopenode-relay"
MAX_PAYLOAD = 7_900  # PostgreSQL refuses 8,000 bytes and more
HEARTBEAT = 5.0  # seconds between liveness probes on the listener
RECONNECT_DELAY = 0.5
CATCHUP_MARGIN = timedelta(seconds=10)  # a send's created_at precedes its commit
NOTIFY_ATTEMPTS = 3
PEER_POLL = 1.0  # seconds between looks at which other nodes listen
JOIN_WAIT = 3.0  # at most this long for the peers' acknowledgements


class _Kept:
    """A pool connection one task keeps statement after statement (Pool.keep),
    replaced when it is no longer reusable or a statement on it failed."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._conn: TrioConnection | None = None

    def start_notify(self, payloads: Sequence[str]) -> bool:
        """Send these notifications now if the kept connection is idle; the
        owning task then reads the result (``use(started=True)``)."""
        conn = self._conn
        return conn is not None and relay_sql.start_notify_many(conn, CHANNEL, payloads)

    @asynccontextmanager
    async def use(self, *, started: bool = False) -> AsyncIterator[TrioConnection]:
        # A started statement leaves the connection busy, not broken.
        if self._conn is not None and not started and not reusable(self._conn):
            await self.release()
        if self._conn is None:
            self._conn = await self._pool.keep()
        try:
            yield self._conn
        except BaseException:
            await self.release()
            raise

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with trio.CancelScope(shield=True):
                await self._pool.give_back(conn)


class ClusterRelay:
    """NOTIFY after commit, LISTEN and relay to local sessions (see module doc)."""

    def __init__(self, dsn: str, pool: Pool, hub: Hub, node_id: str) -> None:
        self._dsn = dsn
        self._pool = pool
        self._hub = hub
        # Unique per process and per in-process node: a node ignores its own.
        self.origin = f"{node_id}.{secrets.token_hex(3)}"
        self._own_prefix = '{"n":' + json.dumps(self.origin) + ","
        self._outgoing: list[str] = []
        self._outgoing_ready = trio.Event()
        # Sent by _notify itself, result not yet read; _publishing while the
        # publish task (or such a statement) has the publisher connection.
        self._started: list[str] = []
        self._publishing = False
        self._jobs_in, self._jobs = trio.open_memory_channel[tuple[Any, ...]](math.inf)
        # Jobs sent to the process task and not yet done; while there are
        # none and nothing runs, the listener handles a notification itself.
        self._queued = 0
        self._processing = trio.Lock()
        # The process loop's and the publish loop's own connections, kept
        # between notifications: neither waits for a pool checkout.
        self._reader = _Kept(pool)
        self._publisher = _Kept(pool)
        self._nursery: trio.Nursery | None = None
        self.listener_pid: int | None = None
        self.listening = trio.Event()
        self.notifications_received = 0
        # Listener pids of the other nodes; None while unknown (publish then).
        self._peer_pids: frozenset[int] | None = None
        self._hello_pids: dict[int, float] = {}
        self._acks: set[int] = set()
        self._acked = trio.Event()
        self._joined = trio.Event()
        self.delivery = Delivery(hub, self._reading, self._enqueue)

    # ------------------------------------------------------------ publishing (hub)

    def messages_committed(self, scope_id: str, seqs: Sequence[int]) -> bool:
        """Tell the other nodes; True when the hub pushes these to local sessions
        itself, False when the relay does (after earlier seqs still on their way)."""
        if not seqs:
            return True
        self._notify({"k": "msg", "s": scope_id, "f": min(seqs), "t": max(seqs)})
        return self.delivery.committed_here(scope_id, seqs, alone=self.alone)

    def membership(
        self,
        scope_id: str,
        member_id: str,
        op: str,
        visibility: str,
        audience: Collection[str] | None,
    ) -> None:
        data: dict[str, Any] = {"k": "mem", "s": scope_id, "m": member_id, "op": op}
        data["v"] = visibility
        if audience is not None:
            data["a"] = sorted(audience)
        self._notify(data)

    def read_state(self, scope_id: str, member_id: str, last_read_seq: int) -> None:
        self._notify({"k": "read", "s": scope_id, "m": member_id, "l": last_read_seq})

    def event(
        self,
        scope_id: str,
        payload: bytes,
        *,
        audience: Collection[str] | None,
        readers_of: str | None = None,
        wakes: Collection[str] = (),
        daemons: bool = True,
        seq: int = 1,
    ) -> None:
        if self._nursery is None or self.alone:
            return
        data: dict[str, Any] = {"k": "ev", "s": scope_id, "e": payload.decode()}
        if wakes:
            data["w"] = sorted(wakes)
        if not daemons:
            data["d"] = 0
        if audience is not None:
            with_audience = {**data, "a": sorted(audience)}
            if self._fits(with_audience) or readers_of is None:
                data = with_audience
        if "a" not in data and readers_of is not None:
            data["r"] = readers_of
        if not self._fits(data):
            log.info("relay_event_oversize", scope_id=scope_id)
            data = {"k": "inv", "s": scope_id, "q": seq, "why": "relay_oversize"}
        self._notify(data)

    def _fits(self, data: dict[str, Any]) -> bool:
        return len(json.dumps({"n": self.origin, **data}).encode()) <= MAX_PAYLOAD

    @property
    def peer_pids(self) -> frozenset[int] | None:
        """The other nodes' relay listeners as last seen (None: unknown)."""
        return self._peer_pids

    @property
    def acknowledged_by(self) -> frozenset[int]:
        """Listener pids of the peers that answered this node's last hello."""
        return frozenset(self._acks)

    @property
    def alone(self) -> bool:
        """True while no other node listens (this node then publishes nothing)."""
        return self._peer_pids is not None and not self._peer_pids

    def _notify(self, data: dict[str, Any]) -> None:
        if self._nursery is None or self.alone:
            return  # nobody to tell
        self._outgoing.append(json.dumps({"n": self.origin, **data}, separators=(",", ":")))
        # Sent from here when the publisher is idle: the NOTIFY then leaves
        # before the rest of the caller's turn (local pushes, other writers)
        # instead of when the publish task is next scheduled.
        if not self._publishing and self._publisher.start_notify(self._outgoing):
            self._started, self._outgoing = self._outgoing, []
            self._publishing = True
        self._outgoing_ready.set()

    # ------------------------------------------------------------ tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = self.delivery.nursery = nursery
            nursery.start_soon(self._publish_loop)
            nursery.start_soon(self._process_loop)
            await nursery.start(self._listen)
            nursery.start_soon(self._poll_peers_loop)
            with trio.move_on_after(JOIN_WAIT + 1.0):
                await self._joined.wait()
            task_status.started()

    async def _publish_loop(self) -> None:
        try:
            await self._publish_batches()
        finally:
            await self._publisher.release()

    async def _publish_batches(self) -> None:
        while True:
            await self._outgoing_ready.wait()
            self._outgoing_ready = trio.Event()
            # Set from here on, so _notify never sends ahead of what this
            # turn took (notifications leave in the order they were made).
            self._publishing = True
            try:
                if self._started:
                    started, self._started = self._started, []
                    await self._publish(started, started=True)
                if self._outgoing:
                    payloads, self._outgoing = self._outgoing, []
                    await self._publish(payloads, started=False)
            finally:
                self._publishing = False

    async def _publish(self, payloads: list[str], *, started: bool) -> None:
        for attempt in range(NOTIFY_ATTEMPTS):
            try:
                async with self._publisher.use(started=started) as conn:
                    if started:
                        await relay_sql.finish_notify(conn)
                    else:
                        await relay_sql.notify_many(conn, CHANNEL, payloads)
                return
            except (psycopg.Error, StorageError, OSError) as exc:
                # Receivers still catch up: the next notification of the
                # scope shows them the hole, which they read after GAP_WAIT.
                log.warning("relay_notify_failed", attempt=attempt, error=repr(exc))
                started = False
                await trio.sleep(0.2 * (attempt + 1))

    async def _listen(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        started = False
        last_alive: datetime | None = None
        gap_since: datetime | None = None
        while True:
            try:
                conn = await TrioConnection.connect(
                    self._dsn, autocommit=True, application_name=APPLICATION_NAME
                )
                try:
                    self.listener_pid, last_alive = await relay_sql.listen(conn, CHANNEL)
                    assert self._nursery is not None
                    self._nursery.start_soon(self._join, self.listener_pid, gap_since)
                    gap_since = None
                    if not started:
                        started = True
                        task_status.started()
                    while True:
                        last_alive = await self._receive(conn)
                finally:
                    self.listener_pid = None
                    self.listening = trio.Event()
                    with trio.CancelScope(shield=True):
                        await conn.close()
            except (psycopg.Error, StorageError, OSError) as exc:
                log.warning("relay_listener_failed", error=repr(exc))
            if gap_since is None and last_alive is not None:
                gap_since = last_alive
            if not started:
                started = True
                task_status.started()
            await trio.sleep(RECONNECT_DELAY)

    async def _join(self, listener_pid: int, gap_since: datetime | None) -> None:
        """Announce this listener to the other nodes and wait until each of them
        publishes to it; then read what a dropped listener missed."""
        peers = await self._poll_peers()
        if peers is None or peers:
            self._acks.clear()
            self._acked = trio.Event()
            self._notify({"k": "hello", "p": listener_pid})
            with trio.move_on_after(JOIN_WAIT) as waited:
                while peers is None or not peers <= self._acks:
                    await self._acked.wait()
                    self._acked = trio.Event()
            if waited.cancelled_caught:
                log.warning("relay_join_unacknowledged", peers=len(peers or ()))
                gap_since = gap_since or await self._database_now()
        if gap_since is not None:
            self._enqueue(("catchup", gap_since - CATCHUP_MARGIN))
        self.delivery.tracked_since = trio.current_time()
        self.listening.set()
        self._joined.set()

    async def _database_now(self) -> datetime | None:
        try:
            async with self._pool.connection() as conn:
                return await relay_sql.database_now(conn)
        except (psycopg.Error, StorageError, OSError):
            return None

    async def _poll_peers_loop(self) -> None:
        while True:
            await trio.sleep(PEER_POLL)
            await self._poll_peers()

    async def _poll_peers(self) -> frozenset[int] | None:
        """Refresh the other nodes' listener pids (None when the lookup failed)."""
        asked_at = trio.current_time()
        try:
            async with self._pool.connection() as conn:
                found = await relay_sql.listener_pids(conn, APPLICATION_NAME)
        except (psycopg.Error, StorageError, OSError) as exc:
            log.warning("relay_peer_lookup_failed", error=repr(exc))
            self._set_peers(None)
            return None
        # A hello heard while the lookup ran may not be in its answer yet.
        self._hello_pids = {p: t for p, t in self._hello_pids.items() if t >= asked_at}
        found.update(self._hello_pids)
        found.discard(self.listener_pid or 0)
        self._set_peers(frozenset(found))
        return self._peer_pids

    def _set_peers(self, pids: frozenset[int] | None) -> None:
        alone = self.alone
        self._peer_pids = pids
        if alone and not self.alone:
            # What this node wrote alone its hub pushed without a cursor: the
            # delivery must not take those seqs for ones still on their way.
            self.delivery.tracked_since = trio.current_time()

    def _greet(self, data: dict[str, Any]) -> None:
        """A node started listening: publish to it from now on, then say so."""
        pid = int(data["p"])
        self._hello_pids[pid] = trio.current_time()
        if self._peer_pids is not None:
            self._set_peers(self._peer_pids | {pid})
        if self.listener_pid is not None:
            self._notify({"k": "ack", "to": data["n"], "p": self.listener_pid})

    def _acknowledged(self, data: dict[str, Any]) -> None:
        if data.get("to") == self.origin:
            self._acks.add(int(data["p"]))
            self._acked.set()

    async def _receive(self, conn: TrioConnection) -> datetime:
        """Queue notifications for up to HEARTBEAT seconds; the database's time after."""
        async with aclosing(conn.notifies(timeout=HEARTBEAT)) as notifies:
            async for notify in notifies:
                job = ("notify", notify.payload)
                if self._queued or self._processing.locked():
                    self._enqueue(job)
                else:
                    # Nothing ahead of it: handled here, without the hop to
                    # the process task (a tenth of a millisecond of a relay).
                    await self._process([job])
        # A probe on the listener itself: a dead connection fails here.
        return await relay_sql.database_now(conn)

    async def _process_loop(self) -> None:
        try:
            await self._process_jobs()
        finally:
            await self._reader.release()

    def _reading(self) -> AbstractAsyncContextManager[TrioConnection]:
        """The process loop's connection (a pool checkout per notification was
        a tenth of the relay's time)."""
        return self._reader.use()

    def _enqueue(self, job: tuple[Any, ...]) -> None:
        self._queued += 1
        self._jobs_in.send_nowait(job)

    async def _process_jobs(self) -> None:
        while True:
            jobs = [await self._jobs.receive()]
            while True:
                try:
                    jobs.append(self._jobs.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                await self._process(jobs)
            finally:
                self._queued -= len(jobs)

    async def _process(self, jobs: list[tuple[Any, ...]]) -> None:
        """Jobs in order, one batch at a time (the listener's and this loop's)."""
        async with self._processing:
            for job in _merge(self._parse(jobs)):
                try:
                    await self._handle(job)
                except (psycopg.Error, StorageError, OSError) as exc:
                    # The scope's next notification (or the gap timer) reads it again.
                    log.warning("relay_failed", kind=job[0], error=repr(exc))

    def _parse(self, jobs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        parsed: list[tuple[Any, ...]] = []
        for job in jobs:
            if job[0] != "notify":
                parsed.append(job)
                continue
            self.notifications_received += 1
            if job[1].startswith(self._own_prefix):
                # Every node hears its own NOTIFYs: skip them before parsing.
                continue
            try:
                data = json.loads(job[1])
            except ValueError:
                log.warning("relay_payload_invalid")
                continue
            if data.get("n") == self.origin:
                continue
            parsed.append((data.get("k"), data))
        return parsed

    # ------------------------------------------------------------ dispatch

    async def _handle(self, job: tuple[Any, ...]) -> None:
        kind = job[0]
        if kind == "msg":
            data = job[1]
            await self.delivery.messages(data["s"], int(data["f"]), int(data["t"]), force=False)
        elif kind == "flush":
            await self.delivery.messages(job[1], 0, 0, force=True)
        elif kind == "anchor":
            await self.delivery.anchor(job[1], int(job[2]))
        elif kind == "catchup":
            await self.delivery.catch_up(job[1])
        elif kind == "mem":
            await self.delivery.membership(job[1])
        elif kind == "read":
            data = job[1]
            payload = encode(ReadStateEvent(scope_id=data["s"], last_read_seq=int(data["l"])))
            for session in self._hub.sessions_of(data["m"]):
                session.push(payload)
        elif kind == "ev":
            await self.delivery.event(job[1])
        elif kind == "inv":
            data = job[1]
            await self.delivery.invalidate(data["s"], int(data.get("q", 1)), str(data.get("why")))
        elif kind == "hello":
            self._greet(job[1])
        elif kind == "ack":
            self._acknowledged(job[1])
        else:
            log.warning("relay_kind_unknown", kind=str(kind))


def _merge(jobs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Consecutive message ranges of one scope become one fetch; nothing is
    reordered across other kinds (a roster change splits the run)."""
    merged: list[tuple[Any, ...]] = []
    for job in jobs:
        if job[0] == "msg" and merged and merged[-1][0] == "msg":
            prev = merged[-1][1]
            if prev["s"] == job[1]["s"]:
                merged[-1] = (
                    "msg",
                    {**prev, "f": min(prev["f"], job[1]["f"]), "t": max(prev["t"], job[1]["t"])},
                )
                continue
        merged.append(job)
    return merged
