"""Sans-IO WebSocket helpers for cheap load-generator readers.

Readers in the fan-out workloads must not be what the bench measures, so they
never decode whole messages: :class:`FrameCounter` walks server→client frame
headers (:func:`protocol.wsframes.frame_at`), counts complete data messages,
counts timestamp markers inside payloads with one C-level ``bytearray.count``
per frame, and parses timestamps only from every ``sample_every``-th message.

Timestamps travel in payloads as ``@bt:<CLOCK_MONOTONIC ns>`` (see
:func:`mark`). ``CLOCK_MONOTONIC`` is system-wide on Linux, so Python
(``time.monotonic_ns``) and Node.js (``process.hrtime.bigint``) processes on
the same machine share it.
"""

from __future__ import annotations

import base64
import re

from protocol.wsframes import OP_CLOSE, OP_PING, WebSocketError, frame_at, parse_close

MARK = b"@bt:"
_TS = re.compile(rb"@bt:(\d+)")

# The key is fixed: readers do not verify Sec-WebSocket-Accept (loopback, our own servers).
_KEY = base64.b64encode(b"scopenode-bench!").decode()


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

    Raises WebSocketError when the server refused the upgrade.
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 16384:
            raise WebSocketError("oversized HTTP response head")
        return None
    status_line = bytes(buf[: buf.find(b"\r\n")])
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or parts[1] != b"101":
        raise WebSocketError(f"upgrade refused: {status_line.decode('latin-1')}")
    return end + 4


class FrameCounter:
    """Counts server→client frames from a byte stream, parsing headers only.

    ``feed`` accepts arbitrary chunks: frames split across reads and several
    frames in one read are both handled. Counters:

    * ``messages``: complete data messages (final text/binary/continuation frames);
    * ``events``: ``@bt:`` markers seen in data payloads (a node may coalesce
      several events into one frame);
    * ``payload_bytes``, ``pings``, ``closed``, ``close_code`` (1005 for a close
      frame without a code).

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
        while (found := frame_at(buf, pos)) is not None:
            opcode, fin, start, end = found
            if opcode < OP_CLOSE:
                self.payload_bytes += end - start
                self.events += buf.count(MARK, start, end)
                if self.keep_payloads:
                    self.payloads.append(bytes(buf[start:end]))
                if fin:
                    self.messages += 1
                    if self.messages % every == 0:
                        self.samples.extend(int(m) for m in _TS.findall(buf, start, end))
            elif opcode == OP_CLOSE:
                self.closed = True
                self.close_code = parse_close(buf[start:end])[0]
            elif opcode == OP_PING:
                self.pings += 1
            pos = end
        if pos:
            del buf[:pos]
