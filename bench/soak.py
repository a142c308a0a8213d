"""``scopenode bench soak --minutes N``: a busy team for N minutes, and is the node steady?

One workspace (``--humans`` humans, ``--public-agents`` agents, ``--private-agents``
private agents owned by humans, ``--channels`` public channels), steady
sessions and churning ones (each reconnects every ``--churn-min-s`` to
``--churn-max-s`` seconds with ``hello.resume``), and an open-loop mix: sends
with Zipf text and ``@mentions`` (to channels, new and existing threads, DMs),
agents that answer their wakes and ``ack`` them, reactions, edits, deletes,
searches, history pages and an attachment upload every few seconds. Every
rate is a timer, never back to back, so CPU per send stays comparable across
the run.

Every ``--report-every`` seconds one line: node RSS and CPU per send, sends,
send/delivery/wake/search/history p50/p99, outbox pending (``GET /metrics``),
database size, messages, scopes, errors. At the end: slopes and verdicts per
figure and the acceptance figures (``bench/soak_analysis.py``), then the
consistency checks: every acked send stored exactly once, seqs gap-free in
every scope, every live stream of every session gap- and duplicate-free per
scope across resumes, no acked wake pushed again, no ``internal`` error. Exit 1
when a check fails, or with ``--strict`` when an acceptance figure fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import h11
import trio

from actors.model import MemberType
from bench import leanws
from bench import report as report_mod
from bench import soak_analysis as analysis
from bench.baseline import open_database
from bench.client import RequestError, Session, SessionClosed, open_session, ws_url
from bench.nodeproc import NodeUnderTest, open_node
from bench.stats import Latency, machine, own_cpu_s, proc_cpu_s, proc_rss_kib, raise_fd_limit
from storage import audit, directory, pg, scopes

REAL_WORDS = ("deploy", "café", "rollback", "incident", "review", "release", "naïve", "hotfix")
CJK_WORDS = ("東京", "大阪", "会議", "北京", "테스트")
EMOJI = ("🚀", "🔥", "✅", "🎉", "👀")
REACTIONS = ("👍", "🎉", "🚀", "👀", ":tada:", ":eyes:")
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
REQUEST_TIMEOUT_S = 30.0
MAX_IN_FLIGHT = 400
RESUME_SCOPES = 100
DRAIN_S = 2.0
SENT_MEMORY_S = 60.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scopenode bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--report-every", type=float, default=30.0, help="seconds per sample")
    p.add_argument("--warmup-minutes", type=float, help="default 2, or 10%% of a short run")
    p.add_argument(
        "--memory-cap-mb",
        type=float,
        help="the node's memory ceiling for RSS's at_cap (default: scopenode_memory_ceiling_bytes"
        " from /metrics, when the node reports it)",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when an acceptance figure fails")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--plot", metavar="DIR", help="PNGs of the samples (needs matplotlib)")
    g = p.add_argument_group("target")
    g.add_argument("--url")
    g.add_argument("--node-pid", type=int)
    g.add_argument("--data-dir")
    g.add_argument("--database-url")
    t = p.add_argument_group("team")
    t.add_argument("--humans", type=int, default=30)
    t.add_argument("--public-agents", type=int, default=10)
    t.add_argument("--private-agents", type=int, default=5)
    t.add_argument("--channels", type=int, default=20)
    t.add_argument("--channels-per-human", type=int, default=10)
    t.add_argument("--channels-per-agent", type=int, default=5)
    t.add_argument("--steady-sessions", type=int, default=40)
    t.add_argument("--churning-sessions", type=int, default=10)
    t.add_argument("--churn-min-s", type=float, help="default 30 (a quarter of a short run)")
    t.add_argument("--churn-max-s", type=float, help="default 60 (half of a short run)")
    r = p.add_argument_group("rates (per second, open loop)")
    r.add_argument("--sends-per-s", type=float, default=39.0, help="all sends, agents' too")
    r.add_argument("--mutations-per-s", type=float, default=5.7, help="reactions+edits+deletes")
    r.add_argument("--searches-per-s", type=float, default=2.4)
    r.add_argument("--history-per-s", type=float, default=3.4)
    r.add_argument("--attachment-every-s", type=float, default=4.0)
    x = p.add_argument_group("text")
    x.add_argument("--vocabulary", type=int, default=5000)
    x.add_argument("--zipf", type=float, default=1.1)
    x.add_argument("--mention-share", type=float, default=0.3)
    x.add_argument("--agent-mention-share", type=float, default=0.35, help="of the mentions")
    x.add_argument("--new-thread-share", type=float, default=0.17)
    x.add_argument("--thread-reply-share", type=float, default=0.15)
    x.add_argument("--dm-share", type=float, default=0.13)
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    run_s = args.minutes * 60
    if args.warmup_minutes is None:
        args.warmup_minutes = min(2.0, args.minutes * 0.1)
    if args.churn_min_s is None:
        args.churn_min_s = min(30.0, run_s / 4)
    if args.churn_max_s is None:
        args.churn_max_s = max(args.churn_min_s, min(60.0, run_s / 2))
    return args


def human_send_rate(args: argparse.Namespace) -> float:
    """Humans' own sends: the total less the agents' answers and the attachments."""
    replies = args.mention_share * args.agent_mention_share
    attachments = 1 / args.attachment_every_s if args.attachment_every_s > 0 else 0.0
    return float(max(0.0, (args.sends_per_s - attachments) / (1 + replies)))


# ---------------------------------------------------------------- text


class Vocabulary:
    """Made-up words plus a few real, accented, CJK and emoji ones, drawn by Zipf rank."""

    def __init__(self, size: int, exponent: float, rng: random.Random) -> None:
        made: set[str] = set()
        while len(made) < size:
            made.add("".join(rng.choices(SYLLABLES, k=rng.randint(2, 4))))
        words = sorted(made)
        rng.shuffle(words)
        # The real words rank high enough to be searched for and found often.
        for i, w in enumerate((*REAL_WORDS, *CJK_WORDS, *EMOJI)):
            words.insert(5 + 7 * i, w)
        self.words = words
        self.plain = [w for w in words if w.isascii()]
        self.cum = list(itertools.accumulate(1 / (r + 1) ** exponent for r in range(len(words))))

    def draw(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=k)

    def text(self, rng: random.Random) -> str:
        return " ".join(self.draw(rng, rng.randint(4, 14)))

    def query(self, rng: random.Random, slugs: Sequence[str]) -> str:
        roll = rng.random()
        if roll < 0.1:
            return rng.choice((*CJK_WORDS, *EMOJI))
        words = [w for w in self.draw(rng, rng.randint(1, 3)) if w.isascii()] or ["deploy"]
        query = " ".join(words)
        return f"in:#{rng.choice(slugs)} {query}" if roll > 0.85 and slugs else query


# ---------------------------------------------------------------- team


@dataclass
class Person:
    member_id: str
    handle: str
    kind: MemberType
    token: str
    private: bool = False
    owner: str | None = None
    channels: list[str] = field(default_factory=list)  # slugs


@dataclass
class Team:
    workspace_id: str
    humans: list[Person]
    agents: list[Person]  # public, then private
    channel_ids: dict[str, str] = field(default_factory=dict)  # slug -> scope id
    members_of: dict[str, list[Person]] = field(default_factory=dict)  # slug -> members

    def person(self, member_id: str) -> Person:
        return next(p for p in (*self.humans, *self.agents) if p.member_id == member_id)


async def provision(dsn: str, args: argparse.Namespace, rng: random.Random) -> Team:
    """Workspace, members and tokens straight through storage, as ``scopenode
    admin`` does (one interpreter per admin command would take minutes)."""
    async with await pg.connect(dsn, autocommit=True) as conn:
        ws = await directory.create_workspace(conn, f"soak-{args.seed}-{rng.randrange(16**6):06x}")
        humans = [
            await _member(conn, ws, MemberType.HUMAN, f"human{i}") for i in range(args.humans)
        ]
        agents = [
            await _member(conn, ws, MemberType.AGENT, f"agent{i}")
            for i in range(args.public_agents)
        ]
        for i in range(args.private_agents):
            owner = humans[i % len(humans)]
            agents.append(await _member(conn, ws, MemberType.AGENT, f"pagent{i}", owner))
    return Team(ws, humans, agents)


async def _member(
    conn: pg.TrioConnection, ws: str, kind: MemberType, handle: str, owner: Person | None = None
) -> Person:
    async with conn.transaction():
        member = await directory.create_member(
            conn,
            workspace_id=ws,
            type_=kind,
            handle=handle,
            owner_member_id=owner.member_id if owner else None,
            private=owner is not None,
        )
        await scopes.join_on_creation(conn, member)
        token = await directory.issue_token(conn, member.id)
    owner_id = owner.member_id if owner else None
    return Person(member.id, handle, kind, token, owner is not None, owner_id)


async def build_channels(
    team: Team, url: str, args: argparse.Namespace, rng: random.Random
) -> None:
    """Channels created by the first human; members join a random few; owners
    invite their private agents into some of their own. Each member acts
    through a short setup session of its own."""
    founder = team.humans[0]
    slugs = [f"soak-{i}" for i in range(args.channels)]
    founder.channels = list(slugs)
    for p in (*team.humans[1:], *team.agents[: args.public_agents]):
        per = args.channels_per_human if p.kind is MemberType.HUMAN else args.channels_per_agent
        p.channels = rng.sample(slugs, min(per, len(slugs)))
    for agent in team.agents[args.public_agents :]:
        owner = team.person(agent.owner or "")
        agent.channels = rng.sample(owner.channels, min(3, len(owner.channels)))
    async with open_session(url, founder.token, kind="browser") as s:
        for slug in slugs:
            r = await s.request("createChannel", slug=slug, name=slug, visibility="public")
            team.channel_ids[slug] = str(r["scopeId"])
    team.members_of = {slug: [] for slug in slugs}
    for p in (*team.humans, *team.agents[: args.public_agents]):
        await _join(url, p, team, [] if p is founder else p.channels)
    for agent in team.agents[args.public_agents :]:
        async with open_session(url, team.person(agent.owner or "").token, kind="browser") as s:
            for slug in agent.channels:
                scope = team.channel_ids[slug]
                await s.request(
                    "invite", scopeId=scope, memberId=agent.member_id, visibility="private"
                )
                team.members_of[slug].append(agent)


async def _join(url: str, person: Person, team: Team, slugs: Sequence[str]) -> None:
    if slugs:
        kind = "daemon" if person.kind is MemberType.AGENT else "browser"
        async with open_session(url, person.token, kind=kind) as s:
            for slug in slugs:
                await s.request("join", scopeId=team.channel_ids[slug])
    for slug in person.channels:
        team.members_of[slug].append(person)


# ---------------------------------------------------------------- measurements


class Meter:
    """The current interval's histograms; ``take`` hands them over and starts anew."""

    NAMES = ("send", "delivery", "wake", "search", "history", "upload")

    def __init__(self) -> None:
        self.lat = {n: Latency(n) for n in self.NAMES}
        self.sends = 0
        self.errors: Counter[str] = Counter()

    def take(self) -> Meter:
        taken = Meter()
        taken.lat, self.lat = self.lat, taken.lat
        taken.sends, self.sends = self.sends, 0
        taken.errors, self.errors = self.errors, taken.errors
        return taken


