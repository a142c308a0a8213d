"""A minimal protocol-v1 session for load generation (``bench/leanws.py``).

Deliberately independent of the node's own client library so the bench can
drive any conformant node. One receive task per session routes ``reply`` and
``error`` frames to the waiting request by ``id`` and hands every other event
to ``on_event`` (which must not block).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import msgspec
import trio

from bench import leanws

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
# What a request waits for; with no event handler nothing else is decoded (the
# load generator's CPU stands for clients on other machines, and events are
# most of what it reads). A line of another shape is decoded anyway.
_ANSWERS = ('{"type":"reply"', '{"type":"error"', '{"type":"pong"')
_TYPED = '{"type":"'


def worth_decoding(line: str, listening: bool) -> bool:
    """Whether a received line is decoded (see ``_ANSWERS``)."""
    return bool(line) and (listening or line.startswith(_ANSWERS) or not line.startswith(_TYPED))


EventHandler = Callable[[dict[str, Any]], None]


class RequestError(Exception):
    """The node answered a request with an ``error`` frame."""

    def __init__(self, frame: dict[str, Any]) -> None:
        self.code = str(frame.get("code"))
        self.retryable = bool(frame.get("retryable"))
        self.frame = frame
        super().__init__(f"{self.code}: {frame.get('message')}")


class SessionClosed(Exception):
    """The WebSocket closed; ``code`` is the close code when known."""

    def __init__(self, code: int | None, reason: str | None = None) -> None:
        self.code = code
        super().__init__(f"session closed ({code}: {reason})")


def ws_url(base: str, workspace_id: str) -> str:
    """``ws://HOST:PORT`` + the protocol's endpoint for ``workspace_id``."""
    return f"{base.rstrip('/')}/v1/ws?workspace={workspace_id}"


class Session:
    """An authenticated session; use :func:`open_session`."""

    def __init__(self, ws: leanws.LeanWebSocket, on_event: EventHandler | None) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, list[Any]] = {}
        self._on_event = on_event
        self.welcome: dict[str, Any] = {}
        self.closed: SessionClosed | None = None

    @property
    def member_id(self) -> str:
        return str(self.welcome.get("member", {}).get("id", ""))

    async def send_raw(self, frame: dict[str, Any]) -> None:
        await self._ws.send_message(_encode(frame))

    async def request(
        self, op: str, /, timeout: float | None = 30.0, **fields: Any
    ) -> dict[str, Any]:
        """Send ``{"type": op, "id": …, **fields}``; return ``reply.result``.

        ``op`` is positional-only because ``react`` has a field named ``op``.
        Raises RequestError for an ``error`` reply, SessionClosed when the
        session ends first, trio.TooSlowError after ``timeout`` seconds
        (``None``: the caller bounds the time, e.g. a load loop's own
        deadline, which spares each request a cancel scope).
        """
        frame = await self._answer({"type": op, "id": next(self._ids), **fields}, timeout)
        if frame.get("type") == "error":
            raise RequestError(frame)
        result: dict[str, Any] = frame.get("result") or {}
        return result

    async def ping(self) -> None:
        """One heartbeat round trip: ``ping`` until its ``pong``."""
        await self._answer({"type": "ping", "id": next(self._ids)}, None)

    async def _answer(self, frame: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send ``frame``; return the frame answering its ``id``."""
        rid = frame["id"]
        done = trio.Event()
        slot: list[Any] = [done]
        self._waiting[rid] = slot
        try:
            with trio.fail_after(timeout) if timeout is not None else nullcontext():
                await self.send_raw(frame)
                await done.wait()
        finally:
            self._waiting.pop(rid, None)
        answer: dict[str, Any] = slot[1]
        if answer.get("type") == "__closed__":
            raise self.closed or SessionClosed(None)
        return answer

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind in ("reply", "error", "pong"):
            slot = self._waiting.get(frame.get("id"))  # type: ignore[arg-type]
            if slot is not None and len(slot) == 1:
                slot.append(frame)
                slot[0].set()
                return
        if self._on_event is not None:
            self._on_event(frame)

    async def _receive_loop(self) -> None:
        try:
            while True:
                text = await self._ws.get_message()
                listening = self._on_event is not None
                for line in text.split("\n"):
                    if worth_decoding(line, listening):
                        self._dispatch(_decode(line))
        except leanws.Closed as e:
            self.closed = SessionClosed(e.code, e.reason)
        finally:
            for slot in list(self._waiting.values()):
                if len(slot) == 1:
                    slot.append({"type": "__closed__"})
                    slot[0].set()

    async def aclose(self) -> None:
        await self._ws.aclose()


@asynccontextmanager
async def open_session(
    url: str,
    token: str,
    *,
    kind: str = "daemon",
    capabilities: list[str] | None = None,
    resume: dict[str, int] | None = None,
    on_event: EventHandler | None = None,
    connect_timeout: float = 30.0,
) -> AsyncIterator[Session]:
    """Connect, send ``hello``, wait for ``welcome``; yields a Session.

    ``url`` is the full endpoint (see :func:`ws_url`). Events that arrive
    after ``welcome`` (``resumed``, ``message``, …) go to ``on_event``.
    """
    ws = await leanws.connect(url, connect_timeout)
    try:
        session = Session(ws, on_event)
        hello: dict[str, Any] = {
            "type": "hello",
            "token": token,
            "client": {"kind": kind, "name": "scopenode-bench", "version": "1"},
        }
        if capabilities:
            hello["capabilities"] = capabilities
        if resume is not None:
            hello["resume"] = resume
        with trio.fail_after(connect_timeout):
            await session.send_raw(hello)
            try:
                text = await ws.get_message()
            except leanws.Closed as e:
                raise SessionClosed(e.code, e.reason) from e
            lines = [line for line in text.split("\n") if line]
            session.welcome = _decode(lines[0])
            if session.welcome.get("type") != "welcome":
                raise SessionClosed(None, f"expected welcome, got {lines[0][:200]}")
        async with trio.open_nursery() as nursery:
            for line in lines[1:]:
                session._dispatch(_decode(line))
            nursery.start_soon(session._receive_loop)
            try:
                yield session
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await ws.aclose()


def now_ns() -> int:
    """Send timestamps (CLOCK_MONOTONIC, shared with reader processes)."""
    return time.monotonic_ns()
