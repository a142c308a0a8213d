"""A trio client for the scopenode WebSocket protocol, version 1 (PROTOCOL.md).

Tests, the bench harness and agent daemons talk to nodes through this module.
Frames are plain dicts so that black-box tests can send and inspect exactly
what is on the wire, including frames the node must reject.

Theory of operation
-------------------
:func:`open_client` connects, sends ``hello`` and waits for ``welcome``. It then
runs one reader task that splits every server frame on ``\\n`` (the node
coalesces queued events into one frame) and routes each object:

* a ``reply`` or ``error`` whose ``id`` matches an in-flight request wakes that
  request (ids are matched by their JSON encoding, so ``1`` and ``"1"`` differ
  as the protocol requires);
* a ``ping`` from the node with an ``id`` is answered with ``pong`` at once;
* everything else — events, ``pong`` to a raw ``ping``, ``error`` with ``id``
  null, replies to ids nobody waits for — goes to the event queue, in arrival
  order, read with
  :meth:`Client.next_event`. Objects that arrived in the ``welcome`` frame are
  queued before the reader starts, so resume traffic is never lost.

When the connection closes, in-flight requests raise :class:`ConnectionClosed`,
:attr:`Client.close_code` is set, and :meth:`Client.next_event` raises
:class:`ConnectionClosed` once the queued events are drained. A server object
that is not a JSON object is a protocol violation: the client closes with 1002
and reports it the same way.

Requests carry no built-in timeout; callers wrap them in ``trio.fail_after``.

Agent daemons use :func:`open_daemon` instead: a :class:`DaemonClient` around
the session keeps the per-targetKey observed frontier, sends with freshness,
and suppresses stale deliveries before any wake (see "Daemon layer" below).
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import structlog
import trio
import trio_websocket

__all__ = [
    "Client",
    "ClientError",
    "ConnectionClosed",
    "DaemonClient",
    "Delivery",
    "Frontier",
    "ProtocolViolation",
    "chunk_client_message_id",
    "open_client",
    "open_daemon",
]

# Client-side close codes (RFC 6455): the server broke the protocol; we gave up
# on an event queue nobody reads.
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_POLICY_VIOLATION = 1008

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class ClientError(Exception):
    """The node answered a request with an ``error`` frame."""

    def __init__(self, frame: Mapping[str, Any], op: str | None = None) -> None:
        self.frame: dict[str, Any] = dict(frame)
        self.code: str = str(frame.get("code", ""))
        self.message: str = str(frame.get("message", ""))
        self.retryable: bool = bool(frame.get("retryable", False))
        details = frame.get("details")
        self.details: dict[str, Any] = dict(details) if isinstance(details, Mapping) else {}
        self.op: str | None = op
        super().__init__(f"{op or '?'}: {self.code}: {self.message}")


class ConnectionClosed(Exception):
    """The WebSocket closed (``code`` is the close code, None if unknown)."""

    def __init__(self, code: int | None, reason: str | None = None) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"connection closed: code={code} reason={reason!r}")


class ProtocolViolation(Exception):
    """The node answered ``hello`` with something other than ``welcome``."""

    def __init__(self, frame: Mapping[str, Any]) -> None:
        self.frame: dict[str, Any] = dict(frame)
        super().__init__(f"expected welcome, got {self.frame.get('type')!r}")


class _Waiter:
    """One in-flight request: the reply frame, or None when the connection closed."""

    __slots__ = ("done", "frame", "op")

    def __init__(self, op: Any) -> None:
        self.op = op
        self.done = trio.Event()
        self.frame: dict[str, Any] | None = None


def _id_key(request_id: Any) -> bytes:
    return _encoder.encode(request_id)


class Client:
    """One authenticated session. Create it with :func:`open_client`."""

    welcome: dict[str, Any]
    member_id: str
    close_code: int | None
    close_reason: str | None

    def __init__(self, ws: trio_websocket.WebSocketConnection, max_pending_events: float) -> None:
        self._ws = ws
        self._max_pending_events = max_pending_events
        self._ids = itertools.count(1)
        self._waiters: dict[bytes, _Waiter] = {}
        # Ids of requests whose caller was cancelled: their late replies are
        # dropped instead of surfacing as events.
        self._abandoned: set[bytes] = set()
        self._pongs_due: list[Any] = []
        self._event_send, self._event_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
        self._closed = trio.Event()
        self.welcome = {}
        self.member_id = ""
        self.close_code = None
        self.close_reason = None

    # --- requests ---------------------------------------------------------

    async def request(self, op: str, /, **fields: Any) -> dict[str, Any]:
        """Send ``{"type": op, "id": <auto>, **fields}`` and return ``reply["result"]``.

        Raises :class:`ClientError` for an ``error`` reply and
        :class:`ConnectionClosed` if the connection closes first.
        """
        frame = {"type": op, "id": next(self._ids), **fields}
        reply = await self.request_frame(frame)
        if reply.get("type") == "error":
            raise ClientError(reply, op)
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    async def request_frame(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send ``frame`` (which must carry an ``id``) and return the whole answer.

        The answer is the ``reply``, ``error`` (returned, not raised) or, for a
        ``ping``, ``pong`` frame with the same id. Auto ids of :meth:`request`
        are the integers from 1 up: ids of frames sent with :meth:`send_raw`
        should not collide with those in flight.
        """
        if "id" not in frame or frame["id"] is None:
            raise ValueError("a request frame needs a non-null 'id'")
        key = _id_key(frame["id"])
        if key in self._waiters:
            raise ValueError(f"request id {frame['id']!r} is already in flight")
        self._raise_if_closed()
        waiter = _Waiter(frame.get("type"))
        self._waiters[key] = waiter
        try:
            await self._send_text(_encoder.encode(frame).decode())
            await waiter.done.wait()
        except BaseException:
            if not waiter.done.is_set():
                self._abandoned.add(key)
            raise
        finally:
            del self._waiters[key]
        if waiter.frame is None:
            self._raise_if_closed()
            raise AssertionError("waiter woken without a frame on an open connection")
        return waiter.frame

    async def send(self, target: str, content: str, **fields: Any) -> dict[str, Any]:
        """The ``send`` op; ``clientMessageId`` defaults to a fresh uuid."""
        client_message_id = fields.pop("clientMessageId", f"c-{uuid.uuid4().hex}")
        return await self.request(
            "send", target=target, content=content, clientMessageId=client_message_id, **fields
        )

    async def history(self, target: str, **fields: Any) -> dict[str, Any]:
        """The ``history`` op (``beforeSeq``/``afterSeq``/``limit`` as keywords)."""
        return await self.request("history", target=target, **fields)

    async def remove(self, scope_id: str, member_id: str) -> dict[str, Any]:
        """The ``remove`` op: end ``member_id``'s membership of the channel ``scope_id``
        (allowed to the channel's owner, and to the owner of a private agent)."""
        return await self.request("remove", scopeId=scope_id, memberId=member_id)

    async def send_raw(self, text: str | bytes) -> None:
        """Write one raw WebSocket message: ``str`` as text, ``bytes`` as binary."""
        self._raise_if_closed()
        try:
            await self._ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise self._closed_error(exc) from None

    # --- events -----------------------------------------------------------

    async def next_event(self, timeout: float | None = None) -> dict[str, Any]:
        """The next server object that is not an answer to one of our requests.

        Raises ``trio.TooSlowError`` after ``timeout`` seconds and
        :class:`ConnectionClosed` once the connection closed and no events remain.
        """
        with trio.fail_after(math.inf if timeout is None else timeout):
            try:
                return await self._event_receive.receive()
            except trio.EndOfChannel:
                raise ConnectionClosed(self.close_code, self.close_reason) from None

    async def events_until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> list[dict[str, Any]]:
        """Collect events up to and including the first one ``predicate`` accepts.

        Raises ``trio.TooSlowError`` if none does within ``timeout`` seconds (the
        events collected so far are consumed and named in the message).
        """
        collected: list[dict[str, Any]] = []
        try:
            with trio.fail_after(timeout):
                while True:
                    event = await self.next_event()
                    collected.append(event)
                    if predicate(event):
                        return collected
        except trio.TooSlowError:
            seen = [event.get("type") for event in collected[-20:]]
            raise trio.TooSlowError(
                f"no matching event within {timeout}s; {len(collected)} seen, last types {seen}"
            ) from None

    def pending_events(self) -> int:
        """How many events are queued and not yet read."""
        return self._event_receive.statistics().current_buffer_used

    # --- closing ------------------------------------------------------------

    async def aclose(self, code: int = 1000) -> None:
        """Close the connection with ``code`` (idempotent)."""
        if not self._closed.is_set():
            # trio-websocket records 1000 for any close we initiate: keep ours.
            self._mark_closed(code, None)
        await self._ws.aclose(code)

    async def wait_closed(self, timeout: float) -> int | None:
        """Wait until the connection closed and return the close code.

        Raises ``trio.TooSlowError`` if it is still open after ``timeout`` seconds.
        """
        with trio.fail_after(timeout):
            await self._closed.wait()
        return self.close_code

    # --- internals ------------------------------------------------------------

    async def _send_text(self, text: str) -> None:
        try:
            await self._ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise self._closed_error(exc) from None

    def _raise_if_closed(self) -> None:
        if self._closed.is_set():
            raise ConnectionClosed(self.close_code, self.close_reason)

    def _closed_error(self, exc: trio_websocket.ConnectionClosed) -> ConnectionClosed:
        if not self._closed.is_set():
            reason = exc.reason
            self._mark_closed(
                None if reason is None else reason.code, None if reason is None else reason.reason
            )
        return ConnectionClosed(self.close_code, self.close_reason)

    def _mark_closed(self, code: int | None, reason: str | None) -> None:
        """Record the close once; wake every waiter and end the event stream."""
        if self._closed.is_set():
            return
        self.close_code = code
        self.close_reason = reason
        self._closed.set()
        self._event_send.close()
        for waiter in self._waiters.values():
            waiter.done.set()

    def _route(self, data: str | bytes) -> tuple[int, str] | None:
        """Route every object of one server frame; on a violation return (close code, why)."""
        if isinstance(data, str):
            data = data.encode()
        for part in data.split(b"\n"):
            if not part.strip():
                continue
            try:
                obj = _decoder.decode(part)
            except msgspec.DecodeError as exc:
                return CLOSE_PROTOCOL_ERROR, f"invalid JSON from server: {exc}"
            if not isinstance(obj, dict):
                return CLOSE_PROTOCOL_ERROR, f"server sent a JSON {type(obj).__name__}"
            kind = obj.get("type")
            if kind == "ping" and obj.get("id") is not None:
                self._pongs_due.append(obj["id"])  # the protocol obliges us to answer
                continue
            if kind in ("reply", "error", "pong") and obj.get("id") is not None:
                key = _id_key(obj["id"])
                waiter = self._waiters.get(key)
                if (
                    waiter is not None
                    and not waiter.done.is_set()
                    and (kind != "pong" or waiter.op == "ping")
                ):
                    waiter.frame = obj
                    waiter.done.set()
                    continue
                if key in self._abandoned:
                    self._abandoned.discard(key)
                    continue
            if self._closed.is_set():
                continue
            if self.pending_events() >= self._max_pending_events:
                unread = self.pending_events()
                return CLOSE_POLICY_VIOLATION, f"client event queue overflow ({unread} unread)"
            self._event_send.send_nowait(obj)
        return None

    async def _handshake(self, hello: dict[str, Any]) -> None:
        await self._send_text(_encoder.encode(hello).decode())
        try:
            data = await self._ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise self._closed_error(exc) from None
        if isinstance(data, str):
            data = data.encode()
        first, _, rest = data.partition(b"\n")
        try:
            welcome = _decoder.decode(first)
        except msgspec.DecodeError:
            welcome = {"type": None, "raw": first.decode(errors="replace")}
        if not isinstance(welcome, dict) or welcome.get("type") != "welcome":
            frame = welcome if isinstance(welcome, dict) else {"type": None, "raw": welcome}
            if frame.get("type") == "error":
                raise ClientError(frame, "hello")
            raise ProtocolViolation(frame)
        self.welcome = welcome
        member = welcome.get("member")
        self.member_id = str(member.get("id", "")) if isinstance(member, dict) else ""
        violation = self._route(rest)
        if violation is not None:
            await self._fail(*violation)
        await self._answer_pings()

    async def _read_frames(self) -> None:
        while True:
            try:
                data = await self._ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                self._closed_error(exc)
                return
            violation = self._route(data)
            if violation is not None:
                await self._fail(*violation)
                return
            await self._answer_pings()

    async def _answer_pings(self) -> None:
        while self._pongs_due and not self._closed.is_set():
            pong = {"type": "pong", "id": self._pongs_due.pop(0)}
            try:
                await self._ws.send_message(_encoder.encode(pong).decode())
            except trio_websocket.ConnectionClosed as exc:
                self._closed_error(exc)

    async def _fail(self, code: int, reason: str) -> None:
        self._mark_closed(code, reason)
        await self._ws.aclose(code, reason[:120])

    async def _heartbeat(self, interval: float) -> None:
        """Send a WebSocket ping every ``interval`` seconds so the node keeps us."""
        while not self._closed.is_set():
            await trio.sleep(interval)
            try:
                await self._ws.ping()
            except trio_websocket.ConnectionClosed:
                return


