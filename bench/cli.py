"""``python -m bench WORKLOAD [options]`` / ``scopenode bench WORKLOAD [options]``.

Prints the parameters, runs the matching baselines of this machine, then
the workload (against ``--url``, or a node started here with an embedded
database), prints a table and writes JSON (``--json``) and PNGs (``--plot``).
Exit status: 0, or 1 when a correctness check of the workload failed
(lost/duplicated deliveries, seq gaps, failed resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import trio

from bench import curve as curve_mod
from bench import report as report_mod
from bench import rounds as rounds_mod
from bench.baseline import BaselinePlan, open_database, run_baseline
from bench.dbbaseline import DbPlan
from bench.fanout_baseline import FanoutPlan
from bench.nodeproc import open_node
from bench.progress import Progress
from bench.provision import make_provisioner
from bench.stats import Latency, machine, own_cpu_s, raise_fd_limit
from bench.workloads import (
    cluster,
    contention,
    fanout,
    idle,
    reactions,
    reconnect,
    send_latency,
    throughput,
)
from bench.workloads.common import Env, WorkloadResult, ratio
from node.config import Settings

WORKLOADS = (
    "baseline",
    "send-latency",
    "throughput",
    "fanout",
    "contention",
    "reconnect-storm",
    "idle",
    "reactions",
    "cluster",
)

# option: (full run, --quick)
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "duration": (10.0, 2.0),
    "messages": (None, None),  # per workload, below
    "senders": (64, 4),
    "scopes": (64, 2),
    "max_sends": (1_000_000, 400),
    "readers": (None, None),  # per workload, below
    "agents": (8, 3),
    "sessions": (None, None),  # per workload, below
    "gap": (10, 3),
    "db_sequential": (2000, 50),
    "db_duration": (5.0, 1.0),
    "db_concurrency": ("32", "2"),
    "timeout": (120.0, 60.0),
    "sample_every": (50, 1),
    "reactors": (4, 2),
    "reactions": (3000, 24),
}
MESSAGES = {
    "send-latency": (2000, 20),
    "fanout": (200, 10),
    "contention": (50, 5),
    "baseline": (200, 10),
    "reactions": (50, 5),
    "cluster": (300, 8),
}
SESSIONS = {"reconnect-storm": (200, 5), "idle": (1000, 10), "cluster": (100, 6)}
# The cluster workload's own sizes: senders of its throughput phase, seconds
# of each mode (through HAProxy, direct), NOTIFY round trips per size.
CLUSTER = {"senders": (16, 2), "duration": (6.0, 1.0), "notify_samples": (300, 20)}
# Rounds of a workload against its baselines (bench/rounds.py).
ROUNDS = (5, 2)
# Reaction readers are full sessions in this process, not raw reader sockets.
READERS = {"reactions": (16, 3)}


def _cluster_sizes(text: str) -> tuple[int, ...]:
    try:
        return cluster.parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"comma-separated sizes of at least 1, not {text!r}"
        ) from e


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scopenode bench", description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=WORKLOADS)
    g = p.add_argument_group("target")
    g.add_argument(
        "--url",
        help="ws://HOST:PORT of a running node, which keeps its own rate limits "
        "(default: start one, with raised limits)",
    )
    g.add_argument("--data-dir", help="node data dir for admin commands (with --url)")
    g.add_argument("--database-url", help="PostgreSQL URL (node, admin and baseline a)")
    g.add_argument("--node-pid", type=int, help="pid of the --url node (CPU and RSS figures)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="write the JSON report here")
    o.add_argument("--plot", metavar="DIR", help="write latency PNGs here (needs matplotlib)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar even on a TTY")
    r = p.add_argument_group("run")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--quick", action="store_true", help="tiny parameters (smoke tests)")
    r.add_argument("--duration", type=float, help="time bound of the measured phase, s")
    r.add_argument("--timeout", type=float, help="extra time allowed for setup and drain, s")
    r.add_argument("--no-baseline", action="store_true", help="skip the machine baselines")
    r.add_argument(
        "--reader-processes",
        type=int,
        default=2,
        help="fanout/idle/reactions: processes holding the reader sessions (reactions: 0 = in"
        " the reactors' process)",
    )
    r.add_argument("--members", type=int, default=16, help="members sessions are spread over")
    w = p.add_argument_group("workload sizes")
    w.add_argument("--messages", type=int, help="K sends / M broadcasts / per-agent sends")
    w.add_argument("--senders", type=int, help="throughput: concurrent senders S")
    w.add_argument("--scopes", type=int, help="throughput: scopes R")
    w.add_argument("--max-sends", type=int, help="throughput: total send bound")
    w.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="throughput: mean pause in ms between one sender's reply and its next send, "
        "drawn from an exponential distribution (0: back to back)",
    )
    w.add_argument(
        "--curve",
        metavar="N,N,...",
        help="throughput: the whole curve in one run, at these sender counts, one and two "
        "senders per scope, each point against the raw statement at the same concurrency "
        "(--duration per point, --db-duration per raw level)",
    )
    w.add_argument(
        "--rounds",
        type=int,
        help="send-latency, throughput, fanout: rounds of the baselines and the node, the "
        "order rotated each round, the ratios their medians (5; --quick 2); throughput "
        "--curve: rounds per point (1)",
    )
    w.add_argument("--readers", type=int, help="fanout/baseline/reactions: reader sessions N")
    w.add_argument("--reactors", type=int, help="reactions: members reacting at once")
    w.add_argument("--reactions", type=int, help="reactions: add/remove bound over all rounds")
    w.add_argument(
        "--relay-floor",
        nargs="?",
        const="inline",
        choices=("inline", "thread"),
        help="reactions, throughput --curve: also run every round through a bare relay "
        "(bench.relayfloor) that does only the statement(s) and the replies (reactions: and "
        "the readers' events, written inline or from a thread): a floor to compare the node "
        "with on this machine",
    )
    w.add_argument("--rate", type=float, default=0.0, help="fanout: sends/s (0: back to back)")
    w.add_argument("--window", type=int, default=32, help="fanout: sends in flight")
    w.add_argument("--sample-every", type=int, help="readers parse every k-th frame (50)")
    w.add_argument("--burst", type=int, default=8, help="baseline fan-out: frames per tick")
    w.add_argument("--agents", type=int, help="contention: agents A")
    w.add_argument("--sessions", type=int, help="reconnect-storm/idle: sessions N")
    w.add_argument("--gap", type=int, help="reconnect-storm: messages missed while away")
    w.add_argument("--db-sequential", type=int, help="baseline a: sequential transactions")
    w.add_argument("--db-duration", type=float, help="baseline a: seconds per concurrency level")
    w.add_argument("--db-concurrency", help="baseline a: comma-separated levels")
    w.add_argument(
        "--nodes",
        type=_cluster_sizes,
        default="1,2,3",
        metavar="N,N,...",
        help="cluster: cluster sizes, each N nodes behind HAProxy on one PostgreSQL",
    )
    w.add_argument("--notify-samples", type=int, help="cluster: raw NOTIFY round trips per size")
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset sizes from the full or ``--quick`` defaults."""
    pick = 1 if args.quick else 0
    if args.workload == "cluster":
        for name, values in CLUSTER.items():
            if getattr(args, name) is None:
                setattr(args, name, values[pick])
    for name, values in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, values[pick])
    if args.messages is None:
        args.messages = MESSAGES.get(args.workload, (100, 10))[pick]
    if args.sessions is None:
        args.sessions = SESSIONS.get(args.workload, (100, 5))[pick]
    if args.readers is None:
        args.readers = READERS.get(args.workload, (1000, 5))[pick]
    if args.rounds is None:
        args.rounds = 1 if args.curve else ROUNDS[pick]
    if args.workload == "baseline" and args.db_concurrency == DEFAULTS["db_concurrency"][pick]:
        args.db_concurrency = f"{args.db_concurrency},{args.senders}"
    return args


