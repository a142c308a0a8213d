"""WebSocket conformance of the server side (RFC 6455), over real sockets.

Raw frames are written by hand to a real node: fragmentation, control frames
between fragments, invalid UTF-8, reserved opcodes and bits, unmasked frames,
oversized and absurdly long frames, close handshakes and abrupt TCP closes.
Each is answered as the RFC says (1002 protocol error, 1007 invalid data, the
peer's close code echoed) or as the protocol's contract says (an oversized
message is an ``error`` ``payload_too_large`` and the session stays open),
and after each the node still serves a new session.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
import trio

from bench.wsframes import parse_upgrade_response, upgrade_request
from node.config import Settings
from tests.nodes import Person, RunningNode, World, running_node

TIMEOUT = 10.0
MAX = Settings().max_frame_bytes
_ids = itertools.count(1)

CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def frame(
    payload: bytes,
    opcode: int = TEXT,
    *,
    fin: bool = True,
    rsv: int = 0,
    masked: bool = True,
    length: int | None = None,
) -> bytes:
    """One client frame; ``length`` declares a length other than the payload's."""
    n = len(payload) if length is None else length
    head = bytearray([(0x80 if fin else 0) | rsv << 4 | opcode])
    bit = 0x80 if masked else 0
    if n < 126:
        head.append(bit | n)
    elif n < 1 << 16:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    if not masked:
        return bytes(head) + payload
    mask = os.urandom(4)
    return bytes(head) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return code.to_bytes(2, "big") + reason


def text(obj: dict[str, Any]) -> bytes:
    return msgspec.json.encode(obj)


def ping_request() -> tuple[int, bytes]:
    request_id = next(_ids)
    return request_id, text({"type": "ping", "id": request_id})


class Raw:
    """A hand-driven client: writes raw bytes, reads server frames (never masked)."""

    def __init__(self, stream: trio.SocketStream, received: bytes) -> None:
        self.stream = stream
        self.buf = bytearray(received)

    async def send(self, *data: bytes) -> None:
        await self.stream.send_all(b"".join(data))

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buf += data
        return bool(data)

    async def frame(self) -> tuple[int, bytes]:
        """The next whole server frame: (opcode, payload). Server frames are unfragmented."""
        with trio.fail_after(TIMEOUT):
            while True:
                buf = self.buf
                if len(buf) >= 2:
                    assert buf[0] & 0x80, "server frames are final"
                    assert not buf[1] & 0x80, "server frames are not masked"
                    n, start = buf[1] & 0x7F, 2
                    if n == 126:
                        n, start = (
                            (int.from_bytes(buf[2:4], "big"), 4) if len(buf) >= 4 else (-1, 0)
                        )
                    elif n == 127:
                        n, start = (
                            (int.from_bytes(buf[2:10], "big"), 10) if len(buf) >= 10 else (-1, 0)
                        )
                    if n >= 0 and len(buf) >= start + n:
                        opcode = buf[0] & 0x0F
                        payload = bytes(buf[start : start + n])
                        del buf[: start + n]
                        return opcode, payload
                if not await self._fill():
                    raise EOFError("connection closed before a whole frame")

    async def json(self) -> dict[str, Any]:
        opcode, payload = await self.frame()
        assert opcode == TEXT, (opcode, payload)
        decoded: dict[str, Any] = msgspec.json.decode(payload)
        return decoded

    async def closed_with(self) -> int | None:
        """Read up to the server's close frame; answer it; wait for the TCP close.

        Returns the close code (None for a close frame without one).
        """
        while True:
            opcode, payload = await self.frame()
            if opcode == CLOSE:
                break
        code = int.from_bytes(payload[:2], "big") if payload else None
        assert len(payload) != 1
        payload[2:].decode("utf-8")
        with suppress(trio.BrokenResourceError):
            await self.send(frame(payload[:2], CLOSE))
        with trio.fail_after(TIMEOUT):
            while await self._fill_quietly():
                pass
        return code

    async def _fill_quietly(self) -> bool:
        try:
            return await self._fill()
        except trio.BrokenResourceError:
            return False

    async def alive(self) -> None:
        """A ``ping`` request still gets its ``pong``."""
        request_id, request = ping_request()
        await self.send(frame(request))
        assert await self.json() == {"type": "pong", "id": request_id}


@asynccontextmanager
async def raw_session(node: RunningNode, person: Person | None = None) -> AsyncIterator[Raw]:
    """An upgraded connection; with ``person`` also past ``hello``/``welcome``."""
    port = node.services.port
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(upgrade_request("127.0.0.1", port, "/v1/ws"))
        head = bytearray()
        with trio.fail_after(TIMEOUT):
            while (end := parse_upgrade_response(head)) is None:
                data = await stream.receive_some(65536)
                assert data, "closed during the upgrade"
                head += data
        raw = Raw(stream, bytes(head[end:]))
        if person is not None:
            hello = {"type": "hello", "token": person.token, "client": {"kind": "browser"}}
            await raw.send(frame(text(hello)))
            assert (await raw.json())["type"] == "welcome"
        yield raw


