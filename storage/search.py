"""Search: the query over the projection, its readiness, and its rebuild.

docs/design.md#search. ``scope_message_search_docs`` holds one document per
live message (written by the send statement, updated by edits, removed by
deletes); migration 7 indexes it twice, a ``simple`` tsvector for words and
trigrams for substrings. A query is one statement: candidates from the indexes,
then the readable predicate of ``storage/visibility.py``, evaluated per row
with the viewer's rights in that row's scope, so a hit is exactly a message
``history`` would show the viewer.

Readiness lives in ``scope_message_search_state`` (scope key ``*``): a
workspace without a row is ready (every send projects its message), an import
that writes messages beside the send path marks it ``building``
(:func:`mark_building`) and :func:`rebuild` makes it ready again. A rebuild of
a ready workspace never touches its row and never deletes the document of a
live message: it only adds what is missing and rewrites what differs, so
searches running meanwhile see at least what they saw before.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import hashlib
import itertools
import json
import math
import re
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from actors.lru import Lru
from actors.search_query import ParsedQuery, Term, TermKind
from protocol.text import TextKind, text_problem
from storage.errors import map_errors
from storage.messages import MESSAGE_COLUMNS, ReadableMessage, message_from_row
from storage.pg import Prepared, TrioConnection
from storage.visibility import ViewerTerms, readable_join, scope_shape

Sort = Literal["recent", "relevance"]
Strategy = Literal["walk", "terms", "scopes"]
MAX_LIMIT = 50
REBUILD_BATCH = 5000

READY = "read_ready"
BUILDING = "building"


class BadCursor(ValueError):
    """The cursor was not issued for this query."""


# ------------------------------------------------------------------ the query

# The predicate's per-scope parameters become columns of the viewer's candidate
# scopes, computed once per scope as scopes.viewer_for does (not once per row:
# the planner would plan that lookup again at every place the predicate uses it).
# ``docs`` (the scope's latest seq) sizes what the viewer could read.
# What the readable predicate needs of one scope for this viewer.
_RIGHTS_COLUMNS = f"""
        NOT %(viewer_private)s AND EXISTS (
            SELECT 1 FROM scope_memberships x
            WHERE x.scope_id = sc.id AND x.member_id = %(viewer_id)s
              AND x.visibility = 'public' AND x.effective_to_seq IS NULL
        ) AS viewer_public,
        {scope_shape("sc")}"""


def _rights(scopes: str) -> str:
    """The viewer's rights in each of the scopes ``scopes`` admits."""
    return f"""
rights AS MATERIALIZED (
    SELECT
        sc.id AS scope_id,{_RIGHTS_COLUMNS},
        sc.latest_seq AS docs
    FROM scopes sc
    WHERE {scopes}
)"""


_RIGHTS = _rights("sc.id IN (SELECT scope_id FROM scopes_in)")
# ``in:#slug``: the channels named and their threads (through the thread-root
# index, which leads with the parent).
IN_CHANNELS = """
    SELECT cp.scope_id FROM scope_channel_profiles cp
    WHERE cp.workspace_id = %(workspace_id)s AND cp.slug = ANY(%(channels)s)
    UNION ALL
    SELECT t.id FROM scope_channel_profiles cp
    JOIN scopes t ON t.parent_scope_id = cp.scope_id
    WHERE cp.workspace_id = %(workspace_id)s AND cp.slug = ANY(%(channels)s)"""
# With ``in:`` only those of the viewer's scopes are candidates: a viewer who
# reads none of them has no documents to search, and the choice knows it.
_RIGHTS_IN = _rights(f"sc.id IN (SELECT scope_id FROM scopes_in) AND sc.id IN ({IN_CHANNELS})")
# With a scope filter only that scope is a candidate (its size decides the strategy).
_RIGHTS_ONE = _rights("sc.id IN (SELECT scope_id FROM scopes_in) AND sc.id = %(scope_id)s")
# The rights of the walk and of the text indexes' candidates, looked up for each
# row that reaches the predicate (a match in a scope the viewer could read)
# instead of joined against every candidate scope: a newest-first page needs
# the rights of a few scopes, and the planner, which cannot estimate the
# candidates, joined them to a list of rights by a nested loop — candidates ×
# the viewer's scopes (3,181 × 824 comparisons, 0.4 s, for a CJK word in a team
# with many threads).
_RIGHTS_OF_ROW = f"""
CROSS JOIN LATERAL (
    SELECT{_RIGHTS_COLUMNS}
    FROM scopes sc
    WHERE sc.id = d.scope_id
) sv"""
# The predicate with the viewer's rights in the row's scope (``sv``, either
# form of the rights above) and the viewer's own parameters.
READABLE_PER_ROW = readable_join(
    ViewerTerms(
        viewer_public="sv.viewer_public", in_thread="sv.in_thread", grant_scopes="sv.grant_scopes"
    )
)

