"""The session's owned outbound path.

Producers hand over already-framed bytes without awaiting (a broadcast frame is
built once and shared by every recipient). When nothing is queued and the
writer is idle, the bytes are written to the socket right away without a task
switch; whatever the kernel does not take is queued, and the session's one
writer task sends everything queued in one write. The queue is capped in
bytes: a consumer that stays over the cap for ``grace`` seconds is closed with
4429, one that reaches four times the cap at once as well — memory never grows
without bound and one stalled peer never slows the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from node.wsframe import frame


class Outbound:
    def __init__(
        self,
        *,
        cap_bytes: int,
        grace: float,
        on_overflow: Callable[[], None],
    ) -> None:
        self._queue: list[bytes] = []
        self._size = 0
        self._cap = cap_bytes
        self._hard_cap = cap_bytes * 4
        self._grace = grace
        self._on_overflow = on_overflow
        self._lot = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        self._over_since: float | None = None
        self._closing: bytes | None = None
        self._fd = -1
        self._writing = False
        self.broken = False
        self.closed = False
        self.bytes_sent = 0

    @property
    def queued_bytes(self) -> int:
        return self._size

    def push(self, payload: bytes) -> None:
        """Queue one JSON payload as its own text frame; never blocks."""
        self.push_frame(frame(payload))

    def push_frame(self, data: bytes) -> None:
        """Queue framed bytes (text or control frames); never blocks."""
        if self.closed or self.broken or self._closing is not None:
            return
        if not self._queue and not self._writing and self._fd >= 0:
            data = self._write_now(data)
            if not data:
                return
        self._queue.append(data)
        self._size += len(data)
        if self._size > self._cap:
            self._note_over()
        self._lot.unpark()

    def _write_now(self, data: bytes) -> bytes:
        """Write what the socket takes now; return the rest."""
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            return data
        except OSError:
            self.broken = True
            self._lot.unpark()
            return b""
        self.bytes_sent += written
        return data[written:]

    async def wait_for_room(self, size: int) -> None:
        """Wait until ``size`` more bytes fit under the cap (for paced bulk senders)."""
        while self._size + size > self._cap and not (self.closed or self.broken):
            await self._room.park()

    def close(self, close_frame: bytes, *, discard: bool = False) -> None:
        """Send ``close_frame`` after what is queued (or instead of it) and stop."""
        if self._closing is not None or self.closed:
            return
        if discard:
            self._queue.clear()
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

    async def serve(self, stream: trio.SocketStream) -> None:
        """The writer task: one ``send_all`` per wake-up with everything queued."""
        self._fd = stream.socket.fileno()
        try:
            while not self.broken:
                if not self._queue and self._closing is None:
                    await self._lot.park()
                    continue
                chunks, self._queue = self._queue, []
                self._size = 0
                closing = self._closing
                if closing is not None:
                    chunks.append(closing)
                self._writing = True
                try:
                    await stream.send_all(b"".join(chunks))
                finally:
                    self._writing = False
                self.bytes_sent += sum(map(len, chunks))
                self._room.unpark_all()
                if closing is not None and not self._queue:
                    self.closed = True
                    return
        finally:
            self._fd = -1
            self._room.unpark_all()
