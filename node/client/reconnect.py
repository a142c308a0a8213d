"""Staying connected: reconnect with backoff, resume, and hand nothing over twice.

A session ends for reasons a client should ride out: the node restarts or is
killed, it drains (4503), the proxy cuts the tunnel, the network drops
(1006), the node closes a slow consumer (4429). :func:`open_reconnecting_client`
yields a :class:`ReconnectingClient`, a :class:`~node.client.connection.Client`
that outlives its WebSocket sessions:

* a supervisor task connects, and after a retryable loss waits a
  :class:`Backoff` delay (exponential, full jitter, capped) and connects
  again, sending ``hello`` with ``resume`` = the last seq seen per scope;
* every session's events go into one queue, read with :meth:`next_event` as
  on a plain client. A ``message`` at or below the last seq already handed
  over for its scope (the resume replay overlaps what was seen) and a
  ``deliver`` whose ``deliveryId`` was handed over already (a pending
  delivery re-sent on connect) are dropped, so the caller sees each once;
* requests wait for a session. Those that are safe to repeat (:data:`RETRIED_OPS`:
  a ``send`` keeps its ``clientMessageId``, an ``ack`` is idempotent, reads
  are reads) are sent again on the next session when the connection drops
  before their answer; any other request raises
  :class:`~node.client.connection.ConnectionClosed` and the caller decides.

A close that retrying cannot fix (4401 bad or revoked token, 4403 wrong
workspace, a protocol error) ends the loop with :class:`SessionEnded`; running
out of attempts or time ends it with :class:`ReconnectGaveUp`. Both are
:class:`ConnectionClosed`, raised by every later call. ``open_daemon(...,
reconnect=Backoff())`` puts a daemon on top (``daemon.py``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
import trio
import trio_websocket

from node.client.connection import (
    Client,
    ClientError,
    ConnectionClosed,
    ProtocolViolation,
    open_client,
)

__all__ = [
    "RETRIED_OPS",
    "RETRYABLE_CLOSE_CODES",
    "Backoff",
    "ReconnectGaveUp",
    "ReconnectingClient",
    "SessionEnded",
    "is_retryable",
    "open_reconnecting_client",
]

log = structlog.get_logger(__name__)

# Closes after which the same token and hello may succeed on a new session:
# going away, lost without a close frame, internal error, service restart,
# heartbeat timeout, slow consumer or session cap, draining. None is a
# connection that ended without a close code (reset, refused).
RETRYABLE_CLOSE_CODES = frozenset({1001, 1006, 1011, 1012, 4408, 4429, 4503})

# Requests that may be sent again after a lost answer without doing twice
# what they do: sends are idempotent by clientMessageId, acks and reactions
# by their keys, deletes leave the one tombstone, the rest only read.
RETRIED_OPS = frozenset(
    {"send", "ack", "history", "search", "scopes", "members", "channels", "people", "markRead"}
    | {"react", "delete"}
)

# Delivery ids remembered for deduplication: far more than a daemon has
# pending at once, so a repeat is always recognised, yet bounded in memory.
SEEN_DELIVERIES = 65_536

# Seconds to wait for the node to answer our close before leaving anyway.
CLOSE_TIMEOUT = 5.0

Connect = Callable[[Mapping[str, int] | None], AbstractAsyncContextManager[Client]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """When to reconnect: ``base`` × 2^n seconds, capped at ``cap``, full jitter.

    The n-th reconnect attempt after a loss (n from 0) waits a uniformly random
    time in ``[0, min(cap, base * 2**n)]``, so the clients of a dead node do
    not come back in step. The loop gives up (:class:`ReconnectGaveUp`) after
    ``max_attempts`` failed attempts in a row, or once it has been without a
    session for ``deadline`` seconds; None means no such limit.
    """

    base: float = 0.1
    cap: float = 10.0
    max_attempts: int | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError("Backoff needs 0 < base <= cap")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("Backoff.max_attempts must be at least 1")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError("Backoff.deadline must be positive")

    def ceiling(self, attempt: int) -> float:
        """The longest wait before attempt ``attempt`` (0-based) after a loss."""
        return min(self.cap, self.base * 2.0 ** min(attempt, 64))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A full-jitter wait before attempt ``attempt``: uniform in ``[0, ceiling]``."""
        return (rng or _rng).uniform(0.0, self.ceiling(attempt))

    def exhausted(self, failures: int, down_for: float) -> bool:
        """True once ``failures`` attempts in a row or ``down_for`` seconds are too many."""
        if self.max_attempts is not None and failures >= self.max_attempts:
            return True
        return self.deadline is not None and down_for >= self.deadline