# Scopes where the viewer could read anything at all: a superset the index scan
# is narrowed to; the predicate decides each row. Private agents keep every
# interval (closed ones too) and the scopes their explicit context opens. Only
# ever read by `IN`: a scope listed twice costs nothing, so nothing removes
# duplicates.
_SCOPES_IN = """
scopes_in AS (
    SELECT vm.scope_id FROM scope_memberships vm
    WHERE vm.member_id = %(viewer_id)s
      AND (vm.visibility = 'private' OR vm.effective_to_seq IS NULL)
    UNION ALL
    SELECT t.id FROM scope_memberships pm
    JOIN scopes t ON t.parent_scope_id = pm.scope_id AND t.type = 'thread'
    WHERE NOT %(viewer_private)s AND pm.member_id = %(viewer_id)s
      AND pm.visibility = 'public' AND pm.effective_to_seq IS NULL
    UNION ALL
    SELECT cx.source_scope_id FROM scope_message_sources cx
    WHERE %(viewer_private)s AND cx.context_member_id = %(viewer_id)s
)"""


# A workspace being built yields no hits, so a page with hits needs no separate
# readiness round trip; only an empty one asks (is_ready()).
_BUILDING = """
SELECT 1 FROM scope_message_search_state st
WHERE st.workspace_id = %(workspace_id)s AND st.scope_key = '*' AND NOT st.read_ready"""


@dataclass(frozen=True, slots=True)
class Filters:
    workspace_id: str
    scope_id: str | None = None
    author_id: str | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    readable: ReadableMessage
    rank: float


@dataclass(frozen=True, slots=True)
class Results:
    hits: list[Hit]
    next_cursor: str | None
    strategy: str | None = None  # the one that ran (None: no hits to tell)


# A LIKE pattern's value: the searched text matched literally.
_LIKE_ESCAPES = str.maketrans({"\\": "\\\\", "%": "\\%", "_": "\\_"})


def _like(text: str) -> str:
    escaped = text.translate(_LIKE_ESCAPES)
    return f"%{escaped}%"


def _tsquery(words: list[str]) -> str:
    # Word terms are letters only, so quoting cannot be escaped out of.
    return " & ".join(f"'{w}':*" for w in words)


def _term_condition(
    t: Term, name: str, params: dict[str, object], *, indexed: bool, raw: bool = False
) -> str:
    """The term's condition: as an operator the text indexes answer, or (not
    ``indexed``) as the same function called per row, which no index takes.
    The readable statement parses its tsquery once (an initplan), not per row."""
    if t.kind is TermKind.WORD:
        params[name] = _tsquery([t.text])
        query = f"to_tsquery('simple', %({name})s)"
        if not raw:
            query = f"(SELECT {query})"
        return f"d.body_tsv @@ {query}" if indexed else f"ts_match_vq(d.body_tsv, {query})"
    params[name] = _like(t.text)
    checked = f"texticlike(d.body, %({name})s)"
    if not indexed:
        return checked
    # A term without trigrams is found through the index of its CJK pairs
    # (migration 9) or of its symbols (migration 13), each partial on its
    # characters, and the pattern checks the candidates as a function call: as
    # an operator the trigram index would be scanned whole for it.
    for suffix, function, characters, keys in (
        ("pairs", "scopenode_cjk_bigrams", CJK_CHARACTER, _pair_lookup(t.text)),
        ("symbols", "scopenode_symbols", SYMBOL_CHARACTER, _symbol_lookup(t.text)),
    ):
        if keys:
            params[f"{name}_{suffix}"] = keys
            return (
                f"d.body ~ '{characters}'"
                f" AND {function}(d.body) @> %({name}_{suffix})s::text[] AND {checked}"
            )
    return f"d.body ILIKE %({name})s"


def _conditions(
    parsed: ParsedQuery,
    filters: Filters,
    params: dict[str, object],
    *,
    indexed: bool,
    raw: bool = False,
) -> list[str]:
    where = ["d.workspace_id = %(workspace_id)s"]
    for i, t in enumerate(parsed.terms):
        where.append(_term_condition(t, f"t{i}", params, indexed=indexed, raw=raw))
    for i, t in enumerate(parsed.excluded):
        excluded = _term_condition(t, f"x{i}", params, indexed=False, raw=raw)
        where.append(f"NOT ({excluded})")
    if filters.scope_id is not None:
        params["scope_id"] = filters.scope_id
        where.append("d.scope_id = %(scope_id)s")
    if filters.author_id is not None:
        params["author_id"] = filters.author_id
        where.append("d.author_member_id = %(author_id)s")
    if parsed.from_handles:
        params["handles"] = list(parsed.from_handles)
        where.append(
            "d.author_member_id IN (SELECT h.id FROM members h"
            " WHERE h.workspace_id = %(workspace_id)s AND h.handle = ANY(%(handles)s))"
        )
    if parsed.in_channels:
        params["channels"] = list(parsed.in_channels)
        where.append(f"d.scope_id IN ({IN_CHANNELS})")
    return where


@dataclass(frozen=True, slots=True)
class _Order:
    rank: str
    order: str
    after: str | None


