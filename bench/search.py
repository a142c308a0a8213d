"""``scopenode bench search``: search latency at scale, against the raw index query.

Builds a corpus by bulk ``COPY`` (``--messages`` over ``--scopes`` channels,
``--members`` members each in a random tenth of the channels, Zipf word
frequencies, ``--cjk`` of the messages in Chinese) with the secondary indexes
of the two tables dropped and created again after, starts a node in this
process, and for four query classes (rare words, common words, phrases, CJK
substrings) times ``search`` through the node next to the same index query
without the readable predicate (``storage.search_sql.build_query(raw=True)``)
and that query kept to the viewer's scopes (``within``: what any visibility
rule must at least filter): each query by all three, in rounds whose order
rotates (``QUERY_ROUNDS``), the ratios reported as the rounds' medians and
spreads. Then it times sends through the node with the text indexes and
without them, alternating (recreated before it exits). Prints one JSON report; docs/performance.md#search records runs.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import random
import shutil
import statistics
import string
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import trio

from actors.model import MemberType
from actors.search_query import ParsedQuery, parse, stem_words, with_stems
from bench.client import open_session
from bench.dbbaseline import checkpoint
from bench.stats import ratio_spread, rotated
from node import logs
from node.app import serve_node
from node.config import Settings, with_raised_limits
from node.database import open_database
from storage import directory, search_sql, search_terms
from storage import search as stored_search
from storage.pg import TrioConnection, connect
from storage.search_terms import DEFAULT_LANGUAGE

BULK_TABLES = ("scope_messages", "scope_message_search_docs")
# Rounds of every query class; the three phases take every place in turn.
QUERY_ROUNDS = 5
COPY_CHUNK = 50_000
COPY_MESSAGES = (
    "COPY scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
    " author_member_id, author_type, notify_principal_member_id,"
    " idempotency_subject_member_id, client_message_id, idempotency_payload_digest,"
    " message_type, content, created_at) FROM STDIN"
)
COPY_DOCS = (
    "COPY scope_message_search_docs (message_id, workspace_id, scope_id, seq,"
    " author_member_id, body, created_at) FROM STDIN"
)
CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自可过天能对着"
# The send comparison drops these and creates them again as the schema
# defines them (their definitions are read from the database).
TEXT_INDEXES = (
    "scope_message_search_docs_tsv_idx",
    "scope_message_search_docs_trgm_idx",
    "scope_message_search_docs_cjk_idx",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scopenode bench search")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--scopes", type=int, default=1000)
    p.add_argument("--members", type=int, default=200)
    p.add_argument("--cjk", type=float, default=0.05, help="share of Chinese messages")
    p.add_argument("--queries", type=int, default=40, help="per class")
    p.add_argument("--sends", type=int, default=4000, help="per phase of the send comparison")
    p.add_argument("--vocabulary", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--database-url", default=None)
    p.add_argument("--json", default=None)
    return p


def _words(n: int, rng: random.Random) -> list[str]:
    seen: set[str] = set()
    while len(seen) < n:
        seen.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))))
    return sorted(seen, key=lambda w: rng.random())


async def _build(conn: TrioConnection, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    vocab = _words(args.vocabulary, rng)
    workspace = await directory.create_workspace(conn, "search-bench")
    members = [
        (
            await directory.create_member(
                conn, workspace_id=workspace, type_=MemberType.HUMAN, handle=f"m{i:03d}"
            )
        ).id
        for i in range(args.members)
    ]
    scopes = [f"scp_bench{i:05d}" for i in range(args.scopes)]
    async with conn.cursor().copy(
        "COPY scopes (id, workspace_id, type, created_by_member_id) FROM STDIN"
    ) as copy:
        for s in scopes:
            await copy.write_row((s, workspace, "channel", members[0]))
    async with conn.cursor().copy(
        "COPY scope_channel_profiles (scope_id, workspace_id, slug, display_name, visibility,"
        " owner_member_id) FROM STDIN"
    ) as copy:
        for i, s in enumerate(scopes):
            await copy.write_row((s, workspace, f"b{i:05d}", f"b{i}", "public", members[0]))
    member_of: dict[str, list[str]] = {}
    async with conn.cursor().copy(
        "COPY scope_memberships (scope_id, member_id, visibility, effective_from_seq) FROM STDIN"
    ) as copy:
        for s in scopes:
            chosen = rng.sample(members, max(2, args.members // 10))
            member_of[s] = chosen
            for m in chosen:
                await copy.write_row((s, m, "public", 1))
    started = time.monotonic()
    corpus = _Corpus(args, rng, vocab, workspace, scopes, member_of)
    async with _indexes_dropped(conn, BULK_TABLES) as timing:
        for first in range(0, args.messages, COPY_CHUNK):
            messages, docs = corpus.chunk(first, min(args.messages, first + COPY_CHUNK))
            async with conn.cursor().copy(COPY_MESSAGES) as copy:
                await copy.write(messages)
            async with conn.cursor().copy(COPY_DOCS) as copy:
                await copy.write(docs)
    for s, latest in corpus.seqs.items():
        await conn.execute("UPDATE scopes SET latest_seq = %s WHERE id = %s", (latest, s))
    # A settled table, as autovacuum leaves one: visibility map set, statistics fresh.
    settled = time.monotonic()
    await conn.execute("VACUUM (ANALYZE) scope_messages, scope_message_search_docs")
    await conn.execute("ANALYZE")
    viewer = max(members, key=lambda m: sum(m in v for v in member_of.values()))
    viewer_scope_ids = [s for s, chosen in member_of.items() if viewer in chosen]
    return {
        "workspace": workspace,
        "viewer": viewer,
        "viewer_scopes": len(viewer_scope_ids),
        "viewer_scope_ids": viewer_scope_ids,
        "build_s": round(time.monotonic() - started, 1),
        "build_phases_s": {
            "copy": timing["copy_s"],
            "create_indexes": timing["index_s"],
            "vacuum_analyze": round(time.monotonic() - settled, 1),
        },
        "classes": {
            "rare": [rng.choice(vocab[len(vocab) // 2 :]) for _ in range(args.queries)],
            "common": [rng.choice(vocab[:20]) for _ in range(args.queries)],
            "phrase": [
                f'"{p}"' for p in rng.sample(corpus.phrases, min(args.queries, len(corpus.phrases)))
            ],
            "cjk": rng.sample(corpus.cjk, min(args.queries, len(corpus.cjk))),
        },
    }


class _Corpus:
    """The generated messages, produced in chunks of COPY text (the whole corpus
    never sits in memory at once)."""

    def __init__(
        self,
        args: argparse.Namespace,
        rng: random.Random,
        vocab: list[str],
        workspace: str,
        scopes: list[str],
        member_of: dict[str, list[str]],
    ) -> None:
        self.args, self.rng, self.vocab = args, rng, vocab
        self.workspace, self.scopes, self.member_of = workspace, scopes, member_of
        # Zipf, s = 1; cumulative once (random.choices would sum the weights per call).
        self.cum = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(vocab))))
        self.seqs = dict.fromkeys(scopes, 0)
        self.cjk: list[str] = []
        self.phrases: list[str] = []
        self.base = time.time() - args.messages

    def chunk(self, first: int, end: int) -> tuple[str, str]:
        messages = io.StringIO()
        docs = io.StringIO()
        for i in range(first, end):
            s, author, body = self._message(i)
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.base + i)) + "+00"
            mid = f"msg_b{i:08d}"
            seq = self.seqs[s]
            messages.write(
                f"{mid}\t{self.workspace}\t{s}\t{seq}\t{20_000_000 + i}\t{author}\thuman\t"
                f"{author}\t{author}\tb-{i}\t\\\\x00\ttext\t{body}\t{at}\n"
            )
            docs.write(f"{mid}\t{self.workspace}\t{s}\t{seq}\t{author}\t{body}\t{at}\n")
        return messages.getvalue(), docs.getvalue()

    def _message(self, i: int) -> tuple[str, str, str]:
        rng = self.rng
        s = rng.choice(self.scopes)
        self.seqs[s] += 1
        author = rng.choice(self.member_of[s])
        if rng.random() < self.args.cjk:
            body = "".join(rng.choices(CJK, k=rng.randint(8, 30)))
            if len(self.cjk) < 1000:
                cut = rng.randrange(len(body) - 2)
                self.cjk.append(body[cut : cut + 2])
            return s, author, body
        words = rng.choices(self.vocab, cum_weights=self.cum, k=rng.randint(4, 16))
        if len(self.phrases) < 1000 and i % 97 == 0:
            self.phrases.append(" ".join(words[1:3]))
        return s, author, " ".join(words)


# The indexes a bulk COPY would otherwise update row by row; the ones that back
# a constraint (primary keys, unique constraints other tables reference) stay.
_SECONDARY_INDEXES = """
SELECT i.relname, pg_get_indexdef(i.oid)
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relname = ANY(%s) AND t.relnamespace = 'public'::regnamespace
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
"""


@asynccontextmanager
async def _indexes_dropped(
    conn: TrioConnection, tables: tuple[str, ...]
) -> AsyncIterator[dict[str, float]]:
    """Drop the tables' secondary indexes for the block, then create them again
    exactly as they were (with room to sort in memory); times both parts."""
    found = await _secondary_indexes(conn, tables)
    timing: dict[str, float] = {}
    await _drop_indexes(conn, found)
    started = time.monotonic()
    yield timing
    timing["copy_s"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    await _create_indexes(conn, found)
    timing["index_s"] = round(time.monotonic() - started, 1)


async def _secondary_indexes(conn: TrioConnection, tables: tuple[str, ...]) -> dict[str, str]:
    """Name -> definition of the tables' secondary indexes."""
    rows = await (await conn.execute(_SECONDARY_INDEXES, (list(tables),))).fetchall()
    return {str(name): str(definition) for name, definition in rows}


