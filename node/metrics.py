"""Counters and gauges rendered in the Prometheus text exposition format (0.0.4).

Every family is written with its HELP and TYPE lines and at least one sample:
a labelled counter nothing has counted yet shows its known label values at 0,
so a scraper sees the family (and a rate of 0) from the node's first scrape.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from actors import lru
from protocol.errors import CloseCode, ErrorCode

SEND_STATES = ("sent", "already_sent", "held", "partial_held")
OUTBOX_STATES = ("pending", "leased", "delivered", "failed", "suppressed")
# Gauges are registered by name where their source lives (node/app.py); their
# help text lives here so every family is described in one place.
GAUGE_HELP = {
    "sessions": "Live sessions on this node.",
    "actors": "Scope actors in memory on this node.",
    "fence_losses": (
        "Send batches decided again because the actor's cached scope was behind the"
        " database (mostly: another node wrote the scope) since start (monotonic)."
    ),
    "group_commit_statements": "Group-commit statements executed since start (monotonic).",
    "group_commit_sends": "Sends committed through the group committer since start (monotonic).",
    "resident_bytes": "Resident memory of the node process at the memory governor's last look.",
    "memory_ceiling_bytes": "Resident memory over which idle actors are passivated (LRU).",
    "memory_passivated_actors": "Actors passivated to stay under the memory ceiling (monotonic).",
    "gc_full_collections": "Full collections of the cyclic garbage collector since start (monotonic).",
    "gc_full_pause_seconds": "Time the node stood still in full collections since start (monotonic).",
    "gc_longest_full_pause_seconds": "The longest single full collection since start.",
}

Labels = Mapping[str, str]

# Upper bounds (seconds) of the latency histograms' buckets: a send on an idle
# node takes about a millisecond, a search ten, a slow one a second or more.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class Histogram:
    """Observations counted into fixed buckets (Prometheus ``histogram``)."""

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: over every bound
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += times
        self.sum += value * times

    def samples(self, name: str) -> Iterable[tuple[str, Labels, float]]:
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            yield f"{name}_bucket", {"le": _number(bound)}, running
        yield f"{name}_bucket", {"le": "+Inf"}, self.total
        yield f"{name}_sum", {}, self.sum
        yield f"{name}_count", {}, self.total


HISTOGRAM_HELP = {
    "send_commit_seconds": (
        "Time from an actor handing a send to the database to its commit, per send."
    ),
    "send_reply_seconds": "Time from the node taking up a send request to its reply, per send.",
    "delivery_seconds": (
        "Time from a message's creation on the node that took it to its events queued"
        " on this node's sessions, per message."
    ),
    "search_seconds": "Time of a search request, from its turn to its answer.",
}


class Metrics:
    def __init__(self) -> None:
        self.send_states: Counter[str] = Counter()
        self.compat_sends = 0
        self.sessions_opened = 0
        self.sessions_closed: Counter[int] = Counter()
        self.frames_in = 0
        self.errors: Counter[str] = Counter()
        self.gauges: dict[str, Callable[[], float]] = {}
        self.outbox_states: dict[str, int] = {}
        self.histograms = {name: Histogram() for name in HISTOGRAM_HELP}
        self.send_commit = self.histograms["send_commit_seconds"]
        self.send_reply = self.histograms["send_reply_seconds"]
        self.delivery = self.histograms["delivery_seconds"]
        self.search = self.histograms["search_seconds"]

    def set_outbox_states(self, counts: dict[str, int]) -> None:
        self.outbox_states = dict(counts)

    def on_send(self, state: str, compat: bool) -> None:
        self.send_states[state] += 1
        if compat:
            self.compat_sends += 1

    def render(self) -> str:
        out: list[str] = []
        states = [*SEND_STATES, *sorted(set(self.send_states) - set(SEND_STATES))]
        _family(
            out,
            "scopenode_sends_total",
            "counter",
            "Send results by state.",
            (({"state": s}, self.send_states[s]) for s in states),
        )
        total = sum(self.send_states.values())
        held = self.send_states["held"] + self.send_states["partial_held"]
        _family(
            out,
            "scopenode_held_ratio",
            "gauge",
            "Share of sends answered held or partial_held since start.",
            [({}, held / total if total else 0.0)],
        )
        _family(
            out,
            "scopenode_compat_sends_total",
            "counter",
            "Agent sends accepted without freshness (sessions that did not declare it).",
            [({}, self.compat_sends)],
        )
        _family(
            out,
            "scopenode_sessions_opened_total",
            "counter",
            "WebSocket sessions opened.",
            [({}, self.sessions_opened)],
        )
        codes = sorted({int(c) for c in CloseCode} | set(self.sessions_closed))
        _family(
            out,
            "scopenode_sessions_closed_total",
            "counter",
            "WebSocket sessions closed, by close code.",
            (({"code": str(c)}, self.sessions_closed[c]) for c in codes),
        )
        _family(
            out,
            "scopenode_frames_in_total",
            "counter",
            "Frames received from clients.",
            [({}, self.frames_in)],
        )
        names = sorted({c.value for c in ErrorCode} | set(self.errors))
        _family(
            out,
            "scopenode_errors_total",
            "counter",
            "Error frames sent to clients, by error code.",
            (({"code": n}, self.errors[n]) for n in names),
        )
        _family(
            out,
            "scopenode_outbox_rows",
            "gauge",
            "Outbox rows by status at the outbox worker's last count.",
            (({"status": s}, self.outbox_states.get(s, 0)) for s in OUTBOX_STATES),
        )
        caches = sorted(lru.sizes().items())
        if caches:  # none before the modules that hold them are imported
            _family(
                out,
                "scopenode_cache_entries",
                "gauge",
                "Entries of each capped cache (docs/operations.md has every cap).",
                (({"cache": name}, entries) for name, entries in caches),
            )
        for name, histogram in self.histograms.items():
            _histogram(out, f"scopenode_{name}", HISTOGRAM_HELP[name], histogram)
        for name, read in sorted(self.gauges.items()):
            help_text = GAUGE_HELP.get(name, name.replace("_", " ").capitalize() + ".")
            _family(out, f"scopenode_{name}", "gauge", help_text, [({}, read())])
        return "\n".join(out) + "\n"


def _family(
    out: list[str],
    name: str,
    type_: str,
    help_text: str,
    samples: Iterable[tuple[Labels, float]],
) -> None:
    out.append(f"# HELP {name} {_escape_help(help_text)}")
    out.append(f"# TYPE {name} {type_}")
    out.extend(_sample(name, labels, value) for labels, value in samples)


def _histogram(out: list[str], name: str, help_text: str, histogram: Histogram) -> None:
    out.append(f"# HELP {name} {_escape_help(help_text)}")
    out.append(f"# TYPE {name} histogram")
    out.extend(_sample(*sample) for sample in histogram.samples(name))


def _sample(name: str, labels: Labels, value: float) -> str:
    rendered = ",".join(f'{key}="{_escape_label(val)}"' for key, val in labels.items())
    return f"{name}{{{rendered}}} {_number(value)}" if rendered else f"{name} {_number(value)}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    # Label values may come from clients (close codes) or future error codes:
    # escape so no value can end the label or the line.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
