"""Server-to-client WebSocket framing, done once per payload (RFC 6455 §5.2).

Server frames are unmasked and permessage-deflate is off, so the bytes of a
frame are the same for every connection: a broadcast is framed once.
"""

from __future__ import annotations

import struct

OP_TEXT = 0x1
OP_CLOSE = 0x8
OP_PONG = 0xA


def frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    head = 0x80 | opcode
    size = len(payload)
    if size < 126:
        return bytes((head, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", head, 126, size) + payload
    return struct.pack("!BBQ", head, 127, size) + payload


def close_frame(code: int, reason: str) -> bytes:
    """A close frame; 1005 (no status received) is answered with an empty body."""
    if code == 1005:
        return frame(b"", OP_CLOSE)
    # A control frame's payload is at most 125 bytes: the code and 123 of reason.
    body = reason.encode()[:123].decode(errors="ignore").encode()
    return frame(code.to_bytes(2, "big") + body, OP_CLOSE)
