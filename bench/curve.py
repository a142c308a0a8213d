"""``scopenode bench throughput --curve 1,2,4,...``: the throughput curve in one run.

One node, one database server. For every point (``n`` senders) and series
(one sender per scope: ``n`` scopes; two per scope: ``n/2`` scopes) the raw
send statement runs at concurrency ``n`` over as many scopes
(:mod:`bench.dbbaseline`, the node idle) and the throughput workload with
``n`` senders, back to back, so each ratio compares figures taken seconds
apart under the same noise; each phase starts right after a ``CHECKPOINT``.
With ``rounds`` > 1 the phases are repeated, their order rotated each round
(raw, node, floor; node, floor, raw; …), and the point reports the median of
each figure (its ratio the median of the rounds' ratios, with their spread),
the rounds kept beside it. Node
CPU per send comes from ``/proc/<pid>/stat`` over the measured window; the
load average is recorded with every point (the machine may be shared).
Every phase is bounded: ``duration`` seconds and ``max_sends`` sends per
point, ``db_duration`` seconds per raw level.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from bench.dbbaseline import DbPlan, checkpoint, measure_db
from bench.relayfloor import SendFloor, open_send_floor
from bench.stats import MachineCpu, rotated, spread
from bench.workloads import throughput
from bench.workloads.common import Env, WorkloadResult, ratio

SERIES = (1, 2)  # senders per scope
WARM_UP_S = 1.0  # the relay floor's first statements, not measured


@dataclass(frozen=True)
class CurvePlan:
    points: tuple[int, ...]
    duration_s: float
    db_duration_s: float
    max_sends: int
    series: tuple[int, ...] = SERIES
    rounds: int = 1
    # Also run every round through the bare send relay (bench.relayfloor).
    relay_floor: bool = False
    lanes: int = 2
    gather_ms: float = 1.0


def parse_points(text: str) -> tuple[int, ...]:
    points = tuple(int(x) for x in text.split(",") if x.strip())
    if not points or min(points) < 1:
        raise ValueError("--curve takes positive sender counts, e.g. 1,2,4,8")
    return points


def _load() -> float:
    return round(os.getloadavg()[0], 2)


async def run_curve(env: Env, dsn: str, plan: CurvePlan) -> dict[str, Any]:
    """Measure every (series, point); returns ``{"points": [...]}``."""
    out: dict[str, Any] = {"points": [], "rounds": plan.rounds}
    raw_own: dict[int, float | None] = {}
    for per_scope in plan.series:
        for senders in plan.points:
            if per_scope > 1 and senders < per_scope:
                continue
            async with AsyncExitStack() as stack:
                floor = await _open_floor(stack, env, dsn, plan, senders, per_scope)
                rounds = [
                    await _round(env, dsn, plan, senders, per_scope, r, floor)
                    for r in range(plan.rounds)
                ]
            point = _combine(rounds)
            if per_scope == 1:
                raw_own[senders] = point["raw_tx_per_s"]
            # The one-sender-per-scope series' raw figure at the same
            # concurrency (every raw worker on its own scope).
            point["raw_own_scopes_tx_per_s"] = raw_own.get(senders)
            out["points"].append(point)
    return out


async def _round(
    env: Env,
    dsn: str,
    plan: CurvePlan,
    senders: int,
    per_scope: int,
    r: int,
    floor: SendFloor | None,
) -> dict[str, Any]:
    """The raw, node and (with ``relay_floor``) floor phases at this point, each
    after a ``CHECKPOINT``, in the order of round ``r`` (rotated each round:
    a drift of the machine's speed within a point favours none of them)."""
    load_before = _load()
    order = rotated(["raw", "node", "floor"] if floor else ["raw", "node"], r)
    level: dict[str, Any] = {}
    floor_figures: dict[str, Any] = {}
    raw_cpu: dict[str, float] | None = None
    node: WorkloadResult | None = None
    for name in order:
        if name == "raw":
            level, raw_cpu = await _raw_phase(env, dsn, plan, senders, per_scope)
        elif name == "node":
            node = await _node_phase(env, dsn, plan, senders, per_scope)
        elif floor is not None:
            floor_figures = await _floor_phase(env, dsn, plan, senders, floor)
    assert node is not None
    res = node.results
    node_cpu = node.cpu.node_cpu_s
    sends = res["sends"]
    point = floor_figures | {
        "senders_per_scope": per_scope,
        "senders": senders,
        "scopes": _scopes(senders, per_scope),
        "sends": sends,
        "sends_per_s": res["sends_per_s"],
        "raw_tx_per_s": level["tx_per_s"],
        "ratio": ratio(res["sends_per_s"], level["tx_per_s"]),
        "p50_ms": res["latency"].get("p50_ms"),
        "raw_p50_ms": level.get("p50_ms"),
        "p99_ms": res["latency"].get("p99_ms"),
        "node_cpu_ms_per_send": round(1000 * node_cpu / sends, 3) if node_cpu and sends else None,
        "generator_cpu_s": node.cpu.generator_cpu_s,
        # The whole machine: busy share and CPU ms per send (node, load
        # generator and PostgreSQL together), and the same for the raw phase
        # per transaction. Raw's window also holds its connects; they are
        # milliseconds of seconds.
        "machine_busy": _get(node.cpu.machine, "busy"),
        "machine_cpu_ms_per_send": _per(node.cpu.machine, sends),
        "raw_machine_busy": _get(raw_cpu, "busy"),
        "raw_machine_cpu_ms_per_tx": _per(raw_cpu, level.get("transactions")),
        # The node's send statements in the run.
        "statements": res.get("statements"),
        "errors": res["errors"],
        "load_avg_1m": [load_before, _load()],
        "at": time.strftime("%H:%M:%S"),
        "order": order,
    }
    if floor_figures:
        point["floor_ratio"] = ratio(floor_figures["floor_sends_per_s"], level["tx_per_s"])
        point["node_over_floor"] = ratio(res["sends_per_s"], floor_figures["floor_sends_per_s"])
    return point


def _scopes(senders: int, per_scope: int) -> int:
    return max(1, senders // per_scope)


async def _raw_phase(
    env: Env, dsn: str, plan: CurvePlan, senders: int, per_scope: int
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """The raw statement at this concurrency, measured again for each series
    and round: the database grows during the run, and so does its cost."""
    env.progress.phase(f"raw x{senders}", 1)
    await checkpoint(dsn)
    machine = MachineCpu()
    # Its workers share scopes as the senders do: two senders per scope are
    # compared with two raw workers per scope.
    raw = await measure_db(
        dsn,
        DbPlan(
            sequential=0,
            concurrency=(senders,),
            duration_s=plan.db_duration_s,
            per_scope=per_scope,
        ),
    )
    cpu = machine.stop()
    env.progress.close()
    level: dict[str, Any] = raw["concurrent"][str(senders)]
    return level, cpu


async def _open_floor(
    stack: AsyncExitStack, env: Env, dsn: str, plan: CurvePlan, senders: int, per_scope: int
) -> SendFloor | None:
    """The bare send relay for every round of a point, as the node stays up
    between them: its connections and prepared statements are made once, and a
    warm-up (not measured) runs its first statements before the first round."""
    if not plan.relay_floor:
        return None
    env.progress.phase(f"relay floor x{senders} warm-up", 1)
    floor = await open_send_floor(stack, dsn, senders, per_scope, plan.lanes, plan.gather_ms)
    await floor.run_phase(min(plan.duration_s, WARM_UP_S), plan.max_sends)
    await floor.settle()
    env.progress.close()
    return floor


async def _floor_phase(
    env: Env, dsn: str, plan: CurvePlan, senders: int, floor: SendFloor
) -> dict[str, Any]:
    """The same load through the bare send relay: the least a Python relay
    committing with the node's own committer pays here (bench.relayfloor)."""
    env.progress.phase(f"relay floor x{senders}", 1)
    await checkpoint(dsn)
    statements_before, _ = await floor.settle()
    phase = await floor.run_phase(plan.duration_s, plan.max_sends)
    statements = (await floor.settle())[0] - statements_before
    env.progress.close()
    return {
        "floor_sends_per_s": phase["sends_per_s"],
        "floor_p50_ms": phase.get("p50_ms"),
        "floor_sends_per_statement": (
            round(int(phase["sends"]) / statements, 2) if statements else None
        ),
    }


async def _node_phase(
    env: Env, dsn: str, plan: CurvePlan, senders: int, per_scope: int
) -> WorkloadResult:
    await checkpoint(dsn)
    return await throughput.run(
        env,
        senders=senders,
        scopes=_scopes(senders, per_scope),
        duration_s=plan.duration_s,
        max_sends=plan.max_sends,
    )


def _combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A point from its rounds: the median of every figure (the ratio is the
    median of the rounds' own ratios, not a ratio of medians), counts summed,
    and the rounds themselves kept."""
    if len(rounds) == 1:
        return dict(rounds[0])
    point = dict(rounds[0])
    # A figure missing from one round (None) is the median of the others'.
    figures = {k for r in rounds for k, v in r.items() if isinstance(v, float | int)}
    for key in figures - _FIXED:
        values = [r[key] for r in rounds if r.get(key) is not None]
        point[key] = statistics.median(values)
    for key in ("sends", "statements"):
        counts = [r.get(key) for r in rounds]
        point[key] = sum(counts) if all(c is not None for c in counts) else None
    point["errors"] = dict(sum((Counter(r["errors"]) for r in rounds), Counter()))
    point["load_avg_1m"] = [rounds[0]["load_avg_1m"][0], rounds[-1]["load_avg_1m"][1]]
    point["rounds"] = rounds
    # How far the rounds' own ratios spread around the median above.
    for key in ("ratio", "floor_ratio", "node_over_floor"):
        if any(r.get(key) is not None for r in rounds):
            point[f"{key}_spread"] = spread([r.get(key) for r in rounds])
    return point


_FIXED = frozenset({"senders_per_scope", "senders", "scopes", "sends", "statements"})


def _get(cpu: dict[str, float] | None, key: str) -> float | None:
    return cpu.get(key) if cpu else None


def _per(cpu: dict[str, float] | None, count: int | None) -> float | None:
    if not cpu or not count:
        return None
    return round(1000 * cpu["cpu_s"] / count, 3)


def render(curve: dict[str, Any]) -> str:
    head = (
        "| senders/scope | senders | scopes | sends/s | raw tx/s | ratio | p50 ms | raw p50 ms"
        " | node CPU ms/send | sends/statement"
        " | load avg (1 min, before/after) | raw tx/s, a scope per worker"
        " | machine busy, node / raw | machine CPU ms per send / per raw tx |"
    )
    lines = [head, _rule(head)]
    for p in curve["points"]:
        cpu = p["node_cpu_ms_per_send"]
        statements = p.get("statements")
        per_statement = p["sends"] / statements if statements else None
        lines.append(
            f"| {p['senders_per_scope']} | {p['senders']} | {p['scopes']} | "
            f"{p['sends_per_s']:,.0f} | {p['raw_tx_per_s']:,.0f} | "
            f"{_num(p['ratio'], '{:.2f} ×')} | {_num(p['p50_ms'], '{:.1f}')} | "
            f"{_num(p['raw_p50_ms'], '{:.1f}')} | {_num(cpu, '{:.3f}')} | "
            f"{_num(per_statement, '{:.2f}')} | "
            f"{p['load_avg_1m'][0]:.1f} / {p['load_avg_1m'][1]:.1f} | "
            f"{_num(p.get('raw_own_scopes_tx_per_s'), '{:,.0f}')} | "
            f"{_num(p.get('machine_busy'), '{:.0%}')} / {_num(p.get('raw_machine_busy'), '{:.0%}')}"
            f" | {_num(p.get('machine_cpu_ms_per_send'), '{:.3f}')}"
            f" / {_num(p.get('raw_machine_cpu_ms_per_tx'), '{:.3f}')} |"
        )
    return "\n".join(lines) + "\n"


def _rule(head: str) -> str:
    return "|" + " --- |" * (head.count("|") - 1)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def plot(directory: str, curve: dict[str, Any]) -> str:
    """sends/s and raw tx/s against senders (log 2), node CPU per send below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for per_scope in sorted({p["senders_per_scope"] for p in curve["points"]}):
        pts = [p for p in curve["points"] if p["senders_per_scope"] == per_scope]
        xs = [p["senders"] for p in pts]
        label = f"{per_scope} sender{'s' if per_scope > 1 else ''}/scope"
        (line,) = top.plot(xs, [p["sends_per_s"] for p in pts], marker="o", label=f"node, {label}")
        top.plot(
            xs,
            [p["raw_tx_per_s"] for p in pts],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
            label=f"raw statement (measured with {label})",
        )
        bottom.plot(
            xs, [p["node_cpu_ms_per_send"] or 0.0 for p in pts], marker="o", label=f"node, {label}"
        )
    top.set_ylabel("sends/s")
    top.set_title("throughput against the raw send statement, same run")
    top.legend(fontsize=8)
    top.grid(True, alpha=0.3)
    bottom.set_ylabel("node CPU per send (ms)")
    bottom.set_xlabel("concurrent senders")
    bottom.set_xscale("log", base=2)
    bottom.legend(fontsize=8)
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    path = os.path.join(directory, "throughput-curve.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
