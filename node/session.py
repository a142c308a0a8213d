"""One WebSocket session: hello, request dispatch, events out.

Reads frames in order; a ``send`` is resolved and handed to its scope actor
inline (so sends from one session reach an actor in the order sent), other
requests run as tasks, bounded per session. Everything leaves through the
session's :class:`~node.outbound.Outbound`.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
import trio

from actors.model import Member
from node import ops
from node.limits import Kind
from node.ops import reactions
from node.ops.context import REPLIED
from node.ops.messages import submit_send
from node.outbound import Outbound
from node.services import Services
from node.views import member_view
from protocol.codec import decode_client_frame, encode, encode_error
from protocol.errors import CloseCode, ErrorCode, FrameError, OperationError
from protocol.frames import (
    CAPABILITY_ACK,
    CAPABILITY_FRESHNESS,
    Hello,
    History,
    React,
    Reply,
    Search,
    Send,
    SendResult,
    Welcome,
)
from protocol.frames import (
    Ping as PingFrame,
)
from protocol.frames import (
    Pong as PongFrame,
)
from protocol.presence import SetPresence, Typing
from protocol.wsframes import (
    BINARY,
    CLOSE,
    OP_PONG,
    PING,
    TEXT,
    TOO_LARGE,
    Event,
    InboundFrames,
    close_frame,
    frame,
    parse_close,
)
from storage import directory

log = structlog.get_logger(__name__)
HELD_LIVE_LIMIT = 10_000  # live events held back while a resume is being served
_SUPPORTED_CAPABILITIES = (CAPABILITY_FRESHNESS, CAPABILITY_ACK)
# The expensive reads: they take from the read buckets as well.
_READS = (History, Search)
# After a refusal the session is not read until the refused request's turn,
# at most this long (pings wait too, well within the heartbeat).
REFUSED_PAUSE_S = 1.0


class SessionClosed(Exception):
    pass


class Session:
    __slots__ = (
        "_cancel",
        "_closed",
        "_deadline",
        "_early",
        "_frames",
        "_held_live",
        "_held_wakes",
        "_inflight",
        "_last_received",
        "_muted",
        "_nursery",
        "_refused_until",
        "_replayed",
        "_resuming",
        "_started",
        "capabilities",
        "close_code",
        "credential_id",
        "is_daemon",
        "member",
        "member_id",
        "outbound",
        "services",
        "session_id",
        "settings",
        "stream",
        "workspace_param",
    )

    def __init__(
        self,
        services: Services,
        stream: trio.SocketStream,
        received: bytes = b"",
        *,
        workspace_param: str | None,
        session_id: str,
    ) -> None:
        """``received``: bytes that arrived after the upgrade request's head."""
        self.services = services
        self.settings = services.settings
        self.stream = stream
        self._frames = InboundFrames(self.settings.max_frame_bytes)
        self._early = received
        self.workspace_param = workspace_param
        self.session_id = session_id
        self.member: Member | None = None
        self.member_id = ""
        self.is_daemon = False
        self.capabilities: frozenset[str] = frozenset()
        self.outbound = Outbound(
            stream,
            cap_bytes=self.settings.outbound_cap_bytes,
            grace=self.settings.slow_consumer_grace,
            on_overflow=self._overflow,
            spawn_writer=self._spawn_writer,
            on_done=self._outbound_done,
        )
        self._last_received = trio.current_time()
        self._resuming: dict[str, int] | None = None
        self._held_live: list[tuple[str, int, bytes]] = []
        # Per resumed scope, the seq the client holds everything through (what
        # it resumed from, or the last seq the replay sent): a live event the
        # relay brings later (another node's message, caught up after a
        # failover) at or below it is one the client has already.
        self._replayed: dict[str, int] | None = None
        # Live wakes that arrive while pending ones are being replayed (None
        # otherwise): the replay goes first, so a daemon never takes a newer
        # wake before an older one and drops the older as already covered.
        self._held_wakes: list[tuple[str, bytes]] | None = None
        self._inflight = trio.Semaphore(self.settings.max_inflight_requests)
        self._cancel = trio.CancelScope()
        self._closed = trio.Event()
        self._started = trio.current_time()
        self._deadline: float | None = None
        self.close_code: int | None = None
        self.credential_id: int | None = None
        self._muted: set[str] | None = None  # scopes whose events this member lost
        self._refused_until = 0.0

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        with self._cancel:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._read_loop()
                finally:
                    if self.member is not None:
                        self.services.hub.discard(self)
                        self.services.presence.closed(self)
                self.close(CloseCode.NORMAL, "bye")
                with trio.move_on_after(2):
                    await self._closed.wait()
                nursery.cancel_scope.cancel()

    def _spawn_writer(self) -> None:
        self._nursery.start_soon(self.outbound.write_queued)

    def _outbound_done(self) -> None:
        """The close frame went out, or the peer is gone: end the session."""
        self._closed.set()
        self._cancel.cancel()

    def close(self, code: int, reason: str, *, discard: bool = False) -> None:
        if self.close_code is not None:
            # One close frame per connection; a later close only moves the deadline.
            self.outbound.close(b"", discard=discard)
            return
        self.close_code = code
        self.services.metrics.sessions_closed[code] += 1
        self.outbound.close(close_frame(code, reason), discard=discard)

    def _overflow(self) -> None:
        if self.close_code is not None:
            return
        log.info("slow_consumer_closed", queued=self.outbound.queued_bytes)
        self.close(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect and resume", discard=True)
        # A peer that reads nothing will not take the close frame either.
        self._deadline = trio.current_time() + 1.0

    def check(self, now: float) -> None:
        """Periodic checks, run by the node's sweeper (no task per session)."""
        if self._deadline is not None and now > self._deadline:
            self._cancel.cancel()
            return
        if self.close_code is not None:
            return
        if self.member is None and now - self._started > self.settings.hello_timeout:
            self.close(CloseCode.UNAUTHENTICATED, "no hello")
        elif now - self._last_received > 3 * self.settings.heartbeat_ms / 1000:
            self.close(CloseCode.HEARTBEAT_TIMEOUT, "heartbeat timeout")
            self._deadline = now + 2.0
        elif self.outbound.overdue(now):
            self._overflow()
        elif self.member is not None:
            self.services.presence.check(self, now)

    # ------------------------------------------------------------ inbound

    @property
    def inbound_buffered(self) -> int:
        """Bytes of incomplete client messages held by this session."""
        return self._frames.buffered

    async def _read_loop(self) -> None:
        data, self._early = self._early, b""
        frames = self._frames
        while self.close_code is None:
            if data and not await self._handle_events(frames.feed(data)):
                return
            if self._refused_until:
                # A client that asks again at once costs the node a refusal per
                # pause, not one per round trip.
                await trio.sleep_until(self._refused_until)
                self._refused_until = 0.0
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            # Any bytes count as life, not only whole frames: a large message
            # arriving slowly keeps the heartbeat alive too.
            self._last_received = trio.current_time()

    async def _handle_events(self, events: list[Event]) -> bool:
        """Handle parsed WebSocket events; False once the session is closing."""
        for kind, payload in events:
            if kind == TEXT:
                await self._on_text(payload)
            elif kind == PING:
                self.outbound.push_frame(frame(payload, OP_PONG))
            elif kind == TOO_LARGE:
                self.services.metrics.frames_in += 1
                self._error(
                    None, ErrorCode.PAYLOAD_TOO_LARGE, "frame exceeds the node's size limit"
                )
            elif kind == BINARY:
                self._error(None, ErrorCode.BAD_FRAME, "binary frames are not accepted")
            elif kind == CLOSE:
                if self.close_code is None:
                    self.close(parse_close(payload)[0], "peer closed")
                return False
            if self.close_code is not None:
                return False
        if (failed := self._frames.failed) is not None:
            self.close(*failed)
            return False
        return True

    async def _on_text(self, payload: bytes) -> None:
        self.services.metrics.frames_in += 1
        try:
            # Straight from the unmasked bytes: the parser already checked UTF-8.
            request = decode_client_frame(payload)
        except FrameError as exc:
            if self.member is None:
                self.close(CloseCode.UNAUTHENTICATED, "first frame must be hello")
                return
            self._error(exc.request_id, exc.code, exc.message, exc.details)
            return
        if self.member is None:
            if not isinstance(request, Hello):
                self.close(CloseCode.UNAUTHENTICATED, "first frame must be hello")
                return
            await self._hello(request)
            return
        await self._dispatch(request)

    async def _dispatch(self, request: Any) -> None:
        if isinstance(request, PingFrame):
            self.push(encode(PongFrame(id=request.id)))
        elif isinstance(request, PongFrame):
            pass
        elif not isinstance(request, SetPresence) and self._touched(request):
            return  # a coalesced typing, answered
        elif isinstance(request, Send):
            if self._admitted(request.id, Kind.SEND):
                await self._send(request)
        elif not self._admitted(
            request.id, Kind.READ if isinstance(request, _READS) else Kind.REQUEST
        ):
            return  # answered rate_limited
        elif isinstance(request, Hello):
            self._error(None, ErrorCode.VALIDATION_FAILED, "hello was already received")
        else:
            await self._inflight.acquire()
            if not (isinstance(request, React) and self._react_at_once(request)):
                self._nursery.start_soon(self._request, request)

    def _touched(self, request: Any) -> bool:
        """A request is activity (docs/presence.md); True when it was a
        ``typing`` answered here as coalesced, free of the rate limits."""
        now = self._last_received  # when the request's bytes arrived
        presence = self.services.presence
        presence.touched(self, now)
        if isinstance(request, Typing) and presence.typing_coalesced(
            self.member_id, request.scope_id, now
        ):
            self.reply(request.id, "typing", {"forwarded": False})
            return True
        return False

    def _react_at_once(self, request: React) -> bool:
        """A reaction on a message of a known scope with a running actor is
        queued from here: a task per reaction (its start, and its wake-up after
        the actor answered) is work the reaction does not need. The actor's
        answer frees the in-flight slot."""

        def finished(error: Exception | None) -> None:
            if error is not None:
                self._failed(request, error)
            self._inflight.release()

        try:
            return reactions.submit_remembered(self, request, finished)
        except Exception as exc:
            finished(exc)
        return True

    def _failed(self, request: Any, exc: Exception) -> None:
        """A request's ``error``: the refusal it raised, or ``internal`` (logged)."""
        if isinstance(exc, OperationError):
            self._error(request.id, exc.code, exc.message, exc.details)
        else:
            log.exception("request_failed", op=request.__struct_config__.tag, error=repr(exc))
            self._error(request.id, ErrorCode.INTERNAL, "internal error")

    def _admitted(self, request_id: int | str, kind: Kind) -> bool:
        """Take the request's tokens from its member's and workspace's buckets,
        shared with the member's other sessions; else answer ``rate_limited``."""
        member = self.member
        assert member is not None
        now = trio.current_time()
        refusal = self.services.limiter.admit(kind, member.id, member.workspace_id, now)
        if refusal is None:
            return True
        self._refused_until = now + min(refusal.wait, REFUSED_PAUSE_S)
        exc = refusal.error()
        self._error(request_id, exc.code, exc.message, exc.details)
        return False

    async def _request(self, request: Any) -> None:
        try:
            if isinstance(request, _READS):
                now = trio.current_time()
                async with self.services.limiter.reading(self.member_id, now):
                    result = await ops.handle(self, request)
            else:
                result = await ops.handle(self, request)
        except Exception as exc:
            self._failed(request, exc)
        else:
            if result is not REPLIED:
                self.reply(request.id, str(request.__struct_config__.tag), result)
        finally:
            self._inflight.release()

    # ------------------------------------------------------------ hello

    async def _hello(self, hello: Hello) -> None:
        async with self.services.pool.connection() as conn:
            found = await directory.authenticate_credential(conn, hello.token)
        if found is None:
            self.close(CloseCode.UNAUTHENTICATED, "bad token")
            return
        member, credential_id, admin = found
        if self.workspace_param and self.workspace_param != member.workspace_id:
            self.close(CloseCode.FORBIDDEN_WORKSPACE, "token not valid for this workspace")
            return
        hub = self.services.hub
        # Checked and registered with no await in between, so concurrent
        # hellos of one member cannot both pass the cap.
        cap = self.settings.max_sessions_per_member
        if len(hub.sessions_of(member.id)) >= cap:
            log.info("session_cap_reached", cap=cap)
            self._error(
                None,
                ErrorCode.RATE_LIMITED,
                "too many sessions for this member",
                {"maxSessions": cap},
            )
            self.close(CloseCode.SLOW_CONSUMER, "too many sessions")
            return
        self.member = member
        self.member_id = member.id
        if not hub.add(self, credential_id):
            self.member, self.member_id = None, ""
            self.close(CloseCode.UNAUTHENTICATED, "token revoked")
            return
        self.credential_id = credential_id
        self.is_daemon = hello.client.kind == "daemon"
        replays = self.is_daemon and member.type.value == "agent"
        if replays:
            self._held_wakes = []
        self.capabilities = frozenset(hello.capabilities) & set(_SUPPORTED_CAPABILITIES)
        structlog.contextvars.bind_contextvars(member_id=member.id)
        self._resuming = dict(hello.resume) if hello.resume else None
        self.push(
            encode(
                Welcome(
                    protocol=1,
                    session_id=self.session_id,
                    node_id=self.services.node_id,
                    workspace_id=member.workspace_id,
                    member=member_view(member),
                    heartbeat_ms=self.settings.heartbeat_ms,
                    capabilities=sorted(self.capabilities),
                    admin=admin,
                )
            )
        )
        self.services.presence.opened(self, trio.current_time())
        if self._resuming is not None:
            await self._inflight.acquire()
            self._nursery.start_soon(self._resume, self._resuming)
        if replays:
            # Inline, before any later request is read: every redelivered
            # `deliver` precedes the replies to what the daemon asks next.
            replayed: set[str] = set()
            try:
                replayed = await ops.redeliver(self)
            except Exception as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                log.warning("redeliver_failed", error=repr(exc))
            finally:
                held, self._held_wakes = self._held_wakes or [], None
                for wake_id, framed in held:
                    if wake_id not in replayed:
                        self.outbound.push_frame(framed)

    async def _resume(self, resume: dict[str, int]) -> None:
        try:
            sent = await ops.resume(self, resume)
        except Exception as exc:
            log.warning("resume_failed", error=repr(exc))
            sent = {}
        finally:
            self._inflight.release()
        held, self._held_live = self._held_live, []
        self._resuming = None
        self._replayed = dict(sent) or None
        for scope_id, seq, framed in held:
            if seq > sent.get(scope_id, -1):
                self.outbound.push_frame(framed)

    # ------------------------------------------------------------ sends

    async def _send(self, request: Send) -> None:
        member = self.member
        assert member is not None
        taken = time.perf_counter()
        try:
            await submit_send(
                self.services,
                member,
                request,
                self.capabilities,
                lambda result: self._send_reply(request.id, result, taken),
            )
        except OperationError as exc:
            self._error(request.id, exc.code, exc.message, exc.details)

    def _send_reply(
        self, request_id: int | str, result: SendResult | OperationError, taken: float
    ) -> None:
        if isinstance(result, OperationError):
            self._error(request_id, result.code, result.message, result.details)
        else:
            self.services.hub.hold_reply(self.outbound)
            self.push(encode(Reply(id=request_id, op="send", result=result)))
            self.services.metrics.send_reply.observe(time.perf_counter() - taken)

    # ------------------------------------------------------------ outbound

    def push(self, payload: bytes) -> None:
        self.outbound.push(payload)

    def release_held(self) -> None:
        """Write what a held reply kept back (see Hub.hold_reply)."""
        self.outbound.release()

    def deliver_events(self, scope_id: str, events: list[tuple[int, bytes]]) -> None:
        """Framed ``message`` events (seq, bytes) of one scope, sent as one write."""
        if self._muted is not None and scope_id in self._muted:
            return
        if self._replayed is not None and (upto := self._replayed.get(scope_id)) is not None:
            events = [event for event in events if event[0] > upto]
            if not events:
                return
        if self._resuming is not None and scope_id in self._resuming:
            self._held_live.extend((scope_id, seq, framed) for seq, framed in events)
            if len(self._held_live) > HELD_LIVE_LIMIT:
                self._overflow()  # the client resumes again from what it has
            return
        if len(events) == 1:
            self.outbound.push_frame(events[0][1])
        else:
            self.outbound.push_frame(b"".join(framed for _, framed in events))

    def push_frame(self, framed: bytes) -> None:
        self.outbound.push_frame(framed)

    def push_wake(self, delivery_id: str, framed: bytes) -> None:
        """A framed ``deliver``: held while the session replays pending ones."""
        if self._held_wakes is not None:
            self._held_wakes.append((delivery_id, framed))
        else:
            self.outbound.push_frame(framed)

    def profile_changed(self, member: Member) -> None:
        """The member was renamed: what this session sends next carries the new name."""
        if self.member is not None and self.member.id == member.id:
            self.member = member

    def mute_scope(self, scope_id: str, muted: bool) -> None:
        """Drop (or again accept) the scope's events; see ``Hub.stop_scope_events``."""
        if muted:
            if self._muted is None:
                self._muted = set()
            self._muted.add(scope_id)
            if self._held_live:
                self._held_live = [held for held in self._held_live if held[0] != scope_id]
        elif self._muted is not None:
            self._muted.discard(scope_id)
            if not self._muted:
                self._muted = None

    def is_muted(self, scope_id: str) -> bool:
        return self._muted is not None and scope_id in self._muted

    def reply(self, request_id: int | str, op: str, result: Any) -> None:
        self.push(encode(Reply(id=request_id, op=op, result=result)))

    def _error(
        self,
        request_id: int | str | None,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.services.metrics.errors[code.value] += 1
        self.push(encode_error(request_id, code, message, details))
