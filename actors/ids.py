"""Opaque identifiers with a readable prefix (docs/design.md#ids), roughly time-ordered."""

from __future__ import annotations

import os
import time


def new_id(prefix: str) -> str:
    """``<prefix>_`` + 48-bit milliseconds + 64 random bits, hex (sortable by time)."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{os.urandom(8).hex()}"
