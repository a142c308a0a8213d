"""``scopenode bench noisy-neighbour``: one member floods, another's sends are timed.

Starts a node (``bench/nodeproc.py``) with the **documented default** rate
limits, not the raised ones of the other benches (``--url`` targets a running
node, which keeps its own). In one workspace, a human (the neighbour) sends to
its own channel at ``--victim-rate`` sends/s, open loop, for the whole run,
from a process of its own; an agent (the flooder) holds ``--sessions``
sessions, half of them sending to its own channel and half searching it
(``--flood``: or all of them one of those), each as fast as the node lets
it: a ``polite`` flooder waits the advertised ``retryAfterMs`` after a
refusal, a ``blind`` one asks again at once.

The run alternates quiet phases (the neighbour alone) and flood phases of
``--phase-s`` seconds, ``--rounds`` rounds, the order flipped every round.
Before them come a warm-up flood, until both of the flooder's buckets have
refused it (so every counted flood phase opens with what the quiet phase
before it refilled), and a warm-up quiet phase; neither is counted. It
reports the neighbour's send p50 and p99 in each condition over all rounds,
the flood over quiet ratios of the pooled figures and their spread over the
rounds (median, min, max of the per-round ratios), the slowest flood-phase
sends and when in their phase they were sent, and the flooder's accepted
sends and searches per second against the documented limit: the rate over
whole flood phases (which includes each phase's opening burst) and the
sustained rate, from a phase's first refusal to its end. Correctness checks
(exit status 1 when one fails): the neighbour is never refused, and the
flooder never gets more than a bucket's size plus its rate over the time
since the first flood. Bounded in count and time; loopback only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from bench import report as report_mod
from bench.client import RequestError, Session, SessionClosed, open_session, ws_url
from bench.nodeproc import NodeUnderTest, open_node
from bench.options import Size, add_target_options, bench_parser, fill_sizes
from bench.progress import Progress
from bench.provision import make_provisioner
from bench.stats import Latency, machine, proc_cpu_s, raise_fd_limit, spread
from bench.workloads.common import create_channel, open_sessions
from node.config import LIMIT_FIELDS, Settings
from node.limits import RAISED_LIMITS_ENV

TARGET_MAX_RATIO = 1.5
# The warm-up flood lasts until both of the flooder's buckets have refused it
# once (their first bucketful spent), at least a phase, at most this long.
WARMUP_MAX_S = 60.0
# --flood: what the flooder's sessions ask, in turn.
FLOODS = {"both": ("send", "search"), "sends": ("send",), "searches": ("search",)}
REQUEST_TIMEOUT_S = 30.0
HEARTBEAT_S = 10.0
# Words of the flooder's messages and searches: each search finds a share of them.
WORDS = tuple(f"{a}{b}" for a in ("ka", "lo", "mi", "su", "te") for b in ("ra", "no", "vi", "zu"))

SIZES = {
    "rounds": Size(5, 2, "quiet/flood pairs counted"),
    "phase_s": Size(60.0, 2.0, "seconds of each phase"),
    "sessions": Size(32, 4, "the flooder's sessions"),
}


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser("noisy-neighbour", __doc__, "two short rounds, few sessions (tests)", SIZES)
    p.add_argument("--victim-rate", type=float, default=2.0, help="the neighbour's sends/s")
    p.add_argument(
        "--flooder",
        choices=("polite", "blind"),
        default="polite",
        help="after a refusal: wait retryAfterMs (polite) or ask again at once (blind)",
    )
    p.add_argument(
        "--flood",
        choices=tuple(FLOODS),
        default="both",
        help="what the flooder's sessions ask: half send and half search (both), or all one",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="extra time for setup, s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="write the JSON report here")
    add_target_options(p, "ws://HOST:PORT of a running node, which keeps its own limits")
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    fill_sizes(args, SIZES)
    if args.rounds < 1 or args.phase_s <= 0 or args.sessions < 2 or args.victim_rate <= 0:
        raise SystemExit("need --rounds >= 1, --phase-s > 0, --sessions >= 2, --victim-rate > 0")
    return args


# ---------------------------------------------------------------- limits


def limit_env(name: str) -> str:
    """The environment variable of a limit setting."""
    return f"SCOPENODE_{name.upper()}"


def documented_limits() -> dict[str, float]:
    """The limit settings of a node whose environment sets none of them."""
    names = (*LIMIT_FIELDS, "max_sessions_per_member")
    assert all(limit_env(name) in RAISED_LIMITS_ENV for name in names)
    saved = {name: os.environ.pop(name) for name in RAISED_LIMITS_ENV if name in os.environ}
    try:
        settings = Settings()
    finally:
        os.environ.update(saved)
    return {name: getattr(settings, name) for name in names}


# ---------------------------------------------------------------- the flooder


@dataclass
class Tally:
    """What one kind of flood request got during one flood phase."""

    # When each accepted request was asked (monotonic), and how long it took.
    accepted: list[float] = field(default_factory=list)
    latency: Latency = field(default_factory=lambda: Latency("flood"))
    refused: int = 0
    first_refused: float | None = None  # when the first refused request was asked
    errors: Counter[str] = field(default_factory=Counter)
    emptied: trio.Event = field(default_factory=trio.Event)  # set at the first refusal


Fields = Callable[[], dict[str, Any]]


async def flood(
    session: Session, op: str, fields: Fields, tally: Tally, polite: bool, end: float
) -> None:
    """Ask ``op`` again and again until cancelled, requests timed on the monotonic
    clock; a polite flooder sleeps no further than ``end``."""
    while session.closed is None:  # a closed one is counted at the end
        asked = time.monotonic()
        t0 = time.perf_counter_ns()
        try:
            await session.request(op, timeout=None, **fields())
        except SessionClosed:
            return
        except RequestError as e:
            if e.code != "rate_limited":
                tally.errors[e.code] += 1
                await trio.sleep(0.01)
                continue
            now = time.monotonic()
            tally.refused += 1
            if tally.first_refused is None:
                tally.first_refused = asked
                tally.emptied.set()
            if polite:
                wait = e.frame.get("details", {}).get("retryAfterMs", 1)
                await trio.sleep(min(wait / 1000, max(0.0, end - now)))
            continue
        tally.latency.record_ns(time.perf_counter_ns() - t0)
        tally.accepted.append(asked)


def send_fields(target: str, rng: random.Random, ids: Iterator[int]) -> Fields:
    """A new send each time (its own ``clientMessageId``), four words of WORDS."""

    def make() -> dict[str, Any]:
        words = " ".join(rng.choices(WORDS, k=4))
        return {"target": target, "content": f"flood {words}", "clientMessageId": f"f{next(ids)}"}

    return make


def search_fields(rng: random.Random) -> Fields:
    def make() -> dict[str, Any]:
        return {"query": rng.choice(WORDS), "limit": 20}

    return make


# ---------------------------------------------------------------- the neighbour


@dataclass
class Phase:
    name: str  # quiet | flood
    round: int  # -1: warm-up
    start: float
    end: float
    latency: Latency
    sends: Tally | None = None
    searches: Tally | None = None
    node_cpu_s: float | None = None


class Neighbour:
    """The neighbour's sends, from a process of its own: in the flooder's
    process its replies would wait for the flooder's frames to be read."""

    def __init__(self, url: str, token: str, target: str, rate: float, seed: int) -> None:
        self.command = [
            sys.executable, "-m", "bench.noisy", "neighbour", url, target, str(rate), str(seed),
        ]  # fmt: skip
        self.token = token  # on the child's stdin, not in its command line
        self.samples: list[Sample] = []
        self._process: trio.Process | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sending from its start (once the child's session is open) to its end."""
        process = await trio.lowlevel.open_process(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert process.stdout is not None
            assert process.stdin is not None
            await process.stdin.send_all(self.token.encode() + b"\n")
            lines = LineReader(process.stdout)
            if await lines.next() != b"ready":
                raise RuntimeError("the neighbour process did not start")
            yield
            await process.stdin.aclose()  # stop sending; report
            with trio.fail_after(REQUEST_TIMEOUT_S + 5):
                while (line := await lines.next()) is not None:
                    asked, ns, error = json.loads(line)
                    self.samples.append(Sample(asked, ns, error))
                await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                    await process.wait()


@dataclass(frozen=True)
class Sample:
    asked: float  # monotonic, shared by the processes of this machine
    ns: int  # 0 when refused
    error: str | None


class LineReader:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> bytes | None:
        """The next line without its newline; None at the end."""
        while b"\n" not in self._buffer:
            data = await self._stream.receive_some(65536)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line


async def neighbour_process(url: str, target: str, rate: float, seed: int) -> None:
    """The child: reads the token from its stdin's first line, says ``ready``
    once its session is open, then sends every ``1/rate`` s (jittered by up to
    a fifth, open loop) until stdin closes, then writes one JSON line per send:
    when it was asked, its latency in ns, its error."""
    samples: list[tuple[float, int, str | None]] = []
    rng = random.Random(seed)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    token = (await LineReader(stdin).next() or b"").decode()

    async def one(session: Session, k: int) -> None:
        asked = time.monotonic()
        t0 = time.perf_counter_ns()
        try:
            await session.request(
                "send",
                timeout=REQUEST_TIMEOUT_S,
                target=target,
                content=f"quiet {k}",
                clientMessageId=f"q{k}",
            )
        except RequestError as e:
            samples.append((asked, 0, e.code))
        except (SessionClosed, trio.TooSlowError) as e:
            samples.append((asked, 0, type(e).__name__))
        else:
            samples.append((asked, time.perf_counter_ns() - t0, None))

    async def sends(session: Session, stop: trio.Event) -> None:
        period = 1.0 / rate
        async with trio.open_nursery() as nursery:
            tick = time.monotonic()
            for k in itertools.count():
                nursery.start_soon(one, session, k)
                tick += period * rng.uniform(0.8, 1.2)
                with trio.move_on_after(max(0.0, tick - time.monotonic())):
                    await stop.wait()
                if stop.is_set():
                    break

    async with open_session(url, token, kind="browser") as session:
        print("ready", flush=True)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sends, session, stop)
            while await stdin.receive_some(1024):
                pass
            stop.set()
    for sample in samples:
        print(json.dumps(sample))
    sys.stdout.flush()


# ---------------------------------------------------------------- the run


@dataclass
class Cast:
    neighbour: Neighbour
    phases: list[Phase]
    flooders: list[Session]
    flood_target: str
    node: NodeUnderTest
    send_ids: Iterator[int] = field(default_factory=itertools.count)
    flooders_open: int = 0  # at the end


async def open_cast(stack: AsyncExitStack, args: argparse.Namespace) -> Cast:
    env = {limit_env(name): str(value) for name, value in documented_limits().items()}
    node = await stack.enter_async_context(
        open_node(args.url, data_dir=args.data_dir, database_url=args.database_url, extra_env=env)
    )
    provisioner = make_provisioner(node.data_dir, args.database_url)
    workspace = await provisioner.create_workspace("noisy-neighbour")
    (human,) = await provisioner.create_members(workspace, "human", ["neighbour"])
    (agent,) = await provisioner.create_members(workspace, "agent", ["flooder"])
    url = ws_url(node.base_url, workspace)
    async with open_session(url, human.token, kind="browser") as quiet:
        quiet_scope = await create_channel(quiet, "quiet")
    flooders = await stack.enter_async_context(
        open_sessions(url, [agent.token] * args.sessions, kind="daemon")
    )
    flood_scope = await create_channel(flooders[0], "flood")
    target = f"scope:{quiet_scope}"
    neighbour = Neighbour(url, human.token, target, args.victim_rate, args.seed)
    return Cast(neighbour, [], flooders, f"scope:{flood_scope}", node)


async def run_phase(cast: Cast, name: str, rnd: int, args: argparse.Namespace) -> Phase:
    start = time.monotonic()
    end = start + args.phase_s
    phase = Phase(name, rnd, start, end, Latency(f"{name}_{rnd}"))
    cast.phases.append(phase)
    pid = cast.node.pid
    cpu_before = proc_cpu_s(pid) if pid is not None else None
    if name == "quiet":
        await trio.sleep(args.phase_s)
    else:
        kinds = FLOODS[args.flood]
        sends = phase.sends = Tally() if "send" in kinds else None
        searches = phase.searches = Tally() if "search" in kinds else None
        polite = args.flooder == "polite"
        rng = random.Random(args.seed * 1000 + rnd)
        warmup = rnd < 0
        if warmup:
            end = start + max(args.phase_s, WARMUP_MAX_S)
        with trio.move_on_at(trio.current_time() + (end - start)):
            async with trio.open_nursery() as nursery:
                if warmup:
                    tallies = [t for t in (sends, searches) if t is not None]
                    nursery.start_soon(_until_refused, tallies, args.phase_s, nursery.cancel_scope)
                for i, session in enumerate(cast.flooders):
                    if kinds[i % len(kinds)] == "send":
                        assert sends is not None
                        fields = send_fields(cast.flood_target, rng, cast.send_ids)
                        nursery.start_soon(flood, session, "send", fields, sends, polite, end)
                    else:
                        assert searches is not None
                        nursery.start_soon(
                            flood,
                            session,
                            "search",
                            search_fields(rng),
                            searches,
                            polite,
                            end,
                        )
    if name == "flood" and rnd < 0:
        phase.end = time.monotonic()
    cpu_after = proc_cpu_s(pid) if pid is not None else None
    if cpu_before is not None and cpu_after is not None:
        phase.node_cpu_s = round(cpu_after - cpu_before, 3)
    return phase


async def keep_alive(sessions: Sequence[Session]) -> None:
    """Ping the flooder's sessions through the quiet phases (the node closes a
    session it hears nothing from for three heartbeats)."""
    while True:
        await trio.sleep(HEARTBEAT_S)
        for session in sessions:
            if session.closed is None:
                with trio.move_on_after(HEARTBEAT_S):
                    await session.ping()


async def _until_refused(tallies: Sequence[Tally], least_s: float, scope: trio.CancelScope) -> None:
    """End the warm-up flood once every kind of request was refused."""
    await trio.sleep(least_s)
    for tally in tallies:
        await tally.emptied.wait()
    scope.cancel()


async def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    limits = documented_limits()
    bound_s = args.timeout + WARMUP_MAX_S + (args.rounds * 2 + 1) * args.phase_s
    with trio.fail_after(bound_s):
        async with AsyncExitStack() as stack:
            cast = await open_cast(stack, args)
            plan = [("flood", -1), ("quiet", -1)]
            for r in range(args.rounds):
                pair = [("quiet", r), ("flood", r)]
                plan += pair if r % 2 == 0 else pair[::-1]
            progress.phase("phases", len(plan))
            async with cast.neighbour.running(), trio.open_nursery() as nursery:
                nursery.start_soon(keep_alive, cast.flooders)
                for done, (name, rnd) in enumerate(plan, 1):
                    await run_phase(cast, name, rnd, args)
                    progress.update(done)
                nursery.cancel_scope.cancel()
            progress.close()
            cast.flooders_open = sum(s.closed is None for s in cast.flooders)
            started_here = cast.node.started_here
    return summarise(cast, limits, args, started_here)


# ---------------------------------------------------------------- the report


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 3) if den else None