def _order(
    parsed: ParsedQuery,
    sort: Sort,
    after: tuple[Any, ...] | None,
    params: dict[str, object],
    *,
    raw: bool = False,
) -> _Order:
    words = [t.text for t in parsed.terms if t.kind is TermKind.WORD]
    if sort == "relevance" and words:
        params["rank_query"] = " | ".join(f"'{w}':*" for w in words)
        query = "to_tsquery('simple', %(rank_query)s)"
        rank = f"ts_rank(d.body_tsv, {query if raw else f'(SELECT {query})'})"
    else:
        rank = "0::real"
    if sort == "relevance":
        order = f"{rank} DESC, d.created_at DESC, d.message_id DESC"
        key = f"({rank}, d.created_at, d.message_id)"
    else:
        order = "d.created_at DESC, d.message_id DESC"
        key = "(d.created_at, d.message_id)"
    condition = None
    if after is not None:
        if sort == "relevance":
            condition = f"{key} < (%(after_rank)s::real, %(after_at)s, %(after_id)s)"
            params.update(after_rank=after[0], after_at=after[1], after_id=after[2])
        else:
            condition = f"{key} < (%(after_at)s, %(after_id)s)"
            params.update(after_at=after[0], after_id=after[1])
    return _Order(rank, order, condition)


def build_query(
    parsed: ParsedQuery,
    filters: Filters,
    viewer_params: dict[str, object],
    *,
    sort: Sort,
    limit: int,
    after: tuple[Any, ...] | None,
    raw: bool = False,
    estimate: Estimate | None = None,
    strategy: Strategy | None = None,
    within: Sequence[str] | None = None,
) -> tuple[str, dict[str, object]]:
    """The search statement and its parameters. ``raw`` leaves out the viewer
    (the bench's baseline: the same index work without the predicate, planned
    for its terms at every call); ``within`` (raw only) keeps the candidates of
    these scopes, the least any visibility filter must do."""
    if not raw:
        return _readable_query(
            parsed,
            filters,
            viewer_params,
            sort,
            limit,
            after,
            estimate or Estimate(None, True),
            strategy,
        )
    params: dict[str, object] = {"workspace_id": filters.workspace_id, "limit": limit + 1}
    where = _conditions(parsed, filters, params, indexed=True, raw=True)
    if within is not None:
        params["within"] = list(within)
        where.append("d.scope_id = ANY(%(within)s)")
    order = _order(parsed, sort, after, params, raw=True)
    if order.after is not None:
        where.append(order.after)
    statement = f"""
SELECT d.message_id, {order.rank}, d.created_at
FROM scope_message_search_docs d
WHERE {" AND ".join(where)}
ORDER BY {order.order}
LIMIT %(limit)s"""
    return statement, params


# ------------------------------------------------------- the readable query
#
# The statement is prepared once per shape (terms and their kinds, filters,
# sort, cursor, limit) and runs with a generic plan, so a search is not planned
# again at every call. A generic plan cannot tell a rare term from a common
# one, so the statement holds three candidate strategies and runs only the one
# its estimate picks (the others sit behind a one-time filter):
#   walk   - the (workspace_id, created_at) index newest first, each row tested,
#            until the page is full: cheap when readable matches are dense;
#   terms  - the text indexes find every match, then sort: cheap for rare terms;
#   scopes - every document of the viewer's scopes, tested, then sort: bounded
#            by what the viewer reads (a substring too short for trigrams).
# Every parameter enters as an initplan, so the planner's estimates never
# depend on the values: the custom plans PostgreSQL makes for the first
# executions cost what the generic one does, and the generic one is kept.

UNKNOWN_FREQ = 1e-4  # a term the statistics do not track is taken as rare

_PARAM_TYPES = {
    "limit": "int8",
    "viewer_private": "bool",
    "walkable": "bool",
    "indexable": "bool",
    "freq": "float8",
    "handles": "text[]",
    "channels": "text[]",
    "after_rank": "float4",
    "after_at": "timestamptz",
}

_PLAN = """
plan AS MATERIALIZED (
    SELECT CASE
        WHEN e.walk <= e.terms AND e.walk <= e.scopes THEN 'walk'
        WHEN e.terms <= e.scopes THEN 'terms'
        ELSE 'scopes'
    END AS how, e.scope_ids
    FROM (
        SELECT
            CASE WHEN %(walkable)s THEN least(n.docs, {limit} * n.docs / (f.freq * r.docs))
                 ELSE 'Infinity'::float8 END AS walk,
            CASE WHEN %(indexable)s THEN f.freq * n.docs ELSE 'Infinity'::float8 END AS terms,
            r.docs AS scopes, r.scope_ids
        FROM (SELECT greatest(sum(rights.docs), 1)::float8 AS docs,
                     array_agg(rights.scope_id) AS scope_ids FROM rights) r,
             (SELECT greatest(c.reltuples, 1)::float8 AS docs FROM pg_class c
              WHERE c.oid = 'scope_message_search_docs'::regclass) n,
             (SELECT coalesce(%(freq)s, {unknown}) AS freq) f
    ) e
)"""


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the statement's strategy choice knows of the terms: the share of
    documents they match (None: unknown), and whether a text index can find
    them (a substring needs three characters in a row for trigrams)."""

    freq: float | None
    indexable: bool


@dataclass(frozen=True, slots=True)
class Sizes:
    """What the strategy choice weighs besides the terms: the documents of the
    viewer's candidate scopes (their latest seqs) and of the whole table."""

    viewer: float
    total: float


