"""Search: one page of readable hits, and its cursor.

docs/design.md#search. ``scope_message_search_docs`` holds one document per
live message (written by the send statement, updated by edits, removed by
deletes); migration 7 indexes it twice, a ``simple`` tsvector for words and
trigrams for substrings. A query is one statement: candidates from the indexes,
then the readable predicate of ``storage/visibility.py``, evaluated per row
with the viewer's rights in that row's scope, so a hit is exactly a message
``history`` would show the viewer.

This module runs that statement (:func:`search`): it chooses the strategy from
the viewer's last sizes, prepares each statement shape once, and issues and
reads cursors. The statement is composed in ``storage/search_sql.py``, the
terms are estimated in ``storage/search_terms.py``, and readiness and rebuild
live in ``storage/search_index.py``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from actors.lru import Lru
from actors.search_query import ParsedQuery
from protocol.text import TextKind, text_problem
from storage.errors import map_errors
from storage.messages import ReadableMessage, message_from_row
from storage.pg import Prepared, TrioConnection, text_param
from storage.search_sql import Filters, Sizes, Sort, Strategy, build_query, pick, walkable
from storage.search_terms import term_stats

MAX_LIMIT = 50


class BadCursor(ValueError):
    """The cursor was not issued for this query."""


@dataclass(frozen=True, slots=True)
class Hit:
    readable: ReadableMessage
    rank: float


@dataclass(frozen=True, slots=True)
class Results:
    hits: list[Hit]
    next_cursor: str | None
    strategy: str | None = None  # the one that ran (None: no hits to tell)


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


async def run_query(conn: TrioConnection, statement: str, params: dict[str, Any]) -> list[Any]:
    """A built search statement through the node's call: prepared once per
    statement text, parameters in text format, without JIT. The bench's raw
    queries take it too, so they time the statement, not a slower path."""
    stmt, names = _prepare(statement)
    with map_errors():
        if conn not in _without_jit:
            # The plan holds three strategies and is costed as if all ran, over
            # jit_above_cost: compiling it would take longer than any search.
            await conn.execute("SET jit = off", prepare=False)
            _without_jit.add(conn)
        return await conn.run_prepared(stmt, [text_param(params.get(name)) for name in names])


def _fingerprint(query: str, parsed: ParsedQuery, filters: Filters, sort: Sort) -> str:
    # The frame's explicit filters are in the parse, not in the query text.
    basis = json.dumps(
        [query, filters.scope_id, filters.author_id, sort, parsed.described()], sort_keys=True
    )
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
    workspace is being built (``search_index.is_ready`` tells an empty page
    from that).

    The strategy is chosen in Python from the sizes the viewer's previous search
    returned (a statement holding one strategy starts faster than one holding
    three); without them the statement chooses. ``strategy`` forces one.
    """
    fingerprint = _fingerprint(query, parsed, filters, sort)
    after = decode_cursor(cursor, fingerprint, sort) if cursor else None
    estimate = (await term_stats(conn)).estimate(parsed)
    # The sizes of an in: search are those of its channels, not of all the viewer reads.
    named = [f"#{c}" for c in parsed.in_channels] + [f"@{p}" for p in parsed.in_people]
    scopes_key = filters.scope_id or ",".join(sorted(named)) or None
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
    rows = await run_query(conn, statement, params)
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
