"""``scopenode bench search-team``: search as a team meets it, while the team writes.

Starts a node (``bench/nodeproc.py``, raised rate limits) and builds the
corpus **through the node's own sends**: one workspace of ``--humans`` humans
and ``--channels`` public channels, each human in ``--channels-per-human`` of
them (members and tokens written through storage as ``bench soak`` does),
``--senders`` concurrent senders sending ``--messages`` messages in a team's
mix — DMs (``--dm-share``), new threads on recent channel messages
(``--new-thread-share``), replies to recent threads (``--thread-reply-share``),
the rest channel messages — with Zipf text (``--zipf`` over ``--vocabulary``
made-up words, and ``deploy``, ``café``, ``東京`` and ``🚀`` placed at common
ranks).

Then, while a writer keeps sending the same mix at ``--write-rate`` sends/s
(open loop), it times requests through the node's WebSocket as two viewers
(humans in ``--channels-per-human`` channels, so hundreds of threads are
readable to each) for each query class of ``CLASSES``: ``--rounds`` rounds,
the class order rotated each round, ``--queries`` requests per class, round
and viewer. Reports p50/p99 per class and viewer, the spread of the per-round
medians, and the messages stored when the measurement started and ended.
Prints a table; ``--json`` writes the report. Every loop is bounded in count
and time; all traffic is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from bench import leanws
from bench import report as report_mod
from bench.baseline import open_database
from bench.client import RequestError, Session, SessionClosed, open_session, ws_url
from bench.nodeproc import open_node
from bench.options import Size, add_target_options, bench_parser, fill_sizes
from bench.soak import SYLLABLES, Person, Team, build_channels, provision
from bench.stats import machine, raise_fd_limit
from storage import audit, pg

# Real words at Zipf ranks (0 = most common) where they are common.
PLACED = {"deploy": 3, "café": 8, "東京": 12, "🚀": 16}
CLASSES = (
    "common",
    "rare",
    "phrase",
    "cjk",
    "emoji",
    "in_other",
    "in_mine_word",
    "nowhere",
    "history",
)
REQUEST_TIMEOUT_S = 60.0
MAX_IN_FLIGHT = 200
HISTORY_LIMIT = 50
SEARCH_LIMIT = 20

SIZES = {
    "messages": Size(60_000, 800, "corpus size in sends"),
    "senders": Size(8, 8, "concurrent senders building it"),
    "rounds": Size(5, 2, "measurement rounds"),
    "queries": Size(10, 2, "per class, round and viewer"),
    "warmup_s": Size(3.0, 1.0, "seconds the writer runs before the first query"),
}


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser("search-team", __doc__, "a tiny corpus and few rounds (tests)", SIZES)
    p.add_argument("--write-rate", type=float, default=39.0, help="sends/s while measuring")
    p.add_argument("--build-timeout", type=float, default=1800.0, help="bound of the build, s")
    p.add_argument("--measure-timeout", type=float, default=600.0, help="bound of the measure, s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE")
    add_target_options(p, "ws://HOST:PORT of a running node (default: start one)")
    t = p.add_argument_group("team")
    t.add_argument("--humans", type=int, default=30)
    t.add_argument("--channels", type=int, default=20)
    t.add_argument("--channels-per-human", type=int, default=10)
    t.add_argument("--vocabulary", type=int, default=5000)
    t.add_argument("--zipf", type=float, default=1.1)
    t.add_argument("--new-thread-share", type=float, default=0.17)
    t.add_argument("--thread-reply-share", type=float, default=0.15)
    t.add_argument("--dm-share", type=float, default=0.13)
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    fill_sizes(args, SIZES)
    # What bench/soak.py's provisioning reads: humans only, no agents.
    args.public_agents = 0
    args.private_agents = 0
    args.channels_per_agent = 0
    return args


# ---------------------------------------------------------------- text


class Vocabulary:
    """Made-up words drawn by Zipf rank, with PLACED's real words at their ranks."""

    def __init__(self, size: int, exponent: float, rng: random.Random) -> None:
        made: set[str] = set()
        while len(made) < size:
            made.add("".join(rng.choices(SYLLABLES, k=rng.randint(2, 4))))
        words = sorted(made)
        rng.shuffle(words)
        self.made_up = list(words)  # by rank, without the real words
        for word, rank in sorted(PLACED.items(), key=lambda kv: kv[1]):
            words.insert(rank, word)
        self.words = words
        self.cum = list(itertools.accumulate(1 / (r + 1) ** exponent for r in range(len(words))))

    def text(self, rng: random.Random) -> str:
        return " ".join(rng.choices(self.words, cum_weights=self.cum, k=rng.randint(4, 14)))


