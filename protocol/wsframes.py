"""WebSocket framing (RFC 6455 §5), both directions, without I/O.

Every frame the node and its Python clients exchange is built and parsed
here; the handshake is wsproto's (node) or trio-websocket's (client library).
Extensions are never negotiated, so reserved bits are always zero.

* Server → client frames are final and unmasked (§5.1), so the bytes of a
  frame are the same for every connection: a broadcast is framed once
  (:func:`frame`, :func:`close_frame`). :func:`frame_at` walks such a stream
  for the bench's readers and lean client, header by header.
* Client → server frames are masked with a fresh random key (§5.3), the
  payload XORed in one C call (``websockets.speedups.apply_mask``):
  :func:`client_frame`. :class:`InboundFrames` is the node's parser of that
  stream: headers are read with a few integer operations, the payload is
  unmasked by the same C call, and an unfragmented ASCII text message reaches
  the JSON decoder as the unmasked ``bytes`` with no further copy (wsproto
  parses every frame through generators and unmasks in Python; on the send
  path that was the largest share of the session's own CPU).

Violations by a client are answered as the RFC says:
:attr:`InboundFrames.failed` holds the close code (1002 protocol error,
1007 invalid UTF-8) and parsing stops. A message over ``max_message`` bytes
is never buffered: its payload is skipped as it arrives and the parser
reports :data:`TOO_LARGE` once it ends, so the session can answer
``payload_too_large`` and stay open.
"""

from __future__ import annotations

import codecs
import os
import struct
from collections.abc import Callable
from typing import Final

try:
    from websockets.speedups import apply_mask
except ImportError:  # a platform without the wheel's C extension
    from websockets.utils import apply_mask

OP_CONT: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA

# Close codes of the framing itself (§7.4.1); the application's are protocol.errors.CloseCode.
PROTOCOL_ERROR: Final = 1002
NO_STATUS: Final = 1005
ABNORMAL: Final = 1006
INVALID_DATA: Final = 1007

# A control frame's payload is at most 125 bytes: a close code and 123 of reason.
MAX_CLOSE_REASON: Final = 123

_H16 = struct.Struct("!BBH").pack
_H64 = struct.Struct("!BBQ").pack


class WebSocketError(Exception):
    """A server's bytes are not a valid WebSocket upgrade or server→client frame stream."""


# Encoding


def frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    """One final, unmasked server→client frame (the node frames every payload here)."""
    head = 0x80 | opcode
    size = len(payload)
    if size < 126:
        return bytes((head, size)) + payload
    if size < 65536:
        return _H16(head, 126, size) + payload
    return _H64(head, 127, size) + payload


def client_frame(
    payload: bytes, opcode: int = OP_TEXT, *, fin: bool = True, key: bytes | None = None
) -> bytes:
    """One client→server frame, masked with ``key`` (a fresh random one by default)."""
    head = (0x80 if fin else 0) | opcode
    size = len(payload)
    if size < 126:
        header = bytes((head, 0x80 | size))
    elif size < 65536:
        header = _H16(head, 0x80 | 126, size)
    else:
        header = _H64(head, 0x80 | 127, size)
    if key is None:
        key = os.urandom(4)
    return header + key + apply_mask(payload, key)


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload; 1005 (no status received) is sent as an empty one."""
    if code == NO_STATUS:
        return b""
    # Cut at a character boundary: a close reason must stay valid UTF-8.
    body = reason.encode()[:MAX_CLOSE_REASON].decode(errors="ignore").encode()
    return code.to_bytes(2, "big") + body


def close_frame(code: int, reason: str) -> bytes:
    """The server's close frame."""
    return frame(close_payload(code, reason), OP_CLOSE)


# Close payloads


def close_code_valid(code: int) -> bool:
    """Whether a peer may send ``code`` in a close frame (RFC 6455 §7.4)."""
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def parse_close(payload: bytes | bytearray) -> tuple[int, str]:
    """(code, reason) of a close payload; 1005 when it carried no code.

    A reason that is not UTF-8 is decoded with replacement characters (the
    node validates first and fails such a close with 1007).
    """
    if len(payload) < 2:
        return NO_STATUS, ""
    return int.from_bytes(payload[:2], "big"), payload[2:].decode(errors="replace")