async def _drop_indexes(conn: TrioConnection, indexes: dict[str, str]) -> None:
    for name in indexes:
        await conn.execute(f'DROP INDEX "{name}"'.encode())


async def _create_indexes(conn: TrioConnection, indexes: dict[str, str]) -> None:
    """Create ``indexes`` again from their definitions, with room to sort in memory."""
    await conn.execute("SET maintenance_work_mem = '1GB'")
    for definition in indexes.values():
        await conn.execute(definition.encode())
    await conn.execute("RESET maintenance_work_mem")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def _queries(
    conn: TrioConnection, client: Any, corpus: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    filters = search_sql.Filters(corpus["workspace"])
    # The node's statements take every parameter through an initplan, so its
    # prepared generic plan fits any value; the raw ones compare a column with
    # the parameter itself, and a generic plan of `scope_id = ANY($n)` guesses.
    # Planned for their own values, the baselines are never slower than their
    # statements allow.
    await conn.execute("SET plan_cache_mode = force_custom_plan")
    for name, queries in corpus["classes"].items():
        out[name] = await _time_class(conn, client, filters, corpus, queries)
    return out


async def _time_class(
    conn: TrioConnection,
    client: Any,
    filters: search_sql.Filters,
    corpus: dict[str, Any],
    queries: list[str],
) -> dict[str, Any]:
    """One class's queries in rounds: each query is timed by all three phases
    in the round's order, which rotates, so a machine that drifts during the
    run favours no phase; the ratios are the rounds' medians and spreads."""

    async def raw(parsed: ParsedQuery, q: str) -> float:
        return await _raw_query(conn, parsed, filters, None)

    async def kept(parsed: ParsedQuery, q: str) -> float:
        # The floor under any visibility rule: the same query kept to the
        # viewer's scopes, without rights, node or WebSocket.
        return await _raw_query(conn, parsed, filters, corpus["viewer_scope_ids"])

    async def node(parsed: ParsedQuery, q: str) -> float:
        t = time.perf_counter()
        await client.request("search", query=q, limit=20)
        return time.perf_counter() - t

    phases = {"raw": raw, "kept": kept, "node": node}
    times: dict[str, list[float]] = {phase: [] for phase in phases}
    rounds: list[dict[str, Any]] = []
    count = min(QUERY_ROUNDS, len(queries))
    for r in range(count):
        order = rotated(list(phases), r)
        got: dict[str, list[float]] = {phase: [] for phase in phases}
        for q in queries[r::count]:
            # The node's words with their stems, as the node searches them.
            parsed = parse(q)
            stems = await search_terms.stems(conn, DEFAULT_LANGUAGE, stem_words(parsed))
            parsed = with_stems(parsed, stems)
            for phase in order:
                got[phase].append(await phases[phase](parsed, q))
        for phase, values in got.items():
            times[phase] += values
        p50s = {f"{phase}_p50_ms": _pct(values, 0.5) for phase, values in got.items()}
        rounds.append({"round": r + 1, "order": order, **p50s})
    node_t, raw_t, scoped_t = times["node"], times["raw"], times["kept"]
    return {
        "queries": len(queries),
        "node_p50_ms": _pct(node_t, 0.5),
        "node_p99_ms": _pct(node_t, 0.99),
        "raw_p50_ms": _pct(raw_t, 0.5),
        "raw_p99_ms": _pct(raw_t, 0.99),
        "p50_ratio": round(statistics.median(node_t) / statistics.median(raw_t), 2),
        "raw_in_viewer_scopes_p50_ms": _pct(scoped_t, 0.5),
        "raw_in_viewer_scopes_p50_ratio": round(
            statistics.median(scoped_t) / statistics.median(raw_t), 2
        ),
        "rounds": rounds,
        "rounds_node_over_raw_p50": ratio_spread(rounds, "node_p50_ms", "raw_p50_ms"),
        "rounds_node_over_kept_p50": ratio_spread(rounds, "node_p50_ms", "kept_p50_ms"),
        "rounds_kept_over_raw_p50": ratio_spread(rounds, "kept_p50_ms", "raw_p50_ms"),
    }


async def _raw_query(
    conn: TrioConnection, parsed: ParsedQuery, filters: search_sql.Filters, within: list[str] | None
) -> float:
    statement, params = search_sql.build_query(
        parsed, filters, {}, sort="recent", limit=20, after=None, raw=True, within=within
    )
    t = time.perf_counter()
    await stored_search.run_query(conn, statement, params)
    return time.perf_counter() - t


async def _sends(client: Any, target: str, n: int) -> float:
    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for lane in range(8):  # eight in flight, bounded total
            nursery.start_soon(_send_lane, client, target, lane, n // 8)
    return round((n // 8 * 8) / (time.perf_counter() - t), 1)


async def _send_lane(client: Any, target: str, lane: int, count: int) -> None:
    for i in range(count):
        await client.request(
            "send",
            target=target,
            content=f"throughput lane {lane} message {i} 发布 ERR-{i}",
            clientMessageId=uuid.uuid4().hex,
        )


SEND_ROUNDS = 5
SEND_WARMUP = 400


async def _send_rounds(
    conn: TrioConnection, dsn: str, client: Any, target: str, n: int
) -> dict[str, Any]:
    """Sends with the text indexes and without them for SEND_ROUNDS rounds
    after an untimed warm-up, the order flipped each round (with, without;
    without, with; with, without; …), the ratio the median of the rounds'
    own with their spread: consecutive phases on shared cores differ
    by about as much as the indexes do, and the phase right after the indexes
    are built again would always be a "with" one otherwise. Every phase
    starts right after a checkpoint: building the three indexes again writes
    hundreds of megabytes of WAL, and the checkpoint that volume triggers (and
    the full-page writes after it) would otherwise land in the phase that
    follows the build, always a "with" one. The indexes are back at the end."""
    with_index: list[float] = []
    without_index: list[float] = []
    # Untimed: the channel's actor, the prepared statements and the first
    # batches of a new scope belong to no phase.
    await _sends(client, target, min(SEND_WARMUP, n))
    found = await _secondary_indexes(conn, ("scope_message_search_docs",))
    text_indexes = {name: found[name] for name in TEXT_INDEXES}
    indexed = True
    for phase in range(2 * SEND_ROUNDS):
        want = phase % 4 in (0, 3)
        if want != indexed:
            if want:
                await _create_indexes(conn, text_indexes)
            else:
                await _drop_indexes(conn, text_indexes)
            indexed = want
        await checkpoint(dsn)
        (with_index if want else without_index).append(await _sends(client, target, n))
    if not indexed:
        await _create_indexes(conn, text_indexes)
    rounds = [{"with": w, "without": wo} for w, wo in zip(with_index, without_index, strict=True)]
    ratios = ratio_spread(rounds, "with", "without")
    return {
        "with_index": with_index,
        "without_index": without_index,
        "ratio": ratios["median"],
        "rounds_ratio": ratios,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # The in-process node logs like a served one at warning level: a debug
    # line per send would be part of what the send phases measure.
    logs.configure("warning")
    if args.data_dir:
        return await _run_in(Path(args.data_dir), args)
    data_dir = Path(mkdtemp(prefix="scopenode-bench-search-"))
    try:
        return await _run_in(data_dir, args)
    finally:
        # The corpus of a million messages is gigabytes: never leave it behind
        # (the embedded server has stopped when the block above returns).
        shutil.rmtree(data_dir, ignore_errors=True)


async def _run_in(data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    async with (
        open_database(data_dir, args.database_url) as dsn,
        await connect(dsn, autocommit=True) as conn,
    ):
        corpus = await _build(conn, args)
        token = await directory.issue_token(conn, corpus["viewer"])
        settings = with_raised_limits(Settings(port=0, data_dir=data_dir, database_url=dsn))
        async with trio.open_nursery() as nursery:
            services = await nursery.start(serve_node, settings)
            url = f"ws://127.0.0.1:{services.port}/v1/ws?workspace={corpus['workspace']}"
            # The bench's lean session, as the other workloads' load generators:
            # the client shares the process, and its parsing would be measured.
            async with open_session(url, token, kind="browser") as client:
                classes = await _queries(conn, client, corpus)
                scope_ok = corpus["viewer_scopes"] > 0
                channel = await client.request("createChannel", slug="tput", name="tput")
                target = f"scope:{channel['scopeId']}"
                sends = await _send_rounds(conn, dsn, client, target, args.sends)
            nursery.cancel_scope.cancel()
    del corpus["classes"], corpus["viewer_scope_ids"]
    return {
        "params": {k: v for k, v in vars(args).items() if k not in ("database_url",)},
        "corpus": corpus,
        "viewer_has_scopes": scope_ok,
        "search": classes,
        "sends_per_s": sends,
    }


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    report = trio.run(run, args)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0