def _flood_figures(
    phases: Sequence[Phase], kind: str, rate: float, burst: float, first_flood: float, last: float
) -> dict[str, Any] | None:
    tallies: list[tuple[Phase, Tally]] = []
    for p in phases:
        tally = getattr(p, kind)
        if tally is not None:
            tallies.append((p, tally))
    if not tallies:
        return None  # not flooded
    counted = [(p, t) for p, t in tallies if p.round >= 0]
    answers = Latency(kind)
    for _, t in counted:
        answers.hist.add(t.latency.hist)
    accepted = sum(len(t.accepted) for _, t in counted)
    flood_s = sum(p.end - p.start for p, _ in counted)
    sustained_n = 0
    sustained_s = 0.0
    for p, t in counted:
        if t.first_refused is not None:
            sustained_n += sum(1 for at in t.accepted if at >= t.first_refused)
            sustained_s += p.end - t.first_refused
    every = sum(len(t.accepted) for _, t in tallies)
    bound = burst + rate * (last - first_flood)
    sustained = round(sustained_n / sustained_s, 2) if sustained_s else None
    errors: Counter[str] = Counter()
    for _, t in tallies:
        errors.update(t.errors)
    return {
        "accepted": accepted,
        "refused": sum(t.refused for _, t in counted),
        "accepted_per_s": round(accepted / flood_s, 2) if flood_s else None,
        "sustained_per_s": sustained,
        "limit_per_s": rate,
        "burst": burst,
        "sustained_over_limit": _ratio(sustained, rate) if sustained is not None else None,
        "rounds_sustained_per_s": [
            round(
                sum(1 for at in t.accepted if at >= t.first_refused) / (p.end - t.first_refused), 2
            )
            if t.first_refused is not None and p.end > t.first_refused
            else None
            for p, t in counted
        ],
        "answer": answers.summary(),
        "errors": dict(errors),
        # Never more than a full bucket plus its rate since the first flood.
        "within_bucket": {"ok": every <= bound, "accepted_all": every, "bound": round(bound, 1)},
    }


