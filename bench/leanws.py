"""A lean WebSocket client transport for the bench's sessions.

The load generator shares the machine's cores with the node and its
database, so every microsecond it spends per message is taken from what it
measures. trio-websocket runs each message through wsproto (pure-Python
parsing and unmasking), a reader task and a memory channel; this transport
reads straight from the socket and frames with :mod:`protocol.wsframes`
(server→client headers walked by ``frame_at``, outgoing frames masked in C
by ``client_frame``, as the node unmasks). It speaks what the bench needs:
text messages (fragmented or not), ping → pong, close.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections import deque

import trio

from bench.wsframes import parse_upgrade_response, upgrade_request
from protocol.wsframes import (
    ABNORMAL,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    WebSocketError,
    client_frame,
    close_payload,
    frame_at,
    parse_close,
)

_READ = 65536


class Closed(Exception):
    """The connection ended; ``code`` is the peer's close code when it sent one."""

    def __init__(self, code: int | None, reason: str | None = None) -> None:
        self.code = code
        self.reason = reason
        super().__init__(f"closed ({code}: {reason})")


class LeanWebSocket:
    """``send_message`` / ``get_message`` / ``aclose`` over one trio stream."""

    def __init__(self, stream: trio.SocketStream, pending: bytes) -> None:
        self._stream = stream
        self._buf = bytearray(pending)
        self._messages: deque[str] = deque()
        self._fragments: list[bytes] = []
        self._send_lock = trio.Lock()
        self._control: list[bytes] = []
        self.closed: Closed | None = None

    async def send_message(self, message: str | bytes) -> None:
        payload = message.encode() if isinstance(message, str) else message
        await self._send(client_frame(payload))

    async def get_message(self) -> str:
        while not self._messages:
            if self.closed is not None:
                raise self.closed
            data = await self._stream.receive_some(_READ)
            if not data:
                self.closed = Closed(ABNORMAL, "connection lost")
                raise self.closed
            self._buf += data
            self._parse()
            for frame in self._control:
                await self._send(frame)
            self._control.clear()
        return self._messages.popleft()

    async def aclose(self, code: int = 1000) -> None:
        if self.closed is None:
            self.closed = Closed(code, "closed by the client")
            with contextlib.suppress(Closed):  # the peer may be gone already
                await self._send(client_frame(close_payload(code), OP_CLOSE))
        await self._stream.aclose()

    async def _send(self, data: bytes) -> None:
        try:
            async with self._send_lock:
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.closed = self.closed or Closed(ABNORMAL, "connection lost")
            raise self.closed from exc

    def _parse(self) -> None:
        buf = self._buf
        pos = 0
        while (found := frame_at(buf, pos)) is not None:
            opcode, fin, start, end = found
            self._frame(opcode, fin, bytes(buf[start:end]))
            pos = end
        if pos:
            del buf[:pos]

    def _frame(self, opcode: int, fin: int, payload: bytes) -> None:
        if opcode in (OP_TEXT, OP_CONT):
            if fin and not self._fragments:
                self._messages.append(payload.decode())
            else:
                self._fragments.append(payload)
                if fin:
                    self._messages.append(b"".join(self._fragments).decode())
                    self._fragments.clear()
        elif opcode == OP_PING:
            self._control.append(client_frame(payload, OP_PONG))
        elif opcode == OP_CLOSE:
            self.closed = Closed(*parse_close(payload))
        elif opcode != OP_PONG:
            raise WebSocketError(f"unexpected opcode {opcode:#x}")


async def connect(url: str, timeout: float) -> LeanWebSocket:
    """Open ``ws://host:port/path?query`` and complete the upgrade."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "ws" or parts.hostname is None:
        raise ValueError(f"only ws:// URLs: {url}")
    port = parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(parts.hostname, port)
        try:
            await stream.send_all(upgrade_request(parts.hostname, port, path))
            buf = bytearray()
            while (head := parse_upgrade_response(buf)) is None:
                data = await stream.receive_some(_READ)
                if not data:
                    raise Closed(ABNORMAL, "closed during the upgrade")
                buf += data
        except BaseException:
            await stream.aclose()
            raise
    return LeanWebSocket(stream, bytes(buf[head:]))