async def _works(node: RunningNode, person: Person) -> None:
    """The node still serves a new session."""
    async with raw_session(node, person) as raw:
        await raw.alive()


async def _closed_with(node: RunningNode, person: Person | None, *frames: bytes) -> int | None:
    async with raw_session(node, person) as raw:
        await raw.send(*frames)
        return await raw.closed_with()


@asynccontextmanager
async def _world(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[RunningNode, Person]]:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        yield node, await world.member("alice")


async def test_fragmented_text_and_control_frames_between_fragments(
    database_url: str, tmp_path: Path
) -> None:
    async with _world(database_url, tmp_path) as (node, alice):
        async with raw_session(node, alice) as raw:
            request_id, request = ping_request()
            # Three fragments, one byte per TCP write for the first.
            first = frame(request[:5], fin=False)
            for i in range(len(first)):
                await raw.send(first[i : i + 1])
            await raw.send(frame(request[5:9], CONT, fin=False), frame(request[9:], CONT))
            assert await raw.json() == {"type": "pong", "id": request_id}

            # A ping and an unsolicited pong between fragments: the ping is
            # answered at once with its payload, the message still completes.
            request_id, request = ping_request()
            await raw.send(frame(request[:3], fin=False), frame(b"are you there", PING))
            assert await raw.frame() == (PONG, b"are you there")
            await raw.send(frame(b"unsolicited", PONG), frame(request[3:], CONT))
            assert await raw.json() == {"type": "pong", "id": request_id}

            # Empty fragments and a multi-byte character split between fragments.
            request_id = next(_ids)
            body = text({"type": "ping", "id": request_id, "note": "héllo ✓"})
            cut = body.index("é".encode()) + 1
            await raw.send(
                frame(b"", fin=False),
                frame(body[:cut], CONT, fin=False),
                frame(b"", CONT, fin=False),
                frame(body[cut:], CONT),
            )
            assert await raw.json() == {"type": "pong", "id": request_id}

            # A binary message is refused by the protocol, not the frame layer.
            await raw.send(frame(b"\x00\x01", BINARY, fin=False), frame(b"\x02", CONT))
            error = await raw.json()
            assert (error["type"], error["code"]) == ("error", "bad_frame")
            await raw.alive()
        await _works(node, alice)


async def test_protocol_violations_close_with_1002_or_1007(
    database_url: str, tmp_path: Path
) -> None:
    _, ping = ping_request()
    cases: list[tuple[str, list[bytes], int]] = [
        ("invalid UTF-8", [frame(b'{"type":"ping","id":1,"x":"\xff"}')], 1007),
        ("overlong UTF-8", [frame(b"\xc0\xaf")], 1007),
        ("UTF-16 surrogate as UTF-8", [frame(b"\xed\xa0\x80")], 1007),
        # Fails fast: the first fragment already cannot be UTF-8, no final frame sent.
        ("invalid UTF-8 in a fragment", [frame(b"\xce\xbaxx\xff", fin=False)], 1007),
        ("truncated UTF-8 at the end", [frame(b"ab\xce", fin=False), frame(b"", CONT)], 1007),
        ("reserved data opcode 0x3", [frame(b"x", 0x3)], 1002),
        ("reserved data opcode 0x7", [frame(b"x", 0x7)], 1002),
        ("reserved control opcode 0xB", [frame(b"x", 0xB)], 1002),
        ("reserved control opcode 0xF", [frame(b"", 0xF)], 1002),
        ("RSV1 without an extension", [frame(ping, rsv=0b100)], 1002),
        ("RSV2", [frame(ping, rsv=0b010)], 1002),
        ("RSV3", [frame(ping, rsv=0b001)], 1002),
        ("unmasked text frame", [frame(ping, masked=False)], 1002),
        ("unmasked ping", [frame(b"x", PING, masked=False)], 1002),
        ("continuation without a start", [frame(b"x", CONT)], 1002),
        ("non-final continuation without a start", [frame(b"x", CONT, fin=False)], 1002),
        ("new text before the message ended", [frame(b"{", fin=False), frame(ping)], 1002),
        ("binary before the text ended", [frame(b"{", fin=False), frame(b"x", BINARY)], 1002),
        ("ping over 125 bytes", [frame(b"x" * 126, PING)], 1002),
        ("pong over 125 bytes", [frame(b"x" * 200, PONG)], 1002),
        ("close over 125 bytes", [frame(close_payload(1000, b"x" * 124), CLOSE)], 1002),
        ("fragmented ping", [frame(b"x", PING, fin=False)], 1002),
        ("fragmented close", [frame(close_payload(1000), CLOSE, fin=False)], 1002),
        ("close payload of one byte", [frame(b"\x03", CLOSE)], 1002),
        ("close code 999", [frame(close_payload(999), CLOSE)], 1002),
        ("close code 1005 on the wire", [frame(close_payload(1005), CLOSE)], 1002),
        ("close code 1006 on the wire", [frame(close_payload(1006), CLOSE)], 1002),
        ("close code 2999", [frame(close_payload(2999), CLOSE)], 1002),
        ("close code 5000", [frame(close_payload(5000), CLOSE)], 1002),
        ("close reason not UTF-8", [frame(close_payload(1000, b"\xff"), CLOSE)], 1007),
        (
            "length with its high bit set",
            [b"\x81\xff" + (1 << 63).to_bytes(8, "big") + b"mask"],
            1002,
        ),
    ]
    async with _world(database_url, tmp_path) as (node, alice):
        for name, frames, expected in cases:
            try:
                got = await _closed_with(node, alice, *frames)
            except (trio.TooSlowError, EOFError) as exc:
                raise AssertionError(f"{name}: {exc!r}") from exc
            assert got == expected, name
        # Before hello too: the frame layer answers first, not the 4401 of a bad hello.
        assert await _closed_with(node, None, frame(b"x", 0x3)) == 1002
        assert await _closed_with(node, None, frame(b"\xff")) == 1007
        # Frames that precede a violation in the same read are still served.
        async with raw_session(node, alice) as raw:
            request_id, request = ping_request()
            await raw.send(frame(request), frame(b"x", CONT))
            assert await raw.json() == {"type": "pong", "id": request_id}
            assert await raw.closed_with() == 1002
        await _works(node, alice)


