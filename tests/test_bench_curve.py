"""The curve's point from its rounds (pure: no node, no database)."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from bench.curve import _combine


def _round(sends_per_s: float, raw: float, *, sends: int, load: list[float]) -> dict[str, Any]:
    return {
        "senders_per_scope": 1,
        "senders": 4,
        "scopes": 4,
        "sends": sends,
        "sends_per_s": sends_per_s,
        "raw_tx_per_s": raw,
        "ratio": round(sends_per_s / raw, 3),
        "p50_ms": 1000 * 4 / sends_per_s,
        "node_cpu_ms_per_send": None,
        "statements": sends // 2,
        "errors": {"unavailable": 1} if sends == 300 else {},
        "load_avg_1m": load,
        "at": "00:00:00",
    }


def test_a_point_reports_the_median_round_ratio_and_summed_counts() -> None:
    rounds = [
        _round(1000.0, 2000.0, sends=100, load=[0.5, 0.6]),  # 0.5
        _round(1500.0, 1000.0, sends=200, load=[0.6, 0.7]),  # 1.5
        _round(900.0, 1000.0, sends=300, load=[0.7, 0.9]),  # 0.9
    ]
    point = _combine(rounds)
    # The median of the rounds' ratios, not the ratio of the medians
    # (1000 / 1000 = 1.0).
    assert point["ratio"] == 0.9
    assert point["sends_per_s"] == 1000.0
    assert point["raw_tx_per_s"] == 1000.0
    assert point["sends"] == 600
    assert point["statements"] == 300
    assert point["errors"] == {"unavailable": 1}
    assert point["load_avg_1m"] == [0.5, 0.9]
    assert point["node_cpu_ms_per_send"] is None
    assert (point["senders"], point["scopes"]) == (4, 4)
    assert point["rounds"] == rounds


def test_one_round_is_the_point_itself() -> None:
    only = _round(1000.0, 2000.0, sends=100, load=[0.5, 0.6])
    assert _combine([only]) == only


class ChainRecorder:
    """The committer's ``apply``, recording each chain's expected seqs."""

    def __init__(self) -> None:
        self.chains: list[list[int]] = []

    async def apply(self, plans: list[Any]) -> list[Any]:
        self.chains.append([plan.expected_seq for plan in plans])
        return [SimpleNamespace(seq=plan.seq) for plan in plans]


async def test_the_send_relay_hands_a_scopes_queued_requests_over_as_one_chain() -> None:
    """Per scope, the requests queued while its last chain committed go as the
    next chain, with consecutive seqs, as a scope actor hands them over; each
    sender gets its reply after the commit."""
    from actors.model import Member, MemberType
    from bench.relayfloor import SendRelay

    author = Member("mem_a", "ws_a", MemberType.AGENT, "a", "a")
    scope = {"scope_id": "scp_a", "workspace_id": "ws_a", "content": "x", "message_type": "text"}
    scopes = [{**scope, "author": author, "generation": 0, "latest_seq": n} for n in (5, 0)]
    committer = ChainRecorder()
    relay = SendRelay(committer, scopes)  # type: ignore[arg-type]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        relay.waiting[0] = [ours.fileno()] * 3
        relay.waiting[1] = [ours.fileno()]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay.scope_loop, 0)
            nursery.start_soon(relay.scope_loop, 1)
            await trio.testing.wait_all_tasks_blocked()
            relay.waiting[0].append(ours.fileno())
            relay.lots[0].unpark()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        replies = theirs.recv(4096)
    assert sorted(committer.chains) == [[0], [5, 6, 7], [8]]
    assert relay.latest == [9, 1]
    assert replies.count(b'"type":"reply"') == 5
