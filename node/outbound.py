"""The session's owned outbound path.

Producers hand over already-framed bytes without awaiting (a broadcast frame is
built once and shared by every recipient). When nothing is queued, the bytes
are written to the socket at once, without a task switch; whatever the kernel
does not take is queued and a writer task is started that sends everything
queued in one write per wake-up and exits when the queue is empty (an idle
session holds no writer task). The queue is capped in bytes: a consumer that
stays over the cap for ``grace`` seconds is closed with 4429, one that reaches
four times the cap at once as well — memory never grows without bound and one
stalled peer never slows the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from protocol.wsframes import frame


class Outbound:
    __slots__ = (
        "_cap",
        "_closing",
        "_fd",
        "_grace",
        "_head_partial",
        "_held",
        "_on_done",
        "_on_overflow",
        "_over_since",
        "_queue",
        "_room",
        "_size",
        "_spawn_writer",
        "_stream",
        "_writer_running",
        "broken",
        "bytes_sent",
        "closed",
    )

    def __init__(
        self,
        stream: trio.SocketStream,
        *,
        cap_bytes: int,
        grace: float,
        on_overflow: Callable[[], None],
        spawn_writer: Callable[[], None],
        on_done: Callable[[], None],
    ) -> None:
        self._stream = stream
        self._fd = stream.socket.fileno()
        self._queue: list[bytes] = []
        # The first queued item is the tail of a frame whose head is on the wire.
        self._head_partial = False
        self._size = 0
        self._cap = cap_bytes
        self._grace = grace
        self._on_overflow = on_overflow
        self._spawn_writer = spawn_writer
        self._on_done = on_done
        self._room: trio.lowlevel.ParkingLot | None = None
        self._over_since: float | None = None
        self._closing: bytes | None = None
        self._writer_running = False
        # Frames held back to leave as one write (see hold()).
        self._held: list[bytes] | None = None
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
        if self._held is not None:
            self._held.append(data)
            return
        if not self._writer_running:
            rest = self._write_now(data)
            if not rest:
                return
            self._head_partial = len(rest) < len(data)
            data = rest
        self._queue.append(data)
        self._size += len(data)
        if self._size > self._cap:
            self._note_over()
        self._ensure_writer()

    def hold(self) -> None:
        """Keep what is pushed from now on until :meth:`release` (one write)."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        if held:
            self.push_frame(held[0] if len(held) == 1 else b"".join(held))

    def _write_now(self, data: bytes) -> bytes:
        """Write what the socket takes now; return the rest."""
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            return data
        except OSError:
            self._fail()
            return b""
        self.bytes_sent += written
        return data[written:]

    def _fail(self) -> None:
        if not self.broken:
            self.broken = True
            self._queue.clear()
            self._size = 0
            self._on_done()

    def _ensure_writer(self) -> None:
        if not self._writer_running:
            self._writer_running = True
            self._spawn_writer()

    def close(self, close_frame: bytes, *, discard: bool = False) -> None:
        """Send ``close_frame`` after what is queued (or instead of it), then report done."""
        if self._closing is not None or self.closed or self.broken:
            return
        if discard:
            # Keep the tail of a partly written frame: the close frame must
            # start on a frame boundary or the client reads garbage.
            self._queue = self._queue[:1] if self._head_partial else []
            self._size = sum(map(len, self._queue))
        self._closing = close_frame
        self._ensure_writer()

    def _note_over(self) -> None:
        if self._size > 4 * self._cap:
            self._on_overflow()
        elif self._over_since is None:
            self._over_since = trio.current_time()

    def overdue(self, now: float) -> bool:
        """True when the queue has stayed over the cap for longer than the grace."""
        if self._size <= self._cap:
            self._over_since = None
            return False
        return self._over_since is not None and now - self._over_since > self._grace

    async def wait_for_room(self, size: int) -> None:
        """Wait until ``size`` more bytes fit under the cap (for paced bulk senders)."""
        while self._size + size > self._cap and not (self.closed or self.broken):
            if self._room is None:
                self._room = trio.lowlevel.ParkingLot()
            await self._room.park()

    async def write_queued(self) -> None:
        """The writer task: send everything queued, one write per wake-up, then exit."""
        try:
            while self._queue or self._closing is not None:
                chunks, self._queue = self._queue, []
                self._head_partial = False
                self._size = 0
                closing = self._closing
                if closing is not None:
                    chunks.append(closing)
                await self._stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                self.bytes_sent += sum(map(len, chunks))
                if self._room is not None:
                    self._room.unpark_all()
                if closing is not None and not self._queue:
                    self.closed = True
                    self._on_done()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._fail()
        finally:
            self._writer_running = False
            if self._room is not None:
                self._room.unpark_all()