def walkable(parsed: ParsedQuery, sort: Sort) -> bool:
    """Whether the walk may run: newest first, and not for ``in:``, whose
    channels may hold none of the newest documents (a viewer outside them
    would walk the whole workspace to find nothing)."""
    return sort == "recent" and not parsed.in_channels


def pick(sizes: Sizes, estimate: Estimate, *, walkable: bool, limit: int) -> Strategy:
    """The strategy ``_PLAN`` would choose for these sizes (its Python twin)."""
    freq = UNKNOWN_FREQ if estimate.freq is None else estimate.freq
    viewer, total = max(sizes.viewer, 1.0), max(sizes.total, 1.0)
    walk = min(total, (limit + 1) * total / (freq * viewer)) if walkable else math.inf
    terms = freq * total if estimate.indexable else math.inf
    if walk <= terms and walk <= viewer:
        return "walk"
    return "terms" if terms <= viewer else "scopes"


def _gate(how: str, gated: bool) -> str:
    return f"(SELECT p.how FROM plan p) = '{how}'" if gated else "true"


_RIGHTS_JOIN = "JOIN rights sv ON sv.scope_id = d.scope_id"


def _branch(
    how: str,
    source: str,
    where: list[str],
    order: _Order,
    limit: int,
    *,
    gated: bool,
    rights: str = _RIGHTS_JOIN,
    presorted: bool = False,
) -> str:
    if presorted:
        # Candidates in page order, so the predicate runs row by row until the
        # page is full instead of on every candidate before a sort (a word in
        # thousands of messages needs ~21 of them tested, not all).
        source = f"(SELECT * FROM {source} d ORDER BY {order.order})"
    return f"""(
SELECT {MESSAGE_COLUMNS}, {order.rank}
FROM {source} d
{rights}
JOIN scope_messages m ON m.id = d.message_id
JOIN members mem ON mem.id = m.author_member_id
{READABLE_PER_ROW}
WHERE {_gate(how, gated)} AND {" AND ".join(where or ["true"])}
  AND m.deleted_at IS NULL AND v.reason IS NOT NULL
ORDER BY {order.order}
LIMIT {limit + 1})"""


def _candidates(name: str, how: str, where: list[str], relevance: bool, *, gated: bool) -> str:
    columns = "d.message_id, d.scope_id, d.created_at" + (", d.body_tsv" if relevance else "")
    return f"""
{name} AS MATERIALIZED (
    SELECT {columns} FROM scope_message_search_docs d
    WHERE {_gate(how, gated)} AND {" AND ".join(where)}
)"""


# Every row carries the strategy that ran and the sizes the choice weighs, so
# the next search of this viewer can choose in Python and run only that one
# (a terms-only statement, which never reads all of the viewer's scopes,
# carries NULL sizes: the choice stands until its sizes expire).
_SIZES = """(SELECT greatest(sum(r.docs), 1) FROM rights r)::float8,
       (SELECT greatest(c.reltuples, 1) FROM pg_class c
        WHERE c.oid = 'scope_message_search_docs'::regclass)::float8"""