def summarise(
    cast: Cast, limits: dict[str, float], args: argparse.Namespace, started_here: bool
) -> dict[str, Any]:
    phases = cast.phases
    refused: Counter[str] = Counter()
    # The slowest sends of the counted flood phases, and when in their phase.
    slowest: list[tuple[float, float]] = []
    for sample in cast.neighbour.samples:
        if sample.error is not None:
            refused[sample.error] += 1
            continue
        phase = next((p for p in phases if p.start <= sample.asked < p.end), None)
        if phase is not None:
            phase.latency.record_ns(sample.ns)
            if phase.name == "flood" and phase.round >= 0:
                slowest.append((round(sample.ns / 1e6, 2), round(sample.asked - phase.start, 2)))
    slowest.sort(reverse=True)
    counted = [p for p in phases if p.round >= 0]
    pooled = {name: Latency(name) for name in ("quiet", "flood")}
    for p in counted:
        pooled[p.name].hist.add(p.latency.hist)
    quiet, noisy = pooled["quiet"].summary(), pooled["flood"].summary()
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        q = next(p for p in counted if p.round == r and p.name == "quiet")
        f = next(p for p in counted if p.round == r and p.name == "flood")
        qs, fs = q.latency.summary(), f.latency.summary()
        rounds.append(
            {
                "round": r,
                "first": "quiet" if q.start < f.start else "flood",
                "quiet_p50_ms": qs["p50_ms"],
                "quiet_p99_ms": qs["p99_ms"],
                "flood_p50_ms": fs["p50_ms"],
                "flood_p99_ms": fs["p99_ms"],
                "p50_ratio": _ratio(fs["p50_ms"], qs["p50_ms"]),
                "p99_ratio": _ratio(fs["p99_ms"], qs["p99_ms"]),
                "node_cpu_s": {"quiet": q.node_cpu_s, "flood": f.node_cpu_s},
            }
        )
    p50_ratio = _ratio(noisy["p50_ms"], quiet["p50_ms"])
    p99_ratio = _ratio(noisy["p99_ms"], quiet["p99_ms"])
    first_flood = phases[0].start
    last = phases[-1].end
    sends = _flood_figures(
        phases, "sends", limits["send_rate"], limits["send_burst"], first_flood, last
    )
    searches = _flood_figures(
        phases, "searches", limits["read_rate"], limits["read_burst"], first_flood, last
    )
    at_limit = all(
        f["sustained_over_limit"] is not None and abs(f["sustained_over_limit"] - 1) <= 0.05
        for f in (sends, searches)
        if f is not None
    )
    return {
        "params": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": machine(),
        "node_started_by_bench": started_here,
        "limits": limits,
        "neighbour": {
            "quiet": quiet,
            "flood": noisy,
            "p50_ratio": p50_ratio,
            "p99_ratio": p99_ratio,
            "rounds_p50_ratio": spread([r["p50_ratio"] for r in rounds]),
            "rounds_p99_ratio": spread([r["p99_ratio"] for r in rounds]),
            "rounds": rounds,
            "sends": len(cast.neighbour.samples),
            "flood_slowest_ms_at_s": slowest[:5],
            "never_refused": {"ok": not refused, **refused},
        },
        "flooder": {
            "sessions": args.sessions,
            "sessions_open": {
                "ok": cast.flooders_open == args.sessions,
                "at_end": cast.flooders_open,
            },
            "mode": args.flooder,
            "sends": sends,
            "searches": searches,
        },
        "verdict": {
            "target_max_ratio": TARGET_MAX_RATIO,
            "p50_within": p50_ratio is not None and p50_ratio <= TARGET_MAX_RATIO,
            "p99_within": p99_ratio is not None and p99_ratio <= TARGET_MAX_RATIO,
            "flooder_at_limit": at_limit,
        },
    }