# Server → client parsing


def frame_at(buf: bytes | bytearray, pos: int) -> tuple[int, int, int, int] | None:
    """The server→client frame starting at ``pos``: (opcode, fin, payload start,
    payload end), ``fin`` 1 for a final frame; None while it is incomplete.

    Raises WebSocketError for a masked frame (servers never mask, RFC 6455 §5.1)
    or an opcode RFC 6455 does not define.
    """
    n = len(buf)
    if n - pos < 2:
        return None
    b0 = buf[pos]
    b1 = buf[pos + 1]
    if b1 & 0x80:
        raise WebSocketError("masked frame from server")
    opcode = b0 & 0x0F
    if OP_BINARY < opcode < OP_CLOSE or opcode > OP_PONG:
        raise WebSocketError(f"unknown opcode {opcode:#x}")
    length = b1 & 0x7F
    start = pos + 2
    if length == 126:
        if n - pos < 4:
            return None
        length = (buf[pos + 2] << 8) | buf[pos + 3]
        start = pos + 4
    elif length == 127:
        if n - pos < 10:
            return None
        length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
        start = pos + 10
    end = start + length
    return None if end > n else (opcode, b0 >> 7, start, end)


# Client → server parsing (the node's inbound stream)

# Event kinds of InboundFrames (the data and control opcodes double as kinds).
TEXT: Final = OP_TEXT
BINARY: Final = OP_BINARY
CLOSE: Final = OP_CLOSE
PING: Final = OP_PING
TOO_LARGE: Final = -1

_NONE: Final = -2  # no message in progress

Event = tuple[int, bytes]
Unmask = Callable[[bytes | bytearray, bytes | bytearray], bytes]


