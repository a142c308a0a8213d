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
from pathlib import Path
from typing import Any

import pytest

from actors.search_query import TermKind, highlights, matches, parse
from node.client import Client, ClientError
from tests.nodes import World, make_channel, running_node

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
                for hit in hits:
                    content = hit["message"]["content"]
                    assert hit["highlights"] == [list(s) for s in highlights(content, parsed)]
                    assert all(0 <= s < e <= len(content) for s, e in hit["highlights"])
