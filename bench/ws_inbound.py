"""Micro-benchmark: client-to-server frame parsing, per message, in one process.

``python -m bench.ws_inbound`` feeds the same masked ``send`` frames to each
candidate the way a socket read hands them over (one frame per read, and a
batch of 16 per read) and reports the CPU per message for parsing alone and
for parsing plus the JSON decode into the protocol's frame types:

* ``wsproto``: wsproto's server ``Connection`` (``receive_data`` + ``events``);
* ``websockets``: websockets' sans-IO ``Protocol`` (C unmasking);
* ``own+websockets``: :class:`protocol.wsframes.InboundFrames` unmasking with
  ``websockets.speedups.apply_mask``;
* ``own+wsaccel``: the same parser unmasking with ``wsaccel`` (if installed);
* ``own+int-xor``: the same parser unmasking with Python's big-int XOR.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec

from protocol import wsframes
from protocol.codec import decode_client_frame
from protocol.wsframes import client_frame

Unmask = wsframes.Unmask


def _send_payload(i: int) -> bytes:
    return msgspec.json.encode(
        {
            "type": "send",
            "id": i,
            "target": "scp_01JD6Z2W3K4M5N6P7Q8R9S0T1V",
            "content": f"bench message {i} " + "lorem ipsum dolor sit amet " * 5,
            "clientMessageId": f"c-{i:08d}",
            "expectedSeq": i,
        }
    )


def _int_xor(data: bytes | bytearray, mask: bytes | bytearray) -> bytes:
    n = len(data)
    key = (bytes(mask) * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def _wsaccel() -> Unmask | None:
    try:
        # Optional and untyped: imported by name so mypy needs neither it nor stubs.
        masker: Any = importlib.import_module("wsaccel.xormask").XorMaskerSimple
    except ImportError:
        return None

    def unmask(data: bytes | bytearray, mask: bytes | bytearray) -> bytes:
        out: bytes = masker(bytes(mask)).process(data)
        return out

    return unmask


def _run_wsproto(reads: list[bytes], decode: bool) -> int:
    from wsproto.connection import Connection, ConnectionType
    from wsproto.events import TextMessage

    conn = Connection(ConnectionType.SERVER)
    got = 0
    for data in reads:
        conn.receive_data(data)
        for event in conn.events():
            if isinstance(event, TextMessage):
                if decode:
                    decode_client_frame(event.data)
                got += 1
    return got


def _run_websockets(reads: list[bytes], decode: bool) -> int:
    from websockets.frames import Frame, Opcode
    from websockets.protocol import Protocol, Side

    proto = Protocol(Side.SERVER, max_size=256 * 1024)
    got = 0
    for data in reads:
        proto.receive_data(data)
        for frame in proto.events_received():
            if isinstance(frame, Frame) and frame.opcode is Opcode.TEXT:
                if decode:
                    decode_client_frame(cast(bytes, frame.data))
                got += 1
    return got


def _run_own(reads: list[bytes], decode: bool, unmask: Unmask | None = None) -> int:
    parser = (
        wsframes.InboundFrames(256 * 1024)
        if unmask is None
        else wsframes.InboundFrames(256 * 1024, unmask)
    )
    got = 0
    for data in reads:
        for kind, payload in parser.feed(data):
            if kind == wsframes.TEXT:
                if decode:
                    decode_client_frame(payload)
                got += 1
    return got


def _own_with(unmask: Unmask) -> Callable[[list[bytes], bool], int]:
    def run(reads: list[bytes], decode: bool) -> int:
        return _run_own(reads, decode, unmask)

    return run


def measure(messages: int, per_read: int, repeat: int) -> dict[str, dict[str, float]]:
    frames = [client_frame(_send_payload(i)) for i in range(messages)]
    reads = [b"".join(frames[i : i + per_read]) for i in range(0, messages, per_read)]
    candidates: dict[str, Callable[[list[bytes], bool], int]] = {
        "wsproto": _run_wsproto,
        "websockets": _run_websockets,
        "own+websockets": _run_own,
        "own+int-xor": _own_with(_int_xor),
    }
    if (accel := _wsaccel()) is not None:
        candidates["own+wsaccel"] = _own_with(accel)
    out: dict[str, dict[str, float]] = {}
    for name, run in candidates.items():
        row: dict[str, float] = {}
        for decode in (False, True):
            best = float("inf")
            for _ in range(repeat):
                t0 = time.process_time()
                got = run(reads, decode)
                best = min(best, time.process_time() - t0)
                assert got == messages, (name, got)
            row["parse+decode_us" if decode else "parse_us"] = round(best / messages * 1e6, 2)
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    frame_size = len(client_frame(_send_payload(0)))
    report = {
        "frame_bytes": frame_size,
        "one_frame_per_read": measure(args.messages, 1, args.repeat),
        "16_frames_per_read": measure(args.messages, 16, args.repeat),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