def render(report: dict[str, Any]) -> str:
    n, f = report["neighbour"], report["flooder"]
    q, x = n["quiet"], n["flood"]
    lines = [
        "",
        f"neighbour send, quiet  p50/p99 {q['p50_ms']:.2f}/{q['p99_ms']:.2f} ms (n={q['count']})",
        f"neighbour send, flood  p50/p99 {x['p50_ms']:.2f}/{x['p99_ms']:.2f} ms (n={x['count']})",
        f"flood/quiet  p50 {n['p50_ratio']} (rounds {_fmtspread(n['rounds_p50_ratio'])})"
        f"  p99 {n['p99_ratio']} (rounds {_fmtspread(n['rounds_p99_ratio'])})",
    ]
    for kind in ("sends", "searches"):
        k = f[kind]
        if k is None:
            continue
        lines.append(
            f"flooder {kind:<8} {k['accepted_per_s']}/s over whole phases,"
            f" sustained {k['sustained_per_s']}/s, limit {k['limit_per_s']}/s"
            f" (burst {k['burst']}), refused {k['refused']},"
            f" answered p50 {k['answer']['p50_ms']} ms"
        )
    v = report["verdict"]
    lines.append(
        f"within {v['target_max_ratio']}x: p50 {v['p50_within']}, p99 {v['p99_within']};"
        f" flooder at the limit: {v['flooder_at_limit']}"
    )
    return "\n".join(lines)


