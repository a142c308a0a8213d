"""What another node committed, pushed to this node's sessions.

The receiving side of the cluster relay (``node/relay.py`` hears the
notifications and hands each to :class:`Delivery`). A ``message`` range is
read with its readers among this node's session members in one statement
(``storage/relay.py``: the one SQL predicate, bound per candidate), each event
is encoded once (twice when ``metadata.recipients`` is shown to some) and
queued on its readers' sessions; this node's daemons also get the wakes the
writing node recorded. Roster changes, other events and invalidations go to
the local members who read the scope.

Order and gaps. Per scope a cursor keeps the seqs this node's sessions were
handed (local commits count too). A cursor starts below the seqs written in
the last :data:`IN_FLIGHT_S` seconds (no further back than the node has
tracked every seq: since it joined, or since peers appeared while it was
alone), whether this node's first commit of the scope or another node's
notification is the first it hears of it: another node's notification of one
may still be on its way, and so may this node's own publish of one (its hub
runs when the commit's reply is back, which can be after another node already
committed and notified the next seq). A local commit the relay has read back
and pushed already is not pushed again by the hub; one below where its cursor
started, taken for handed, is pushed late rather than never. A range that
leaves a hole below it (another node's notification still in flight, or a node
that died between commit and NOTIFY) is held for :data:`GAP_WAIT` seconds;
then the hole is read from the database, so sessions get every seq in order
and never a silent gap. After the listener was away, a catch-up reads every
scope with messages since then and pushes what the sessions missed; a range
longer than :data:`RANGE_LIMIT` becomes ``invalidate {scopeId, reason:
"relay_gap", fromSeq}``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

import structlog
import trio

from actors.sources import VIEW_KIND
from node.hub import Hub, LiveSession, wake_frame
from node.views import privileged_readers, stored_message_view
from protocol.codec import encode
from protocol.frames import InvalidateEvent, MembershipEvent, MessageEvent
from protocol.wsframes import frame
from storage import outbox
from storage import relay as relay_sql
from storage.pg import TrioConnection
from storage.sources import pending

log = structlog.get_logger(__name__)

GAP_WAIT = 1.0
# How long another node's notification of a commit may take to arrive here
# (the relay's catch-up margin): seqs this recent are pushed when a scope's
# cursor starts.
IN_FLIGHT_S = 10.0
RANGE_LIMIT = 1_000  # longer holes are an invalidate, not a push
CURSORS_KEPT = 20_000
READERS_KEPT = 10_000  # scopes whose readers among local members are remembered
ABOVE_KEPT = 10_000
# A cursor without a frontier has seen only this node's own commits (on a node
# without peers, every cursor): of those only the newest can ever meet another
# node's notification, so no more than this many are kept.
UNANCHORED_KEPT = 64


class _Cursor:
    """Seqs of one scope this node's sessions were handed: all up to ``frontier``
    and those in ``above``. A scope first seen through a local commit has no
    frontier yet (what came before it is unknown) until a notification gives one.
    Seqs up to ``start``, the first frontier, are taken for handed, not seen."""

    __slots__ = ("above", "frontier", "start")

    def __init__(self, frontier: int | None) -> None:
        self.frontier = self.start = frontier
        self.above: set[int] = set()

    def has(self, seq: int) -> bool:
        return (self.frontier is not None and seq <= self.frontier) or seq in self.above

    def start_at(self, frontier: int) -> None:
        if self.frontier is None:
            self.frontier = self.start = frontier
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


class _Readers:
    """Who among the asked members reads a scope, for one roster of it."""

    __slots__ = ("asked", "readers", "roster")

    def __init__(self, roster: str) -> None:
        self.roster = roster
        self.asked: set[str] = set()
        self.readers: set[str] = set()

    def covers(self, candidates: Collection[str]) -> bool:
        return self.asked.issuperset(candidates)


class Delivery:
    """Relayed ranges, roster changes, events and invalidations, pushed to
    this node's sessions (see module doc)."""

    def __init__(
        self,
        hub: Hub,
        reading: Callable[[], AbstractAsyncContextManager[TrioConnection]],
        enqueue: Callable[[tuple[Any, ...]], None],
    ) -> None:
        self._hub = hub
        # The relay's process loop connection, and its job queue (a held
        # range comes back as a ``flush`` job).
        self._reading = reading
        self._enqueue = enqueue
        # Where gap timers run; the relay's, set when it starts.
        self.nursery: trio.Nursery | None = None
        self._cursors: OrderedDict[str, _Cursor] = OrderedDict()
        self._readers: OrderedDict[str, _Readers] = OrderedDict()
        # A scope never changes workspace: learnt from its first relayed read.
        self._workspace_of: dict[str, str] = {}
        self._held: dict[str, int] = {}
        self._fetching: set[str] = set()
        # Since when (trio clock) every seq of a scope comes through here: another
        # node's by its notification, this node's own through committed_here
        # with a cursor. Older seqs were in the sessions' first reads, or pushed
        # by the hub while the node was alone: a new cursor never starts below
        # them. Set by the relay when it joins and when peers appear; None: as
        # far back as IN_FLIGHT_S.
        self.tracked_since: float | None = None
        self.events_relayed = 0
        self.catchups = 0
        self.lean_reads = 0  # relayed ranges answered without the full statement

    def committed_here(self, scope_id: str, seqs: Sequence[int], *, alone: bool) -> bool:
        """This node committed ``seqs``: True when the hub pushes them to local
        sessions itself, False when the relay does (they follow earlier seqs
        still on their way) or did already."""
        if alone and scope_id not in self._cursors:
            # No other node writes here: nothing can arrive out of order, and a
            # cursor per scope would only hold memory.
            return True
        cursor = self._cursor(scope_id, None)
        if cursor.frontier is None:
            # Nothing says what this node's sessions were handed below this
            # commit: another node's seqs just before it may still be on their
            # way here. Held until the database says where to start (anchor).
            self._hold(scope_id, max(seqs))
            self._enqueue(("anchor", scope_id, min(seqs)))
            return False
        if cursor.start is not None and min(seqs) <= cursor.start:
            # Taken for handed when the cursor started (nothing below it was
            # recent enough, or no session here to hand it to), so the relay
            # never pushed it: late rather than never.
            cursor.add(seqs)
            return True
        handed = sum(cursor.has(seq) for seq in seqs)
        if handed == len(seqs):
            # Read back and pushed by the relay already: another node's later
            # seq (or a catch-up) was handled here before this publish ran.
            return False
        if handed or scope_id in self._fetching or cursor.missing(min(seqs) - 1):
            # Another node's earlier seqs are not delivered here yet (two nodes
            # wrote the scope), or the relay is reading ours back: deliver ours
            # after them, read back in order.
            self._hold(scope_id, max(seqs))
            self._enqueue(("flush", scope_id))
            return False
        cursor.add(seqs)
        return True

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

    async def messages(self, scope_id: str, first: int, last: int, *, force: bool) -> None:
        if first > 1 and scope_id not in self._cursors:
            # The first this node hears of the scope. Its own commit below
            # ``first`` may not be published yet (the hub runs after the
            # commit's reply, which can come after the other node's
            # notification), nor another node's notification of one: start
            # below the recent seqs, as for a first local commit. Everything
            # below ``first`` is committed, so they are read now.
            start = await self._first_unhanded(scope_id, first)
            self._cursor(scope_id, None).start_at(start - 1)
            force = True
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
                assert self.nursery is not None
                self.nursery.start_soon(self._flush_later, scope_id)
            self._hold(scope_id, upto)
            return
        self._fetching.add(scope_id)
        try:
            await self._push_range(scope_id, cursor, missing)
        finally:
            self._fetching.discard(scope_id)

    async def anchor(self, scope_id: str, first_local: int) -> None:
        """Start a scope's cursor below this node's first commit to it, or below
        the first seq recent enough that another node's notification of it may
        still be on its way; then push what is held, in order."""
        cursor = self._cursor(scope_id, None)
        if cursor.frontier is None:
            cursor.start_at(await self._first_unhanded(scope_id, first_local) - 1)
        await self.messages(scope_id, 0, 0, force=True)

    async def _first_unhanded(self, scope_id: str, below: int) -> int:
        """Where a scope's new cursor starts: ``below``, or the first seq under
        it recent enough that its notification (or this node's own publish of
        it) may still be on its way."""
        if not self._hub.member_ids(self._workspace_of.get(scope_id)):
            return below  # no session here to hand anything to
        margin = IN_FLIGHT_S
        if self.tracked_since is not None:
            margin = min(margin, trio.current_time() - self.tracked_since)
        async with self._reading() as conn:
            recent = await relay_sql.first_recent_seq(
                conn, scope_id, below, window=RANGE_LIMIT, margin_s=margin
            )
        # The recent seq, when there is one, is below ``below``.
        return recent or below

    async def _flush_later(self, scope_id: str) -> None:
        await trio.sleep(GAP_WAIT)
        if scope_id in self._held:
            self._enqueue(("flush", scope_id))

    async def _push_range(self, scope_id: str, cursor: _Cursor, seqs: list[int]) -> None:
        candidates = self._hub.member_ids(self._workspace_of.get(scope_id))
        if seqs[-1] - seqs[0] >= RANGE_LIMIT:
            cursor.add(range(seqs[0], seqs[-1] + 1))
            if candidates:
                await self.invalidate(scope_id, seqs[0], "relay_gap")
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
            shown_to = privileged_readers(message.author.id, message.metadata)
            for reader in row.readers:
                privileged = shown_to is not None and reader in shown_to
                if privileged not in framed:
                    view = stored_message_view(message, reader if privileged else None)
                    view.sources += [pending(_view_kind(k)) for k in row.source_kinds]
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
        if batches:
            self._hub.observe_delivery(
                r.message.created_at for r in rows if r.message.seq in wanted
            )
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
        """``deliver`` to this node's daemons the wakes of these messages (another
        node's, which it pushed only to the daemons it holds, or this node's own
        held behind them)."""
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

    async def catch_up(self, cutoff: datetime) -> None:
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

    async def membership(self, data: dict[str, Any]) -> None:
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

    async def event(self, data: dict[str, Any]) -> None:
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

    async def invalidate(self, scope_id: str, from_seq: int, reason: str) -> None:
        local = self._hub.member_ids()
        async with self._reading() as conn:
            targets = await relay_sql.current_readers(conn, scope_id, local)
        payload = encode(InvalidateEvent(scope_id=scope_id, reason=reason, from_seq=from_seq))
        for reader in targets:
            for session in self._hub.sessions_of(reader):
                session.push(payload)


def _view_kind(kind: str) -> str:
    return VIEW_KIND.get(kind, "context")


def _is_private_agent(sessions: Collection[LiveSession]) -> bool:
    for session in sessions:
        member = getattr(session, "member", None)
        return bool(member is not None and member.is_private_agent)
    return False
