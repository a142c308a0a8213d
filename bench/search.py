"""``scopenode bench search``: search latency at scale, against the raw index query.

Builds a corpus by bulk ``COPY`` (``--messages`` over ``--scopes`` channels,
``--members`` members each in a random tenth of the channels, Zipf word
frequencies, ``--cjk`` of the messages in Chinese), starts a node in this
process, and for four query classes (rare words, common words, phrases, CJK
substrings) times ``search`` through the node next to the same index query
without the readable predicate (``storage.search.build_query(raw=True)``),
interleaved in the same run. Then it times sends through the node with the
text indexes and after dropping them (recreated before it exits).
Prints one JSON report; docs/performance.md#search records runs.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import string
import time
from dataclasses import replace
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import trio

from actors.model import MemberType
from actors.search_query import parse
from node.app import serve_node
from node.client import open_client
from node.config import Settings
from node.database import open_database
from storage import directory
from storage import search as index
from storage.pg import TrioConnection, connect

CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自可过天能对着"
TEXT_INDEXES = {
    "scope_message_search_docs_tsv_idx": "USING gin (body_tsv)",
    "scope_message_search_docs_trgm_idx": "USING gin (body gin_trgm_ops)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scopenode bench search")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--scopes", type=int, default=1000)
    p.add_argument("--members", type=int, default=200)
    p.add_argument("--cjk", type=float, default=0.05, help="share of Chinese messages")
    p.add_argument("--queries", type=int, default=40, help="per class")
    p.add_argument("--sends", type=int, default=400, help="per phase of the send comparison")
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
    weights = [1 / (rank + 1) for rank in range(len(vocab))]  # Zipf, s = 1
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
    seqs = dict.fromkeys(scopes, 0)
    started = time.monotonic()
    common = vocab[:20]
    messages = io.StringIO()
    docs = io.StringIO()
    cjk_samples: list[str] = []
    phrases: list[str] = []
    base = time.time() - args.messages
    for i in range(args.messages):
        s = rng.choice(scopes)
        seqs[s] += 1
        author = rng.choice(member_of[s])
        if rng.random() < args.cjk:
            body = "".join(rng.choices(CJK, k=rng.randint(8, 30)))
            if len(cjk_samples) < 1000:
                cut = rng.randrange(len(body) - 2)
                cjk_samples.append(body[cut : cut + 2])
        else:
            words = rng.choices(vocab, weights=weights, k=rng.randint(4, 16))
            body = " ".join(words)
            if len(phrases) < 1000 and i % 97 == 0:
                phrases.append(" ".join(words[1:3]))
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(base + i)) + "+00"
        mid = f"msg_b{i:08d}"
        messages.write(
            f"{mid}\t{workspace}\t{s}\t{seqs[s]}\t{20_000_000 + i}\t{author}\thuman\t{author}\t"
            f"{author}\tb-{i}\t\\\\x00\ttext\t{body}\t{at}\n"
        )
        docs.write(f"{mid}\t{workspace}\t{s}\t{seqs[s]}\t{author}\t{body}\t{at}\n")
    async with conn.cursor().copy(
        "COPY scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
        " author_member_id, author_type, notify_principal_member_id,"
        " idempotency_subject_member_id, client_message_id, idempotency_payload_digest,"
        " message_type, content, created_at) FROM STDIN"
    ) as copy:
        await copy.write(messages.getvalue())
    async with conn.cursor().copy(
        "COPY scope_message_search_docs (message_id, workspace_id, scope_id, seq,"
        " author_member_id, body, created_at) FROM STDIN"
    ) as copy:
        await copy.write(docs.getvalue())
    for s, latest in seqs.items():
        await conn.execute("UPDATE scopes SET latest_seq = %s WHERE id = %s", (latest, s))
    await conn.execute("ANALYZE")
    viewer = max(members, key=lambda m: sum(m in v for v in member_of.values()))
    return {
        "workspace": workspace,
        "viewer": viewer,
        "viewer_scopes": sum(viewer in v for v in member_of.values()),
        "build_s": round(time.monotonic() - started, 1),
        "classes": {
            "rare": [rng.choice(vocab[len(vocab) // 2 :]) for _ in range(args.queries)],
            "common": [rng.choice(common) for _ in range(args.queries)],
            "phrase": [f'"{p}"' for p in rng.sample(phrases, min(args.queries, len(phrases)))],
            "cjk": rng.sample(cjk_samples, min(args.queries, len(cjk_samples))),
        },
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def _queries(
    conn: TrioConnection, client: Any, corpus: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    filters = index.Filters(corpus["workspace"])
    for name, queries in corpus["classes"].items():
        node_t: list[float] = []
        raw_t: list[float] = []
        for q in queries:
            statement, params = index.build_query(
                parse(q), filters, {}, sort="recent", limit=20, after=None, raw=True
            )
            t = time.perf_counter()
            await (await conn.execute(statement, params, prepare=False)).fetchall()
            raw_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.search(q, limit=20)
            node_t.append(time.perf_counter() - t)
        out[name] = {
            "queries": len(queries),
            "node_p50_ms": _pct(node_t, 0.5),
            "node_p99_ms": _pct(node_t, 0.99),
            "raw_p50_ms": _pct(raw_t, 0.5),
            "raw_p99_ms": _pct(raw_t, 0.99),
            "p50_ratio": round(statistics.median(node_t) / statistics.median(raw_t), 2),
        }
    return out


async def _sends(client: Any, target: str, n: int) -> float:
    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for lane in range(8):  # eight in flight, bounded total
            nursery.start_soon(_send_lane, client, target, lane, n // 8)
    return round((n // 8 * 8) / (time.perf_counter() - t), 1)


async def _send_lane(client: Any, target: str, lane: int, count: int) -> None:
    for i in range(count):
        await client.send(target, f"throughput lane {lane} message {i} 发布 ERR-{i}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data_dir = Path(args.data_dir or mkdtemp(prefix="scopenode-bench-search-"))
    async with (
        open_database(data_dir, args.database_url) as dsn,
        await connect(dsn, autocommit=True) as conn,
    ):
        corpus = await _build(conn, args)
        token = await directory.issue_token(conn, corpus["viewer"])
        settings = replace(
            Settings(port=0, data_dir=data_dir, database_url=dsn),
            send_rate=1e6,
            send_burst=10**6,
            request_rate=1e6,
            request_burst=10**6,
        )
        async with trio.open_nursery() as nursery:
            services = await nursery.start(serve_node, settings)
            url = f"ws://127.0.0.1:{services.port}/v1/ws?workspace={corpus['workspace']}"
            async with open_client(url, token) as client:
                classes = await _queries(conn, client, corpus)
                scope_ok = corpus["viewer_scopes"] > 0
                channel = await client.request("createChannel", slug="tput", name="tput")
                target = f"scope:{channel['scopeId']}"
                with_index = await _sends(client, target, args.sends)
                for name in TEXT_INDEXES:
                    await conn.execute(f"DROP INDEX {name}")
                without_index = await _sends(client, target, args.sends)
                for name, how in TEXT_INDEXES.items():
                    await conn.execute(f"CREATE INDEX {name} ON scope_message_search_docs {how}")
                with_again = await _sends(client, target, args.sends)
            nursery.cancel_scope.cancel()
    del corpus["classes"]
    return {
        "params": {k: v for k, v in vars(args).items() if k not in ("database_url",)},
        "corpus": corpus,
        "viewer_has_scopes": scope_ok,
        "search": classes,
        "sends_per_s": {
            "with_index": with_index,
            "without_index": without_index,
            "with_index_again": with_again,
            "ratio": round(min(with_index, with_again or with_index) / without_index, 2),
        },
    }


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    report = trio.run(run, args)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0