def params_of(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"json", "plot", "no_progress", "workload"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def baseline_plan(args: argparse.Namespace) -> BaselinePlan | None:
    if args.no_baseline:
        return None
    levels = tuple(sorted({int(x) for x in str(args.db_concurrency).split(",") if x}))
    db = DbPlan(
        sequential=args.db_sequential,
        concurrency=levels,
        duration_s=args.db_duration,
    )
    fan = FanoutPlan(
        clients=args.readers,
        messages=args.messages,
        burst=args.burst,
        reader_processes=args.reader_processes,
        sample_every=args.sample_every,
        timeout_s=args.timeout,
    )
    url = args.database_url
    match args.workload:
        case "baseline":
            return BaselinePlan(db=db, fanout=fan, database_url=url)
        case "send-latency":
            return BaselinePlan(
                db=DbPlan(args.db_sequential, (), args.db_duration), fanout=None, database_url=url
            )
        case "throughput":
            plan = DbPlan(args.db_sequential, (args.senders,), args.db_duration)
            return BaselinePlan(db=plan, fanout=None, database_url=url)
        case "fanout":
            return BaselinePlan(db=None, fanout=fan, database_url=url)
        case _:
            return None


def ratios(workload: str, results: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    raw = baseline.get("raw_tx", {})
    match workload:
        case "send-latency":
            raw_p50 = raw.get("sequential", {}).get("p50_ms")
            return {
                "send_p50_over_raw_tx_p50": ratio(results["latency"]["p50_ms"], raw_p50),
                "target_max": 2.0,
                "stretch_max": 1.5,
            }
        case "throughput":
            level = raw.get("concurrent", {}).get(str(results["senders"]), {})
            return {
                "sends_per_s_over_raw_tx_per_s": ratio(
                    results["sends_per_s"], level.get("tx_per_s")
                ),
                "at_concurrency": results["senders"],
                "target_min": 1.0,
                "stretch_min": 1.5,
            }
        case "fanout":
            rate = results["deliveries_per_s"]
            return {
                "deliveries_over_wsproto_baseline": ratio(
                    rate, baseline.get("ws_fanout", {}).get("deliveries_per_s")
                ),
                "deliveries_over_node_ws": ratio(
                    rate, baseline.get("node_ws_fanout", {}).get("deliveries_per_s")
                ),
                "target_min_over_node_ws": 2.0,
            }
        case "reactions":
            raw_p50 = results.get("raw_statement", {}).get("p50_ms")
            found = {
                "reaction_p50_over_raw_statement_p50": ratio(
                    results["reply_latency"].get("p50_ms"), raw_p50
                ),
                "at_concurrency": results["reactors"],
                "target_max": 1.5,
            }
            if "relay_floor" in results:
                found["relay_floor_p50_over_raw_statement_p50"] = ratio(
                    results["relay_floor"]["p50_ms"], raw_p50
                )
            return found
        case "idle":
            return {
                "kib_per_session_over_target": ratio(
                    results.get("kib_per_session"), results["target_kib_per_session"]
                ),
                "target_max": 1.0,
            }
        case "baseline":
            ws, node = baseline.get("ws_fanout", {}), baseline.get("node_ws_fanout", {})
            return {
                "wsproto_over_node_ws": ratio(
                    ws.get("deliveries_per_s"), node.get("deliveries_per_s")
                )
            }
    return {}


async def run_workload(env: Env, args: argparse.Namespace) -> WorkloadResult:
    match args.workload:
        case "send-latency":
            return await send_latency.run(env, messages=args.messages, duration_s=args.duration)
        case "throughput":
            return await throughput.run(
                env,
                senders=args.senders,
                scopes=args.scopes,
                duration_s=args.duration,
                max_sends=args.max_sends,
                pace_ms=args.pace,
            )
        case "fanout":
            return await fanout.run(
                env,
                readers=args.readers,
                messages=args.messages,
                rate=args.rate,
                window=args.window,
                sample_every=args.sample_every,
            )
        case "contention":
            return await contention.run(
                env, agents=args.agents, messages=args.messages, duration_s=args.duration
            )
        case "reconnect-storm":
            return await reconnect.run(env, sessions=args.sessions, gap=args.gap)
        case "idle":
            return await idle.run(env, sessions=args.sessions)
        case "reactions":
            return await reactions.run(
                env,
                readers=args.readers,
                reactors=args.reactors,
                messages=args.messages,
                reactions=args.reactions,
                duration_s=args.duration,
                database_url=args.database_url,
                baseline=not args.no_baseline,
                relay_floor=args.relay_floor,
            )
    raise ValueError(args.workload)


async def run(args: argparse.Namespace, progress: Progress) -> tuple[dict[str, Any], list[Latency]]:
    report: dict[str, Any] = {
        "workload": args.workload,
        "params": params_of(args),
        "machine": machine(),
    }
    plan = baseline_plan(args)
    if args.workload == "baseline":
        assert plan is not None
        baseline = await run_baseline(plan, progress)
        report["results"] = baseline
        report["baseline"] = {}
        report["ratios"] = ratios(args.workload, baseline, baseline)
        readers_cpu = sum(
            float(v.get("reader_cpu_s", 0.0)) for v in baseline.values() if isinstance(v, dict)
        )
        report["generator_cpu_s"] = round(own_cpu_s() + readers_cpu, 3)
        return report, []
    if args.curve:
        return await run_curve(args, progress, report)
    if args.workload == "cluster":
        return await run_cluster(args, progress, report), []
    async with open_node(
        args.url,
        data_dir=args.data_dir,
        database_url=args.database_url,
        node_pid=args.node_pid,
    ) as node:
        env = Env(
            node=node,
            provisioner=make_provisioner(node.data_dir, args.database_url),
            seed=args.seed,
            progress=progress,
            reader_processes=args.reader_processes,
            timeout_s=args.timeout,
            members_cap=args.members,
        )
        rounds: dict[str, Any] = {}
        if plan is None:
            result, baseline = await run_workload(env, args), {}
        else:
            # Baselines run against the node's own database server.
            plan = dataclasses.replace(plan, data_dir=node.data_dir)
            result, baseline, rounds = await _run_rounds(env, args, plan, progress)
    report["node_started_by_bench"] = node.started_here
    report["results"] = result.results
    report["baseline"] = baseline
    report["ratios"] = ratios(args.workload, result.results, baseline)
    report |= rounds
    report["generator_cpu_s"] = result.cpu.generator_cpu_s
    report["node_cpu_s"] = result.cpu.node_cpu_s
    report["machine_cpu"] = result.cpu.machine
    return report, result.latencies


async def _run_rounds(
    env: Env, args: argparse.Namespace, plan: BaselinePlan, progress: Progress
) -> tuple[WorkloadResult, dict[str, Any], dict[str, Any]]:
    """``args.rounds`` rounds of the baselines and the workload, the order
    rotated each round: the last round's whole figures, and the report's
    ``rounds``, ``figures`` and ``ratios`` (the rounds' medians and spreads)."""
    rounds: list[dict[str, Any]] = []
    result: WorkloadResult | None = None
    baseline: dict[str, Any] = {}
    found: dict[str, Any] = {}
    for r in range(max(1, args.rounds)):
        order = rounds_mod.order_of(r)
        for phase in order:
            if phase == "baseline":
                baseline = await run_baseline(plan, progress)
            else:
                result = await run_workload(env, args)
        assert result is not None
        found = ratios(args.workload, result.results, baseline)
        measured = result.results | {"node_cpu_s": result.cpu.node_cpu_s}
        rounds.append(
            rounds_mod.round_entry(args.workload, order, measured, baseline, found, args.senders)
        )
    assert result is not None
    return result, baseline, {"rounds": rounds} | rounds_mod.combine(args.workload, rounds, found)


async def run_curve(
    args: argparse.Namespace, progress: Progress, report: dict[str, Any]
) -> tuple[dict[str, Any], list[Latency]]:
    if args.workload != "throughput":
        raise SystemExit("--curve is a throughput option")
    plan = curve_mod.CurvePlan(
        points=curve_mod.parse_points(args.curve),
        duration_s=args.duration,
        db_duration_s=args.db_duration,
        max_sends=args.max_sends,
        rounds=max(1, args.rounds),
        relay_floor=args.relay_floor is not None,
        # The relay commits with the lanes and gathering of the node it is
        # compared with (the node's settings, read from the same environment).
        lanes=Settings().commit_lanes,
        gather_ms=Settings().commit_gather_ms,
    )
    async with open_node(
        args.url,
        data_dir=args.data_dir,
        database_url=args.database_url,
        node_pid=args.node_pid,
    ) as node:
        env = Env(
            node=node,
            provisioner=make_provisioner(node.data_dir, args.database_url),
            seed=args.seed,
            progress=progress,
            reader_processes=args.reader_processes,
            timeout_s=args.timeout,
            members_cap=args.members,
        )
        async with open_database(args.database_url, node.data_dir) as dsn:
            report["results"] = {"curve": await curve_mod.run_curve(env, dsn, plan)}
    report["node_started_by_bench"] = node.started_here
    report["baseline"] = {}
    report["ratios"] = {}
    return report, []


async def run_cluster(
    args: argparse.Namespace, progress: Progress, report: dict[str, Any]
) -> dict[str, Any]:
    plan = cluster.ClusterPlan(
        sizes=args.nodes,
        notify_samples=args.notify_samples,
        sends=args.messages,
        senders=args.senders,
        sessions=args.sessions,
        duration_s=args.duration,
        timeout_s=args.timeout,
        database_url=args.database_url,
        seed=args.seed,
    )
    results = await cluster.run(plan, progress)
    report["generator_cpu_s"] = results.pop("generator_cpu_s")
    report["results"] = results
    report["baseline"] = {}
    report["ratios"] = {
        size: r["target"] for size, r in results["by_nodes"].items() if r["target"] is not None
    }
    return report


def failed_checks(results: dict[str, Any]) -> list[str]:
    """Names of correctness flags that are false anywhere in ``results``."""
    bad = []
    for key, value in report_mod.flatten(results):
        leaf = key.rsplit(".", 1)[-1]
        if leaf in ("ok", "complete") and value is False:
            bad.append(key)
    return bad


def main(argv: list[str] | None = None) -> int:
    """``scopenode bench ARGS``: the ``scopenode.commands`` entry point ``bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["search"]:
        # Its own corpus and report (bench/search.py): no sessions or baselines of the rest.
        from bench.search import main as search_main

        return search_main(argv[1:])
    if argv[:1] == ["search-team"]:
        # A team's corpus built through sends, searched while it writes (bench/search_team.py).
        from bench.search_team import main as search_team_main

        return search_team_main(argv[1:])
    if argv[:1] == ["compare"]:
        # Two nodes at once, load in alternating blocks (bench/compare.py).
        from bench.compare import main as compare_main

        return compare_main(argv[1:])
    if argv[:1] == ["noisy-neighbour"]:
        # One member floods, another's sends are timed, at the default limits (bench/noisy.py).
        from bench.noisy import main as noisy_main

        return noisy_main(argv[1:])
    if argv[:1] == ["soak"]:
        # A long mixed workload with samples and verdicts (bench/soak.py).
        from bench.soak import main as soak_main

        return soak_main(argv[1:])
    args = resolve(build_parser().parse_args(argv))
    raise_fd_limit()
    print(f"scopenode bench {args.workload}")
    print(json.dumps(params_of(args), indent=None, sort_keys=True))
    progress = Progress(False if args.no_progress else None)
    try:
        report, latencies = trio.run(run, args, progress)
    finally:
        progress.close()
    print()
    curve = report["results"].get("curve") if isinstance(report.get("results"), dict) else None
    if curve is not None:
        print(curve_mod.render(curve))
    elif args.workload == "cluster":
        print(cluster.render(report["results"]))
    else:
        print(report_mod.render(report))
    if args.json:
        report_mod.write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.plot and curve is not None:
        print(f"wrote {curve_mod.plot(args.plot, curve)}")
    elif args.plot:
        for path in report_mod.plot(args.plot, args.workload, latencies):
            print(f"wrote {path}")
    bad = failed_checks(report["results"])
    if bad:
        print(f"correctness checks failed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
