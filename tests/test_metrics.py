"""``/metrics`` is valid Prometheus text exposition: every family has HELP,
TYPE and samples; label values are escaped. Checked with the reference parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from node.client import ClientError, ConnectionClosed, open_client
from node.metrics import LATENCY_BUCKETS, Metrics
from tests.nodes import World, running_node


def families(text: str) -> dict[str, object]:
    """Parse ``text`` and check the contract for every family; name -> family."""
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    assert parsed
    for name, family in parsed.items():
        assert family.documentation, f"{name}: no HELP"
        assert family.type in ("counter", "gauge", "histogram"), f"{name}: TYPE {family.type}"
        assert family.samples, f"{name}: no samples"
    # Exactly one HELP and one TYPE line per family, each before its samples.
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert helps == types
    assert len(set(types)) == len(types) == len(parsed)
    return dict(parsed)


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_a_fresh_node_renders_every_family_with_samples() -> None:
    metrics = Metrics()
    text = metrics.render()
    parsed = families(text)
    assert {"scopenode_sends", "scopenode_errors", "scopenode_sessions_closed"} <= set(parsed)
    # Counters nothing has counted yet still show their known label values at 0.
    assert samples(text, "scopenode_errors_total")[(("code", "forbidden"),)] == 0
    assert samples(text, "scopenode_sessions_closed_total")[(("code", "4429"),)] == 0


def test_counts_gauges_and_escaped_labels() -> None:
    metrics = Metrics()
    metrics.on_send("sent", False)
    metrics.on_send("held", True)
    metrics.sessions_opened = 3
    metrics.sessions_closed[1000] += 2
    metrics.frames_in = 7
    odd = 'back\\slash "quoted"\nnewline'
    metrics.errors[odd] += 1
    metrics.gauges["sessions"] = lambda: 2.0
    metrics.gauges["something_new"] = lambda: 1.5
    metrics.set_outbox_states({"pending": 4})
    text = metrics.render()
    families(text)
    assert samples(text, "scopenode_sends_total")[(("state", "sent"),)] == 1
    assert samples(text, "scopenode_held_ratio")[()] == 0.5
    assert samples(text, "scopenode_compat_sends_total")[()] == 1
    assert samples(text, "scopenode_sessions_opened_total")[()] == 3
    assert samples(text, "scopenode_sessions_closed_total")[(("code", "1000"),)] == 2
    assert samples(text, "scopenode_frames_in_total")[()] == 7
    assert samples(text, "scopenode_errors_total")[(("code", odd),)] == 1
    assert samples(text, "scopenode_outbox_rows")[(("status", "pending"),)] == 4
    assert samples(text, "scopenode_sessions")[()] == 2
    assert samples(text, "scopenode_something_new")[()] == 1.5


def test_histograms_count_into_cumulative_buckets() -> None:
    metrics = Metrics()
    for seconds in (0.0003, 0.0005, 0.004, 0.004, 30.0):
        metrics.search.observe(seconds)
    metrics.send_commit.observe(0.0015, 3)  # one batch of three sends
    text = metrics.render()
    parsed = families(text)
    assert parsed["scopenode_search_seconds"].type == "histogram"
    buckets = samples(text, "scopenode_search_seconds_bucket")
    assert buckets[(("le", "0.0005"),)] == 2  # an upper bound is inclusive
    assert buckets[(("le", "0.002"),)] == 2
    assert buckets[(("le", "0.005"),)] == 4
    assert buckets[(("le", "10.0"),)] == 4
    assert buckets[(("le", "+Inf"),)] == 5
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert samples(text, "scopenode_search_seconds_count")[()] == 5
    assert samples(text, "scopenode_search_seconds_sum")[()] == pytest.approx(30.0088)
    assert samples(text, "scopenode_send_commit_seconds_count")[()] == 3
    assert samples(text, "scopenode_send_commit_seconds_bucket")[(("le", "0.002"),)] == 3
    assert samples(text, "scopenode_delivery_seconds_count")[()] == 0


async def http_get(port: int, path: str) -> tuple[bytes, str]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            await stream.send_all(request.encode())
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head, body.decode()


async def test_metrics_endpoint_of_a_running_node(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as client:
            await client.request("createChannel", slug="room", name="Room")
            assert (await client.send("#room", "counted"))["state"] == "sent"
            await client.request("search", query="counted")
            with pytest.raises(ClientError):
                await client.request("join", scopeId="scp_missing")  # an error frame
        with pytest.raises(ConnectionClosed):
            async with open_client(node.url, "snt_wrong"):
                pass
        head, text = await http_get(node.services.port, "/metrics")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"text/plain; version=0.0.4" in head
    parsed = families(text)
    assert {"scopenode_sessions", "scopenode_actors"} <= set(parsed)
    assert samples(text, "scopenode_sends_total")[(("state", "sent"),)] >= 1
    assert samples(text, "scopenode_sessions_opened_total")[()] >= 1
    assert sum(samples(text, "scopenode_errors_total").values()) >= 1
    # Each latency histogram counted the send (its commit, reply and delivery) and the search.
    for name in ("send_commit", "send_reply", "delivery", "search"):
        assert samples(text, f"scopenode_{name}_seconds_count")[()] >= 1, name
        assert samples(text, f"scopenode_{name}_seconds_sum")[()] > 0, name
