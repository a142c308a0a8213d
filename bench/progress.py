"""A progress bar on stderr, drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    """``update(done)`` redraws at most ten times a second; ``close()`` ends the line."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.label = ""
        self.total = 0
        self._last = 0.0
        self._drawn = False

    def phase(self, label: str, total: int) -> None:
        self.close()
        self.label = label
        self.total = max(0, total)
        self.update(0, force=True)

    def update(self, done: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        frac = min(1.0, done / self.total) if self.total else 0.0
        bar = "#" * int(frac * width)
        sys.stderr.write(f"\r{self.label:<16} [{bar:<{width}}] {done}/{self.total} ")
        sys.stderr.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._drawn = False
