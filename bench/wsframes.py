"""Sans-IO WebSocket helpers for cheap load-generator readers.

Readers in the fan-out workloads must not be what the bench measures, so they
never decode whole messages: :class:`FrameCounter` walks server→client frame
headers (which are never masked, RFC 6455 §5.1), counts complete data
messages, counts timestamp markers inside payloads with one C-level
``bytearray.count`` per frame, and parses timestamps only from every
``sample_every``-th message.

Timestamps travel in payloads as ``@bt:<CLOCK_MONOTONIC ns>`` (see
:func:`mark`). ``CLOCK_MONOTONIC`` is system-wide on Linux, so Python
(``time.monotonic_ns``) and Node.js (``process.hrtime.bigint``) processes on
the same machine share it.
"""

from __future__ import annotations

import base64
import os
import re

MARK = b"@bt:"
_TS = re.compile(rb"@bt:(\d+)")

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

# The key is fixed: readers do not verify Sec-WebSocket-Accept (loopback, our own servers).
_KEY = base64.b64encode(b"scopenode-bench!").decode()


class FrameError(Exception):
    """The peer sent bytes that are not a valid server→client frame stream."""


def mark(t_ns: int) -> str:
    """The payload marker carrying a send timestamp."""
    return f"@bt:{t_ns}"


def upgrade_request(host: str, port: int, path: str) -> bytes:
    """A minimal HTTP/1.1 WebSocket upgrade request."""
    return (
        f"GET {path} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {_KEY}\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        "\r\n"
    ).encode("ascii")


def parse_upgrade_response(buf: bytes | bytearray) -> int | None:
    """Return the length of a complete ``101`` response head, or None if incomplete.

    Raises FrameError when the server refused the upgrade.
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 16384:
            raise FrameError("oversized HTTP response head")
        return None
    status_line = bytes(buf[: buf.find(b"\r\n")])
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or parts[1] != b"101":
        raise FrameError(f"upgrade refused: {status_line.decode('latin-1')}")
    return end + 4


def client_frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    """Encode one masked, final client→server frame (RFC 6455 §5.3)."""
    n = len(payload)
    head = bytearray([0x80 | opcode])
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += n.to_bytes(2, "big")
    else:
        head.append(0x80 | 127)
        head += n.to_bytes(8, "big")
    mask = os.urandom(4)
    if n:
        key = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    else:
        masked = b""
    return bytes(head) + mask + masked


def server_frame_at(buf: bytes | bytearray, pos: int) -> tuple[int, int, int] | None:
    """The server→client frame starting at ``pos``: (first byte, payload start,
    payload end), or None while it is incomplete. Raises FrameError for a
    masked frame (servers never mask, RFC 6455 §5.1)."""
    n = len(buf)
    if n - pos < 2:
        return None
    b1 = buf[pos + 1]
    if b1 & 0x80:
        raise FrameError("masked frame from server")
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
    return None if end > n else (buf[pos], start, end)


class FrameCounter:
    """Counts server→client frames from a byte stream, parsing headers only.

    ``feed`` accepts arbitrary chunks: frames split across reads and several
    frames in one read are both handled. Counters:

    * ``messages``: complete data messages (final text/binary/continuation frames);
    * ``events``: ``@bt:`` markers seen in data payloads (a node may coalesce
      several events into one frame);
    * ``payload_bytes``, ``pings``, ``closed``, ``close_code``.

    Every ``sample_every``-th message has its timestamps parsed into
    ``samples`` (drain with :meth:`take_samples`). With ``keep_payloads`` the
    data payloads are kept in ``payloads`` (setup phase only: it costs a copy).
    """

    __slots__ = (
        "_buf",
        "close_code",
        "closed",
        "events",
        "keep_payloads",
        "messages",
        "payload_bytes",
        "payloads",
        "pings",
        "sample_every",
        "samples",
    )

    def __init__(self, sample_every: int = 50, *, keep_payloads: bool = False) -> None:
        self._buf = bytearray()
        self.sample_every = max(1, sample_every)
        self.keep_payloads = keep_payloads
        self.messages = 0
        self.events = 0
        self.payload_bytes = 0
        self.pings = 0
        self.closed = False
        self.close_code: int | None = None
        self.samples: list[int] = []
        self.payloads: list[bytes] = []

    def take_samples(self) -> list[int]:
        out = self.samples
        self.samples = []
        return out

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        buf = self._buf
        buf += data
        pos = 0
        every = self.sample_every
        while (found := server_frame_at(buf, pos)) is not None:
            b0, start, end = found
            length = end - start
            opcode = b0 & 0x0F
            if opcode < 0x8:
                self.payload_bytes += length
                self.events += buf.count(MARK, start, end)
                if self.keep_payloads:
                    self.payloads.append(bytes(buf[start:end]))
                if b0 & 0x80:
                    self.messages += 1
                    if self.messages % every == 0:
                        self.samples.extend(int(m) for m in _TS.findall(buf, start, end))
            elif opcode == OP_CLOSE:
                self.closed = True
                if length >= 2:
                    self.close_code = (buf[start] << 8) | buf[start + 1]
            elif opcode == OP_PING:
                self.pings += 1
            elif opcode != OP_PONG:
                raise FrameError(f"unknown opcode {opcode:#x}")
            pos = end
        if pos:
            del buf[:pos]
