"""Opaque identifiers with a readable prefix (SPEC §7.8), roughly time-ordered."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _base32(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """``<prefix>_`` + 48-bit milliseconds + 80 random bits, Crockford base32."""
    millis = time.time_ns() // 1_000_000
    return f"{prefix}_{_base32(millis, 10)}{_base32(int.from_bytes(os.urandom(10)), 16)}"