# ---------------------------------------------------------------- the team's sends


@dataclass
class Tally:
    """What the sends built, as the node acknowledged them."""

    acked: int = 0
    channel: int = 0
    thread: int = 0
    dm: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    thread_scopes: dict[str, str] = field(default_factory=dict)  # thread scope -> slug
    dm_scopes: set[str] = field(default_factory=set)
    by_slug: Counter[str] = field(default_factory=Counter)  # channel + its threads
    send_ms: list[float] = field(default_factory=list)


class Mix:
    """Targets and texts of the team's mix; shared by all senders (one trio thread)."""

    def __init__(self, args: argparse.Namespace, team: Team, vocab: Vocabulary) -> None:
        self.args, self.team, self.vocab = args, team, vocab
        self.rng = random.Random(args.seed + 2)
        self.roots: dict[str, deque[str]] = {}  # slug -> recent channel messages
        self.threads: dict[str, deque[str]] = {}  # slug -> recent thread roots
        self.ids = itertools.count(1)

    def target(self, person: Person) -> tuple[str, str, str | None]:
        """(target, kind, slug): kind is channel, thread or dm."""
        a, rng = self.args, self.rng
        roll = rng.random()
        if roll < a.dm_share:
            other = rng.choice([h for h in self.team.humans if h is not person])
            return f"dm:{other.member_id}", "dm", None
        slug = rng.choice(person.channels)
        roll -= a.dm_share
        if roll < a.new_thread_share:
            roots = self.roots.get(slug)
            if roots:
                root = roots.popleft()
                self.threads.setdefault(slug, deque(maxlen=200)).append(root)
                return f"#{slug}:{root}", "thread", slug
        elif roll < a.new_thread_share + a.thread_reply_share and self.threads.get(slug):
            return f"#{slug}:{rng.choice(self.threads[slug])}", "thread", slug
        return f"#{slug}", "channel", slug

    async def send(self, session: Session, person: Person, tally: Tally) -> bool:
        target, kind, slug = self.target(person)
        cmid = f"team-{self.args.seed}-{next(self.ids)}"
        t0 = time.perf_counter()
        try:
            r = await session.request(
                "send",
                timeout=REQUEST_TIMEOUT_S,
                target=target,
                content=self.vocab.text(self.rng),
                clientMessageId=cmid,
            )
        except RequestError as e:
            tally.errors[e.code] += 1
            return False
        except (SessionClosed, leanws.Closed, trio.ClosedResourceError, trio.TooSlowError) as e:
            tally.errors[f"request_{type(e).__name__}"] += 1
            return False
        if r.get("state") not in ("sent", "already_sent"):
            tally.errors[f"state_{r.get('state')}"] += 1
            return False
        tally.send_ms.append((time.perf_counter() - t0) * 1000)
        tally.acked += 1
        scope = str(r["targetKey"])
        if kind == "dm":
            tally.dm += 1
            tally.dm_scopes.add(scope)
            return True
        assert slug is not None
        tally.by_slug[slug] += 1
        if kind == "thread":
            tally.thread += 1
            tally.thread_scopes[scope] = slug
        else:
            tally.channel += 1
            self.roots.setdefault(slug, deque(maxlen=100)).append(str(r["messageId"]))
        return True


@asynccontextmanager
async def team_sessions(
    url: str, people: Sequence[Person]
) -> AsyncIterator[list[tuple[Person, Session]]]:
    """One browser session per person, kept alive with pings."""
    async with trio.open_nursery() as nursery:
        sessions: list[tuple[Person, Session]] = []
        for person in people:
            session = await nursery.start(_held_session, url, person)
            sessions.append((person, session))
        try:
            yield sessions
        finally:
            nursery.cancel_scope.cancel()


async def _held_session(
    url: str, person: Person, *, task_status: trio.TaskStatus[Session] = trio.TASK_STATUS_IGNORED
) -> None:
    async with open_session(url, person.token, kind="browser") as s:
        task_status.started(s)
        period = max(1.0, int(s.welcome.get("heartbeatMs", 20_000)) / 1000 / 2)
        while s.closed is None:
            await trio.sleep(period)
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await s.ping()


