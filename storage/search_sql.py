"""Search: the statement, composed.

docs/design.md#search. One statement per search: the candidates of the text
indexes (or of a walk, or of the viewer's scopes), then the readable predicate
of ``storage/visibility.py`` per row with the viewer's rights in that row's
scope. This module composes it from fragments: the viewer's candidate scopes
and rights, each term's condition, the order and the cursor's place, the three
strategies and the statement's own choice among them (``_PLAN``) with its
Python twin (:func:`pick`). It runs nothing; ``storage/search.py`` runs it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from actors.search_query import ParsedQuery, Term, TermKind
from storage.messages import MESSAGE_COLUMNS
from storage.search_terms import (
    CJK_CHARACTER,
    SYMBOL_CHARACTER,
    UNKNOWN_FREQ,
    Estimate,
    pair_lookup,
    symbol_lookup,
)
from storage.visibility import ViewerTerms, readable_join, scope_shape

Sort = Literal["recent", "relevance"]
Strategy = Literal["walk", "terms", "scopes"]


# ------------------------------------------------------------------ the query

# The predicate's per-scope parameters become columns of the viewer's candidate
# scopes, computed once per scope as viewer_for (storage/access.py) does (not
# once per row: the planner would plan that lookup again at every place the
# predicate uses it).
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
# ``in:#slug``: the channels named; ``in:@handle``: the viewer's DM with that
# member (its identity is ``dm:`` and the two ids in code point order, as
# storage/scopes.py builds it).
_IN_CHANNEL_ROOTS = """
    SELECT cp.scope_id FROM scope_channel_profiles cp
    WHERE cp.workspace_id = %(workspace_id)s AND cp.slug = ANY(%(channels)s)"""
_IN_DM_ROOTS = """
    SELECT dm.id FROM members p
    JOIN scopes dm ON dm.identity_key = 'dm:' || CASE
        WHEN p.id = %(viewer_id)s THEN p.id
        WHEN p.id COLLATE "C" < %(viewer_id)s COLLATE "C" THEN p.id || ':' || %(viewer_id)s
        ELSE %(viewer_id)s || ':' || p.id END
    WHERE p.workspace_id = %(workspace_id)s AND p.handle = ANY(%(people)s)"""


def in_scopes(parsed: ParsedQuery) -> str:
    """The scopes ``in:`` names and their threads (through the thread-root
    index, which leads with the parent)."""
    roots = " UNION ALL ".join(
        part
        for part, named in (
            (_IN_CHANNEL_ROOTS, parsed.in_channels),
            (_IN_DM_ROOTS, parsed.in_people),
        )
        if named
    )
    return f"""
    SELECT r.scope_id FROM ({roots}) r (scope_id)
    UNION ALL
    SELECT t.id FROM scopes t WHERE t.parent_scope_id IN ({roots})"""


# With ``in:`` only those of the viewer's scopes are candidates: a viewer who
# reads none of them has no documents to search, and the choice knows it.
def _rights_in(parsed: ParsedQuery) -> str:
    return _rights(f"sc.id IN (SELECT scope_id FROM scopes_in) AND sc.id IN ({in_scopes(parsed)})")


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
# interval (closed ones too) and the scopes their explicit context opens; a
# workflow scope never (its transcript is read through its plan). Only
# ever read by `IN`: a scope listed twice costs nothing, so nothing removes
# duplicates.
_SCOPES_IN = """
scopes_in AS (
    SELECT vm.scope_id FROM scope_memberships vm
    JOIN scopes vs ON vs.id = vm.scope_id AND vs.type <> 'workflow'
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
# readiness round trip; only an empty one asks (search_index.is_ready()).
_BUILDING = """
SELECT 1 FROM scope_message_search_state st
WHERE st.workspace_id = %(workspace_id)s AND st.scope_key = '*' AND NOT st.read_ready"""


@dataclass(frozen=True, slots=True)
class Filters:
    workspace_id: str
    scope_id: str | None = None
    author_id: str | None = None


# A LIKE pattern's value: the searched text matched literally.
_LIKE_ESCAPES = str.maketrans({"\\": "\\\\", "%": "\\%", "_": "\\_"})


def _like(text: str) -> str:
    escaped = text.translate(_LIKE_ESCAPES)
    return f"%{escaped}%"


def _tsquery(needles: Sequence[str]) -> str:
    """A word or its stems at the start of a word of the message. Word terms
    and stems are letters only, so quoting cannot be escaped out of."""
    return " | ".join(f"'{w}':*" for w in needles)


def _term_condition(
    t: Term, name: str, params: dict[str, object], *, indexed: bool, raw: bool = False
) -> str:
    """The term's condition: as an operator the text indexes answer, or (not
    ``indexed``) as the same function called per row, which no index takes.
    The readable statement parses its tsquery once (an initplan), not per row."""
    if t.kind is TermKind.WORD:
        params[name] = _tsquery(t.needles)
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
        ("pairs", "scopenode_cjk_bigrams", CJK_CHARACTER, pair_lookup(t.text)),
        ("symbols", "scopenode_symbols", SYMBOL_CHARACTER, symbol_lookup(t.text)),
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
    if parsed.in_scopes:
        params["channels"] = list(parsed.in_channels)
        params["people"] = list(parsed.in_people)
        params.setdefault("viewer_id", None)  # the raw statement has no viewer, and no DMs
        where.append(f"d.scope_id IN ({in_scopes(parsed)})")
    if parsed.since is not None:
        params["since"] = parsed.since
        where.append("d.created_at >= %(since)s")
    if parsed.until is not None:
        params["until"] = parsed.until
        where.append("d.created_at < %(until)s")
    return where


def _rank(words: list[Term], params: dict[str, object], *, raw: bool) -> str:
    """Word rank; a word found as typed counts 1 more than one found only by
    its stem (``ts_rank`` stays below 1), so exact hits come first."""

    def query(name: str) -> str:
        text = f"to_tsquery('simple', %({name})s)"
        return text if raw else f"(SELECT {text})"

    params["rank_query"] = _tsquery([n for t in words for n in t.needles])
    rank = f"ts_rank(d.body_tsv, {query('rank_query')})"
    stemmed = [t for t in words if t.stems]
    for i, t in enumerate(stemmed):
        params[f"exact{i}"] = _tsquery([t.text])
        rank += f" + (d.body_tsv @@ {query(f'exact{i}')})::int"
    return f"({rank})::real" if stemmed else rank


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
    words = [t for t in parsed.terms if t.kind is TermKind.WORD]
    rank = _rank(words, params, raw=raw) if sort == "relevance" and words else "0::real"
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

_PARAM_TYPES = {
    "limit": "int8",
    "viewer_private": "bool",
    "walkable": "bool",
    "indexable": "bool",
    "freq": "float8",
    "handles": "text[]",
    "channels": "text[]",
    "people": "text[]",
    "since": "timestamptz",
    "until": "timestamptz",
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
class Sizes:
    """What the strategy choice weighs besides the terms: the documents of the
    viewer's candidate scopes (their latest seqs) and of the whole table."""

    viewer: float
    total: float


def walkable(parsed: ParsedQuery, sort: Sort) -> bool:
    """Whether the walk may run: newest first, and not for ``in:``, whose
    scopes may hold none of the newest documents (a viewer outside them
    would walk the whole workspace to find nothing)."""
    return sort == "recent" and not parsed.in_scopes


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
            ctes.append(_rights_in(parsed) if parsed.in_scopes else _RIGHTS)
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