@dataclass
class Ledger:
    """What the checks need: acked sends, send times by message, acked wakes."""

    acked: list[audit.AckedSend] = field(default_factory=list)
    sent_at: dict[str, tuple[int, int]] = field(default_factory=dict)  # msg -> (t0, client)
    early: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    acked_deliveries: set[str] = field(default_factory=set)
    repushed_acked: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def arrived(self, meter: Meter, message_id: str, client: int, kind: str) -> None:
        """A ``message`` (at ``client``) or ``deliver`` of ``message_id`` arrived now."""
        now = time.perf_counter_ns()
        sent = self.sent_at.get(message_id)
        if sent is None:
            # The event may beat the send's reply; kept until the reply comes.
            self.early.setdefault(message_id, []).append((now, client, kind))
        elif kind == "wake" or client != sent[1]:
            meter.lat[kind].record_ns(now - sent[0])

    def sent(self, meter: Meter, message_id: str, t0: int, client: int) -> None:
        self.sent_at[message_id] = (t0, client)
        for at, where, kind in self.early.pop(message_id, ()):
            if kind == "wake" or where != client:
                meter.lat[kind].record_ns(max(0, at - t0))

    def forget_old(self) -> None:
        horizon = time.perf_counter_ns() - int(SENT_MEMORY_S * 1e9)
        for table in (self.sent_at, self.early):
            stale = [k for k, v in table.items() if _first_time(v) < horizon]
            for key in stale:
                del table[key]


