"""``scopenode bench compare``: two node builds or settings, measured in pairs.

This machine's speed drifts by 2–3× within minutes, so two runs one after the
other compare moments more than builds. Here both nodes run at once (each
started by the bench with its own embedded database; ``--a-path``/``--b-path``
put a source tree first on its ``PYTHONPATH``, ``--a-env``/``--b-env`` add
environment variables) and the load alternates between them in blocks, the
order flipped every block, after one warm-up block each. Each node's CPU is
read from ``/proc`` around each of its blocks. Ops:

* ``react``: one reactor toggles 👍 on 50 messages of a channel that
  ``--readers`` sessions watch, ``--per`` sequential reactions per block;
* ``send``: one sender, ``--per`` sequential sends per block;
* ``throughput``: the throughput workload (``--senders`` over ``--scopes``,
  ``--duration`` seconds) as one block.

The report gives each side's CPU per op and latency over all blocks and, per
block pair, B's CPU per op (and, for ``throughput``, sends per second) over
A's: the median of those ratios, their spread (min, max) and how many blocks
B was ahead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.client import Session, ws_url
from bench.nodeproc import NodeUnderTest, open_node
from bench.progress import Progress
from bench.provision import make_provisioner
from bench.stats import Latency, proc_cpu_s, spread
from bench.workloads import throughput
from bench.workloads.common import Env, create_channel, join_each_member, open_sessions

MESSAGES = 50


@dataclass
class Side:
    name: str
    node: NodeUnderTest
    env: Env
    session: Session | None = None
    scope_id: str = ""
    message_ids: list[str] = field(default_factory=list)
    next_op: int = 0
    latency: Latency = field(init=False)
    cpu_s: float = 0.0
    ops: int = 0
    blocks: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.latency = Latency(f"{self.name}_op")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scopenode bench compare", description=__doc__)
    for side in ("a", "b"):
        p.add_argument(f"--{side}-path", help=f"source tree first on node {side.upper()}'s path")
        p.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=f"environment of node {side.upper()} (repeatable)",
        )
    p.add_argument("--op", choices=("react", "send", "throughput"), default="react")
    p.add_argument("--blocks", type=int, default=20, help="measured blocks per side")
    p.add_argument("--per", type=int, default=300, help="react/send: sequential ops per block")
    p.add_argument("--readers", type=int, default=16, help="react: sessions watching")
    p.add_argument("--senders", type=int, default=4, help="throughput: senders")
    p.add_argument("--scopes", type=int, default=4, help="throughput: scopes")
    p.add_argument("--duration", type=float, default=3.0, help="throughput: seconds per block")
    p.add_argument("--json", metavar="FILE", help="write the report here")
    return p


def _environment(path: str | None, pairs: list[str]) -> dict[str, str]:
    extra = dict(pair.split("=", 1) for pair in pairs)
    if path:
        kept = os.environ.get("PYTHONPATH")
        first = str(Path(path).resolve())
        extra["PYTHONPATH"] = os.pathsep.join([first, kept]) if kept else first
    return extra


async def _open_side(
    stack: AsyncExitStack, name: str, extra: dict[str, str], args: argparse.Namespace
) -> Side:
    node = await stack.enter_async_context(
        open_node(None, data_dir=None, database_url=None, extra_env=extra)
    )
    env = Env(
        node=node,
        provisioner=make_provisioner(node.data_dir, None),
        seed=1,
        progress=Progress(False),
        members_cap=4,
    )
    side = Side(name, node, env)
    if args.op == "throughput":
        return side
    ws = await env.provisioner.create_workspace(f"compare-{name}")
    (actor,) = await env.provisioner.create_members(ws, "human", ["actor"])
    url = ws_url(node.base_url, ws)
    (side.session,) = await stack.enter_async_context(
        open_sessions(url, [actor.token], kind="browser")
    )
    side.scope_id = await create_channel(side.session, "compare")
    if args.op == "react":
        watchers = await env.provisioner.create_members(ws, "human", ["w0", "w1", "w2", "w3"])
        tokens = [watchers[i % len(watchers)].token for i in range(args.readers)]
        readers = await stack.enter_async_context(open_sessions(url, tokens, kind="browser"))
        await join_each_member(readers, side.scope_id)
        for i in range(MESSAGES):
            sent = await side.session.request(
                "send", target=f"scope:{side.scope_id}", content=f"m{i}", clientMessageId=f"m{i}"
            )
            side.message_ids.append(str(sent["messageId"]))
    return side


async def _block(side: Side, args: argparse.Namespace, *, counted: bool) -> None:
    pid = side.node.pid
    assert pid is not None
    if args.op == "throughput":
        result = await throughput.run(
            side.env,
            senders=args.senders,
            scopes=args.scopes,
            duration_s=args.duration,
            max_sends=10**7,
        )
        sends = result.results["sends"]
        cpu = result.cpu.node_cpu_s or 0.0
        if counted:
            side.cpu_s += cpu
            side.ops += sends
            # The workload's own rate: its senders may finish after the duration.
            rate = float(result.results["sends_per_s"])
            side.blocks.append({"cpu_ms": 1000 * cpu / max(1, sends), "rate": rate})
        return
    before = proc_cpu_s(pid) or 0.0
    latencies = [await _one(side, args.op) for _ in range(args.per)]
    # The events of the block's last ops leave inside its window.
    await trio.sleep(0.05)
    cpu = (proc_cpu_s(pid) or 0.0) - before
    if counted:
        for ns in latencies:
            side.latency.record_ns(ns)
        side.cpu_s += cpu
        side.ops += args.per
        side.blocks.append({"cpu_ms": 1000 * cpu / args.per})


async def _one(side: Side, op: str) -> int:
    assert side.session is not None
    k = side.next_op
    side.next_op += 1
    start = time.perf_counter_ns()
    if op == "react":
        message_id = side.message_ids[(k // 2) % len(side.message_ids)]
        await side.session.request(
            "react", messageId=message_id, emoji="👍", op=("add", "remove")[k % 2]
        )
    else:
        await side.session.request(
            "send", target=f"scope:{side.scope_id}", content=f"s{k}", clientMessageId=f"s{k}"
        )
    return time.perf_counter_ns() - start


def _report(a: Side, b: Side, args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"op": args.op, "blocks": len(a.blocks)}
    for side in (a, b):
        entry: dict[str, Any] = {
            "node_cpu_ms_per_op": round(1000 * side.cpu_s / side.ops, 4) if side.ops else None,
            "ops": side.ops,
        }
        if args.op == "throughput":
            entry["sends_per_s_median"] = round(
                statistics.median(x["rate"] for x in side.blocks), 1
            )
        else:
            entry["p50_ms"] = side.latency.percentile_ms(50)
        report[side.name] = entry
    cpu = [
        y["cpu_ms"] / x["cpu_ms"] for x, y in zip(a.blocks, b.blocks, strict=True) if x["cpu_ms"]
    ]
    report["b_over_a_cpu_per_op_median"] = round(statistics.median(cpu), 3) if cpu else None
    report["b_over_a_cpu_per_op_spread"] = spread(cpu)
    report["blocks_b_cpu_lower"] = sum(r < 1 for r in cpu)
    if args.op == "throughput":
        rate = [y["rate"] / x["rate"] for x, y in zip(a.blocks, b.blocks, strict=True) if x["rate"]]
        report["b_over_a_sends_per_s_median"] = round(statistics.median(rate), 3) if rate else None
        report["b_over_a_sends_per_s_spread"] = spread(rate)
        report["blocks_b_faster"] = sum(r > 1 for r in rate)
    return report


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        a = await _open_side(stack, "a", _environment(args.a_path, args.a_env), args)
        b = await _open_side(stack, "b", _environment(args.b_path, args.b_env), args)
        for side in (a, b):
            await _block(side, args, counted=False)
        for i in range(args.blocks):
            for side in (a, b) if i % 2 == 0 else (b, a):
                await _block(side, args, counted=True)
        return _report(a, b, args)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    report = trio.run(run, args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0