async def test_close_handshake_echoes_the_code(database_url: str, tmp_path: Path) -> None:
    async with _world(database_url, tmp_path) as (node, alice):
        for code in (1000, 1001, 1003, 1011, 3000, 4000, 4999):
            got = await _closed_with(node, alice, frame(close_payload(code, b"bye"), CLOSE))
            assert got == code
        # No status code: answered with a close frame without one.
        assert await _closed_with(node, alice, frame(b"", CLOSE)) is None
        # Before hello, and in the middle of a fragmented message.
        assert await _closed_with(node, None, frame(close_payload(1000), CLOSE)) == 1000
        frames = [frame(b'{"type":', fin=False), frame(close_payload(1001), CLOSE)]
        assert await _closed_with(node, alice, *frames) == 1001
        # Bytes after the close frame are ignored.
        frames = [frame(close_payload(1000), CLOSE), frame(b"x", 0x3)]
        assert await _closed_with(node, alice, *frames) == 1000
        await _works(node, alice)


async def test_oversized_messages_get_payload_too_large_and_the_session_stays_open(
    database_url: str, tmp_path: Path
) -> None:
    async with _world(database_url, tmp_path) as (node, alice):
        async with raw_session(node, alice) as raw:
            # One frame over the limit.
            await raw.send(frame(b"x" * (MAX + 1)))
            error = await raw.json()
            assert (error["type"], error["id"], error["code"]) == (
                "error",
                None,
                "payload_too_large",
            )
            await raw.alive()
            # Fragments each under the limit, together over it; a ping in between.
            half = MAX // 2 + 1
            await raw.send(frame(b"[" * half, fin=False), frame(b"hi", PING))
            assert await raw.frame() == (PONG, b"hi")
            await raw.send(frame(b"[" * half, CONT, fin=False), frame(b"]", CONT))
            assert (await raw.json())["code"] == "payload_too_large"
            await raw.alive()
            # Exactly at the limit is a frame like any other (here: not JSON).
            await raw.send(frame(b" " * MAX))
            assert (await raw.json())["code"] == "bad_frame"
            await raw.alive()

        # An absurd declared length: the node skips what arrives, buffers none of it.
        async with raw_session(node, alice) as raw:
            await raw.send(frame(b"", length=1 << 62)[:14])
            chunk = b"z" * 65536
            for _ in range(256):  # 16 MiB, far more than the socket buffers hold
                await raw.send(chunk)
                assert all(s.inbound_buffered <= 65536 for s in node.services.sessions)
            await _works(node, alice)
            assert all(s.inbound_buffered < 65536 for s in node.services.sessions)
        await _works(node, alice)


async def test_abrupt_tcp_close_mid_frame_does_not_hurt_the_node(
    database_url: str, tmp_path: Path
) -> None:
    async with _world(database_url, tmp_path) as (node, alice):
        _, request = ping_request()
        partials = [
            frame(request)[:1],  # half a header
            frame(request)[:4],  # the header without the whole mask
            frame(request)[:10],  # part of the payload
            frame(request[:5], fin=False),  # a message without its end
            frame(b"x" * 70000)[:30000],  # a 64-bit length frame, cut
            frame(b"", length=1 << 40)[:14] + b"y" * 1000,  # inside a skipped frame
        ]
        for partial in partials:
            async with raw_session(node, alice) as raw:
                await raw.send(partial)
            # The node notices the end of the stream and drops the session.
            with trio.fail_after(TIMEOUT):
                while len(node.services.sessions) > 0:
                    await trio.sleep(0.01)
            await _works(node, alice)
        # Before the upgrade finished, too.
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        await stream.send_all(upgrade_request("127.0.0.1", node.services.port, "/v1/ws")[:20])
        await stream.aclose()
        await _works(node, alice)
