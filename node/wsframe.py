"""Server-to-client WebSocket framing, done once per payload (RFC 6455 §5.2).

Server frames are unmasked and permessage-deflate is off, so the bytes of a
frame are the same for every connection: a broadcast is framed once.
"""

from __future__ import annotations

import struct

OP_TEXT = 0x1
OP_PONG = 0xA


def frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    head = 0x80 | opcode
    size = len(payload)
    if size < 126:
        return bytes((head, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", head, 126, size) + payload
    return struct.pack("!BBQ", head, 127, size) + payload