def _readable_query(
    parsed: ParsedQuery,
    filters: Filters,
    viewer_params: dict[str, object],
    sort: Sort,
    limit: int,
    after: tuple[Any, ...] | None,
    estimate: Estimate,
    strategy: Strategy | None,
) -> tuple[str, dict[str, object]]:
    """The readable statement: with ``strategy`` that strategy alone, without
    it all three behind the statement's own choice (``_PLAN``)."""
    relevance = sort == "relevance"
    if strategy == "walk" and relevance:
        raise ValueError("a walk in rank order would read everything")
    params: dict[str, object] = {"workspace_id": filters.workspace_id}
    params.update((k, viewer_params[k]) for k in ("viewer_id", "viewer_private", "owner_id"))
    order = _order(parsed, sort, after, params)
    tail = [order.after] if order.after is not None else []
    gated = strategy is None
    viewer_scopes = (
        "(SELECT p.scope_ids FROM plan p)"
        if gated
        else "(SELECT array_agg(r.scope_id) FROM rights r)"
    )
    # The terms or the walk strategy alone reads rights only for the scopes its
    # candidates come from (narrowed to the viewer's scopes first); it cannot
    # report the viewer's sizes then.
    lazy_rights = strategy in ("terms", "walk")
    in_viewer_scopes = (
        f"(d.scope_id IN (SELECT s.scope_id FROM {'scopes_in' if lazy_rights else 'rights'} s))"
        " IS TRUE"
    )
    ctes = [_SCOPES_IN]
    if not lazy_rights:
        if filters.scope_id is not None:
            ctes.append(_RIGHTS_ONE)
        else:
            ctes.append(_RIGHTS_IN if parsed.in_channels else _RIGHTS)
    if gated:
        params.update(
            walkable=walkable(parsed, sort), indexable=estimate.indexable, freq=estimate.freq
        )
        ctes.append(_PLAN.format(limit=limit + 1, unknown=UNKNOWN_FREQ))
    branches = []
    if strategy in (None, "terms"):
        terms = [in_viewer_scopes, *_conditions(parsed, filters, params, indexed=True), *tail]
        ctes.append(_candidates("terms_docs", "terms", terms, relevance, gated=gated))
        branches.append(
            _branch(
                "terms",
                "terms_docs",
                [],
                order,
                limit,
                gated=gated,
                rights=_RIGHTS_OF_ROW,
                presorted=not relevance,
            )
        )
    if strategy in (None, "scopes"):
        scopes = [
            f"d.scope_id = ANY({viewer_scopes}::text[])",
            *_conditions(parsed, filters, params, indexed=False),
            *tail,
        ]
        ctes.append(_candidates("scopes_docs", "scopes", scopes, relevance, gated=gated))
        branches.append(
            _branch("scopes", "scopes_docs", [], order, limit, gated=gated, presorted=not relevance)
        )
    if strategy == "walk" or (gated and not relevance):
        # In the walk the viewer's scopes are a hashed filter on each row, tested
        # before its terms (not a join against every candidate scope per row).
        walk = [in_viewer_scopes, *_conditions(parsed, filters, params, indexed=False), *tail]
        rights = _RIGHTS_OF_ROW if lazy_rights else _RIGHTS_JOIN
        branch = _branch(
            "walk", "scope_message_search_docs", walk, order, limit, gated=gated, rights=rights
        )
        branches.insert(0, branch)
    how = "(SELECT p.how FROM plan p)" if gated else f"'{strategy}'"
    sizes = "NULL::float8, NULL::float8" if lazy_rights else _SIZES
    statement = f"""
WITH {",".join(ctes)}
SELECT hits.*, {how}::text, {sizes} FROM ({" UNION ALL ".join(branches)}) hits
WHERE NOT EXISTS ({_BUILDING})"""
    return _opaque(statement), params


@functools.lru_cache(maxsize=512)
def _opaque(statement: str) -> str:
    """Each parameter as an initplan: estimates that do not depend on its value."""

    def wrap(match: re.Match[str]) -> str:
        type_ = _PARAM_TYPES.get(match.group(1), "text")
        # An array is cast again outside, or `= ANY((SELECT …))` means a subquery.
        cast = f"::{type_}" if type_.endswith("[]") else ""
        return f"(SELECT {match.group(0)}::{type_}){cast}"

    return re.sub(r"%\((\w+)\)s", wrap, statement)


# Statement shapes (terms and their kinds, filters, sort, cursor) seen lately;
# each is prepared once per connection.
STATEMENTS_KEPT = 256
_prepared: Lru[str, tuple[Prepared, tuple[str, ...]]] = Lru("search_statements", STATEMENTS_KEPT)
_without_jit: weakref.WeakSet[TrioConnection] = weakref.WeakSet()


def _prepare(statement: str) -> tuple[Prepared, tuple[str, ...]]:
    found = _prepared.get(statement)
    if found is None:
        name = "scopenode_search_" + hashlib.sha256(statement.encode()).hexdigest()[:16]
        found = Prepared.from_named(name, statement, _ALL_UNKNOWN)
        _prepared.put(statement, found)
    return found


class _Unknown(dict[str, int]):
    """Every parameter's type comes from its cast in the statement."""

    def __missing__(self, key: str) -> int:
        return 0


_ALL_UNKNOWN = _Unknown()


# A text[] parameter's items, quoted as PostgreSQL's array input reads them.
_ARRAY_ITEM_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"'})


def _text(value: object) -> bytes | None:
    """A parameter in PostgreSQL's text format."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, list | tuple):
        quoted = ('"' + str(item).translate(_ARRAY_ITEM_ESCAPES) + '"' for item in value)
        return ("{" + ",".join(quoted) + "}").encode()
    return str(value).encode()


# ------------------------------------------------------------ term statistics

_TERM_STATS = """
SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs
FROM pg_stats s
WHERE s.schemaname = 'public' AND s.tablename = 'scope_message_search_docs'
  AND s.attname = 'body_tsv'
