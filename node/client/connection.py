"""One WebSocket session with a node: the protocol, version 1 (``docs/protocol.md``).

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

Agent daemons use :func:`node.client.open_daemon` instead (``daemon.py``), which
wraps this session.
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import msgspec
import trio
import trio_websocket

from node.client import attachments
from node.client.attachments import http_base
from node.client.cards import CardRequests
from node.client.schedules import ScheduleOps
from node.client.tasks import TaskOps
from node.client.workflows import WorkflowOps

__all__ = [
    "Client",
    "ClientError",
    "ConnectionClosed",
    "ProtocolViolation",
    "open_client",
]

# Client-side close codes (RFC 6455): the server broke the protocol; we gave up
# on an event queue nobody reads.
CLOSE_PROTOCOL_ERROR = 1002
# How long a cancelled client's close frame may take to go out.
CANCELLED_CLOSE_S = 0.1
CLOSE_POLICY_VIOLATION = 1008
# One read takes what the socket holds up to this much: the node coalesces a
# burst into large writes, and trio-websocket's 4 KiB default cost a read, an
# epoll round and a parse pass per 4 KiB of it.
RECEIVE_BYTES = 64 * 1024

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


class Client(TaskOps, WorkflowOps, ScheduleOps, CardRequests):
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
        # Set by open_client: where and as whom attachments go over HTTP.
        self.http_url = ""
        self.token = ""

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

    async def service_post(self, service: str, content: str, **fields: Any) -> dict[str, Any]:
        """The ``servicePost`` op: post as ``service`` (its handle), for its managers;
        ``clientMessageId`` defaults to a fresh uuid, ``target`` to its conversation."""
        client_message_id = fields.pop("clientMessageId", f"c-{uuid.uuid4().hex}")
        return await self.request(
            "servicePost",
            service=service,
            content=content,
            clientMessageId=client_message_id,
            **fields,
        )

    async def history(self, target: str, **fields: Any) -> dict[str, Any]:
        """The ``history`` op (``beforeSeq``/``afterSeq``/``aroundSeq``/``limit`` as keywords)."""
        return await self.request("history", target=target, **fields)

    async def search(
        self,
        query: str,
        *,
        scope_id: str | None = None,
        author_id: str | None = None,
        sort: str = "recent",
        limit: int = 20,
        cursor: str | None = None,
        from_member: str | None = None,
        in_scope: str | None = None,
        before: str | None = None,
        after: str | None = None,
        on: str | None = None,
    ) -> dict[str, Any]:
        """One page of the ``search`` op: ``{hits: [{scopeId, message, highlights}],
        nextCursor, hasMore, searched}``; pass ``nextCursor`` back as ``cursor`` for
        the next page. ``from_member`` ("@ann"), ``in_scope`` ("#ops" or "@ann"
        for your DMs with ann) and ``before``/``after``/``on`` ("YYYY-MM-DD",
        UTC) are the query's ``from:``, ``in:`` and date operators as fields;
        ``query`` may be empty when they are given. Raises :class:`ClientError`
        ``search_unavailable`` (retryable) while the workspace's index is being
        built."""
        optional = {
            "scopeId": scope_id,
            "authorId": author_id,
            "cursor": cursor,
            "fromMember": from_member,
            "inScope": in_scope,
            "before": before,
            "after": after,
            "on": on,
        }
        given = {name: value for name, value in optional.items() if value is not None}
        return await self.request("search", query=query, sort=sort, limit=limit, **given)

    async def search_all(
        self, query: str, *, max_hits: int = 1000, **filters: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """Every hit of a query, page by page (at most ``max_hits``): the paging
        loop of :meth:`search` for daemons that want the whole answer."""
        cursor: str | None = None
        yielded = 0
        while yielded < max_hits:
            page = await self.search(query, cursor=cursor, **filters)
            for hit in page["hits"][: max_hits - yielded]:
                yielded += 1
                yield hit
            cursor = page["nextCursor"]
            if not page["hasMore"] or cursor is None:
                return

    async def react(self, message_id: str, emoji: str, op: str = "add") -> dict[str, Any]:
        """The ``react`` op: add (or, with ``op="remove"``, take back) your reaction
        ``emoji`` (one emoji or ``:short_name:``) on a message you can read.
        Returns ``{"changed": bool}``: adding what is already there changes nothing."""
        return await self.request("react", messageId=message_id, emoji=emoji, op=op)

    async def upload(
        self,
        source: bytes | str | os.PathLike[str],
        name: str | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        """Upload bytes or a file (streamed) over HTTP with this session's token:
        ``{"attachmentId", "name", "contentType", "size"}``. Name the id in a
        send's ``attachmentIds`` to attach it; unclaimed uploads go after a day.
        Raises :class:`AttachmentError` (``413`` too large, ``401``, …)."""
        return await attachments.upload(self.http_url, self.token, source, name, content_type)

    async def download(self, attachment_id: str, path: str | os.PathLike[str] | None = None) -> Any:
        """An attachment's bytes, or with ``path`` written there (streamed) and
        its size returned. One this member may not read raises
        :class:`AttachmentError` with status 404, like an unknown id."""
        if path is None:
            return await attachments.download(self.http_url, self.token, attachment_id)
        return await attachments.download_to(self.http_url, self.token, attachment_id, path)

    async def remove(self, scope_id: str, member_id: str) -> dict[str, Any]:
        """The ``remove`` op: end ``member_id``'s membership of the channel ``scope_id``
        (allowed to the channel's owner, and to the owner of a private agent)."""
        return await self.request("remove", scopeId=scope_id, memberId=member_id)

    async def edit(
        self, message_id: str, content: str, revision: int | None = None
    ) -> dict[str, Any]:
        """The ``edit`` op: replace the content of one's own text message.

        Returns ``{messageId, revision, editedAt}``. With ``revision`` (the one
        the caller edited) a newer stored revision raises :class:`ClientError`
        ``conflict``, whose ``details["revision"]`` is the current one.
        """
        fields: dict[str, Any] = {"messageId": message_id, "content": content}
        if revision is not None:
            fields["revision"] = revision
        return await self.request("edit", **fields)

    async def delete(self, message_id: str) -> dict[str, Any]:
        """The ``delete`` op: leave a tombstone in the message's place (its author,
        or the channel's owner). Idempotent."""
        return await self.request("delete", messageId=message_id)

    async def typing(self, scope_id: str) -> bool:
        """The ``typing`` op: tell the scope's readers this member is typing.
        False when the node coalesced it with one sent under 2 s ago."""
        result = await self.request("typing", scopeId=scope_id)
        return bool(result.get("forwarded"))

    async def set_presence(self, idle: bool) -> str:
        """The ``setPresence`` op: this session is idle (or active again); the
        member's presence after it (``online``/``away``)."""
        result = await self.request("setPresence", state="idle" if idle else "active")
        return str(result["state"])

    async def presence(self, member_ids: Sequence[str] | None = None) -> dict[str, str]:
        """The ``presence`` op: member id → ``online``/``away``/``offline`` of
        ``member_ids`` (without them: of everyone this member may see who is
        not offline), whose ``presence`` events this session gets from now on."""
        fields = {} if member_ids is None else {"memberIds": list(member_ids)}
        result = await self.request("presence", **fields)
        return {entry["memberId"]: entry["state"] for entry in result["members"]}

    async def update_profile(
        self,
        display_name: str,
        member_id: str | None = None,
        avatar_color: str | None = None,
    ) -> dict[str, Any]:
        """The ``updateProfile`` op: rename the caller, or with ``member_id`` an agent
        it owns, and set its avatar colour (one of the palette; None keeps it).
        Returns ``{memberId, displayName, avatarColor?}``; members who see it get
        ``memberUpdated``."""
        fields: dict[str, Any] = {"displayName": display_name}
        if member_id is not None:
            fields["memberId"] = member_id
        if avatar_color is not None:
            fields["avatarColor"] = avatar_color
        return await self.request("updateProfile", **fields)

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
                url,
                connect_timeout=connect_timeout,
                max_message_size=max_message_size,
                receive_buffer_size=RECEIVE_BYTES,
            ) as ws,
            _run_client(ws, hello, connect_timeout, max_pending_events, heartbeat) as client,
        ):
            client.http_url = http_base(url)
            client.token = token
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
                # A cancelled caller cancels the readers too: nobody would read
                # the node's answer to the close, so it is not waited for.
                cancelled = trio.current_effective_deadline() == -math.inf
                grace = CANCELLED_CLOSE_S if cancelled else connect_timeout
                with trio.CancelScope(shield=True), trio.move_on_after(grace):
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