@asynccontextmanager
async def open_client(
    url: str,
    token: str,
    *,
    kind: Literal["browser", "daemon"] = "browser",
    name: str = "scopenode-client",
    version: str = "0.1",
    capabilities: Sequence[str] = (),
    resume: Mapping[str, int] | None = None,
    connect_timeout: float = 10.0,
    max_message_size: int = 16 * 1024 * 1024,
    max_pending_events: float = 100_000,
    heartbeat: bool = False,
) -> AsyncIterator[Client]:
    """Connect to ``url``, authenticate with ``token`` and yield the session.

    ``connect_timeout`` bounds the WebSocket handshake and, separately, the
    wait for ``welcome``. If the node closes instead of answering (4401 bad
    token, 4403 wrong workspace) this raises :class:`ConnectionClosed` with
    that code. More than ``max_pending_events`` unread events close the
    connection with 1008 (pass ``math.inf`` to never do so). With
    ``heartbeat`` the client sends a WebSocket ping every ``heartbeatMs`` so
    an idle session outlives the node's 3 × heartbeat timeout; it is off by
    default so that tests of that timeout see a silent client.
    """
    hello: dict[str, Any] = {
        "type": "hello",
        "token": token,
        "client": {"kind": kind, "name": name, "version": version},
        "capabilities": list(capabilities),
    }
    if resume is not None:
        hello["resume"] = dict(resume)
    ws: trio_websocket.WebSocketConnection | None = None
    try:
        async with (
            trio_websocket.open_websocket_url(
                url, connect_timeout=connect_timeout, max_message_size=max_message_size
            ) as ws,
            _run_client(ws, hello, connect_timeout, max_pending_events, heartbeat) as client,
        ):
            yield client
    finally:
        # trio-websocket 0.12 never closes a client's TCP stream when the server
        # closed first (its aclose() returns early once a close reason is
        # recorded), which leaks the socket. SocketStream.aclose is idempotent.
        stream = getattr(ws, "_stream", None)
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