def _first_time(value: Any) -> int:
    return int(value[0]) if isinstance(value, tuple) else int(value[0][0])


@dataclass
class Stream:
    """Seqs of ``message`` events one logical session got, per scope, across resumes."""

    contiguous: bool  # a private agent reads only part of a scope
    last: OrderedDict[str, int] = field(default_factory=OrderedDict)
    gaps: int = 0
    duplicates: int = 0
    truncated_resumes: int = 0
    examples: list[str] = field(default_factory=list)

    def seen(self, scope: str, seq: int) -> None:
        last = self.last.get(scope)
        if last is not None and seq <= last:
            self.duplicates += 1
            self._example(f"{scope}: {seq} after {last}")
            return
        if last is not None and self.contiguous and seq != last + 1:
            self.gaps += 1
            self._example(f"{scope}: {seq} after {last}")
        self.last[scope] = seq
        self.last.move_to_end(scope)

    def resume_from(self) -> dict[str, int] | None:
        """The most recently active scopes; the others start afresh (a client
        resumes what it has open)."""
        while len(self.last) > RESUME_SCOPES:
            self.last.popitem(last=False)
        return dict(self.last) or None

    def resumed(self, states: dict[str, Any]) -> None:
        for scope in list(self.last):
            state = states.get(scope)
            if state is None or state.get("hasMore"):
                # Past the replay the client would page history; this one starts afresh.
                self.truncated_resumes += state is not None
                del self.last[scope]

    def _example(self, text: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(text)


# ---------------------------------------------------------------- sessions


class Client:
    """One logical session of a member: steady, or reconnecting with resume."""

    def __init__(self, soak: Soak, index: int, person: Person, churning: bool) -> None:
        self.soak, self.index, self.person, self.churning = soak, index, person, churning
        self.session: Session | None = None
        self.stream = Stream(contiguous=not person.private)
        self.connects = 0
        self.resumes = 0
        self.ready = trio.Event()
        self._resumed = trio.Event()
        self.in_progress: set[str] = set()
        self.replaying = False

    @property
    def daemon(self) -> bool:
        return self.person.kind is MemberType.AGENT

    def on_event(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        soak = self.soak
        if kind == "message":
            message = frame["message"]
            self.stream.seen(str(frame["scopeId"]), int(message["seq"]))
            if not self.replaying:  # a replayed message is late by design
                soak.ledger.arrived(soak.meter, str(message["id"]), self.index, "delivery")
        elif kind == "deliver":
            soak.on_deliver(self, frame)
        elif kind == "resumed":
            self.stream.resumed(frame.get("scopes") or {})
            self.replaying = False
            self.resumes += 1
            self._resumed.set()
        elif kind == "error":
            soak.count_error(str(frame.get("code")))

    async def run(self, stop: trio.Event) -> None:
        rng = self.soak.rng
        while not stop.is_set():
            try:
                await self._connected(stop)
            except (SessionClosed, leanws.Closed, OSError, trio.TooSlowError) as e:
                self.soak.count_error(f"session_{type(e).__name__}")
            self.session = None
            if not stop.is_set():
                with trio.move_on_after(rng.uniform(1, 3)):
                    await stop.wait()

    async def _connected(self, stop: trio.Event) -> None:
        resume = self.stream.resume_from()
        self._resumed = trio.Event()
        self.replaying = resume is not None
        kind = "daemon" if self.daemon else "browser"
        async with open_session(
            self.soak.url, self.person.token, kind=kind, resume=resume, on_event=self.on_event
        ) as s:
            self.connects += 1
            if resume is not None:
                with trio.move_on_after(REQUEST_TIMEOUT_S):
                    await self._resumed.wait()
            self.session = s
            self.ready.set()
            stay = self.soak.rng.uniform(self.soak.args.churn_min_s, self.soak.args.churn_max_s)
            with trio.move_on_after(stay if self.churning else float("inf")):
                await self._keep_alive(s, stop)

    async def _keep_alive(self, s: Session, stop: trio.Event) -> None:
        period = max(1.0, int(s.welcome.get("heartbeatMs", 20_000)) / 1000 / 2)
        while not stop.is_set() and s.closed is None:
            with trio.move_on_after(period):
                await stop.wait()
            if not stop.is_set() and s.closed is None:
                with trio.move_on_after(REQUEST_TIMEOUT_S):
                    await s.ping()
        if s.closed is not None and not stop.is_set():
            self.soak.count_error(f"closed_{s.closed.code}")


# ---------------------------------------------------------------- the soak


class Soak:
    def __init__(self, args: argparse.Namespace, node: NodeUnderTest, dsn: str) -> None:
        self.args, self.node, self.dsn = args, node, dsn
        self.rng = random.Random(args.seed)
        self.vocab = Vocabulary(args.vocabulary, args.zipf, random.Random(args.seed + 1))
        self.meter = Meter()
        self.ledger = Ledger()
        self.ids = itertools.count(1)
        self.url = ""
        self.team: Team | None = None
        self.clients: list[Client] = []
        self.in_flight = 0
        self.skipped: Counter[str] = Counter()
        self.roots: dict[str, deque[str]] = {}  # slug -> recent channel messages
        self.threads: dict[str, deque[str]] = {}  # slug -> roots with a thread
        self.own: dict[str, deque[str]] = {}  # member -> own recent messages (edits)
        self.deletable: dict[str, deque[str]] = {}  # member -> own thread/DM messages
        self.deleted: set[str] = set()
        self.wake_nursery: trio.Nursery | None = None

    def count_error(self, code: str) -> None:
        self.meter.errors[code] += 1
        self.ledger.errors[code] += 1

    # ------------------------------------------------------------ setup

    def make_clients(self, team: Team) -> None:
        a = self.args
        people = [*team.agents]
        steady_humans = max(0, a.steady_sessions - len(people))
        humans = [team.humans[i % len(team.humans)] for i in range(steady_humans)]
        churners = [
            team.humans[(steady_humans + i) % len(team.humans)] for i in range(a.churning_sessions)
        ]
        for p in (*people, *humans):
            self.clients.append(Client(self, len(self.clients), p, churning=False))
        for p in churners:
            self.clients.append(Client(self, len(self.clients), p, churning=True))

    # ------------------------------------------------------------ picks

    def connected_humans(self) -> list[Client]:
        return [c for c in self.clients if not c.daemon and c.session is not None]

    def pick_human(self) -> Client | None:
        humans = self.connected_humans()
        return self.rng.choice(humans) if humans else None

    def target_for(self, person: Person) -> tuple[str, str | None]:
        """A send target and, for a channel message, its slug (a future thread root)."""
        a, rng, team = self.args, self.rng, self.team
        assert team is not None
        roll = rng.random()
        if roll < a.dm_share:
            other = rng.choice([h for h in team.humans if h is not person] or [person])
            return f"dm:{other.member_id}", None
        slug = rng.choice(person.channels)
        roll -= a.dm_share
        if roll < a.new_thread_share:
            root = self._fresh_root(slug)
            if root is not None:
                self.threads.setdefault(slug, deque(maxlen=200)).append(root)
                return f"#{slug}:{root}", None
        elif roll < a.new_thread_share + a.thread_reply_share and self.threads.get(slug):
            return f"#{slug}:{rng.choice(self.threads[slug])}", None
        return f"#{slug}", slug

    def _fresh_root(self, slug: str) -> str | None:
        roots = self.roots.get(slug)
        while roots:
            root = roots.popleft()
            if root not in self.deleted:
                return root
        return None

    def mention_for(self, person: Person, target: str) -> str:
        a, rng, team = self.args, self.rng, self.team
        assert team is not None
        if target.startswith("dm:"):
            return team.person(target[3:]).handle
        slug = target[1:].split(":", 1)[0]
        members = [m for m in team.members_of.get(slug, []) if m is not person]
        agents = [m for m in members if m.kind is MemberType.AGENT]
        agents = [m for m in agents if not m.private or m.owner == person.member_id]
        humans = [m for m in members if m.kind is MemberType.HUMAN]
        pool = agents if agents and rng.random() < a.agent_mention_share else humans
        return rng.choice(pool or members or [person]).handle

    def compose(self, person: Person, target: str) -> str:
        words = self.vocab.draw(self.rng, self.rng.randint(4, 14))
        if self.rng.random() < self.args.mention_share:
            words.insert(self.rng.randrange(len(words) + 1), "@" + self.mention_for(person, target))
        return " ".join(words)

    # ------------------------------------------------------------ requests

    async def request(
        self, client: Client, op: str, lat: str | None = None, /, **fields: Any
    ) -> dict[str, Any] | None:
        """One request on ``client``'s session; errors counted, None on failure."""
        s = client.session
        if s is None:
            self.skipped["disconnected"] += 1
            return None
        t0 = time.perf_counter_ns()
        try:
            result = await s.request(op, timeout=REQUEST_TIMEOUT_S, **fields)
        except RequestError as e:
            self.count_error(e.code)
            return None
        except (SessionClosed, leanws.Closed, trio.ClosedResourceError, trio.TooSlowError) as e:
            # A churning session may close between the pick and the write; the
            # op is named so a request left unanswered can be traced.
            self.count_error(f"request_{type(e).__name__}_{op}")
            return None
        if lat is not None:
            self.meter.lat[lat].record_ns(time.perf_counter_ns() - t0)
        return result

    async def send(
        self, client: Client, target: str, content: str, attachment_ids: Sequence[str] = ()
    ) -> dict[str, Any] | None:
        cmid = f"soak-{self.args.seed}-{next(self.ids)}"
        t0 = time.perf_counter_ns()
        fields: dict[str, Any] = {"target": target, "content": content, "clientMessageId": cmid}
        if attachment_ids:
            fields["attachmentIds"] = list(attachment_ids)
        r = await self.request(client, "send", "send", **fields)
        if r is None or r.get("state") not in ("sent", "already_sent"):
            return None
        mid, scope = str(r["messageId"]), str(r["targetKey"])
        self.ledger.acked.append(audit.AckedSend(scope, mid, cmid))
        self.ledger.sent(self.meter, mid, t0, client.index)
        self.meter.sends += 1
        return r

    async def human_send(self) -> None:
        client = self.pick_human()
        if client is None:
            self.skipped["send"] += 1
            return
        person = client.person
        target, slug = self.target_for(person)
        r = await self.send(client, target, self.compose(person, target))
        if r is None:
            return
        mid = str(r["messageId"])
        self.own.setdefault(person.member_id, deque(maxlen=30)).append(mid)
        if slug is not None:
            self.roots.setdefault(slug, deque(maxlen=100)).append(mid)
        else:
            self.deletable.setdefault(person.member_id, deque(maxlen=30)).append(mid)

    async def mutate(self) -> None:
        client = self.pick_human()
        if client is None:
            return
        roll, member = self.rng.random(), client.person.member_id
        if roll < 0.6:
            await self.react(client)
        elif roll < 0.85 and self.own.get(member):
            mid = self.rng.choice(self.own[member])
            if mid not in self.deleted:
                await self.request(client, "edit", messageId=mid, content=self.vocab.text(self.rng))
        elif self.deletable.get(member):
            mid = self.deletable[member].popleft()
            self.deleted.add(mid)
            await self.request(client, "delete", messageId=mid)

    async def react(self, client: Client) -> None:
        slug = self.rng.choice(client.person.channels)
        roots = self.roots.get(slug)
        if not roots:
            return
        op = "remove" if self.rng.random() < 0.2 else "add"
        mid = self.rng.choice(roots)
        emoji = self.rng.choice(REACTIONS)
        await self.request(client, "react", messageId=mid, emoji=emoji, op=op)

    async def search(self) -> None:
        client = self.pick_human()
        if client is not None:
            query = self.vocab.query(self.rng, client.person.channels)
            await self.request(client, "search", "search", query=query, limit=20)

    async def history(self) -> None:
        client = self.pick_human()
        if client is None:
            return
        known = list(client.stream.last)[-200:]
        team = self.team
        assert team is not None
        channels = [team.channel_ids[s] for s in client.person.channels]
        scope = self.rng.choice(known or channels)
        page = await self.request(client, "history", "history", target=f"scope:{scope}", limit=50)
        before = page and page.get("continueBeforeSeq")
        if before and self.rng.random() < 0.5:
            await self.request(
                client, "history", "history", target=f"scope:{scope}", beforeSeq=before, limit=50
            )

    async def attach(self) -> None:
        client = self.pick_human()
        if client is None or client.session is None:
            return
        body = self.rng.randbytes(self.rng.randint(1024, 64 * 1024))
        host, port = _host_port(self.node.base_url)
        t0 = time.perf_counter_ns()
        try:
            status, answer = await http_request(
                host,
                port,
                "POST",
                f"/v1/attachments?name={quote(f'soak-{next(self.ids)}.bin')}",
                [
                    ("authorization", f"Bearer {client.person.token}"),
                    ("content-type", "application/octet-stream"),
                ],
                body,
            )
        except (OSError, trio.TooSlowError, h11.ProtocolError):
            self.count_error("upload_transport")
            return
        if status != 201:
            self.count_error(f"upload_{status}")
            return
        self.meter.lat["upload"].record_ns(time.perf_counter_ns() - t0)
        attachment = str(json.loads(answer)["attachmentId"])
        slug = self.rng.choice(client.person.channels)
        await self.send(client, f"#{slug}", self.vocab.text(self.rng), [attachment])

    # ------------------------------------------------------------ wakes

    def on_deliver(self, client: Client, frame: dict[str, Any]) -> None:
        did = str(frame["deliveryId"])
        if did in self.ledger.acked_deliveries:
            self.ledger.repushed_acked.append(did)
            return
        self.ledger.arrived(self.meter, str(frame["message"]["id"]), client.index, "wake")
        if did in client.in_progress or self.wake_nursery is None:
            return
        client.in_progress.add(did)
        self.wake_nursery.start_soon(self.answer_wake, client, frame)

    async def answer_wake(self, client: Client, frame: dict[str, Any]) -> None:
        did = str(frame["deliveryId"])
        try:
            if not client.person.private:
                target = f"scope:{frame['targetKey']}"
                await self.send(client, target, self.vocab.text(self.rng))
            if await self.request(client, "ack", deliveryId=did) is not None:
                self.ledger.acked_deliveries.add(did)
        finally:
            client.in_progress.discard(did)


# ---------------------------------------------------------------- pacing


async def paced(
    soak: Soak,
    name: str,
    rate: float,
    action: Callable[[], Awaitable[None]],
    actions: trio.Nursery,
    t0: float,
    end: float,
) -> None:
    """Start ``action`` at a fixed rate until ``end`` (trio time), whatever the
    replies take; past MAX_IN_FLIGHT a tick is skipped and counted."""
    if rate <= 0:
        return
    for k in itertools.count():
        at = t0 + k / rate
        if at >= end:
            return
        await trio.sleep_until(at)
        if soak.in_flight >= MAX_IN_FLIGHT:
            soak.skipped[f"{name}_overload"] += 1
            continue
        actions.start_soon(_tracked, soak, action)


async def _tracked(soak: Soak, action: Callable[[], Awaitable[None]]) -> None:
    soak.in_flight += 1
    try:
        await action()
    finally:
        soak.in_flight -= 1


# ---------------------------------------------------------------- sampling


class Sampler:
    """One sample per interval: node process, latencies, outbox, database."""

    def __init__(self, soak: Soak, conn: pg.TrioConnection) -> None:
        self.soak, self.conn = soak, conn
        self.samples: list[dict[str, Any]] = []
        pid = soak.node.pid
        self._cpu = proc_cpu_s(pid) if pid else None

    async def run(self, t0: float, end: float) -> None:
        every = self.soak.args.report_every
        last = t0
        for k in itertools.count(1):
            at = min(t0 + k * every, end)
            await trio.sleep_until(at)
            self.samples.append(await self.take(at - t0, at - last))
            print(render_line(self.samples[-1]), flush=True)
            last = at
            self.soak.ledger.forget_old()
            if at >= end:
                return

    async def take(self, t_s: float, interval_s: float) -> dict[str, Any]:
        soak = self.soak
        taken = soak.meter.take()
        team = soak.team
        assert team is not None
        cpu = self._node_cpu()
        size = await audit.database_size(self.conn)
        metrics = await node_metrics(soak.node.base_url)
        scope_count, messages = await audit.workspace_totals(self.conn, team.workspace_id)
        sample: dict[str, Any] = {
            "t_s": round(t_s, 1),
            "interval_s": round(interval_s, 1),
            "rss_mib": self._rss_mib(),
            "node_cpu_s": cpu,
            "sends": taken.sends,
            "cpu_per_send_ms": round(cpu * 1000 / taken.sends, 3) if cpu and taken.sends else None,
            "outbox_pending": _int_or_none(metrics.get(PENDING_SAMPLE)),
            "memory_ceiling_mib": _mib_or_none(metrics.get(CEILING_SAMPLE)),
            "db_size_mib": round(size / 2**20, 2),
            "messages": messages,
            "scopes": scope_count,
            "connects": sum(c.connects for c in soak.clients),
            "resumes": sum(c.resumes for c in soak.clients),
            "errors": dict(taken.errors),
        }
        for name, lat in taken.lat.items():
            sample[f"{name}_count"] = lat.count
            sample[f"{name}_p50_ms"] = lat.percentile_ms(50) if lat.count else None
            sample[f"{name}_p99_ms"] = lat.percentile_ms(99) if lat.count else None
        return sample

    def _rss_mib(self) -> float | None:
        pid = self.soak.node.pid
        kib = proc_rss_kib(pid) if pid else None
        return round(kib / 1024, 1) if kib is not None else None

    def _node_cpu(self) -> float | None:
        pid = self.soak.node.pid
        now = proc_cpu_s(pid) if pid else None
        spent = None if now is None or self._cpu is None else round(now - self._cpu, 3)
        self._cpu = now
        return spent


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _mib_or_none(value: float | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def render_line(s: dict[str, Any]) -> str:
    def pair(name: str) -> str:
        return f"{_fmt(s[f'{name}_p50_ms'])}/{_fmt(s[f'{name}_p99_ms'])}"

    return (
        f"[{s['t_s'] / 60:6.2f} min] rss {_fmt(s['rss_mib'])} MiB"
        f"  cpu {_fmt(s['cpu_per_send_ms'], '.2f')} ms/send  sends {s['sends']}"
        f"  send {pair('send')}  delivery {pair('delivery')}  wake {pair('wake')}"
        f"  search {pair('search')}  history {pair('history')} ms"
        f"  outbox {_fmt(s['outbox_pending'], 'd')}  db {_fmt(s['db_size_mib'])} MiB"
        f"  messages {s['messages']}  scopes {s['scopes']}  errors {s['errors'] or '{}'}"
    )


# ---------------------------------------------------------------- HTTP


def _host_port(base_url: str) -> tuple[str, int]:
    u = urlsplit(base_url)
    return u.hostname or "127.0.0.1", u.port or 80


async def http_request(
    host: str,
    port: int,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes = b"",
    timeout: float = REQUEST_TIMEOUT_S,
) -> tuple[int, bytes]:
    """One HTTP/1.1 exchange on a fresh loopback connection: (status, body)."""
    conn = h11.Connection(h11.CLIENT)
    all_headers = [("host", f"{host}:{port}"), ("connection", "close"), *headers]
    if method == "POST":
        all_headers.append(("content-length", str(len(body))))
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            out = conn.send(h11.Request(method=method, target=target, headers=all_headers)) or b""
            if body:
                out += conn.send(h11.Data(data=body)) or b""
            out += conn.send(h11.EndOfMessage()) or b""
            await stream.send_all(out)
            return await _read_response(conn, stream)


async def _read_response(conn: h11.Connection, stream: trio.SocketStream) -> tuple[int, bytes]:
    status, chunks = 0, []
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, b"".join(chunks)


PENDING_SAMPLE = 'scopenode_outbox_rows{status="pending"}'
CEILING_SAMPLE = "scopenode_memory_ceiling_bytes"


async def node_metrics(base_url: str) -> dict[str, float]:
    """``GET /metrics`` as {sample name with labels: value}; empty when unreachable."""
    host, port = _host_port(base_url)
    try:
        status, body = await http_request(host, port, "GET", "/metrics", [], timeout=10)
    except (OSError, trio.TooSlowError, h11.ProtocolError):
        return {}
    found: dict[str, float] = {}
    for line in body.decode(errors="replace").splitlines() if status == 200 else ():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            try:
                found[name] = float(value)
            except ValueError:
                continue
    return found


# ---------------------------------------------------------------- checks


async def consistency(soak: Soak, conn: pg.TrioConnection) -> dict[str, Any]:
    team = soak.team
    assert team is not None
    missing = await audit.missing_acked(conn, soak.ledger.acked)
    dup_ids = await audit.duplicate_client_ids(conn, team.workspace_id)
    seqs = await audit.seq_anomalies(conn, team.workspace_id)
    streams = [c.stream for c in soak.clients]
    gaps = sum(s.gaps for s in streams)
    dups = sum(s.duplicates for s in streams)
    internal = soak.ledger.errors.get("internal", 0)
    return {
        "acked_stored_once": {
            "acked": len(soak.ledger.acked),
            "missing": missing[:20],
            "duplicate_client_ids": dup_ids,
            "ok": not missing and not dup_ids,
        },
        "seqs_gap_free": {"anomalies": seqs, "ok": not seqs},
        "live_streams": {
            "sessions": len(streams),
            "gaps": gaps,
            "duplicates": dups,
            "truncated_resumes": sum(s.truncated_resumes for s in streams),
            "examples": [e for s in streams for e in s.examples][:10],
            "ok": gaps == 0 and dups == 0,
        },
        "no_repushed_acked_wake": {
            "acked_wakes": len(soak.ledger.acked_deliveries),
            "repushed": soak.ledger.repushed_acked[:20],
            "ok": not soak.ledger.repushed_acked,
        },
        "no_internal_error": {"internal": internal, "ok": internal == 0},
    }


# ---------------------------------------------------------------- run


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with (
        open_node(
            args.url, data_dir=args.data_dir, database_url=args.database_url, node_pid=args.node_pid
        ) as node,
        open_database(args.database_url, node.data_dir) as dsn,
    ):
        soak = Soak(args, node, dsn)
        async with await pg.connect(dsn, autocommit=True) as conn:
            return await run_soak(soak, conn)


async def run_soak(soak: Soak, conn: pg.TrioConnection) -> dict[str, Any]:
    args = soak.args
    started = time.monotonic()
    team = soak.team = await provision(soak.dsn, args, soak.rng)
    soak.url = ws_url(soak.node.base_url, team.workspace_id)
    await build_channels(team, soak.url, args, soak.rng)
    soak.make_clients(team)
    stop = trio.Event()
    gen_cpu0 = own_cpu_s()
    async with trio.open_nursery() as sessions:
        soak.wake_nursery = sessions
        for c in soak.clients:
            sessions.start_soon(c.run, stop)
        with trio.fail_after(120):
            for c in soak.clients:
                await c.ready.wait()
        print(
            f"team ready after {time.monotonic() - started:.1f} s: workspace {team.workspace_id},"
            f" {len(soak.clients)} sessions",
            flush=True,
        )
        sampler = Sampler(soak, conn)
        await drive(soak, sampler)
        await trio.sleep(DRAIN_S)
        stop.set()
    checks = await consistency(soak, conn)
    run_s = args.minutes * 60
    facts = analysis.RunFacts(
        run_s=run_s,
        warmup_s=args.warmup_minutes * 60,
        rss_cap_mib=memory_cap_mib(args, sampler.samples),
        offered_sends=round(args.sends_per_s * run_s),
        acked_sends=len(soak.ledger.acked),
    )
    return {
        "params": {k: v for k, v in vars(args).items() if k not in ("json", "plot")},
        "machine": machine(),
        "workspace_id": team.workspace_id,
        "memory_cap_mib": facts.rss_cap_mib,
        "samples": sampler.samples,
        **analysis.analyse(sampler.samples, facts),
        "checks": checks,
        "totals": totals(soak, own_cpu_s() - gen_cpu0),
    }


def memory_cap_mib(args: argparse.Namespace, samples: Sequence[dict[str, Any]]) -> float | None:
    """``--memory-cap-mb``, else the ceiling the node reports in ``/metrics``."""
    if args.memory_cap_mb is not None:
        return float(args.memory_cap_mb)
    reported = [s["memory_ceiling_mib"] for s in samples if s.get("memory_ceiling_mib")]
    return float(reported[-1]) if reported else None


async def drive(soak: Soak, sampler: Sampler) -> None:
    args = soak.args
    t0 = trio.current_time()
    end = t0 + args.minutes * 60
    load = (
        ("send", human_send_rate(args), soak.human_send),
        ("mutation", args.mutations_per_s, soak.mutate),
        ("search", args.searches_per_s, soak.search),
        ("history", args.history_per_s, soak.history),
        ("attachment", 1 / args.attachment_every_s if args.attachment_every_s else 0, soak.attach),
    )
    async with trio.open_nursery() as actions, trio.open_nursery() as pacers:
        for name, rate, action in load:
            pacers.start_soon(paced, soak, name, rate, action, actions, t0, end)
        pacers.start_soon(sampler.run, t0, end)


def totals(soak: Soak, generator_cpu_s: float) -> dict[str, Any]:
    return {
        "acked_sends": len(soak.ledger.acked),
        "errors": dict(soak.ledger.errors),
        "skipped": dict(soak.skipped),
        "connects": sum(c.connects for c in soak.clients),
        "resumes": sum(c.resumes for c in soak.clients),
        "acked_wakes": len(soak.ledger.acked_deliveries),
        "generator_cpu_s": round(generator_cpu_s, 2),
    }


# ---------------------------------------------------------------- output


def render_summary(report: dict[str, Any]) -> str:
    lines = ["", "figure               slope/10min  verdict"]
    for key, slope in report["slopes_per_10min"].items():
        lines.append(f"  {key:<18} {_fmt(slope, '>11.3f')}  {report['verdicts'][key]}")
    lines += ["", "acceptance"]
    for a in report["acceptance"]:
        mark = "pass" if a["pass"] else "FAIL"
        lines.append(f"  {mark}  {a['name']:<32} {_fmt(a['value'], '.3f')} (limit {a['limit']})")
    lines += ["", "checks"]
    for name, check in report["checks"].items():
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'}  {name}")
    t = report["totals"]
    lines += [
        "",
        f"acked sends {t['acked_sends']}, connects {t['connects']}, resumes {t['resumes']},"
        f" acked wakes {t['acked_wakes']}, errors {t['errors'] or '{}'},"
        f" skipped {t['skipped'] or '{}'}",
    ]
    return "\n".join(lines)


def plot(directory: str, samples: Sequence[dict[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    written = []
    minutes = [s["t_s"] / 60 for s in samples]
    for figure in analysis.FIGURES:
        ys = [s.get(figure.key) for s in samples]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(minutes, [float("nan") if y is None else y for y in ys], marker=".")
        ax.set_xlabel("minute")
        ax.set_ylabel(figure.key)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = os.path.join(directory, f"soak-{figure.key}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def exit_status(report: dict[str, Any], strict: bool) -> int:
    if not all(c["ok"] for c in report["checks"].values()):
        return 1
    if strict and not all(a["pass"] for a in report["acceptance"]):
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = resolve(build_parser().parse_args(argv))
    raise_fd_limit()
    print("scopenode bench soak")
    print(json.dumps(vars(args), sort_keys=True), flush=True)
    report = trio.run(run, args)
    print(render_summary(report))
    if args.json:
        report_mod.write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        for path in plot(args.plot, report["samples"]):
            print(f"wrote {path}")
    status = exit_status(report, args.strict)
    if status:
        print("soak failed: see checks/acceptance above", file=sys.stderr)
    return status