"""
STATS_TTL = 300.0  # seconds; ANALYZE (auto or rebuild) changes them slowly
_WORD_RUN = re.compile(r"[^\W_]+")


class TermStats:
    """The most common words of the documents and the share of documents
    holding each (``pg_stats``); ``floor`` is the least tracked share."""

    __slots__ = ("_cumulative", "_lexemes", "floor", "loaded_at")

    def __init__(self, freqs: dict[str, float], floor: float, loaded_at: float) -> None:
        # Sorted, with running sums: the words sharing a prefix are one slice,
        # found by bisection (a scan of every tracked word took ~0.3 ms).
        self._lexemes = sorted(freqs)
        self._cumulative = [0.0, *itertools.accumulate(freqs[w] for w in self._lexemes)]
        self.floor = floor
        self.loaded_at = loaded_at

    def word(self, prefix: str) -> float:
        """Documents with a word starting with ``prefix`` (a word term)."""
        lexemes = self._lexemes
        low = bisect.bisect_left(lexemes, prefix)
        high = bisect.bisect_left(lexemes, prefix + "\U0010ffff", low)
        while high < len(lexemes) and lexemes[high].startswith(prefix):
            high += 1  # words continuing with the highest code point
        found = self._cumulative[high] - self._cumulative[low]
        return min(1.0, found) if found > 0 else self.floor / 2

    def estimate(self, parsed: ParsedQuery) -> Estimate:
        freq: float | None = None
        indexable = False
        for t in parsed.terms:
            share = self._share(t)
            if share is not None:
                freq = share if freq is None else freq * share
            indexable = (
                indexable
                or t.kind is TermKind.WORD
                or _trigrams(t.text)
                or bool(_pair_lookup(t.text))
                or bool(_symbol_lookup(t.text))
            )
        if not parsed.terms:
            freq = 1.0  # filters and exclusions only: nearly everything matches
        return Estimate(freq, indexable)

    def _share(self, t: Term) -> float | None:
        if t.kind is TermKind.WORD:
            return self.word(t.text)
        runs = _WORD_RUN.findall(t.text)
        if not runs or not all(_is_tracked_word(run) for run in runs):
            return None  # unsegmented text, digits: no word statistics
        # The words anywhere in a message: an upper bound the trigram index
        # needs anyway (its candidates hold every trigram, adjacent or not).
        share = 1.0
        for run in runs:
            share *= self.word(run)
        return share


# The characters scopenode_cjk_bigrams() pairs (storage/schema_v9_cjk_bigrams.sql).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# The same class as SQL text, exactly as the partial index's predicate states
# it (migration 10): a query names it so that PostgreSQL may use that index.
CJK_CHARACTER = "[" + _CJK.encode("unicode_escape").decode() + "]"
_CJK_PAIR = re.compile(f"(?=([{_CJK}]{{2}}))")


def cjk_bigrams(text: str) -> list[str]:
    """The distinct adjacent pairs of CJK characters in ``text``, as the
    database function indexes them."""
    return sorted(set(_CJK_PAIR.findall(text)))


# The characters scopenode_symbols() indexes (storage/schema_v13_symbols.sql),
# as the partial index's predicate states them.
_SYMBOLS = "\u2190-\u2bff\U0001f000-\U0001faff"
SYMBOL_CHARACTER = "[" + _SYMBOLS.encode("unicode_escape").decode() + "]"
_SYMBOL = re.compile(f"[{_SYMBOLS}]")


def symbols(text: str) -> list[str]:
    """The distinct emoji and pictographs in ``text``, as the database function
    indexes them."""
    return sorted(set(_SYMBOL.findall(text)))


def _symbol_lookup(text: str) -> list[str]:
    """The symbols to find a substring term by: only when neither trigrams nor
    CJK pairs find it."""
    return [] if _trigrams(text) or cjk_bigrams(text) else symbols(text)


def _pair_lookup(text: str) -> list[str]:
    """The pairs to find a substring term by: only when it has no trigram."""
    return [] if _trigrams(text) else cjk_bigrams(text)


def _is_tracked_word(run: str) -> bool:
    return run.isalpha() and run.isascii()


def _trigrams(text: str) -> bool:
    """Whether pg_trgm can extract a trigram from ``%text%`` (three word
    characters in a row)."""
    return any(len(run) >= 3 for run in _WORD_RUN.findall(text))


_stats: TermStats | None = None


async def term_stats(conn: TrioConnection) -> TermStats:
    """The cached statistics, read again every ``STATS_TTL`` seconds."""
    global _stats
    now = time.monotonic()
    if _stats is None or now - _stats.loaded_at > STATS_TTL:
        with map_errors():
            row = await (await conn.execute(_TERM_STATS, prepare=False)).fetchone()
        if row is None or row[0] is None:
            _stats = TermStats({}, UNKNOWN_FREQ * 2, now)
        else:
            shares = [float(f) for f in row[1][: len(row[0])]]
            _stats = TermStats(dict(zip(row[0], shares, strict=True)), min(shares), now)
    return _stats


def _fingerprint(query: str, filters: Filters, sort: Sort) -> str:
    basis = json.dumps([query, filters.scope_id, filters.author_id, sort])
    return hashlib.sha256(basis.encode()).hexdigest()[:12]


def encode_cursor(fingerprint: str, sort: Sort, last: Hit) -> str:
    message = last.readable.message
    key: list[object] = [message.created_at.isoformat(), message.id]
    if sort == "relevance":
        key.insert(0, last.rank)
    raw = json.dumps({"f": fingerprint, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


REAL_MAX = 3.4028234663852886e38  # the largest finite float4
REAL_TINY = 1.401298464324817e-45  # the smallest positive float4: below it a real is 0


def decode_cursor(cursor: str, fingerprint: str, sort: Sort) -> tuple[Any, ...]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        body = json.loads(raw)
        key = body["k"]
        if body["f"] != fingerprint or len(key) != (3 if sort == "relevance" else 2):
            raise BadCursor("the cursor belongs to another query")
        at = datetime.fromisoformat(str(key[-2]))
        if at.tzinfo is None or not isinstance(key[-1], str):
            raise BadCursor("not a cursor")
        # Issued in UTC; another offset may be one PostgreSQL refuses (+23:59),
        # and one that moves it past the year 9999 raises OverflowError.
        at = at.astimezone(UTC)
        if text_problem(key[-1], TextKind.KEY) is not None:
            raise BadCursor("not a cursor")
        if sort == "relevance":
            rank = float(key[0])
            # The statement compares it as a ``real``: a rank it cannot hold
            # (too large, or so small it would round to 0) was not issued.
            if rank != 0 and not REAL_TINY <= abs(rank) <= REAL_MAX:
                raise BadCursor("not a cursor")
            return (rank, at, key[-1])
        return (at, key[-1])
    except BadCursor:
        raise
    except (
        binascii.Error,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        UnicodeDecodeError,
        OverflowError,
    ):
        raise BadCursor("not a cursor") from None


SIZES_TTL = 60.0  # seconds a viewer's sizes choose its strategy before they are read again
SIZES_KEPT = 10_000

# (workspace, viewer, scope filter) -> (sizes, read at): the strategy choice's
# inputs from the viewer's last search with hits. Only speed depends on them:
# every strategy returns the same hits.
_sizes: Lru[tuple[str, str, str | None], tuple[Sizes, float]] = Lru("search_sizes", SIZES_KEPT)


def _known_sizes(key: tuple[str, str, str | None]) -> Sizes | None:
    found = _sizes.get(key)
    if found is None or time.monotonic() - found[1] > SIZES_TTL:
        return None
    return found[0]


def _remember_sizes(key: tuple[str, str, str | None], sizes: Sizes) -> None:
    _sizes.put(key, (sizes, time.monotonic()))


async def search(
    conn: TrioConnection,
    query: str,
    parsed: ParsedQuery,
    filters: Filters,
    viewer_params: dict[str, object],
    *,
    sort: Sort = "recent",
    limit: int = 20,
    cursor: str | None = None,
    strategy: Strategy | None = None,
) -> Results:
    """One page of readable hits, newest (or best ranked) first; none while the
    workspace is being built (:func:`is_ready` tells an empty page from that).

    The strategy is chosen in Python from the sizes the viewer's previous search
    returned (a statement holding one strategy starts faster than one holding
    three); without them the statement chooses. ``strategy`` forces one.
    """
    fingerprint = _fingerprint(query, filters, sort)
    after = decode_cursor(cursor, fingerprint, sort) if cursor else None
    estimate = (await term_stats(conn)).estimate(parsed)
    # The sizes of an in: search are those of its channels, not of all the viewer reads.
    scopes_key = filters.scope_id or ",".join(sorted(parsed.in_channels)) or None
    key = (filters.workspace_id, str(viewer_params["viewer_id"]), scopes_key)
    if strategy is None and (sizes := _known_sizes(key)) is not None:
        strategy = pick(sizes, estimate, walkable=walkable(parsed, sort), limit=limit)
    statement, params = build_query(
        parsed,
        filters,
        viewer_params,
        sort=sort,
        limit=limit,
        after=after,
        estimate=estimate,
        strategy=strategy,
    )
    stmt, names = _prepare(statement)
    with map_errors():
        if conn not in _without_jit:
            # The plan holds three strategies and is costed as if all ran, over
            # jit_above_cost: compiling it would take longer than any search.
            await conn.execute("SET jit = off", prepare=False)
            _without_jit.add(conn)
        rows = await conn.run_prepared(stmt, [_text(params.get(name)) for name in names])
    if rows and rows[0][-1] is not None:
        _remember_sizes(key, Sizes(float(rows[0][-2]), float(rows[0][-1])))
    hits = [
        Hit(ReadableMessage(message_from_row(r), r[15], r[16]), float(r[-4])) for r in rows[:limit]
    ]
    more = len(rows) > limit
    return Results(
        hits,
        encode_cursor(fingerprint, sort, hits[-1]) if more else None,
        str(rows[0][-3]) if rows else None,
    )


# -------------------------------------------------------------- readiness


@dataclass(frozen=True, slots=True)
class Status:
    state: str  # read_ready or building
    indexed: int  # documents of the workspace
    messages: int  # live (not deleted) messages of the workspace

    def view(self) -> dict[str, object]:
        return {"state": self.state, "indexed": self.indexed, "messages": self.messages}


SELECT_READY = """
SELECT read_ready FROM scope_message_search_state
WHERE workspace_id = %s AND scope_key = '*'
"""
COUNT_INDEXED = "SELECT count(*) FROM scope_message_search_docs WHERE workspace_id = %s"
COUNT_LIVE = "SELECT count(*) FROM scope_messages WHERE workspace_id = %s AND deleted_at IS NULL"
# Only a ready projection may stop being ready by an import; a rebuild's own
# progress never clears read_ready (it never writes a ready row).
MARK_BUILDING = """
INSERT INTO scope_message_search_state
    (workspace_id, scope_key, migration_state, backfill_state, finalize_state, read_ready)