_rng = random.Random()


class SessionEnded(ConnectionClosed):
    """The node ended the session for a reason a reconnect cannot fix (4401, 4403, …)."""


class ReconnectGaveUp(ConnectionClosed):
    """The :class:`Backoff` ran out of attempts or time; ``__cause__`` is the last failure."""


def is_retryable(exc: BaseException) -> bool:
    """Whether a new session may succeed after ``exc`` ended (or refused) one."""
    if isinstance(exc, SessionEnded | ReconnectGaveUp | ProtocolViolation):
        return False
    if isinstance(exc, ConnectionClosed):
        return exc.code is None or exc.code in RETRYABLE_CLOSE_CODES
    if isinstance(exc, ClientError):
        return exc.retryable  # hello answered with an error: the session cap (rate_limited)
    if isinstance(exc, trio_websocket.ConnectionRejected):
        # The upgrade answered with HTTP: a draining node's 503, a proxy's 502.
        status = exc.status_code or 0
        return status >= 500 or status == 429
    return isinstance(
        exc,
        OSError
        | trio_websocket.HandshakeError
        | trio_websocket.ConnectionClosed
        | trio.BrokenResourceError
        | trio.ClosedResourceError
        | trio.TooSlowError,
    )


def _close_code(exc: BaseException) -> int | None:
    return exc.code if isinstance(exc, ConnectionClosed) else None


