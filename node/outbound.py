"""The session's owned outbound path.

Producers append encoded payloads without awaiting; one writer task sends
everything queued in one write (several JSON objects per text frame,
newline-separated, as PROTOCOL.md allows). The queue is capped in bytes: a
consumer that stays over the cap for ``grace`` seconds is closed with 4429,
and one that reaches ``hard_cap`` is closed at once — memory never grows
without bound and one stalled peer never slows the others.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from node.wsframe import coalesce


class Outbound:
    def __init__(
        self,
        *,
        cap_bytes: int,
        grace: float,
        on_overflow: Callable[[], None],
    ) -> None:
        self._payloads: list[bytes] = []
        self._control: list[bytes] = []
        self._size = 0
        self._cap = cap_bytes
        self._hard_cap = cap_bytes * 4
        self._grace = grace
        self._on_overflow = on_overflow
        self._lot = trio.lowlevel.ParkingLot()
        self._over_since: float | None = None
        self._closing: bytes | None = None
        self.closed = False
        self.bytes_sent = 0

    @property
    def queued_bytes(self) -> int:
        return self._size

    def push(self, payload: bytes) -> None:
        """Queue one JSON payload; never blocks."""
        if self.closed or self._closing is not None:
            return
        self._payloads.append(payload)
        self._size += len(payload) + 1
        if self._size > self._cap:
            self._note_over()
        self._lot.unpark()

    def push_control(self, frame_bytes: bytes) -> None:
        """Queue an already-framed control frame (pong); sent before payloads."""
        if not self.closed:
            self._control.append(frame_bytes)
            self._lot.unpark()

    def close(self, close_frame: bytes, *, discard: bool = False) -> None:
        """Send ``close_frame`` after what is queued (or instead of it) and stop."""
        if self._closing is not None or self.closed:
            return
        if discard:
            self._payloads.clear()
            self._size = 0
        self._closing = close_frame
        self._lot.unpark()

    def _note_over(self) -> None:
        if self._size > self._hard_cap:
            self._on_overflow()
            return
        if self._over_since is None:
            self._over_since = trio.current_time()

    def overdue(self) -> bool:
        """True when the queue has stayed over the cap for longer than the grace."""
        if self._size <= self._cap:
            self._over_since = None
            return False
        return self._over_since is not None and trio.current_time() - self._over_since > self._grace

    async def serve(self, stream: trio.abc.SendStream) -> None:
        """The writer task: one ``send_all`` per wake-up with everything queued."""
        while True:
            if not self._payloads and not self._control and self._closing is None:
                await self._lot.park()
                continue
            chunks = self._control
            self._control = []
            if self._payloads:
                payloads, self._payloads = self._payloads, []
                self._size = 0
                chunks.append(coalesce(payloads))
            if self._closing is not None and not self._payloads:
                chunks.append(self._closing)
            data = b"".join(chunks)
            if data:
                await stream.send_all(data)
                self.bytes_sent += len(data)
            if self._closing is not None and not self._payloads and not self._control:
                self.closed = True
                return
