"""Search end to end (docs/design.md#search): real nodes, real PostgreSQL.

- the query language and highlights (pure);
- a corpus in English, German, Chinese, Japanese, Korean, emoji and code
  identifiers: each query finds exactly the expected messages
  (``tests/data/search_corpus.json``);
- visibility: for generated worlds (members, private agents, grants, threads,
  leaves) every hit is readable through ``history`` and every readable
  matching message is found, against a brute-force oracle;
- readiness: a workspace imported beside the send path answers
  ``search_unavailable`` until ``rebuild``; a rebuild of a ready workspace
  never makes a concurrent search fail or find less;
- edits and deletes show in the next search; filters, sorting, paging,
  ``aroundSeq`` and bad input.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from actors.model import Member, MemberType
from actors.search_query import TermKind, highlights, matches, parse, stem_words, with_stems
from node.client import Client, ClientError
from storage import search as index
from storage import search_index, search_sql, search_terms
from storage.pg import TrioConnection, connect
from storage.visibility import Viewer
from tests.nodes import Person, RunningNode, World, make_channel, running_node

CORPUS = json.loads((Path(__file__).parent / "data" / "search_corpus.json").read_text())
TIMEOUT = 20


async def hits_of(client: Client, query: str, **filters: Any) -> list[dict[str, Any]]:
    return [hit async for hit in client.search_all(query, **filters)]


async def error_of(client: Client, op: str, **fields: Any) -> str:
    with pytest.raises(ClientError) as failed:
        await client.request(op, **fields)
    return str(failed.value.code)


# ------------------------------------------------------------------ pure parts


def test_parse_kinds_and_operators() -> None:
    parsed = parse('Deploy "exact Phrase" -foo -"bar baz" from:@ann in:#ops ERR-4312 发布 --x')
    assert [(t.text, t.kind) for t in parsed.terms] == [
        ("deploy", TermKind.WORD),
        ("exact phrase", TermKind.SUBSTRING),
        ("err-4312", TermKind.SUBSTRING),
        ("发布", TermKind.SUBSTRING),
        ("--x", TermKind.SUBSTRING),
    ]
    assert [t.text for t in parsed.excluded] == ["foo", "bar baz"]
    assert parsed.from_handles == ("ann",)
    assert parsed.in_channels == ("ops",)
    # Not operators: literal terms.
    assert [t.text for t in parse("from:ann in:ops - x").terms] == ["from:ann", "in:ops", "-", "x"]


@pytest.mark.parametrize("query", ["   ", '""', "-", " - "])
def test_parse_rejects_nothing_to_search(query: str) -> None:
    if query.strip() == "-":
        assert parse(query).terms  # a lone dash is a literal
        return
    with pytest.raises(ValueError, match="nothing"):
        parse(query)


def test_highlights_are_character_offsets() -> None:
    content = "Deployment 🚀 of ERR-4312: 我们的系统 deploys, redeploy"
    spans = highlights(content, parse("deploy err-4312 系统"))
    assert [content[a:b] for a, b in spans] == ["Deploy", "ERR-4312", "系统", "deploy"]
    # Overlapping terms merge; a word never matches inside another word.
    assert highlights("abcdef", parse("abc abcd")) == [(0, 4)]
    assert highlights("xabc", parse("abc")) == []
    assert matches("Straße", parse("STRAßE"))
    assert not matches("Strasse", parse("straße"))


# ---------------------------------------------------------------- languages


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="abcé\U0010ffff", min_size=1, max_size=4),
        st.floats(min_value=1e-6, max_value=0.5),
        max_size=30,
    ),
    st.text(alphabet="abcé\U0010ffff", min_size=1, max_size=3),
)
def test_term_stats_sum_every_tracked_word_with_the_prefix(
    freqs: dict[str, float], prefix: str
) -> None:
    stats = search_terms.TermStats(freqs, 1e-4, 0.0)
    found = sum(f for word, f in freqs.items() if word.startswith(prefix))
    expected = min(1.0, found) if found else 1e-4 / 2
    assert stats.word(prefix) == pytest.approx(expected, rel=1e-9, abs=1e-12)


async def test_the_cjk_pairs_of_python_and_the_index_agree(database_url: str) -> None:
    """The query side pairs a term as the database function pairs a document:
    same character ranges, edges included."""
    edges = "\u303f\u3040\u30ff\u3100\u33ff\u3400\u4dbf\u4e00\u9fff\ua000"
    edges += "\uabff\uac00\ud7af\ud7b0\uf8ff\uf900\ufaff\ufb00"
    texts = [
        "",
        "自",
        "自不能 自不",
        "release 发布 ok",
        "デプロイ確認ありがとう",
        "배포 회의 서울",
        "a自b不c",
        "😀自😀不能",
        edges,
        "".join(f"{a}{b}" for a in edges for b in edges),
    ]
    async with await connect(database_url, autocommit=True) as conn:
        for text in texts:
            cur = await conn.execute("SELECT scopenode_cjk_bigrams(%s)", (text,))
            row = await cur.fetchone()
            assert row is not None
            assert sorted(row[0]) == search_terms.cjk_bigrams(text), text


async def test_a_cjk_pair_is_found_through_the_partial_index_of_pairs(database_url: str) -> None:
    """The index of CJK pairs holds only documents with CJK characters; the
    term's condition states that predicate, so the index still serves it."""
    parsed = parse("发布")
    statement, params = search_sql.build_query(
        parsed, search_sql.Filters("ws_none"), {}, sort="recent", limit=20, after=None, raw=True
    )
    async with await connect(database_url) as conn:
        # Left only the scan of the whole table (made dear) or the partial
        # index: PostgreSQL takes the index only if the query implies its
        # predicate. Rolled back.
        await conn.execute("DROP INDEX scope_message_search_docs_recent_idx")
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute("EXPLAIN " + statement, params)  # type: ignore[arg-type]
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
        await conn.rollback()
        cur = await conn.execute(
            "SELECT pg_get_expr(x.indpred, x.indrelid) FROM pg_index x"
            " WHERE x.indexrelid = 'scope_message_search_docs_cjk_idx'::regclass"
        )
        predicate = (await cur.fetchone() or [None])[0]
    assert "scope_message_search_docs_cjk_idx" in plan, plan
    assert predicate is not None
    assert search_terms.CJK_CHARACTER in str(predicate)


