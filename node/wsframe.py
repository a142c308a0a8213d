"""Server-to-client WebSocket framing, done once per payload (RFC 6455 §5.2).

Server frames are unmasked and permessage-deflate is off, so the bytes of a
frame are the same for every connection: a broadcast is framed once.
"""

from __future__ import annotations

import struct

OP_TEXT = 0x1
OP_PONG = 0xA
MAX_SERVER_FRAME = 1024 * 1024


def frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    head = 0x80 | opcode
    size = len(payload)
    if size < 126:
        return bytes((head, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", head, 126, size) + payload
    return struct.pack("!BBQ", head, 127, size) + payload


def coalesce(payloads: list[bytes]) -> bytes:
    """Frames holding the payloads joined by newlines, each frame ≤ 1 MiB when possible."""
    out: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for payload in payloads:
        if group and size + len(payload) + 1 > MAX_SERVER_FRAME:
            out.append(frame(b"\n".join(group)))
            group, size = [], 0
        group.append(payload)
        size += len(payload) + 1
    if group:
        out.append(frame(b"\n".join(group)))
    return b"".join(out)