@asynccontextmanager
async def _run_client(
    ws: trio_websocket.WebSocketConnection,
    hello: dict[str, Any],
    connect_timeout: float,
    max_pending_events: float,
    heartbeat: bool,
) -> AsyncIterator[Client]:
    """Handshake on ``ws``, then run the reader (and heartbeat) around the caller's block."""
    client = Client(ws, max_pending_events)
    with trio.fail_after(connect_timeout):
        await client._handshake(hello)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read_frames)
            if heartbeat:
                interval = float(client.welcome.get("heartbeatMs", 20_000)) / 1000
                nursery.start_soon(client._heartbeat, interval)
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(connect_timeout):
                    await client.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The background tasks end quietly, so the group holds what the
        # caller's block raised (plus Cancelled when a task failed): hand
        # that exception back unwrapped, as a plain context manager would.
        errors = [e for e in group.exceptions if not isinstance(e, trio.Cancelled)]
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        if len(errors) == 1:
            raise errors[0] from None
        raise


# --- Daemon layer (SPEC R-29, seed 002 §2.4-2.5, §3.5-3.9) --------------------------------------
#
# Agent daemons wrap a `Client` (composition, not inheritance) in a
# `DaemonClient`. It keeps, per targetKey, the observed frontier — the highest
# target seq the agent *runtime* has actually seen — and the latest-known
# refresh hint. Observed advances, high-water only, at runtime-visible
# boundaries: a delivery handed to the runtime (`handed_to_runtime`), `history`
# coverage (`read_history`) and the agent's own accepted sends. Receiving a
# `deliver` frame or a `message` event, a `held` result or a search hit does
# not advance it.
#
# Stale-delivery suppression (§3.6.1) runs in `next_wake`, the one entry by
# which deliveries reach the runtime, when a delivery is dequeued rather than
# when it arrives: one that waited in the local queue while `read_history`
# covered it is stale by the time it would wake the runtime. A stale delivery
# is acknowledged (so the node never redelivers it) and dropped, with a log
# line, before any wake.

