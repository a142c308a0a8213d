"""Cross-node events: what another node committed reaches this node's sessions.

Every node of a cluster shares one PostgreSQL. After a commit the hub hands
the event to :class:`ClusterRelay`, which NOTIFYs it on :data:`CHANNEL`;
every node LISTENs there on one dedicated connection (``application_name``
:data:`APPLICATION_NAME`), ignores its own notifications and relays the rest.
Payloads are ids and seqs, never message bodies (PostgreSQL caps a payload
below 8,000 bytes): a ``message`` relay is ``{"n": origin, "k": "msg", "s":
scopeId, "f": fromSeq, "t": toSeq}``, and the receiving node fetches the
messages with their readers among its own session members in one statement
(``storage/relay.py``: the one SQL predicate, bound per candidate), encodes
each event once (twice when ``metadata.recipients`` is shown to some) and
queues it on its readers' sessions.

One channel for the whole database rather than one per workspace: a node
never has to LISTEN/UNLISTEN as sessions of new workspaces come and go, and
the listener connection is never busy with anything but notifications. The
cost is that every node parses every node's notifications, including those of
workspaces it has no session in (a JSON parse and a dict lookup each, no
query: a node with no reader of the scope issues no statement). Per-workspace
channels would cut that at the price of LISTEN bookkeeping; at the rates one
database sustains, parsing is not what limits a node.

Order and gaps. Per scope the relay keeps a cursor of the seqs its sessions
were handed (local commits count too). A notification that leaves a hole
below it (another node's notification still in flight, or a node that died
between commit and NOTIFY) is held for :data:`GAP_WAIT` seconds; then the hole
is read from the database, so sessions get every seq in order and never a
silent gap. When the LISTEN connection drops, the node reconnects and, before
relaying anything newer, reads every scope with messages since the last moment
it knew it was listening (minus :data:`CATCHUP_MARGIN` for transactions in
flight) and pushes what its sessions missed by seq; a range too long to push
becomes ``invalidate {scopeId, reason: "relay_gap", fromSeq}``.

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
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import structlog
import trio

from actors.sources import VIEW_KIND
from node.hub import Hub, LiveSession, wake_frame
from node.views import sees_recipients, stored_message_view
from protocol.codec import encode
from protocol.frames import (
    InvalidateEvent,
    MembershipEvent,
    MessageEvent,
    ReadStateEvent,
)
from protocol.wsframes import frame
from storage import outbox
from storage import relay as relay_sql
from storage.errors import StorageError
from storage.pg import Pool, TrioConnection, reusable
from storage.sources import pending

log = structlog.get_logger(__name__)

CHANNEL = "scopenode_events"
APPLICATION_NAME = "scopenode-relay"
MAX_PAYLOAD = 7_900  # PostgreSQL refuses 8,000 bytes and more
HEARTBEAT = 5.0  # seconds between liveness probes on the listener
RECONNECT_DELAY = 0.5
CATCHUP_MARGIN = timedelta(seconds=10)  # a send's created_at precedes its commit
GAP_WAIT = 1.0
RANGE_LIMIT = 1_000  # longer holes are an invalidate, not a push
CURSORS_KEPT = 20_000
READERS_KEPT = 10_000  # scopes whose readers among local members are remembered
ABOVE_KEPT = 10_000
# A cursor without a frontier has seen only this node's own commits (on a node
# without peers, every cursor): of those only the newest can ever meet another
# node's notification, so no more than this many are kept.
UNANCHORED_KEPT = 64
NOTIFY_ATTEMPTS = 3
PEER_POLL = 1.0  # seconds between looks at which other nodes listen
JOIN_WAIT = 3.0  # at most this long for the peers' acknowledgements


class _Cursor:
    """Seqs of one scope this node's sessions were handed: all up to ``frontier``
    and those in ``above``. A scope first seen through a local commit has no
    frontier yet (what came before it is unknown) until a notification gives one."""

    __slots__ = ("above", "frontier")

    def __init__(self, frontier: int | None) -> None:
        self.frontier = frontier
        self.above: set[int] = set()

    def has(self, seq: int) -> bool:
        return (self.frontier is not None and seq <= self.frontier) or seq in self.above

    def start_at(self, frontier: int) -> None:
        if self.frontier is None:
            self.frontier = frontier
            self.above = {s for s in self.above if s > frontier}
            self.add(())

    def add(self, seqs: Collection[int]) -> None:
        self.above.update(seqs)
        if self.frontier is None:
            if len(self.above) > UNANCHORED_KEPT:
                self.above = set(sorted(self.above)[-UNANCHORED_KEPT // 2 :])
            return
        self.above = {s for s in self.above if s > self.frontier}
        while self.frontier + 1 in self.above:
            self.frontier += 1
            self.above.discard(self.frontier)
        if len(self.above) > ABOVE_KEPT:
            # A hole that never fills: stop tracking below the highest seq.
            self.frontier = max(self.above)
            self.above.clear()

    def missing(self, upto: int) -> list[int]:
        if self.frontier is None:
            return []
        return [s for s in range(self.frontier + 1, upto + 1) if s not in self.above]


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


class _Readers:
    """Who among the asked members reads a scope, for one roster of it."""

    __slots__ = ("asked", "readers", "roster")

    def __init__(self, roster: str) -> None:
        self.roster = roster
        self.asked: set[str] = set()
        self.readers: set[str] = set()

    def covers(self, candidates: Collection[str]) -> bool:
        return self.asked.issuperset(candidates)


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
        self._cursors: OrderedDict[str, _Cursor] = OrderedDict()
        self._readers: OrderedDict[str, _Readers] = OrderedDict()
        # A scope never changes workspace: learnt from its first relayed read.
        self._workspace_of: dict[str, str] = {}
        self._held: dict[str, int] = {}
        self._fetching: set[str] = set()
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
        self.events_relayed = 0
        self.catchups = 0
        self.lean_reads = 0  # relayed ranges answered without the full statement

    # ------------------------------------------------------------ publishing (hub)

    def messages_committed(self, scope_id: str, seqs: Sequence[int]) -> bool:
        """Tell the other nodes; True when the hub pushes these to local sessions
        itself, False when the relay does (after earlier seqs still on their way)."""
        if not seqs:
            return True
        self._notify({"k": "msg", "s": scope_id, "f": min(seqs), "t": max(seqs)})
        if self.alone and scope_id not in self._cursors:
            # No other node writes here: nothing can arrive out of order, and a
            # cursor per scope would only hold memory.
            return True
        cursor = self._cursor(scope_id, None)
        if scope_id in self._fetching or cursor.missing(min(seqs) - 1):
            # Another node's earlier seqs are not delivered here yet (two nodes
            # wrote the scope): deliver ours after them, read back in order.
            self._hold(scope_id, max(seqs))
            self._enqueue(("flush", scope_id))
            return False
        cursor.add(seqs)
        return True

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
            self._nursery = nursery
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
            self._peer_pids = None
            return None
        # A hello heard while the lookup ran may not be in its answer yet.
        self._hello_pids = {p: t for p, t in self._hello_pids.items() if t >= asked_at}
        found.update(self._hello_pids)
        found.discard(self.listener_pid or 0)
        self._peer_pids = frozenset(found)
        return self._peer_pids

    def _greet(self, data: dict[str, Any]) -> None:
        """A node started listening: publish to it from now on, then say so."""
        pid = int(data["p"])
        self._hello_pids[pid] = trio.current_time()
        if self._peer_pids is not None:
            self._peer_pids = self._peer_pids | {pid}
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

    # ------------------------------------------------------------ relaying

    async def _handle(self, job: tuple[Any, ...]) -> None:
        kind = job[0]
        if kind == "msg":
            data = job[1]
            await self._messages(data["s"], int(data["f"]), int(data["t"]), force=False)
        elif kind == "flush":
            await self._messages(job[1], 0, 0, force=True)
        elif kind == "catchup":
            await self._catch_up(job[1])
        elif kind == "mem":
            await self._membership(job[1])
        elif kind == "read":
            data = job[1]
            payload = encode(ReadStateEvent(scope_id=data["s"], last_read_seq=int(data["l"])))
            for session in self._hub.sessions_of(data["m"]):
                session.push(payload)
        elif kind == "ev":
            await self._event(job[1])
        elif kind == "inv":
            data = job[1]
            await self._invalidate(data["s"], int(data.get("q", 1)), str(data.get("why")))
        elif kind == "hello":
            self._greet(job[1])
        elif kind == "ack":
            self._acknowledged(job[1])
        else:
            log.warning("relay_kind_unknown", kind=str(kind))

    def _hold(self, scope_id: str, upto: int) -> None:
        self._held[scope_id] = max(upto, self._held.get(scope_id, 0))

    def _cursor(self, scope_id: str, frontier: int | None) -> _Cursor:
        cursor = self._cursors.get(scope_id)
        if cursor is None:
            cursor = self._cursors[scope_id] = _Cursor(frontier)
            if len(self._cursors) > CURSORS_KEPT:
                self._cursors.popitem(last=False)
        else:
            self._cursors.move_to_end(scope_id)
        return cursor

    async def _messages(self, scope_id: str, first: int, last: int, *, force: bool) -> None:
        cursor = self._cursor(scope_id, first - 1)
        if first > 0:
            cursor.start_at(first - 1)
        upto = max(last, self._held.pop(scope_id, 0))
        missing = cursor.missing(upto)
        if not missing:
            return
        if not force and missing[0] < first:
            # A hole below this range: another node's notification may still
            # be on its way. Hold the range; read the hole if it stays open.
            if scope_id not in self._held:
                assert self._nursery is not None
                self._nursery.start_soon(self._flush_later, scope_id)
            self._hold(scope_id, upto)
            return
        self._fetching.add(scope_id)
        try:
            await self._push_range(scope_id, cursor, missing)
        finally:
            self._fetching.discard(scope_id)

    async def _flush_later(self, scope_id: str) -> None:
        await trio.sleep(GAP_WAIT)
        if scope_id in self._held:
            self._enqueue(("flush", scope_id))

    async def _push_range(self, scope_id: str, cursor: _Cursor, seqs: list[int]) -> None:
        candidates = self._hub.member_ids(self._workspace_of.get(scope_id))
        if seqs[-1] - seqs[0] >= RANGE_LIMIT:
            cursor.add(range(seqs[0], seqs[-1] + 1))
            if candidates:
                await self._invalidate(scope_id, seqs[0], "relay_gap")
            return
        if not candidates:
            cursor.add(seqs)
            return
        async with self._reading() as conn:
            rows = await self._read(conn, scope_id, seqs[0], seqs[-1], candidates)
        wanted = set(seqs)
        batches: dict[LiveSession, list[tuple[int, bytes]]] = {}
        for row in rows:
            message = row.message
            if message.seq not in wanted:
                continue
            framed: dict[bool, bytes] = {}
            recipients = message.metadata.get("recipients") or ()
            for reader in row.readers:
                privileged = bool(recipients) and sees_recipients(
                    reader, message.author.id, recipients
                )
                if privileged not in framed:
                    view = stored_message_view(message, reader if privileged else None)
                    view.sources = [pending(_view_kind(k)) for k in row.source_kinds]
                    framed[privileged] = frame(
                        encode(MessageEvent(scope_id=scope_id, message=view))
                    )
                for session in self._hub.sessions_of(reader):
                    batches.setdefault(session, []).append((message.seq, framed[privileged]))
        cursor.add(seqs)
        for session, events in batches.items():
            session.deliver_events(scope_id, events)
            self.events_relayed += len(events)
        self._hub.events_published += sum(len(e) for e in batches.values())
        await self._wake_daemons(scope_id, [row for row in rows if row.message.seq in wanted])

    async def _read(
        self, conn: TrioConnection, scope_id: str, first: int, last: int, candidates: list[str]
    ) -> list[relay_sql.RelayedMessage]:
        """The messages with their readers among ``candidates``.

        Humans and public agents read all of a scope or none of it, by the
        roster alone, so what the full statement decided for them holds for
        as long as the roster it was read under: the lean read then answers,
        and checks that roster in the same statement. A private agent among
        the candidates (its right depends on each message), a roster change
        or a candidate not yet decided takes the full statement again.
        """
        known = self._readers.get(scope_id)
        if known is not None and known.covers(candidates) and not self._any_private(candidates):
            rows = await relay_sql.messages_in_range(conn, scope_id, first, last)
            if all(row.roster == known.roster for row in rows):
                self.lean_reads += 1
                self._readers.move_to_end(scope_id)
                readers = tuple(c for c in candidates if c in known.readers)
                return [replace(row, readers=readers) for row in rows]
        rows = await relay_sql.readers_in_range(conn, scope_id, first, last, candidates)
        if rows:
            if len(self._workspace_of) >= CURSORS_KEPT and scope_id not in self._workspace_of:
                del self._workspace_of[next(iter(self._workspace_of))]
            self._workspace_of[scope_id] = rows[0].message.author.workspace_id
            self._remember(scope_id, rows[0], candidates)
        return rows

    def _any_private(self, candidates: list[str]) -> bool:
        return any(_is_private_agent(self._hub.sessions_of(c)) for c in candidates)

    def _remember(
        self, scope_id: str, row: relay_sql.RelayedMessage, candidates: list[str]
    ) -> None:
        public = [c for c in candidates if not _is_private_agent(self._hub.sessions_of(c))]
        known = self._readers.get(scope_id)
        if known is None or known.roster != row.roster:
            known = self._readers[scope_id] = _Readers(row.roster)
            if len(self._readers) > READERS_KEPT:
                self._readers.popitem(last=False)
        known.asked.update(public)
        known.readers.update(c for c in public if c in row.readers)

    async def _wake_daemons(self, scope_id: str, rows: Sequence[Any]) -> None:
        """``deliver`` to this node's daemons the wakes another node wrote for
        these messages (that node pushed them only to the daemons it holds)."""
        readers = {reader for row in rows for reader in row.readers}
        daemons = {}
        for reader in readers:
            sessions = [s for s in self._hub.sessions_of(reader) if s.is_daemon]
            if sessions:
                daemons[reader] = sessions
        if not daemons:
            return
        messages = {row.message.id: row.message for row in rows}
        async with self._reading() as conn:
            wakes = await outbox.wakes_of_messages(conn, list(messages), list(daemons))
        for message_id, agent_id, reason in wakes:
            message = messages[message_id]
            view = stored_message_view(message, agent_id)
            wake_id, wake = wake_frame(message_id, agent_id, scope_id, message.seq, reason, view)
            for session in daemons[agent_id]:
                if not session.is_muted(scope_id):
                    session.push_wake(wake_id, wake)

    async def _catch_up(self, cutoff: datetime) -> None:
        self.catchups += 1
        if not self._hub.member_ids():
            return
        async with self._reading() as conn:
            active = await relay_sql.active_since(conn, cutoff)
        log.info("relay_catch_up", scopes=len(active))
        for scope in active:
            cursor = self._cursors.get(scope.scope_id)
            if cursor is None:
                if scope.first_seq_since is None:
                    continue
                cursor = self._cursor(scope.scope_id, scope.first_seq_since - 1)
            self._held.pop(scope.scope_id, None)
            missing = cursor.missing(scope.latest_seq)
            if missing:
                await self._push_range(scope.scope_id, cursor, missing)

    async def _membership(self, data: dict[str, Any]) -> None:
        scope_id, member_id, op = data["s"], data["m"], data["op"]
        if op == "left":
            self._hub.stop_scope_events(scope_id, member_id)
        else:
            self._hub.allow_scope_events(scope_id, member_id)
        local = self._hub.member_ids()
        if not local:
            return
        if "a" in data:
            targets = set(data["a"]).intersection(local)
        else:
            async with self._reading() as conn:
                targets = await relay_sql.current_readers(conn, scope_id, local)
            if member_id in local:
                targets.add(member_id)
        payload = encode(
            MembershipEvent(scope_id=scope_id, member_id=member_id, op=op, visibility=data["v"])
        )
        for reader in targets:
            for session in self._hub.sessions_of(reader):
                session.push(payload)
                self.events_relayed += 1

    async def _event(self, data: dict[str, Any]) -> None:
        scope_id = data["s"]
        local = self._hub.member_ids()
        if not local:
            return
        if "a" in data:
            targets = set(data["a"]).intersection(local)
        else:
            targets = await self._readers_of(scope_id, str(data.get("r")), local)
        wakes = set(data.get("w", ()))
        daemons = bool(data.get("d", 1))
        payload = str(data["e"]).encode()
        for reader in targets:
            woken = reader in wakes
            for session in self._hub.sessions_of(reader):
                if (daemons or woken or not session.is_daemon) and not session.is_muted(scope_id):
                    session.push(payload)
                    self.events_relayed += 1

    async def _readers_of(self, scope_id: str, message_id: str, local: list[str]) -> set[str]:
        """Current readers of a message among ``local``; private agents left out,
        since whose activity they may see depends on who acted (conservative)."""
        async with self._reading() as conn:
            found = await relay_sql.readers_of_message(conn, scope_id, message_id, local)
        if found is None:
            return set()
        return {
            reader
            for reader in found.readers
            if not _is_private_agent(self._hub.sessions_of(reader))
        }

    async def _invalidate(self, scope_id: str, from_seq: int, reason: str) -> None:
        local = self._hub.member_ids()
        async with self._reading() as conn:
            targets = await relay_sql.current_readers(conn, scope_id, local)
        payload = encode(InvalidateEvent(scope_id=scope_id, reason=reason, from_seq=from_seq))
        for reader in targets:
            for session in self._hub.sessions_of(reader):
                session.push(payload)


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


def _view_kind(kind: str) -> str:
    return VIEW_KIND.get(kind, "context")


def _is_private_agent(sessions: Collection[LiveSession]) -> bool:
    for session in sessions:
        member = getattr(session, "member", None)
        return bool(member is not None and member.is_private_agent)
    return False