class ReconnectingClient(Client):
    """A :class:`Client` kept connected across sessions. Use :func:`open_reconnecting_client`.

    :attr:`welcome` and :attr:`member_id` are those of the current session;
    :attr:`welcomes` holds one ``welcome`` per session so far (its ``nodeId``
    says where each one landed) and :attr:`repeats_dropped` every event
    dropped as already handed over (``("message", "scopeId:seq")`` or
    ``("deliver", deliveryId)``). :meth:`session` waits for the live session.
    """

    # The wrapped sessions own the sockets; this object only routes, so it
    # does not run Client.__init__ (which wants a socket).
    def __init__(
        self,
        connect: Connect,
        backoff: Backoff,
        *,
        resume: Mapping[str, int] | None = None,
        track_resume: bool = True,
    ) -> None:
        self._connect = connect
        self.backoff = backoff
        self._track_resume = track_resume
        self._last_seq: dict[str, int] = dict(resume or {})
        self._seen_deliveries: OrderedDict[str, None] = OrderedDict()
        self._current: Client | None = None
        self._fatal: ConnectionClosed | None = None
        self._changed = trio.Event()
        self._ids = itertools.count(1)
        self._event_send, self._event_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._closed = trio.Event()
        self.welcome = {}
        self.member_id = ""
        self.close_code = None
        self.close_reason = None
        self.http_url = ""
        self.token = ""
        self.welcomes: list[dict[str, Any]] = []
        self.repeats_dropped: list[tuple[str, str]] = []

    # --- the session of the moment ----------------------------------------------

    async def session(self) -> Client:
        """The live session, once there is one; raises the loop's end if it ended."""
        while True:
            if self._fatal is not None:
                raise self._fatal
            if self._current is not None:
                return self._current
            await self._changed.wait()

    def resume_point(self) -> dict[str, int]:
        """What the next ``hello.resume`` will carry: the last seq handed over per scope."""
        return dict(self._last_seq)

    # --- requests ------------------------------------------------------------------

    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        """:meth:`Client.request` on the live session; an op of :data:`RETRIED_OPS`
        is sent again on the next session when the connection drops before its
        answer (a ``send`` with the same ``clientMessageId``)."""
        while True:
            session = await self.session()
            try:
                return await session.request(op, **fields)
            except ConnectionClosed as exc:
                if self._fatal is not None:
                    raise self._fatal from exc
                if op not in RETRIED_OPS or not is_retryable(exc):
                    raise
                await self._gone(session)

    async def request_frame(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send ``frame`` on the live session (waiting for one) and return its answer."""
        return await (await self.session()).request_frame(frame)

    async def send_raw(self, text: str | bytes) -> None:
        await (await self.session()).send_raw(text)

    async def _gone(self, session: Client) -> None:
        """Wait until the supervisor has let ``session`` go (it failed a request)."""
        while self._current is session and self._fatal is None:
            await self._changed.wait()

    # --- events --------------------------------------------------------------------

    async def next_event(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event of any session, each once; raises how the loop ended once drained."""
        try:
            return await Client.next_event(self, timeout)
        except ConnectionClosed:
            if self._fatal is not None:
                raise self._fatal from None
            raise

    def _hand_over(self, event: dict[str, Any]) -> None:
        if self._is_repeat(event):
            return
        self._event_send.send_nowait(event)

    def _is_repeat(self, event: dict[str, Any]) -> bool:
        """Drop what was handed over already, and remember what is handed over now."""
        kind = event.get("type")
        if kind == "message":
            return self._message_repeat(event)
        if kind == "deliver":
            delivery_id = event.get("deliveryId")
            if not isinstance(delivery_id, str):
                return False
            if delivery_id in self._seen_deliveries:
                self.repeats_dropped.append(("deliver", delivery_id))
                return True
            self._seen_deliveries[delivery_id] = None
            if len(self._seen_deliveries) > SEEN_DELIVERIES:
                self._seen_deliveries.popitem(last=False)
        return False

    def _message_repeat(self, event: dict[str, Any]) -> bool:
        scope_id = event.get("scopeId")
        message = event.get("message")
        seq = message.get("seq") if isinstance(message, dict) else None
        if not isinstance(scope_id, str) or not isinstance(seq, int):
            return False
        # Per scope the node hands a session each seq once, in order: what is
        # at or below the last one handed over is a resume replay overlapping it.
        if seq <= self._last_seq.get(scope_id, 0) and scope_id in self._last_seq:
            self.repeats_dropped.append(("message", f"{scope_id}:{seq}"))
            return True
        if self._track_resume or scope_id in self._last_seq:
            self._last_seq[scope_id] = seq
        return False

    # --- the loop --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, pump, reconnect. ``started`` after the first welcome; an end
        before it raises, an end after it is raised by every later call."""
        failures = 0  # failed attempts since the last session
        down_since = trio.current_time()
        while True:
            ended = await self._one_session(None if self.welcomes else task_status)
            if self._fatal is not None:  # closed by the client meanwhile
                return
            if ended is None:
                failures, down_since = 0, trio.current_time()
            else:
                fatal = self._verdict(ended, failures, trio.current_time() - down_since)
                if fatal is not None:
                    self._end(fatal)
                    if not self.welcomes:
                        raise fatal
                    return
                failures += 1
            # Even the first attempt after a loss waits its jitter: the clients
            # of one dead node must not all land in the same instant.
            delay = self.backoff.delay(failures)
            log.info("reconnect_scheduled", error=repr(ended), failures=failures, delay=delay)
            await trio.sleep(delay)

    async def _one_session(self, task_status: trio.TaskStatus[None] | None) -> BaseException | None:
        """One session, start to end: None if it was welcomed (and has ended
        since), else what kept it from being established."""
        try:
            async with self._connect(dict(self._last_seq) or None) as client:
                self._attach(client)
                if task_status is not None:
                    task_status.started()
                lost = await self._pump(client)
        except Exception as exc:  # judged by is_retryable, in _verdict
            self._detach()
            return exc
        self._detach(lost)
        return None if lost is None or is_retryable(lost) else lost

    def _verdict(
        self, ended: BaseException, failures: int, down_for: float
    ) -> ConnectionClosed | None:
        """The loop's end after ``ended``, or None to try again."""
        code = _close_code(ended)
        if not is_retryable(ended):
            reason = ended.reason if isinstance(ended, ConnectionClosed) else repr(ended)
            fatal: ConnectionClosed = SessionEnded(code, reason)
        elif self.backoff.exhausted(failures + 1, down_for):
            fatal = ReconnectGaveUp(code, f"gave up after {failures + 1} attempts: {ended!r}")
        else:
            return None
        fatal.__cause__ = ended
        return fatal

    def _attach(self, client: Client) -> None:
        self._current = client
        self.welcome = client.welcome
        self.member_id = client.member_id
        self.http_url, self.token = client.http_url, client.token
        self.welcomes.append(client.welcome)
        self._notify()
        log.info("session_up", nodeId=client.welcome.get("nodeId"), session=len(self.welcomes))

    def _detach(self, lost: ConnectionClosed | None = None) -> None:
        if self._current is not None:
            self.close_code = self._current.close_code
            self.close_reason = self._current.close_reason
        self._current = None
        self._notify()
        if lost is not None:
            log.info("session_lost", code=lost.code, reason=lost.reason)

    async def _pump(self, client: Client) -> ConnectionClosed:
        while True:
            try:
                event = await client.next_event()
            except ConnectionClosed as exc:
                return exc
            self._hand_over(event)

    def _end(self, fatal: ConnectionClosed) -> None:
        self._fatal = fatal
        self.close_code, self.close_reason = fatal.code, fatal.reason
        self._closed.set()
        self._event_send.close()
        self._notify()
        if fatal.__cause__ is not None:  # not the caller's own close
            log.warning("reconnect_ended", error=str(fatal), cause=repr(fatal.__cause__))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- closing ------------------------------------------------------------------

    async def aclose(self, code: int = 1000) -> None:
        """Close the live session with ``code`` and stop reconnecting (idempotent)."""
        if self._fatal is None:
            self._end(SessionEnded(code, "closed by the client"))
        if self._current is not None:
            # A dead peer never answers the close: do not wait for it long.
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._current.aclose(code)


def _session_factory(url: str, token: str, kwargs: dict[str, Any]) -> Connect:
    def connect(resume: Mapping[str, int] | None) -> AbstractAsyncContextManager[Client]:
        return open_client(url, token, resume=resume, **kwargs)

    return connect


@asynccontextmanager
async def open_reconnecting_client(
    url: str,
    token: str,
    *,
    backoff: Backoff | None = None,
    resume: Mapping[str, int] | None = None,
    track_resume: bool = True,
    **kwargs: Any,
) -> AsyncIterator[ReconnectingClient]:
    """:func:`open_client` that reconnects and resumes by itself (module doc).

    Returns once the first session is welcomed; a first connect that fails
    for good raises here (:class:`SessionEnded`, :class:`ReconnectGaveUp`).
    ``resume`` is where to start per scope (``{scopeId: lastSeenSeq}``, 0 for
    "everything"); with ``track_resume`` every scope a ``message`` arrives for
    is resumed too, from its last seq, otherwise only those of ``resume``.
    Other keywords go to :func:`open_client` for every session.
    """
    client = ReconnectingClient(
        _session_factory(url, token, kwargs),
        backoff or Backoff(),
        resume=resume,
        track_resume=track_resume,
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True):
                    await client.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The loop never raises once started, so the group holds the first
        # connect's end or what the caller's block raised: hand it back unwrapped.
        if len(group.exceptions) == 1:
            only = group.exceptions[0]
            raise only from only.__cause__
        raise