async def test_the_symbols_of_python_and_the_index_agree(database_url: str) -> None:
    """Emoji and pictographs: the query side takes a term's symbols as the
    database function takes a document's, edges of the ranges included."""
    edges = "\u218f\u2190\u2bff\u2c00\U0001efff\U0001f000\U0001faff\U0001fb00"
    texts = ["", "plain text", "ship it 🚀🚀 ✅", "👍🏽 ok", "→ next ⏰", edges, "東京🎉"]
    async with await connect(database_url, autocommit=True) as conn:
        for text in texts:
            cur = await conn.execute("SELECT scopenode_symbols(%s)", (text,))
            row = await cur.fetchone()
            assert row is not None
            assert sorted(row[0]) == search_terms.symbols(text), text


async def test_an_emoji_is_found_through_the_partial_index_of_symbols(database_url: str) -> None:
    parsed = parse("🚀")
    statement, params = search_sql.build_query(
        parsed, search_sql.Filters("ws_none"), {}, sort="recent", limit=20, after=None, raw=True
    )
    async with await connect(database_url) as conn:
        await conn.execute("DROP INDEX scope_message_search_docs_recent_idx")
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute("EXPLAIN " + statement, params)  # type: ignore[arg-type]
        plan = "\n".join(str(row[0]) for row in await cur.fetchall())
        await conn.rollback()
    assert "scope_message_search_docs_symbols_idx" in plan, plan


async def test_the_raw_query_kept_to_scopes_finds_only_their_documents(database_url: str) -> None:
    """The bench's floor under visibility (``within``): the raw query with the
    viewer's scopes as its only filter."""
    parsed = parse("deploy")
    async with await connect(database_url) as conn:
        # Documents without their messages: foreign keys off for this
        # transaction, rolled back.
        await conn.execute("SET LOCAL session_replication_role = replica")
        for i, scope in enumerate(["scp_a", "scp_b", "scp_c", "scp_a"]):
            await conn.execute(
                "INSERT INTO scope_message_search_docs"
                " (message_id, workspace_id, scope_id, seq, author_member_id, body)"
                " VALUES (%s, 'ws_within', %s, %s, 'mem_x', 'deploy now')",
                (f"msg_w{i}", scope, i + 1),
            )
        found = {}
        for within in (None, ["scp_a", "scp_c"], []):
            statement, params = search_sql.build_query(
                parsed,
                search_sql.Filters("ws_within"),
                {},
                sort="recent",
                limit=20,
                after=None,
                raw=True,
                within=within,
            )
            cur = await conn.execute(statement, params)  # type: ignore[arg-type]
            found[None if within is None else tuple(within)] = sorted(
                str(row[0]) for row in await cur.fetchall()
            )
        await conn.rollback()
    assert found[None] == ["msg_w0", "msg_w1", "msg_w2", "msg_w3"]
    assert found[("scp_a", "scp_c")] == ["msg_w0", "msg_w2", "msg_w3"]
    assert found[()] == []