class InboundFrames:
    """Sans-IO parser of the client-to-server frame stream of one session.

    :meth:`feed` takes bytes as read from the socket and returns the complete
    events in order: ``(TEXT, payload)`` (whole message, valid UTF-8),
    ``(BINARY, b"")`` once a binary message ends (its payload is not kept),
    ``(TOO_LARGE, b"")`` once an oversized message ends, ``(PING, payload)``
    and ``(CLOSE, payload)`` (validated; see :func:`parse_close`). Pongs are
    consumed. After a close or a failure, further bytes are ignored.
    """

    __slots__ = (
        "_buf",
        "_discard",
        "_msg",
        "_parts",
        "_size",
        "_skip",
        "_skip_fin",
        "_unmask",
        "_utf8",
        "closed",
        "failed",
        "max_message",
    )

    def __init__(self, max_message: int, unmask: Unmask = apply_mask) -> None:
        self.max_message = max_message
        self._unmask = unmask
        self._buf = bytearray()
        self._msg = _NONE  # opcode of the message in progress
        self._parts: list[bytes] = []
        self._size = 0
        self._discard = False
        self._utf8: codecs.IncrementalDecoder | None = None
        self._skip = 0  # payload bytes of a discarded frame still to come
        self._skip_fin = False
        self.closed = False
        self.failed: tuple[int, str] | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame (never an oversized frame's payload)."""
        return len(self._buf) + sum(map(len, self._parts))

    def _fail(self, code: int, reason: str) -> None:
        self.failed = (code, reason)
        self._buf = bytearray()
        self._parts = []

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self.closed or self.failed is not None:
            return events
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        n = len(buf)
        pos = 0
        unmask = self._unmask
        if self._skip:
            pos = min(self._skip, n)
            self._skip -= pos
            if not self._skip and self._skip_fin:
                self._end_discarded(events)
        while n - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            if not b1 & 0x80:
                self._fail(PROTOCOL_ERROR, "client frames must be masked")
                return events
            if b0 & 0x70:
                self._fail(PROTOCOL_ERROR, "reserved bits set without an extension")
                return events
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            length = b1 & 0x7F
            if length < 126:
                head = pos + 6
                if n < head:
                    break
            elif length == 126:
                head = pos + 8
                if n < head:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
            else:
                head = pos + 14
                if n < head:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                if length >> 63:
                    self._fail(PROTOCOL_ERROR, "frame length has its high bit set")
                    return events
            if opcode >= 0x8:
                if opcode > OP_PONG or opcode == 0xB or not fin or length > 125:
                    self._fail(PROTOCOL_ERROR, _control_error(opcode, fin, length))
                    return events
            elif opcode == OP_CONT:
                if self._msg == _NONE:
                    self._fail(PROTOCOL_ERROR, "continuation frame without a message")
                    return events
            elif opcode > BINARY:
                self._fail(PROTOCOL_ERROR, f"reserved opcode {opcode:#x}")
                return events
            elif self._msg != _NONE:
                self._fail(PROTOCOL_ERROR, "new message before the previous one ended")
                return events
            end = head + length
            if opcode < 0x8 and (
                self._discard
                or (opcode if opcode else self._msg) == BINARY
                or self._size + length > self.max_message
            ):
                # Skipped as it arrives: an absurd declared length costs no memory.
                if opcode:
                    self._msg = opcode
                self._discard = True
                self._parts = []
                self._utf8 = None
                if end > n:
                    self._skip = end - n
                    self._skip_fin = bool(fin)
                    pos = n
                    break
                pos = end
                if fin:
                    self._end_discarded(events)
                continue
            if end > n:
                break
            payload = unmask(buf[head:end], buf[head - 4 : head]) if length else b""
            pos = end
            if opcode == TEXT and fin:
                if not payload.isascii():
                    try:
                        payload.decode("utf-8")
                    except UnicodeDecodeError:
                        self._fail(INVALID_DATA, "text is not valid UTF-8")
                        return events
                events.append((TEXT, payload))
            elif opcode < 0x8:
                if opcode:
                    self._msg = opcode
                    self._utf8 = codecs.getincrementaldecoder("utf-8")()
                self._size += length
                self._parts.append(payload)
                utf8 = self._utf8
                assert utf8 is not None
                try:
                    # Fails fast, mid-message, as soon as a fragment cannot be UTF-8.
                    utf8.decode(payload, bool(fin))
                except UnicodeDecodeError:
                    self._fail(INVALID_DATA, "text is not valid UTF-8")
                    return events
                if fin:
                    events.append((TEXT, b"".join(self._parts)))
                    self._reset_message()
            elif opcode == PING:
                events.append((PING, payload))
            elif opcode == CLOSE:
                if failure := _close_error(payload):
                    self._fail(*failure)
                    return events
                self.closed = True
                self._buf = bytearray()
                events.append((CLOSE, payload))
                return events
        if pos < n:
            if buf is self._buf:
                del self._buf[:pos]
            else:
                self._buf = bytearray(buf[pos:])
        elif self._buf:
            self._buf = bytearray()
        return events

    def _end_discarded(self, events: list[Event]) -> None:
        events.append((BINARY if self._msg == BINARY else TOO_LARGE, b""))
        self._reset_message()

    def _reset_message(self) -> None:
        self._msg = _NONE
        self._parts = []
        self._size = 0
        self._discard = False
        self._utf8 = None
        self._skip_fin = False


def _control_error(opcode: int, fin: int, length: int) -> str:
    if opcode > OP_PONG or opcode == 0xB:
        return f"reserved opcode {opcode:#x}"
    if not fin:
        return "fragmented control frame"
    return "control frame payload over 125 bytes"


def _close_error(payload: bytes) -> tuple[int, str] | None:
    if len(payload) == 1:
        return PROTOCOL_ERROR, "close payload of one byte"
    if len(payload) >= 2:
        if not close_code_valid(int.from_bytes(payload[:2], "big")):
            return PROTOCOL_ERROR, "invalid close code"
        try:
            payload[2:].decode("utf-8")
        except UnicodeDecodeError:
            return INVALID_DATA, "close reason is not valid UTF-8"
    return None