async def build(
    mix: Mix, sessions: Sequence[tuple[Person, Session]], args: argparse.Namespace
) -> dict[str, Any]:
    """``args.messages`` acked sends from ``args.senders`` concurrent senders."""
    tally = Tally()
    attempts = itertools.count()
    max_attempts = int(args.messages * 1.2) + 100
    rng = random.Random(args.seed + 3)

    claimed = 0  # acked or in flight: the corpus stops at exactly args.messages

    async def sender() -> None:
        nonlocal claimed
        while claimed < args.messages and next(attempts) < max_attempts:
            claimed += 1
            person, session = rng.choice(sessions)
            if not await mix.send(session, person, tally):
                claimed -= 1

    started = time.monotonic()
    with trio.move_on_after(args.build_timeout):
        async with trio.open_nursery() as nursery:
            for _ in range(args.senders):
                nursery.start_soon(sender)
    elapsed = time.monotonic() - started
    return {
        "tally": tally,
        "build_s": round(elapsed, 1),
        "sends_per_s": round(tally.acked / elapsed, 1) if elapsed else None,
        "complete": tally.acked >= args.messages,
    }


# ---------------------------------------------------------------- the writer


async def writer(
    mix: Mix,
    sessions: Sequence[tuple[Person, Session]],
    rate: float,
    stop: trio.Event,
    bound_s: float,
    tally: Tally,
    skipped: Counter[str],
) -> None:
    """Start one send every 1/``rate`` s, whatever the replies take, until
    ``stop`` or ``bound_s``; past MAX_IN_FLIGHT a tick is skipped and counted."""
    if rate <= 0:
        return
    rng = random.Random(mix.args.seed + 4)
    in_flight = 0

    async def one() -> None:
        nonlocal in_flight
        in_flight += 1
        try:
            person, session = rng.choice(sessions)
            await mix.send(session, person, tally)
        finally:
            in_flight -= 1

    t0 = trio.current_time()
    with trio.move_on_after(bound_s + REQUEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for k in range(int(rate * bound_s)):
                at = t0 + k / rate
                with trio.move_on_at(at):
                    await stop.wait()
                if stop.is_set():
                    break
                if in_flight >= MAX_IN_FLIGHT:
                    skipped["writer_overload"] += 1
                    continue
                nursery.start_soon(one)


# ---------------------------------------------------------------- queries


@dataclass
class Viewer:
    person: Person
    session: Session
    channel_ids: dict[str, str]  # the viewer's channels: slug -> scope id
    others: list[str]  # slugs of channels it is not in
    busiest: str  # scope id of its busiest channel
    readable_threads: int


class Queries:
    """The request of class ``cls`` number ``i`` for a viewer."""

    def __init__(self, vocab: Vocabulary, rng: random.Random) -> None:
        made = vocab.made_up
        self.common = [made[0], "deploy", made[1], "café", made[2]]
        rare_ranks = range(len(made) // 5, len(made) * 2 // 5)
        self.rare = [made[r] for r in rng.sample(rare_ranks, 20)]
        self.phrases = [f'"{a} {b}"' for a, b in itertools.permutations(made[:4], 2)]
        # Made-up words start with one of SYLLABLES' consonants: never with q.
        self.nowhere = ["q" + "".join(rng.choices("qxjwhc", k=6)) for _ in range(20)]

    def request(self, cls: str, i: int, v: Viewer) -> tuple[str, dict[str, Any]]:
        if cls == "history":
            return "history", {"target": f"scope:{v.busiest}", "limit": HISTORY_LIMIT}
        return "search", {"query": self.query(cls, i, v), "limit": SEARCH_LIMIT}

    def query(self, cls: str, i: int, v: Viewer) -> str:
        def pick(options: Sequence[str]) -> str:
            return options[i % len(options)]

        if cls == "common":
            return pick(self.common)
        if cls == "rare":
            return pick(self.rare)
        if cls == "phrase":
            return pick(self.phrases)
        if cls == "cjk":
            return "東京"
        if cls == "emoji":
            return "🚀"
        if cls == "in_other":
            return f"in:#{pick(v.others)}"
        if cls == "in_mine_word":
            return f"in:#{pick(sorted(v.channel_ids))} {pick(self.common)}"
        if cls == "nowhere":
            return pick(self.nowhere)
        raise ValueError(cls)


@dataclass
class Sample:
    round: int
    cls: str
    viewer: str
    ms: float
    hits: int


async def measure(
    viewers: Sequence[Viewer], queries: Queries, args: argparse.Namespace, conn: pg.TrioConnection
) -> tuple[list[Sample], Counter[str], list[int], bool]:
    """``args.rounds`` rounds of every class, the order rotated each round."""
    samples: list[Sample] = []
    errors: Counter[str] = Counter()
    messages_at_round: list[int] = []
    complete = False
    with trio.move_on_after(args.measure_timeout):
        for r in range(args.rounds):
            messages_at_round.append(await _messages(conn, args.workspace_id))
            order = CLASSES[r % len(CLASSES) :] + CLASSES[: r % len(CLASSES)]
            for cls in order:
                for i in range(args.queries):
                    turn = viewers if i % 2 == 0 else list(reversed(viewers))
                    for v in turn:
                        op, fields = queries.request(cls, r * args.queries + i, v)
                        t0 = time.perf_counter()
                        try:
                            result = await v.session.request(
                                op, timeout=REQUEST_TIMEOUT_S, **fields
                            )
                        except RequestError as e:
                            errors[f"{cls}:{e.code}"] += 1
                            continue
                        ms = (time.perf_counter() - t0) * 1000
                        hits = len(result.get("hits" if op == "search" else "messages") or ())
                        samples.append(Sample(r, cls, v.person.handle, ms, hits))
        complete = True
    return samples, errors, messages_at_round, complete


async def _messages(conn: pg.TrioConnection, workspace_id: str) -> int:
    _, messages = await audit.workspace_totals(conn, workspace_id)
    return messages


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 2)


def summarise(samples: Sequence[Sample], viewers: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls in CLASSES:
        per_viewer: dict[str, Any] = {}
        for handle in viewers:
            mine = [s for s in samples if s.cls == cls and s.viewer == handle]
            if not mine:
                per_viewer[handle] = {"count": 0}
                continue
            ms = [s.ms for s in mine]
            rounds = sorted({s.round for s in mine})
            medians = [statistics.median(s.ms for s in mine if s.round == r) for r in rounds]
            per_viewer[handle] = {
                "count": len(mine),
                "p50_ms": pct(ms, 0.5),
                "p99_ms": pct(ms, 0.99),
                "round_p50_min_ms": round(min(medians), 2),
                "round_p50_max_ms": round(max(medians), 2),
                "hits_median": statistics.median(s.hits for s in mine),
            }
        out[cls] = per_viewer
    return out


# ---------------------------------------------------------------- run


def _viewer(person: Person, session: Session, team: Team, tally: Tally) -> Viewer:
    mine = {slug: team.channel_ids[slug] for slug in person.channels}
    others = [slug for slug in team.channel_ids if slug not in mine]
    busiest = max(mine, key=lambda slug: tally.by_slug[slug])
    threads = sum(slug in mine for slug in tally.thread_scopes.values())
    return Viewer(person, session, mine, others, mine[busiest], threads)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with (
        open_node(args.url, data_dir=args.data_dir, database_url=args.database_url) as node,
        open_database(args.database_url, node.data_dir) as dsn,
    ):
        rng = random.Random(args.seed)
        started = time.monotonic()
        team = await provision(dsn, args, rng)
        args.workspace_id = team.workspace_id
        url = ws_url(node.base_url, team.workspace_id)
        await build_channels(team, url, args, rng)
        vocab = Vocabulary(args.vocabulary, args.zipf, random.Random(args.seed + 1))
        mix = Mix(args, team, vocab)
        print(f"team ready after {time.monotonic() - started:.1f} s", flush=True)
        async with (
            await pg.connect(dsn, autocommit=True) as conn,
            team_sessions(url, team.humans) as sessions,
        ):
            built = await build(mix, sessions, args)
            tally: Tally = built["tally"]
            print(
                f"corpus: {tally.acked} sends in {built['build_s']} s"
                f" ({built['sends_per_s']}/s), {len(tally.thread_scopes)} threads",
                flush=True,
            )
            scopes, messages_built = await audit.workspace_totals(conn, team.workspace_id)
            async with team_sessions(url, team.humans[1:3]) as viewer_sessions:
                viewers = [_viewer(p, s, team, tally) for p, s in viewer_sessions]
                queries = Queries(vocab, random.Random(args.seed + 5))
                written, skipped = Tally(), Counter[str]()
                stop = trio.Event()
                bound_s = args.warmup_s + args.measure_timeout
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        writer, mix, sessions, args.write_rate, stop, bound_s, written, skipped
                    )
                    await trio.sleep(args.warmup_s)
                    t0 = time.monotonic()
                    before = await _messages(conn, team.workspace_id)
                    samples, errors, at_round, complete = await measure(
                        viewers, queries, args, conn
                    )
                    after = await _messages(conn, team.workspace_id)
                    measure_s = time.monotonic() - t0
                    stop.set()
    handles = [v.person.handle for v in viewers]
    return {
        "params": {k: v for k, v in vars(args).items() if k not in ("json", "workspace_id")},
        "machine": machine(),
        "corpus": {
            "acked_sends": tally.acked,
            "build_s": built["build_s"],
            "sends_per_s": built["sends_per_s"],
            "complete": built["complete"],
            "channel_messages": tally.channel,
            "thread_messages": tally.thread,
            "dm_messages": tally.dm,
            "channels": len(team.channel_ids),
            "thread_scopes": len(tally.thread_scopes),
            "dm_scopes": len(tally.dm_scopes),
            "scopes": scopes,
            "messages": messages_built,
            "send_p50_ms": pct(tally.send_ms, 0.5) if tally.send_ms else None,
            "errors": dict(tally.errors),
        },
        "viewers": [
            {
                "handle": v.person.handle,
                "channels": len(v.channel_ids),
                "readable_threads": v.readable_threads,
            }
            for v in viewers
        ],
        "measurement": {
            "messages_at_start": before,
            "messages_at_end": after,
            "messages_at_round_start": at_round,
            "seconds": round(measure_s, 1),
            "complete": complete,
            "errors": dict(errors),
            "writer": {
                "rate": args.write_rate,
                "acked_sends": written.acked,
                "sends_per_s": round(written.acked / (measure_s + args.warmup_s), 1),
                "send_p50_ms": pct(written.send_ms, 0.5) if written.send_ms else None,
                "send_p99_ms": pct(written.send_ms, 0.99) if written.send_ms else None,
                "errors": dict(written.errors),
                "skipped": dict(skipped),
            },
        },
        "queries": {
            "common": queries.common,
            "phrase": queries.phrases[:3],
            "cjk": "東京",
            "emoji": "🚀",
            "in_other": queries.query("in_other", 0, viewers[0]),
            "in_mine_word": queries.query("in_mine_word", 0, viewers[0]),
            "nowhere": queries.nowhere[0],
            "history": f"history limit {HISTORY_LIMIT} of the viewer's busiest channel",
        },
        "classes": summarise(samples, handles),
    }


# ---------------------------------------------------------------- output


def render(report: dict[str, Any]) -> str:
    c, m = report["corpus"], report["measurement"]
    viewers = [v["handle"] for v in report["viewers"]]
    lines = [
        "",
        f"corpus {c['acked_sends']} sends in {c['build_s']} s ({c['sends_per_s']}/s):"
        f" {c['channel_messages']} channel, {c['thread_messages']} in {c['thread_scopes']}"
        f" threads, {c['dm_messages']} in {c['dm_scopes']} DMs",
        "viewers: "
        + ", ".join(
            f"{v['handle']} ({v['channels']} channels, {v['readable_threads']} threads)"
            for v in report["viewers"]
        ),
        f"messages at measurement {m['messages_at_start']} -> {m['messages_at_end']};"
        f" writer {m['writer']['sends_per_s']}/s (target {m['writer']['rate']}),"
        f" send p50/p99 {m['writer']['send_p50_ms']}/{m['writer']['send_p99_ms']} ms",
        "",
        f"{'class':<14}"
        + "".join(f"{h + ' p50/p99 ms (round p50 min-max)':<46}{'hits':>6}  " for h in viewers),
    ]
    for cls, per in report["classes"].items():
        row = f"{cls:<14}"
        for h in viewers:
            s = per[h]
            if not s["count"]:
                row += f"{'-':<46}{'-':>6}  "
                continue
            cell = (
                f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f}"
                f" ({s['round_p50_min_ms']:.2f}-{s['round_p50_max_ms']:.2f}) n={s['count']}"
            )
            row += f"{cell:<46}{s['hits_median']:>6}  "
        lines.append(row)
    if m["errors"]:
        lines.append(f"errors: {m['errors']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = resolve(build_parser().parse_args(argv))
    raise_fd_limit()
    print("scopenode bench search-team")
    print(json.dumps(vars(args), sort_keys=True), flush=True)
    report = trio.run(run, args)
    print(render(report))
    if args.json:
        report_mod.write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0 if report["corpus"]["complete"] and report["measurement"]["complete"] else 1