async def test_the_strategy_choice_of_python_and_the_statement_agree(database_url: str) -> None:
    """``pick`` (the choice a viewer's later searches make in Python) and the
    statement's own ``plan`` choose alike for the same sizes and terms."""
    async with await connect(database_url, autocommit=True) as conn:
        row = await (
            await conn.execute(
                "SELECT reltuples FROM pg_class WHERE oid = 'scope_message_search_docs'::regclass"
            )
        ).fetchone()
        assert row is not None
        total = float(row[0])
        chosen: set[str] = set()
        for viewer_docs in (0.0, 1.0, 30.0, 5_000.0, 2e6):
            for freq in (None, 1e-7, 1e-3, 0.05, 0.9):
                for indexable in (True, False):
                    for walkable in (True, False):
                        statement = (
                            "WITH rights AS (SELECT 'scp'::text AS scope_id,"
                            " %(viewer_docs)s::float8 AS docs),"
                            + search_sql._PLAN.format(limit=21, unknown=search_terms.UNKNOWN_FREQ)
                            + " SELECT how FROM plan"
                        )
                        params = {
                            "viewer_docs": viewer_docs,
                            "freq": freq,
                            "indexable": indexable,
                            "walkable": walkable,
                        }
                        cur = await conn.execute(statement, params)
                        found = await cur.fetchone()
                        assert found is not None
                        expected = search_sql.pick(
                            search_sql.Sizes(viewer_docs, total),
                            search_terms.Estimate(freq, indexable),
                            walkable=walkable,
                            limit=20,
                        )
                        assert found[0] == expected, params
                        chosen.add(expected)
    assert chosen == {"walk", "terms", "scopes"}