VALUES (%(workspace_id)s, '*', 'complete', %(backfill)s, %(finalize)s, false)
ON CONFLICT (workspace_id, scope_key) DO UPDATE
SET backfill_state = EXCLUDED.backfill_state, finalize_state = EXCLUDED.finalize_state,
    read_ready = false, updated_at = now()
WHERE NOT scope_message_search_state.read_ready OR %(force)s
"""
MARK_READY = """
INSERT INTO scope_message_search_state
    (workspace_id, scope_key, migration_state, backfill_state, finalize_state, read_ready)
VALUES (%s, '*', 'complete', 'complete', 'complete', true)
ON CONFLICT (workspace_id, scope_key) DO UPDATE
SET migration_state = 'complete', backfill_state = 'complete', finalize_state = 'complete',
    read_ready = true, updated_at = now()
"""
# One batch of the backfill, in global-seq order: every live message gets its
# document (the same row the send statement writes), a document whose body
# differs is rewritten, a deleted message's document goes. FOR SHARE makes a
# concurrent edit wait or be seen, so an old body never overwrites a new one.
BACKFILL_BATCH = """
WITH batch AS (
    SELECT m.id, m.workspace_id, m.scope_id, m.seq, m.author_member_id, m.content,
           m.created_at, m.deleted_at, m.workspace_global_seq
    FROM scope_messages m
    WHERE m.workspace_id = %(workspace_id)s AND m.workspace_global_seq > %(after)s
    ORDER BY m.workspace_global_seq
    LIMIT %(batch)s
    FOR SHARE
), written AS (
    INSERT INTO scope_message_search_docs
        (message_id, workspace_id, scope_id, seq, author_member_id, body, created_at)
    SELECT b.id, b.workspace_id, b.scope_id, b.seq, b.author_member_id, b.content, b.created_at
    FROM batch b WHERE b.deleted_at IS NULL
    ON CONFLICT (message_id) DO UPDATE SET body = EXCLUDED.body
    WHERE scope_message_search_docs.body IS DISTINCT FROM EXCLUDED.body
    RETURNING 1
), dropped AS (
    DELETE FROM scope_message_search_docs d USING batch b
    WHERE d.message_id = b.id AND b.deleted_at IS NOT NULL
    RETURNING 1
)
SELECT max(workspace_global_seq), count(*), (SELECT count(*) FROM written),
       (SELECT count(*) FROM dropped)