log = structlog.get_logger(__name__)

DAEMON_CAPABILITIES = ("freshness", "ack")
_ACCEPTED_STATES = ("sent", "already_sent")


def _seq(value: Any) -> int | None:
    """``value`` as a target seq, or None when it is not one (bools are not seqs)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class Frontier:
    """Per-targetKey observed frontier (seed 002 §2.4) and latest-known refresh hint (§2.5).

    Pure bookkeeping, no I/O. Both values are high-water marks and start at 0.
    The frontier belongs to the agent runtime, not to one WebSocket session:
    hand the same instance to every :func:`open_daemon` for as long as the
    runtime's context lives.
    """

    __slots__ = ("_latest", "_observed")

    def __init__(self) -> None:
        self._observed: dict[str, int] = {}
        self._latest: dict[str, int] = {}

    def observed(self, target_key: str) -> int:
        """The highest target seq of ``target_key`` the runtime has seen (0: none)."""
        return self._observed.get(target_key, 0)

    def latest_known(self, target_key: str) -> int:
        """The newest target seq the daemon has heard of; never below :meth:`observed`."""
        return max(self._latest.get(target_key, 0), self.observed(target_key))

    def needs_refresh(self, target_key: str) -> bool:
        """The node reported messages in ``target_key`` that the runtime has not seen."""
        return self.latest_known(target_key) > self.observed(target_key)

    def advance(self, target_key: str, seq: int) -> None:
        """A runtime-visible boundary covered ``seq``: raise observed to it (never lowers)."""
        if seq > self._observed.get(target_key, 0):
            self._observed[target_key] = seq

    def hint(self, target_key: str, latest_seq: int) -> None:
        """The node reported ``latest_seq`` (``held``, ``partial_held``): remember it.

        A hint never advances observed: the runtime has not seen those messages.
        """
        if latest_seq > self._latest.get(target_key, 0):
            self._latest[target_key] = latest_seq

    def is_stale(self, target_key: str, target_seq: int) -> bool:
        """A delivery at ``target_seq`` is stale once the runtime has seen that far."""
        return target_seq <= self.observed(target_key)

    def __repr__(self) -> str:
        keys = sorted(self._observed.keys() | self._latest.keys())
        parts = (f"{k}: {self.observed(k)}/{self.latest_known(k)}" for k in keys)
        return f"Frontier({', '.join(parts)})"


@dataclass(frozen=True, slots=True, eq=False)
class Delivery:
    """One ``deliver`` event (PROTOCOL.md, Server events)."""

    delivery_id: str
    agent_id: str
    target_key: str
    target_seq: int
    reason: str
    message: dict[str, Any]

    @property
    def message_id(self) -> str:
        return str(self.message.get("id", ""))

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> Delivery:
        """Parse a ``deliver`` event; raises ``ValueError`` if a field is missing or mistyped."""
        delivery_id = event.get("deliveryId")
        target_key = event.get("targetKey")
        target_seq = _seq(event.get("targetSeq"))
        message = event.get("message")
        if (
            not isinstance(delivery_id, str)
            or not isinstance(target_key, str)
            or target_seq is None
            or not isinstance(message, dict)
        ):
            raise ValueError(f"malformed deliver event: {dict(event)!r}")
        return cls(
            delivery_id=delivery_id,
            agent_id=str(event.get("agentId", "")),
            target_key=target_key,
            target_seq=target_seq,
            reason=str(event.get("reason", "")),
            message=message,
        )


def chunk_client_message_id(client_message_id: str, index: int) -> str:
    """The deterministic ``clientMessageId`` of row ``index`` of a chunked send (§3.9)."""
    return f"{client_message_id}.{index}"


class DaemonClient:
    """An agent daemon's session: deliveries, acks and fresh sends. Use :func:`open_daemon`.

    Read deliveries with :meth:`next_wake` and every other event with
    :meth:`next_event`; each keeps what it is not after for the other, so
    nothing is lost. Do not read events from the wrapped :attr:`client`
    directly (deliveries would bypass suppression). Other requests may go
    through :attr:`client`; sends and history should go through :meth:`send`
    and :meth:`read_history`, which keep :attr:`frontier`.
    """

    client: Client
    frontier: Frontier
    suppressed: list[dict[str, Any]]

    def __init__(self, client: Client, frontier: Frontier | None = None) -> None:
        self.client = client
        self.frontier = Frontier() if frontier is None else frontier
        # One record per suppressed delivery, oldest first (the fields of the log line).
        self.suppressed = []
        self._deliveries: deque[Delivery] = deque()
        self._events: deque[dict[str, Any]] = deque()
        # Returned by next_wake, not yet acknowledged: a repeated push of one of
        # these (the outbox retries unacknowledged deliveries) must not wake again.
        self._outstanding: set[str] = set()

    # --- deliveries -----------------------------------------------------------

    async def next_wake(self, timeout: float | None = None) -> Delivery:
        """The next delivery to wake the runtime for, in arrival order.

        On the way, a stale delivery (``targetSeq`` at or below the observed
        frontier of its targetKey) is acknowledged and dropped without a wake,
        and a repeat of a delivery already returned and not yet acknowledged is
        dropped. The returned delivery is not observed yet: call
        :meth:`handed_to_runtime` once the runtime has the message, then
        :meth:`ack`. Raises ``trio.TooSlowError`` after ``timeout`` seconds and
        :class:`ConnectionClosed` once the connection closed and no delivery
        remains. Cancellation loses nothing: a delivery being suppressed when
        cancelled is checked again by the next call.
        """
        with trio.fail_after(math.inf if timeout is None else timeout):
            while True:
                if self._deliveries:
                    delivery = self._deliveries.popleft()
                else:
                    self._sort(await self.client.next_event())
                    continue
                if self.frontier.is_stale(delivery.target_key, delivery.target_seq):
                    try:
                        await self._suppress(delivery)
                    except BaseException:
                        self._deliveries.appendleft(delivery)
                        raise
                    continue
                if delivery.delivery_id in self._outstanding:
                    log.debug(
                        "delivery_repeat_dropped",
                        deliveryId=delivery.delivery_id,
                        targetKey=delivery.target_key,
                        targetSeq=delivery.target_seq,
                    )
                    continue
                self._outstanding.add(delivery.delivery_id)
                return delivery

    def handed_to_runtime(self, delivery: Delivery) -> None:
        """The runtime has the delivery's message: advance observed to its ``targetSeq``.

        Call it only once the handoff succeeded (seed 002 §3.5): observed never
        moves back.
        """
        self.frontier.advance(delivery.target_key, delivery.target_seq)

    async def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` so that the node never redelivers it."""
        await self.client.request("ack", deliveryId=delivery.delivery_id)
        self._outstanding.discard(delivery.delivery_id)

    def pending_deliveries(self) -> int:
        """Deliveries received and not yet through :meth:`next_wake`."""
        return len(self._deliveries)

    # --- other events -----------------------------------------------------------

    async def next_event(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event that is not a ``deliver`` (those wait for :meth:`next_wake`)."""
        with trio.fail_after(math.inf if timeout is None else timeout):
            while not self._events:
                self._sort(await self.client.next_event())
            return self._events.popleft()

    async def events_until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> list[dict[str, Any]]:
        """Like :meth:`Client.events_until`, over the events of :meth:`next_event`."""
        collected: list[dict[str, Any]] = []
        with trio.fail_after(timeout):
            while True:
                event = await self.next_event()
                collected.append(event)
                if predicate(event):
                    return collected

    # --- runtime-visible reads and fresh sends -------------------------------------

    async def read_history(self, target: str, **fields: Any) -> dict[str, Any]:
        """The ``history`` op; the runtime sees the page, so observed advances to
        ``coversThroughSeq`` of the returned targetKey (and ``latestSeq`` is a hint)."""
        result = await self.client.history(target, **fields)
        target_key = result.get("targetKey")
        if isinstance(target_key, str):
            covers = _seq(result.get("coversThroughSeq"))
            if covers is not None:
                self.frontier.advance(target_key, covers)
            latest = _seq(result.get("latestSeq"))
            if latest is not None:
                self.frontier.hint(target_key, latest)
        return result

    async def send(
        self,
        target: str,
        content: str,
        *,
        target_key: str,
        client_message_id: str | None = None,
        source_message_ids: Sequence[str] = (),
        **fields: Any,
    ) -> dict[str, Any]:
        """A fresh ``send``: ``seenUpToSeq`` is the observed frontier of ``target_key``.

        ``sent`` / ``already_sent`` advance observed to ``acceptedSeq``; ``held``
        records ``latestSeq`` as the refresh hint and leaves observed alone —
        refresh (:meth:`read_history`) before deciding to send again. Returns the
        reply's ``result``; errors raise :class:`ClientError`.
        """
        freshness: dict[str, Any] = {
            "targetKey": target_key,
            "seenUpToSeq": self.frontier.observed(target_key),
        }
        if source_message_ids:
            freshness["sourceMessageIds"] = list(source_message_ids)
        result = await self.client.send(
            target,
            content,
            clientMessageId=client_message_id or f"c-{uuid.uuid4().hex}",
            freshness=freshness,
            **fields,
        )
        self._record_send(result, target_key)
        return result

    async def send_chunked(
        self,
        target: str,
        chunks: Sequence[str],
        *,
        target_key: str,
        client_message_id: str,
        **fields: Any,
    ) -> dict[str, Any]:
        """One logical send written as several rows, client side (seed 002 §3.9).

        Row ``i`` is a fresh send with ``clientMessageId``
        :func:`chunk_client_message_id` ``(client_message_id, i)`` and
        ``seenUpToSeq = max(observed, lastAcceptedSeq)``, where
        ``lastAcceptedSeq`` is the seq of the previous row of this call; the
        first row thus uses the observed frontier. The first row that is held
        ends the call with ``held`` (no row accepted) or ``partial_held``
        (``accepted``, ``heldChunk``, ``latestSeq``, ``needsRefreshUntilSeq``).
        To continue, refresh (:meth:`read_history`) and call again with the same
        ``client_message_id`` and the same ``chunks``: accepted rows replay as
        ``already_sent`` and the held row goes on from the refreshed frontier.
        When every row is accepted the result is ``sent`` (``already_sent`` if
        all were replays) with ``accepted`` and the last row's ``messageId`` /
        ``acceptedSeq``.
        """
        if not chunks:
            raise ValueError("send_chunked needs at least one chunk")
        accepted: list[dict[str, Any]] = []
        last_accepted = 0
        replayed = True
        result: dict[str, Any] = {}
        for index, chunk in enumerate(chunks):
            seen = max(self.frontier.observed(target_key), last_accepted)
            result = await self.client.send(
                target,
                chunk,
                clientMessageId=chunk_client_message_id(client_message_id, index),
                freshness={"targetKey": target_key, "seenUpToSeq": seen},
                **fields,
            )
            self._record_send(result, target_key)
            accepted_seq = _seq(result.get("acceptedSeq"))
            if result.get("state") in _ACCEPTED_STATES and accepted_seq is not None:
                accepted.append({"messageId": result.get("messageId"), "acceptedSeq": accepted_seq})
                last_accepted = max(last_accepted, accepted_seq)
                replayed = replayed and result.get("state") == "already_sent"
                continue
            latest = result.get("latestSeq")
            return {
                "state": "partial_held" if accepted else "held",
                "targetKey": result.get("targetKey", target_key),
                "accepted": accepted,
                "heldChunk": index,
                "latestSeq": latest,
                "needsRefreshUntilSeq": result.get("needsRefreshUntilSeq", latest),
                "clientMessageId": client_message_id,
            }
        return {
            "state": "already_sent" if replayed else "sent",
            "targetKey": result.get("targetKey", target_key),
            "accepted": accepted,
            "messageId": accepted[-1]["messageId"],
            "acceptedSeq": last_accepted,
            "latestSeq": result.get("latestSeq"),
            "clientMessageId": client_message_id,
        }

    # --- internals ------------------------------------------------------------

    def _sort(self, event: dict[str, Any]) -> None:
        """Queue ``event`` for :meth:`next_wake` (a delivery) or :meth:`next_event`."""
        if event.get("type") == "deliver":
            try:
                self._deliveries.append(Delivery.from_event(event))
            except ValueError:
                log.warning("malformed_delivery", event=event)
                self._events.append(event)
            return
        self._events.append(event)

    async def _suppress(self, delivery: Delivery) -> None:
        """Acknowledge and drop a stale delivery, with the log line of §3.6.1."""
        record: dict[str, Any] = {
            "deliveryId": delivery.delivery_id,
            "messageId": delivery.message_id,
            "target": delivery.message.get("scopeId"),
            "targetKey": delivery.target_key,
            "targetSeq": delivery.target_seq,
            "observedSeq": self.frontier.observed(delivery.target_key),
            "latestKnownSeq": self.frontier.latest_known(delivery.target_key),
            "deliveryReason": delivery.reason,
            "reason": "stale",
        }
        try:
            await self.client.request("ack", deliveryId=delivery.delivery_id)
        except ClientError as exc:
            if exc.code != "not_found":
                raise
            record["ack"] = "not_found"  # already consumed (acked elsewhere, pruned)
        self._outstanding.discard(delivery.delivery_id)
        self.suppressed.append(record)
        log.info("delivery_suppressed", **record)

    def _record_send(self, result: Mapping[str, Any], target_key: str) -> None:
        """Fold one send result into the frontier (own accepted seq, refresh hint)."""
        key = result.get("targetKey")
        key = key if isinstance(key, str) else target_key
        state = result.get("state")
        if state in _ACCEPTED_STATES:
            accepted = _seq(result.get("acceptedSeq"))
            if accepted is not None:
                self.frontier.advance(key, accepted)
        elif state == "partial_held":
            for row in result.get("accepted") or ():
                seq = _seq(row.get("acceptedSeq")) if isinstance(row, Mapping) else None
                if seq is not None:
                    self.frontier.advance(key, seq)
        for field_name in ("latestSeq", "needsRefreshUntilSeq"):
            latest = _seq(result.get(field_name))
            if latest is not None:
                self.frontier.hint(key, latest)
        if state in ("held", "partial_held"):
            log.info(
                "send_held",
                state=state,
                targetKey=key,
                clientMessageId=result.get("clientMessageId"),
                seenUpToSeq=result.get("seenUpToSeq"),
                observedSeq=self.frontier.observed(key),
                latestKnownSeq=self.frontier.latest_known(key),
            )


@asynccontextmanager
async def open_daemon(
    url: str,
    token: str,
    *,
    frontier: Frontier | None = None,
    name: str = "scopenode-daemon",
    capabilities: Sequence[str] = DAEMON_CAPABILITIES,
    **kwargs: Any,
) -> AsyncIterator[DaemonClient]:
    """:func:`open_client` as a daemon (``kind="daemon"``, capabilities freshness and ack).

    Pass the runtime's ``frontier`` when reconnecting so that deliveries the
    runtime already covered are suppressed; other keywords go to
    :func:`open_client`.
    """
    async with open_client(
        url, token, kind="daemon", name=name, capabilities=capabilities, **kwargs
    ) as client:
        yield DaemonClient(client, frontier)