async def test_language_corpus(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as a:
            await make_channel(a, "corpus")
            keys: dict[str, str] = {}
            for key, content in CORPUS["messages"].items():
                keys[(await a.send("#corpus", content))["messageId"]] = key
            for case in CORPUS["queries"]:
                hits = await hits_of(a, case["query"])
                found = sorted(keys[h["message"]["id"]] for h in hits)
                assert found == sorted(case["expect"]), case["query"]
                parsed = parse(case["query"])
                async with await connect(database_url, autocommit=True) as conn:
                    stems = await search_terms.stems(conn, "english", stem_words(parsed))
                parsed = with_stems(parsed, stems)
                for hit in hits:
                    content = hit["message"]["content"]
                    assert hit["highlights"] == [list(s) for s in highlights(content, parsed)]
                    assert all(0 <= s < e <= len(content) for s, e in hit["highlights"])


# ---------------------------------------------------------------- visibility

HUMANS = ("ann", "bob", "cid")
AGENTS = (("pa", "ann"), ("pb", "bob"))  # private agents and their owners
WORDS = ("alpha", "beta")
Step = tuple[str, int, int]

steps = st.lists(
    st.tuples(
        st.sampled_from(["send", "send", "reply", "join", "leave", "invite", "grant"]),
        st.integers(0, len(HUMANS) + len(AGENTS) - 1),
        st.integers(0, len(HUMANS) - 1),
    ),
    min_size=3,
    max_size=14,
)


async def _ignore_refusal(client: Client, op: str, **fields: Any) -> dict[str, Any] | None:
    try:
        return await client.request(op, **fields)
    except ClientError:
        return None  # the world allows it or not; the oracle reads what happened


async def _play(node: RunningNode, conn: TrioConnection, world_steps: list[Step]) -> None:
    """One generated world, in a workspace of its own."""
    world = await World.create(node)
    people: list[Person] = [await world.member(h) for h in HUMANS]
    for handle, owner in AGENTS:
        owner_person = people[HUMANS.index(owner)]
        people.append(
            await world.member(handle, MemberType.AGENT, owner=owner_person, private=True)
        )
    async with (
        world.client(people[0]) as ann,
        world.client(people[1]) as bob,
        world.client(people[2]) as cid,
        world.client(people[3], kind="daemon") as pa,
        world.client(people[4], kind="daemon") as pb,
    ):
        clients = [ann, bob, cid, pa, pb]
        channel = await make_channel(ann, "c", bob)
        scopes = {channel}
        root: str | None = None
        for n, (action, who, other) in enumerate(world_steps):
            actor = clients[who]
            word = WORDS[n % 2]
            if action == "send":
                sent = await _ignore_refusal(
                    actor,
                    "send",
                    target=f"scope:{channel}",
                    content=f"{word} n{n}",
                    clientMessageId=f"v{n}",
                )
                if sent is not None and root is None:
                    root = sent["messageId"]
            elif action == "reply" and root is not None:
                sent = await _ignore_refusal(
                    actor,
                    "send",
                    target=f"#c:{root}",
                    content=f"{word} reply n{n}",
                    clientMessageId=f"v{n}",
                )
                if sent is not None:
                    for reader in clients:  # any reader names the thread's scope
                        page = await _ignore_refusal(
                            reader, "history", target=f"#c:{root}", limit=1
                        )
                        if page is not None:
                            scopes.add(page["scopeId"])
                            break
            elif action in ("join", "leave") and who < len(HUMANS):
                await _ignore_refusal(actor, action, scopeId=channel)
            elif action == "invite" and who >= len(HUMANS):
                owner = clients[HUMANS.index(AGENTS[who - len(HUMANS)][1])]
                await _ignore_refusal(
                    owner,
                    "invite",
                    scopeId=channel,
                    memberId=people[who].id,
                    visibility="private",
                )
            elif action == "grant" and who < len(HUMANS):
                await _ignore_refusal(
                    actor, "grant", scopeId=channel, granteeMemberId=people[other].id
                )
        await _check_every_viewer(conn, people, clients, scopes, channel)


async def _check_every_viewer(
    conn: TrioConnection,
    people: list[Person],
    clients: list[Client],
    scopes: set[str],
    channel: str,
) -> None:
    """Every viewer finds exactly the "alpha" messages its history shows, through
    the session and through every forced strategy of the index."""
    parsed = parse("alpha")
    pa, pb = clients[3], clients[4]
    for viewer in clients:
        readable: set[str] = set()
        for scope in scopes:
            page = await _ignore_refusal(viewer, "history", target=f"scope:{scope}", limit=200)
            if page is not None:
                readable |= {m["id"] for m in page["messages"] if matches(m["content"], parsed)}
        hits = await hits_of(viewer, "alpha")
        found = [h["message"]["id"] for h in hits]
        assert len(found) == len(set(found))
        assert set(found) == readable
        member = people[clients.index(viewer)].member
        in_channel = {h["message"]["id"] for h in hits if h["scopeId"] == channel}
        for strategy, sort in _EVERY_STRATEGY:
            stored = await _stored_hits(conn, member, strategy, sort)
            assert stored == set(found), (strategy, sort)
            stored = await _stored_hits(conn, member, strategy, sort, scope_id=channel)
            assert stored == in_channel, (strategy, sort, "in the channel")
        if viewer in (pa, pb) and found:
            REACHED["private agent hit"] += 1
        if len(scopes) > 1 and found:
            REACHED["world with a thread"] += 1


REACHED: Counter[str] = Counter()

_EVERY_STRATEGY: list[tuple[search_sql.Strategy, search_sql.Sort]] = [
    ("walk", "recent"),
    ("terms", "recent"),
    ("scopes", "recent"),
    ("terms", "relevance"),
    ("scopes", "relevance"),
]


async def _stored_hits(
    conn: TrioConnection,
    member: Member,
    strategy: search_sql.Strategy,
    sort: search_sql.Sort,
    *,
    scope_id: str | None = None,
) -> set[str]:
    """Every hit of "alpha" for ``member`` through one forced strategy."""
    viewer = Viewer(member, public_reader=False, grant_scopes=()).params()
    filters = search_sql.Filters(member.workspace_id, scope_id)
    found: set[str] = set()
    cursor = None
    while True:
        page = await index.search(
            conn, "alpha", parse("alpha"), filters, viewer,
            sort=sort, limit=50, cursor=cursor, strategy=strategy,
        )  # fmt: skip
        assert page.strategy in (None, strategy)
        found |= {hit.readable.message.id for hit in page.hits}
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


WORLD_EXAMPLES = 25
# A world hypothesis found once: a private agent's reply in a thread after a
# grant and a leave.
FOUND_WORLD: list[Step] = [
    ("invite", 3, 0),
    ("grant", 0, 1),
    ("send", 1, 0),
    ("send", 0, 0),
    ("reply", 0, 0),
    ("leave", 1, 0),
    ("send", 0, 0),
    ("reply", 3, 0),
]


async def test_search_finds_exactly_the_readable_matches(database_url: str, tmp_path: Path) -> None:
    """Generated worlds, each in a workspace of its own on one node (a node per
    world was most of this test's CPU), and one connection for the oracle's
    queries (a connection per query cost more than the searches)."""
    async with (
        running_node(database_url, tmp_path) as node,
        await connect(node.database_url, autocommit=True) as conn,
    ):

        @settings(
            max_examples=WORLD_EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(world_steps=steps)
        @example(world_steps=FOUND_WORLD)
        def play(world_steps: list[Step]) -> None:
            trio.from_thread.run(_play, node, conn, world_steps)

        await trio.to_thread.run_sync(play)


def test_generated_worlds_reach_agents_and_threads() -> None:
    # Runs after the property test (file order): its worlds must not be trivial.
    assert REACHED["private agent hit"] > 0, REACHED
    assert REACHED["world with a thread"] > 0, REACHED


# ---------------------------------------------------------------- filters, paging, errors


async def test_filters_paging_sort_and_errors(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        other = await World.create(node, "other")
        ann, bob = await world.member("ann"), await world.member("bob")
        eve = await other.member("eve")
        async with world.client(ann) as a, world.client(bob) as b, other.client(eve) as e:
            ops = await make_channel(a, "ops", b)
            dev = await make_channel(a, "dev", b)
            sent, notes = [], []
            for i in range(7):
                sent.append(await a.send("#ops", f"rollout step {i}"))
                notes.append(await b.send("#dev", f"rollout note {i} rollout"))
            ids = [s["messageId"] for s in sent]
            # Paging: newest first, disjoint pages, all found.
            first = await a.search("rollout", scope_id=ops, limit=3)
            assert [h["message"]["id"] for h in first["hits"]] == ids[::-1][:3]
            assert first["hasMore"]
            assert first["nextCursor"]
            everything = await hits_of(a, "rollout", scope_id=ops, limit=3)
            assert [h["message"]["id"] for h in everything] == ids[::-1]
            assert len(await hits_of(a, "rollout")) == 14
            assert len(await hits_of(a, "rollout", author_id=bob.id)) == 7
            assert len(await hits_of(a, "rollout from:@bob")) == 7
            assert len(await hits_of(a, "rollout in:#dev")) == 7
            assert len(await hits_of(a, "rollout -note")) == 7
            assert len(await hits_of(a, '"step 3"')) == 1
            # Relevance: the message with the word twice ranks first.
            ranked = await hits_of(a, "rollout", sort="relevance")
            assert len(ranked) == 14
            assert ranked[0]["scopeId"] == dev
            # in: covers the channel's threads; a channel the viewer is not in
            # has nothing for it, with or without terms.
            await a.send(f"#dev:{notes[0]['messageId']}", "rollout in a thread")
            await make_channel(b, "quiet")
            await b.send("#quiet", "rollout where ann is not")
            assert len(await hits_of(a, "rollout in:#dev")) == 8
            assert await hits_of(a, "rollout in:#quiet") == []
            assert await hits_of(a, "in:#quiet") == []
            assert len(await hits_of(b, "in:#quiet")) == 1
            # Another workspace sees nothing; its scope ids are not_found.
            assert await hits_of(e, "rollout") == []
            assert await error_of(e, "search", query="rollout", scopeId=ops) == "not_found"
            # A scope the member left is forbidden, like history.
            await b.request("leave", scopeId=ops)
            assert await error_of(b, "search", query="rollout", scopeId=ops) == "forbidden"
            assert len(await hits_of(b, "rollout")) == 9  # #dev, its thread, #quiet
            # Bad input is typed and the session lives on.
            assert await error_of(a, "search", query="   ") == "validation_failed"
            assert await error_of(a, "search", query="x" * 257) == "validation_failed"
            assert await error_of(a, "search", query="a", limit=51) == "validation_failed"
            assert await error_of(a, "search", query="a", sort="best") == "validation_failed"
            assert await error_of(a, "search", query="a", cursor="!!") == "validation_failed"
            cursor = first["nextCursor"]
            assert await error_of(a, "search", query="other", cursor=cursor) == (
                "validation_failed"
            )
            # Opening a hit: history around its seq.
            hit = first["hits"][0]["message"]
            around = await a.history("#ops", aroundSeq=4, limit=4)
            assert [m["seq"] for m in around["messages"]] == [2, 3, 4, 5]
            assert hit["seq"] == 7
            assert await error_of(a, "history", target="#ops", aroundSeq=3, afterSeq=1) == (
                "validation_failed"
            )


async def test_edits_and_deletes_show_in_the_next_search(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as a:
            await make_channel(a, "c")
            edited = (await a.send("#c", "the kettle is broken"))["messageId"]
            deleted = (await a.send("#c", "kettle gossip"))["messageId"]
            assert {h["message"]["id"] for h in await hits_of(a, "kettle")} == {edited, deleted}
            await a.edit(edited, "the teapot is fixed")
            await a.delete(deleted)
            assert await hits_of(a, "kettle") == []
            [hit] = await hits_of(a, "teapot")
            assert hit["message"]["id"] == edited
            assert hit["highlights"] == [[4, 10]]


# ---------------------------------------------------------------- readiness

IMPORTED = 100_000


async def _import_beside_the_send_path(database_url: str, workspace_id: str, author: str) -> str:
    """COPY messages straight into scope_messages, as a restore would, without
    the projection; the importer marks the workspace building first."""
    async with await connect(database_url, autocommit=True) as conn:
        await search_index.mark_building(conn, workspace_id)
        cur = await conn.execute(
            "SELECT s.id FROM scopes s JOIN scope_channel_profiles p ON p.scope_id = s.id"
            " WHERE p.workspace_id = %s AND p.slug = 'bulk'",
            (workspace_id,),
        )
        row = await cur.fetchone()
        assert row is not None
        scope_id = str(row[0])
        columns = (
            "id, workspace_id, scope_id, seq, workspace_global_seq, author_member_id,"
            " author_type, notify_principal_member_id, idempotency_subject_member_id,"
            " client_message_id, idempotency_payload_digest, message_type, content"
        )
        async with conn.transaction():
            async with conn.cursor().copy(f"COPY scope_messages ({columns}) FROM STDIN") as copy:
                for i in range(1, IMPORTED + 1):
                    word = "needle" if i % 1000 == 0 else "hay"
                    await copy.write_row(
                        (
                            f"msg_imp{i:07d}",
                            workspace_id,
                            scope_id,
                            i,
                            10_000_000 + i,
                            author,
                            "human",
                            author,
                            author,
                            f"imp-{i}",
                            b"\x00",
                            "text",
                            f"{word} {i}",
                        )
                    )
            await conn.execute(
                "UPDATE scopes SET latest_seq = %s WHERE id = %s", (IMPORTED, scope_id)
            )
    return scope_id


async def test_rebuild_makes_an_import_searchable_and_never_downgrades(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as a:
            await make_channel(a, "bulk")
            await _import_beside_the_send_path(database_url, world.workspace_id, ann.id)
            with pytest.raises(ClientError) as failed:
                await a.search("needle")
            assert failed.value.code == "search_unavailable"
            assert failed.value.frame.get("retryable") is True
            async with await connect(database_url, autocommit=True) as conn:
                assert (await search_index.status(conn, world.workspace_id)).state == "building"
                done = await search_index.rebuild(conn, world.workspace_id)
            assert done.view() == {"state": "read_ready", "indexed": IMPORTED, "messages": IMPORTED}
            expected = IMPORTED // 1000
            assert len(await hits_of(a, "needle", limit=50)) == expected

            # A second rebuild while a client searches: never a failure, never fewer.
            counts: list[int] = []

            async def keep_searching(cancel: trio.CancelScope) -> None:
                with cancel:
                    while True:
                        page = await a.search("needle", limit=50)
                        counts.append(len(page["hits"]))

            async with trio.open_nursery() as nursery:
                cancel = trio.CancelScope()
                nursery.start_soon(keep_searching, cancel)
                async with await connect(database_url, autocommit=True) as conn:
                    again = await search_index.rebuild(conn, world.workspace_id)
                cancel.cancel()
            assert again.state == "read_ready"
            assert counts
            assert min(counts) == 50
