"""Search with stems and filters (docs/design.md#search): the query's
``from:``, ``in:``, ``before:``, ``after:`` and ``on:`` operators and the same
filters as fields of the ``search`` frame, parsed without I/O and answered by
a real node.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.search_query import (
    QueryError,
    Refinements,
    TermKind,
    highlights,
    parse,
    stem_words,
    with_stems,
)
from node.client import Client, ClientError
from storage.pg import connect
from storage.search_terms import UnknownLanguage
from tests.nodes import World, make_channel, running_node


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# ------------------------------------------------------------------ the parser


def test_operators_parse_beside_words() -> None:
    parsed = parse("from:@ann in:#ops deploy in:@bob after:2024-05-01 before:2024-05-10")
    assert [(t.text, t.kind) for t in parsed.terms] == [("deploy", TermKind.WORD)]
    assert parsed.from_handles == ("ann",)
    assert parsed.in_channels == ("ops",)
    assert parsed.in_people == ("bob",)
    # after: and before: exclude the day named; on: is that day.
    assert parsed.since == day("2024-05-02")
    assert parsed.until == day("2024-05-10")
    on = parse("on:2024-02-29")
    assert (on.since, on.until, on.terms) == (day("2024-02-29"), day("2024-03-01"), ())
    # Several bounds keep the narrowest window; repeated names count once.
    narrow = parse("after:2024-01-01 after:2024-03-01 before:2024-06-01 before:2024-04-01 x")
    assert (narrow.since, narrow.until) == (day("2024-03-02"), day("2024-04-01"))
    assert parse("from:@ann from:@ann").from_handles == ("ann",)
    # Nothing comes after the last day there is.
    last = parse("after:9999-12-31")
    assert last.since == last.until


def test_filters_alone_are_a_search() -> None:
    assert parse("from:@ann").from_handles == ("ann",)
    assert parse("before:2024-01-01").until == day("2024-01-01")
    fields = Refinements(from_member="@ann", in_scope="ops", before="2024-05-10", on=None)
    parsed = parse("", fields)
    assert (parsed.from_handles, parsed.in_channels) == (("ann",), ("ops",))
    assert parse("", Refinements(in_scope="@bob")).in_people == ("bob",)
    assert parse("", Refinements(in_scope="#ops")).in_channels == ("ops",)
    assert parse("x", Refinements(after="2024-05-01")).since == day("2024-05-02")
    assert parsed.described() == {
        "terms": [],
        "excluded": [],
        "from": ["@ann"],
        "in": ["#ops"],
        "since": None,
        "until": "2024-05-10",
    }


@pytest.mark.parametrize(
    ("query", "fields", "path"),
    [
        ("before:2024-13-01", Refinements(), "$.query"),
        ("after:yesterday", Refinements(), "$.query"),
        ("x on:2024-02-30", Refinements(), "$.query"),
        ("x", Refinements(before="2024-1-1"), "$.before"),
        ("x", Refinements(after="soon"), "$.after"),
        ("x", Refinements(on="2024-02-30"), "$.on"),
        ("x", Refinements(from_member="@"), "$.fromMember"),
        ("x", Refinements(in_scope="#Not A Slug"), "$.inScope"),
        ("", Refinements(), "$.query"),
    ],
)
def test_bad_filters_name_their_field(query: str, fields: Refinements, path: str) -> None:
    with pytest.raises(QueryError) as failed:
        parse(query, fields)
    assert failed.value.path == path


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["from:@", "in:#", "in:@", "before:", "after:", "on:", "-", '"']),
            st.text(max_size=12),
            st.dates().map(date.isoformat),
        ),
        max_size=12,
    ).map("".join)
)
def test_any_query_parses_or_is_a_query_error(query: str) -> None:
    problem: QueryError | None = None
    try:
        parsed = parse(query)
    except QueryError as exc:
        problem = exc
    if problem is not None:
        assert problem.path == "$.query"
        return
    assert not parsed.empty
    for bound in (parsed.since, parsed.until):
        assert bound is None or bound.tzinfo is UTC


def test_stems_join_their_words_and_highlight() -> None:
    parsed = with_stems(parse("roadmaps deploying 发布"), {"roadmaps": ("roadmap",)})
    assert stem_words(parse("roadmaps -old deploying 发布")) == ["deploying", "roadmaps"]
    assert parsed.terms[0].needles == ("roadmaps", "roadmap")
    assert parsed.terms[1].needles == ("deploying",)
    content = "the roadmap; roadmaps 发布"
    assert [content[a:b] for a, b in highlights(content, parsed)] == [
        "roadmap",
        "roadmaps",
        "发布",
    ]


# ------------------------------------------------------------ through a node


async def ids_of(client: Client, query: str, **fields: Any) -> list[str]:
    page = await client.search(query, limit=50, **fields)
    return [hit["message"]["id"] for hit in page["hits"]]


async def error_of(client: Client, **fields: Any) -> tuple[str, str | None]:
    with pytest.raises(ClientError) as failed:
        await client.request("search", **fields)
    return str(failed.value.code), failed.value.details.get("path")


async def test_stems_filters_and_bounds(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob, cat = await world.members("ann", "bob", "cat")
        async with world.client(ann) as a, world.client(bob) as b, world.client(cat) as c:
            ops = await make_channel(a, "ops", b, c)
            await make_channel(a, "dev", b)
            exact = (await a.send("#ops", "the roadmaps for the deploy"))["messageId"]
            stem = (await a.send("#ops", "our roadmap: deployed on friday"))["messageId"]
            bobs = (await b.send("#ops", "deploy from bob"))["messageId"]
            dev = (await a.send("#dev", "deploy in dev"))["messageId"]
            dm = (await a.send(f"dm:{bob.id}", "deploy, between us"))["messageId"]
            secret = await c.request("createChannel", slug="secret", name="S", visibility="private")
            await c.request("invite", scopeId=secret["scopeId"], memberId=bob.id)
            hidden = (await c.send("#secret", "deploy the secret"))["messageId"]

            # Stems: roadmaps finds roadmap, deploying finds deployed; the
            # exact word ranks above a stem-only hit.
            assert set(await ids_of(a, "roadmaps")) == {exact, stem}
            assert await ids_of(a, "roadmaps", sort="relevance") == [exact, stem]
            assert stem in await ids_of(a, "deploying")
            page = await a.search("roadmaps deploying", limit=50)
            hit = next(h for h in page["hits"] if h["message"]["id"] == stem)
            content = hit["message"]["content"]
            assert [content[s:e] for s, e in hit["highlights"]] == ["roadmap", "deploy"]

            # from: and in: combine with words, or stand alone.
            assert await ids_of(a, "from:@ann in:#ops deploy") == [stem, exact]
            assert await ids_of(a, "deploy", from_member="@ann", in_scope="#ops") == [
                stem,
                exact,
            ]
            assert set(await ids_of(a, "from:@ann")) == {exact, stem, dev, dm}
            assert await ids_of(b, "in:@ann") == [dm]
            assert await ids_of(a, "deploy", in_scope="@bob") == [dm]
            assert await ids_of(c, "in:@ann") == []  # not cat's DM
            assert set(await ids_of(a, "deploy")) == {exact, stem, bobs, dev, dm}

            # A private channel the viewer is not in answers like one that
            # does not exist: nothing, as an unknown channel or handle.
            assert await ids_of(a, "in:#secret") == []
            assert await ids_of(a, "deploy in:#secret") == []
            assert await ids_of(a, "deploy", in_scope="secret") == []
            assert await ids_of(a, "in:#nowhere") == []
            assert await ids_of(a, "from:@nobody deploy") == []
            assert await ids_of(b, "in:#secret") == [hidden]

            # Dates are UTC days: move the first three messages back in time.
            async with await connect(database_url, autocommit=True) as conn:
                for message_id, at in (
                    (exact, "2024-05-01"),
                    (stem, "2024-05-02"),
                    (bobs, "2024-05-03"),
                ):
                    for table, key in (
                        ("scope_messages", "id"),
                        ("scope_message_search_docs", "message_id"),
                    ):
                        await conn.execute(
                            f"UPDATE {table} SET created_at = %s WHERE {key} = %s",
                            (day(at), message_id),
                        )
            assert await ids_of(a, "in:#ops before:2024-05-02") == [exact]
            assert await ids_of(a, "in:#ops after:2024-05-02") == [bobs]
            assert await ids_of(a, "in:#ops on:2024-05-02") == [stem]
            assert await ids_of(a, "deploy after:2024-04-30 before:2024-05-03") == [stem, exact]
            assert await ids_of(a, "deploy", after="2024-05-01", before="2024-05-03") == [stem]
            assert await ids_of(a, "in:#ops before:2024-05-01") == []

            # The reply says what was searched, for an empty page too.
            empty = await a.search("deploy", from_member="nobody", before="2024-01-01")
            assert empty["hits"] == []
            assert empty["searched"]["from"] == ["@nobody"]
            assert empty["searched"]["until"] == "2024-01-01"

            # Bad dates and filters are typed and name their field.
            assert await error_of(a, query="before:2024-13-01") == ("validation_failed", "$.query")
            assert await error_of(a, query="x", after="May 1") == ("validation_failed", "$.after")
            assert await error_of(a, query="x", fromMember="@") == (
                "validation_failed",
                "$.fromMember",
            )
            assert await error_of(a, query="") == ("validation_failed", "$.query")
            assert ops


async def test_a_language_the_database_lacks_stops_the_node(
    database_url: str, tmp_path: Path
) -> None:
    with pytest.raises(BaseExceptionGroup) as failed:
        async with running_node(database_url, tmp_path, search_language="no_such_language"):
            pass
    assert failed.group_contains(UnknownLanguage, depth=None)
