"""The WebSocket framing module (protocol/wsframes.py), checked against wsproto.

Every frame built here is parsed by wsproto's ``FrameProtocol`` and every
frame wsproto builds is parsed here, in each length class of RFC 6455 §5.2
(7-bit up to 125, 16-bit from 126 to 65535, 64-bit from 65536), so the two
implementations agree on the bytes, not only this module with itself.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.frame_protocol import FrameProtocol, Opcode

from protocol.wsframes import (
    BINARY,
    CLOSE,
    INVALID_DATA,
    NO_STATUS,
    OP_BINARY,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    PING,
    PROTOCOL_ERROR,
    TEXT,
    TOO_LARGE,
    Event,
    InboundFrames,
    WebSocketError,
    client_frame,
    close_code_valid,
    close_frame,
    close_payload,
    frame,
    frame_at,
    parse_close,
)

SIZES = [0, 1, 125, 126, 65_535, 65_536]
# Header bytes before the payload (the masking key included) per length class.
SERVER_HEAD = {0: 2, 1: 2, 125: 2, 126: 4, 65_535: 4, 65_536: 10}
KEY = b"\x37\xfa\x21\x3d"


def payload_of(size: int) -> bytes:
    return (bytes(range(32, 127)) * (size // 95 + 1))[:size]


def feed_all(parser: InboundFrames, data: bytes, chunk: int | None = None) -> list[Event]:
    if chunk is None:
        return parser.feed(data)
    events: list[Event] = []
    for i in range(0, len(data), chunk):
        events += parser.feed(data[i : i + chunk])
    return events


def xor(data: bytes, key: bytes) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(data))


# Server → client


@pytest.mark.parametrize("size", SIZES)
def test_server_frame_is_what_wsproto_reads(size: int) -> None:
    payload = payload_of(size)
    data = frame(payload)
    assert len(data) == SERVER_HEAD[size] + size
    assert data[0] == 0x80 | OP_TEXT, "final"
    assert not data[1] & 0x80, "unmasked"
    reader = FrameProtocol(client=True, extensions=[])
    reader.receive_bytes(frame(payload, OP_BINARY) + data)
    binary, text = reader.received_frames()
    assert (binary.opcode, binary.payload, binary.message_finished) == (
        Opcode.BINARY,
        payload,
        True,
    )
    assert (text.opcode, text.payload) == (Opcode.TEXT, payload.decode())


@pytest.mark.parametrize("size", SIZES)
def test_frame_at_reads_wsproto_and_own_frames(size: int) -> None:
    payload = payload_of(size)
    head = SERVER_HEAD[size]
    # wsproto frames a bytes payload as binary.
    wsproto_frame = bytes(FrameProtocol(client=False, extensions=[]).send_data(payload))
    for data, opcode in ((frame(payload), OP_TEXT), (wsproto_frame, OP_BINARY)):
        assert frame_at(data, 0) == (opcode, 1, head, head + size)
        # Any prefix is incomplete, whether the cut is in the header or the payload.
        for cut in {0, 1, head - 1, head, len(data) - 1} - {len(data)}:
            assert frame_at(data[:cut], 0) is None, cut
        assert frame_at(b"junk" + data, 4) == (opcode, 1, head + 4, head + 4 + size)


def test_frame_at_walks_a_stream_from_any_position() -> None:
    server = FrameProtocol(client=False, extensions=[])
    stream = (
        bytes(server.send_data("ab", fin=False))
        + bytes(server.send_data("cd", fin=True))
        + bytes(server.ping(b"p"))
        + frame(b"x" * 300)
        + close_frame(1000, "bye")
    )
    seen = []
    pos = 0
    while (found := frame_at(stream, pos)) is not None:
        opcode, fin, start, end = found
        seen.append((opcode, fin, stream[start:end]))
        pos = end
    assert pos == len(stream)
    assert seen == [
        (OP_TEXT, 0, b"ab"),
        (OP_CONT, 1, b"cd"),
        (OP_PING, 1, b"p"),
        (OP_TEXT, 1, b"x" * 300),
        (OP_CLOSE, 1, b"\x03\xe8bye"),
    ]


def test_frame_at_refuses_masked_frames_and_unknown_opcodes() -> None:
    with pytest.raises(WebSocketError, match="masked"):
        frame_at(client_frame(b"hi"), 0)
    for opcode in (0x3, 0x7, 0xB, 0xF):
        with pytest.raises(WebSocketError, match="unknown opcode"):
            frame_at(frame(b"", opcode), 0)


# Client → server


@pytest.mark.parametrize("size", SIZES)
def test_client_frame_is_what_wsproto_reads(size: int) -> None:
    payload = payload_of(size)
    reader = FrameProtocol(client=False, extensions=[])
    reader.receive_bytes(
        client_frame(payload, OP_BINARY) + client_frame(payload) + client_frame(b"", OP_PING)
    )
    binary, text, ping = reader.received_frames()
    assert (binary.opcode, binary.payload) == (Opcode.BINARY, payload)
    assert (text.opcode, text.payload) == (Opcode.TEXT, payload.decode())
    assert (ping.opcode, ping.payload) == (Opcode.PING, b"")


@pytest.mark.parametrize("size", SIZES)
def test_client_frame_masks_with_its_key(size: int) -> None:
    payload = payload_of(size)
    data = client_frame(payload, key=KEY)
    head = SERVER_HEAD[size] + 4
    assert len(data) == head + size
    assert data[1] & 0x80, "the mask bit is set"
    assert data[head - 4 : head] == KEY
    assert data[head:] == xor(payload, KEY)
    assert frame(payload)[1:2] == bytes([data[1] & 0x7F]), "same length class as a server frame"


def test_client_frames_get_a_fresh_key_each() -> None:
    keys = {client_frame(b"same")[2:6] for _ in range(16)}
    assert len(keys) > 1


def test_fragments_from_client_frame_are_one_message_for_wsproto() -> None:
    reader = FrameProtocol(client=False, extensions=[])
    reader.receive_bytes(
        client_frame(b"one ", fin=False)
        + client_frame(b"x", OP_PING)
        + client_frame(b"two ", OP_CONT, fin=False)
        + client_frame(b"three", OP_CONT)
    )
    frames = [(f.opcode, f.payload, f.message_finished) for f in reader.received_frames()]
    assert frames == [
        (Opcode.TEXT, "one ", False),
        (Opcode.PING, b"x", True),
        (Opcode.TEXT, "two ", False),
        (Opcode.TEXT, "three", True),
    ]


# The node's inbound parser


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [None, 1, 7, 4096])
def test_inbound_reads_every_length_class_however_it_is_split(size: int, chunk: int | None) -> None:
    if chunk == 1 and size > 126:
        chunk = 997  # one byte per read is covered by the small sizes; keeps the test fast
    payload = payload_of(size)
    stream = client_frame(payload) + client_frame(b"p", OP_PING) + client_frame(payload)
    parser = InboundFrames(max_message=1 << 20)
    assert feed_all(parser, stream, chunk) == [(TEXT, payload), (PING, b"p"), (TEXT, payload)]
    assert parser.buffered == 0
    assert parser.failed is None


@pytest.mark.parametrize("size", SIZES)
def test_inbound_reads_wsproto_client_frames(size: int) -> None:
    payload = payload_of(size).decode()
    writer = FrameProtocol(client=True, extensions=[])
    stream = bytes(writer.send_data(payload)) + bytes(writer.close(4000, "done"))
    events = InboundFrames(max_message=1 << 20).feed(stream)
    assert events == [(TEXT, payload.encode()), (CLOSE, b"\x0f\xa0done")]
    assert parse_close(events[1][1]) == (4000, "done")


def test_inbound_joins_fragments_around_control_frames() -> None:
    text = "καλημέρα κόσμε".encode()
    # Cut inside a two-byte character: each fragment alone is not UTF-8, the message is.
    cut = text.index("μ".encode()) + 1
    stream = (
        client_frame(text[:cut], fin=False)
        + client_frame(b"", OP_PING)
        + client_frame(b"", OP_PONG)
        + client_frame(text[cut:], OP_CONT, fin=False)
        + client_frame(b"", OP_CONT)
    )
    parser = InboundFrames(max_message=1024)
    assert feed_all(parser, stream, 3) == [(PING, b""), (TEXT, text)]


def test_inbound_skips_oversized_and_binary_messages_and_goes_on() -> None:
    parser = InboundFrames(max_message=100)
    stream = (
        client_frame(b"x" * 101)
        + client_frame(b"y" * 60, fin=False)
        + client_frame(b"y" * 60, OP_CONT)
        + client_frame(b"\x00\x01", OP_BINARY)
        + client_frame(b"ok")
    )
    events = feed_all(parser, stream, 16)
    assert events == [(TOO_LARGE, b""), (TOO_LARGE, b""), (BINARY, b""), (TEXT, b"ok")]
    assert parser.failed is None


def test_inbound_never_buffers_a_declared_huge_frame() -> None:
    parser = InboundFrames(max_message=1024)
    head = client_frame(b"z" * 70_000)
    for i in range(0, 60_000, 5_000):
        parser.feed(head[i : i + 5_000])
        assert parser.buffered < 100


@pytest.mark.parametrize(
    ("stream", "code"),
    [
        (frame(b"unmasked"), PROTOCOL_ERROR),
        (bytes([0xC1]) + client_frame(b"rsv1")[1:], PROTOCOL_ERROR),
        (client_frame(b"", 0x3), PROTOCOL_ERROR),
        (client_frame(b"", 0xB), PROTOCOL_ERROR),
        (client_frame(b"more", OP_CONT), PROTOCOL_ERROR),
        (client_frame(b"a", fin=False) + client_frame(b"b"), PROTOCOL_ERROR),
        (client_frame(b"p", OP_PING, fin=False), PROTOCOL_ERROR),
        (client_frame(b"p" * 126, OP_PING), PROTOCOL_ERROR),
        (client_frame(b"\x03", OP_CLOSE), PROTOCOL_ERROR),
        (client_frame(b"\xc0\xaf"), INVALID_DATA),
        (client_frame(b"\xce", fin=False) + client_frame(b"\xff", OP_CONT), INVALID_DATA),
        (client_frame(b"\x03\xe8\xff", OP_CLOSE), INVALID_DATA),
        (bytes([0x81, 0xFF]) + (1 << 63).to_bytes(8, "big") + KEY, PROTOCOL_ERROR),
    ],
    # Named, not shown: the masking keys are random, and pytest-xdist needs
    # every worker to collect the same test ids.
    ids=[
        "unmasked",
        "rsv1",
        "reserved-data-opcode",
        "reserved-control-opcode",
        "orphan-continuation",
        "new-message-mid-fragments",
        "fragmented-ping",
        "long-ping",
        "one-byte-close",
        "invalid-utf8",
        "invalid-utf8-across-fragments",
        "invalid-utf8-close-reason",
        "length-top-bit-set",
    ],
)
def test_inbound_fails_rfc_violations_with_their_close_code(stream: bytes, code: int) -> None:
    parser = InboundFrames(max_message=1024)
    assert parser.feed(stream) == []
    assert parser.failed is not None
    assert parser.failed[0] == code
    assert parser.feed(client_frame(b"after")) == [], "nothing is parsed after a failure"


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535])
def test_inbound_fails_close_codes_a_peer_may_not_send(code: int) -> None:
    parser = InboundFrames(max_message=1024)
    assert parser.feed(client_frame(code.to_bytes(2, "big"), OP_CLOSE)) == []
    assert parser.failed == (PROTOCOL_ERROR, "invalid close code")


@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1011, 1014, 3000, 4429, 4999])
def test_inbound_ends_at_a_valid_close(code: int) -> None:
    parser = InboundFrames(max_message=1024)
    stream = client_frame(close_payload(code, "bye"), OP_CLOSE) + client_frame(b"late")
    assert parser.feed(stream) == [(CLOSE, code.to_bytes(2, "big") + b"bye")]
    assert parser.closed
    assert parser.feed(client_frame(b"later")) == []


def test_an_empty_close_has_no_status() -> None:
    assert InboundFrames(1024).feed(client_frame(b"", OP_CLOSE)) == [(CLOSE, b"")]
    assert parse_close(b"") == (NO_STATUS, "")


# No deadline: a loaded host must not turn a slow example into a failure.
@settings(deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=300), st.integers(min_value=1, max_value=4)),
        min_size=1,
        max_size=6,
    ),
    st.integers(min_value=1, max_value=600),
)
def test_inbound_rebuilds_any_fragmented_stream(
    messages: list[tuple[str, int]], chunk: int
) -> None:
    stream = b""
    for text, parts in messages:
        data = text.encode()
        step = -(-len(data) // parts) or 1
        pieces = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
        for i, piece in enumerate(pieces):
            stream += client_frame(piece, OP_CONT if i else OP_TEXT, fin=i == len(pieces) - 1)
    events = feed_all(InboundFrames(max_message=1 << 20), stream, chunk)
    assert events == [(TEXT, text.encode()) for text, _ in messages]


# Close frames


def test_close_frame_carries_code_and_reason_for_wsproto() -> None:
    reader = FrameProtocol(client=True, extensions=[])
    reader.receive_bytes(close_frame(4429, "slow consumer"))
    [closing] = reader.received_frames()
    assert (closing.opcode, closing.payload) == (Opcode.CLOSE, (4429, "slow consumer"))


def test_close_without_status_is_an_empty_frame() -> None:
    assert close_frame(NO_STATUS, "ignored") == bytes([0x88, 0x00])
    assert close_payload(NO_STATUS) == b""


def test_a_long_close_reason_is_cut_at_a_character_boundary() -> None:
    payload = close_payload(1000, "é" * 100)  # 200 bytes of UTF-8
    assert len(payload) <= 125
    code, reason = parse_close(payload)
    assert (code, reason) == (1000, "é" * 61)
    reader = FrameProtocol(client=True, extensions=[])
    reader.receive_bytes(close_frame(1000, "é" * 100))
    [closing] = reader.received_frames()
    assert closing.payload == (1000, "é" * 61)


def test_close_code_validity_follows_rfc_6455() -> None:
    valid = {c for c in range(70_000) if close_code_valid(c)}
    expected = {1000, 1001, 1002, 1003, *range(1007, 1015), *range(3000, 5000)}
    assert valid == expected


def test_parse_close_tolerates_a_reason_that_is_not_utf8() -> None:
    assert parse_close(b"\x0f\xa0\xff") == (4000, "\ufffd")
    assert parse_close(bytearray(b"\x03\xe8ok")) == (1000, "ok")