def _fmtspread(spread: dict[str, float | None]) -> str:
    return f"median {spread['median']}, {spread['min']}-{spread['max']}"


def failed(report: dict[str, Any]) -> list[str]:
    checks = {
        "neighbour.never_refused": report["neighbour"]["never_refused"]["ok"],
        "flooder.sessions_open": report["flooder"]["sessions_open"]["ok"],
    }
    for kind in ("sends", "searches"):
        figures = report["flooder"][kind]
        if figures is not None:
            checks[f"flooder.{kind}.within_bucket"] = figures["within_bucket"]["ok"]
    return [name for name, ok in checks.items() if not ok]


def main(argv: Sequence[str] | None = None) -> int:
    args = resolve(build_parser().parse_args(argv))
    raise_fd_limit()
    print("scopenode bench noisy-neighbour")
    print(json.dumps(vars(args), sort_keys=True), flush=True)
    progress = Progress(None)
    try:
        report = trio.run(run, args, progress)
    finally:
        progress.close()
    print(render(report))
    if args.json:
        report_mod.write_json(args.json, report)
        print(f"wrote {args.json}")
    bad = failed(report)
    if bad:
        print(f"correctness checks failed: {', '.join(bad)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    # The neighbour's own process (Neighbour.command).
    _, _, url, target, rate, seed = sys.argv
    trio.run(neighbour_process, url, target, float(rate), int(seed))