FROM batch
"""


async def is_ready(conn: TrioConnection, workspace_id: str) -> bool:
    with map_errors():
        cur = await conn.execute(SELECT_READY, (workspace_id,))
        row = await cur.fetchone()
    return row is None or bool(row[0])


async def status(conn: TrioConnection, workspace_id: str) -> Status:
    ready = await is_ready(conn, workspace_id)
    with map_errors():
        indexed = await (await conn.execute(COUNT_INDEXED, (workspace_id,))).fetchone()
        live = await (await conn.execute(COUNT_LIVE, (workspace_id,))).fetchone()
    assert indexed is not None
    assert live is not None
    return Status(READY if ready else BUILDING, int(indexed[0]), int(live[0]))


async def mark_building(conn: TrioConnection, workspace_id: str, *, force: bool = True) -> None:
    """Before messages are written beside the send path (an import, a restore):
    search answers ``search_unavailable`` until :func:`rebuild` completes."""
    params = {
        "workspace_id": workspace_id,
        "backfill": "pending",
        "finalize": "pending",
        "force": force,
    }
    with map_errors():
        await conn.execute(MARK_BUILDING, params)


async def rebuild(
    conn: TrioConnection,
    workspace_id: str,
    *,
    batch: int = REBUILD_BATCH,
    progress: Callable[[int], None] | None = None,
) -> Status:
    """Backfill then finalize; the workspace is ``read_ready`` afterwards.

    ``conn`` is in autocommit: each batch commits alone, so a rebuild holds no
    long transaction and a stopped one is resumed by running it again.
    """
    if not await is_ready(conn, workspace_id):
        await _set_building(conn, workspace_id, "running", "pending")
    after = 0
    examined = 0
    while True:
        with map_errors():
            cur = await conn.execute(
                BACKFILL_BATCH, {"workspace_id": workspace_id, "after": after, "batch": batch}
            )
            row = await cur.fetchone()
        assert row is not None
        if not row[1]:
            break
        after = int(row[0])
        examined += int(row[1])
        if progress is not None:
            progress(examined)
    if not await is_ready(conn, workspace_id):
        await _set_building(conn, workspace_id, "complete", "running")
    with map_errors():
        # Fresh statistics, so the planner picks the text indexes for the new rows.
        await conn.execute("ANALYZE scope_message_search_docs")
        await conn.execute(MARK_READY, (workspace_id,))
    return await status(conn, workspace_id)


async def _set_building(
    conn: TrioConnection, workspace_id: str, backfill: str, finalize: str
) -> None:
    params = {
        "workspace_id": workspace_id,
        "backfill": backfill,
        "finalize": finalize,
        "force": False,
    }
    with map_errors():
        await conn.execute(MARK_BUILDING, params)
