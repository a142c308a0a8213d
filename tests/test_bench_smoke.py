"""Smoke tests of the bench harness that need no node: frame counting and baseline (b)."""

from __future__ import annotations

import shutil

import pytest
import trio
from wsproto.frame_protocol import FrameProtocol

from bench.cli import build_parser, resolve
from bench.fanout_baseline import (
    FanoutPlan,
    ensure_node_peer,
    python_server_cmd,
    run_fanout_server,
)
from bench.rawfanout import envelope, serve_fanout
from bench.workloads.reactions import op_sequence
from bench.wsframes import FrameCounter, mark, parse_upgrade_response, upgrade_request
from protocol.wsframes import WebSocketError, client_frame
from tests.conftest import require_tool


def server_frame(payload: str | bytes) -> bytes:
    return bytes(FrameProtocol(client=False, extensions=[]).send_data(payload, fin=True))


def test_counter_counts_several_frames_in_one_read() -> None:
    frames = b"".join(server_frame(f"{mark(1000 + i)} hello") for i in range(5))
    fc = FrameCounter(sample_every=1)
    fc.feed(frames)
    assert (fc.messages, fc.events) == (5, 5)
    assert fc.take_samples() == [1000, 1001, 1002, 1003, 1004]


def test_counter_reassembles_frames_split_across_reads() -> None:
    payloads = ["a" * 10, "b" * 300, "c" * 70_000, mark(42)]
    stream = b"".join(server_frame(p) for p in payloads)
    fc = FrameCounter(sample_every=1)
    for i in range(len(stream)):  # one byte per read: every header and payload split
        fc.feed(stream[i : i + 1])
    assert fc.messages == 4
    assert fc.payload_bytes == sum(len(p) for p in payloads)
    assert fc.take_samples() == [42]


def test_counter_counts_coalesced_events_in_one_frame() -> None:
    payload = "\n".join(f'{{"type":"message","content":"{mark(i)}"}}' for i in range(1, 4))
    fc = FrameCounter(sample_every=1)
    fc.feed(server_frame(payload))
    assert (fc.messages, fc.events) == (1, 3)
    assert fc.take_samples() == [1, 2, 3]


def test_counter_samples_every_kth_message_only() -> None:
    fc = FrameCounter(sample_every=3)
    fc.feed(b"".join(server_frame(mark(i)) for i in range(1, 10)))
    assert fc.messages == 9
    assert fc.take_samples() == [3, 6, 9]


def test_counter_handles_control_frames_and_close_code() -> None:
    fp = FrameProtocol(client=False, extensions=[])
    data = bytes(fp.ping(b"x")) + server_frame(mark(5)) + bytes(fp.close(4429, "slow"))
    fc = FrameCounter()
    fc.feed(data)
    assert (fc.pings, fc.messages, fc.closed, fc.close_code) == (1, 1, True, 4429)


def test_counter_rejects_masked_frames() -> None:
    with pytest.raises(WebSocketError):
        FrameCounter().feed(client_frame(b"masked"))


def test_counter_keeps_payloads_in_setup_mode() -> None:
    fc = FrameCounter(keep_payloads=True)
    fc.feed(server_frame('{"type":"welcome"}') + server_frame("x"))
    assert fc.payloads == [b'{"type":"welcome"}', b"x"]


def test_upgrade_response_parsing() -> None:
    assert b"Upgrade: websocket" in upgrade_request("127.0.0.1", 80, "/v1/ws?workspace=w")
    assert parse_upgrade_response(b"HTTP/1.1 101 Switching") is None
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    assert parse_upgrade_response(head + b"\x81\x00") == len(head)
    with pytest.raises(WebSocketError):
        parse_upgrade_response(b"HTTP/1.1 403 Forbidden\r\n\r\n")


def test_envelope_has_requested_size_and_marker() -> None:
    env = envelope(7, 123456789, 230)
    assert len(env) == 230
    assert mark(123456789) in env


async def _raw_reader(port: int, counter: FrameCounter, expected: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(upgrade_request("127.0.0.1", port, "/"))
        buf = b""
        while (head := parse_upgrade_response(buf)) is None:
            buf += await stream.receive_some(65536)
        counter.feed(buf[head:])
        while counter.events < expected:
            data = await stream.receive_some(65536)
            if not data:
                break
            counter.feed(data)


async def test_raw_fanout_in_process_delivers_every_frame_to_every_reader() -> None:
    clients, messages = 5, 40
    counters = [FrameCounter(sample_every=1) for _ in range(clients)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            result = []

            async def server(task_status: trio.TaskStatus[int]) -> None:
                result.append(
                    await serve_fanout(clients, messages, burst=3, task_status=task_status)
                )

            port = await nursery.start(server)
            for c in counters:
                nursery.start_soon(_raw_reader, port, c, messages)
    assert result[0].clients == clients
    for c in counters:
        assert (c.messages, c.events) == (messages, messages)
        assert len(c.take_samples()) == messages


def test_raw_fanout_baseline_with_reader_processes_counts_exactly() -> None:
    out = run_fanout_server(
        python_server_cmd(), FanoutPlan(clients=6, messages=25, sample_every=5, timeout_s=30)
    )
    assert out["complete"], out
    assert out["deliveries"] == out["expected_deliveries"] == 150
    assert out["latency"]["count"] > 0


@require_tool(
    "Node.js",
    None if shutil.which("node") else "no node on PATH (Debian: apt-get install nodejs npm)",
)
def test_node_ws_fanout_baseline_counts_exactly() -> None:
    cmd, why = ensure_node_peer()
    assert cmd is not None, why
    out = run_fanout_server(cmd, FanoutPlan(clients=4, messages=20, timeout_s=30))
    assert out["complete"], out
    assert out["deliveries"] == 80


def test_reaction_ops_are_add_remove_pairs_spread_over_the_messages() -> None:
    ops = op_sequence(1, ["m0", "m1", "m2"], 5)
    assert ops == [
        ("m1", "add"), ("m1", "remove"),
        ("m2", "add"), ("m2", "remove"),
        ("m0", "add"), ("m0", "remove"),
    ]  # fmt: skip


def test_bench_cli_knows_the_reactions_workload() -> None:
    args = resolve(build_parser().parse_args(["reactions", "--quick"]))
    assert (args.readers, args.reactors, args.messages) == (3, 2, 5)
    assert resolve(build_parser().parse_args(["fanout"])).readers == 1000
