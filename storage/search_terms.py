"""Search: what the terms tell the strategy choice.

docs/design.md#search. How many documents a query's terms match, estimated
from the text index's statistics (``pg_stats`` of ``body_tsv``, cached for
``STATS_TTL``), and whether a text index can find them at all: the trigram
test, and the CJK pairs and symbols that the partial indexes of migrations 9,
10 and 13 hold for terms without trigrams (their character classes exactly as
those indexes' predicates state them).

And the stems of the query's words in the node's search language
(:func:`stems`): the database's own stemmer for that text search
configuration, asked once per word and kept; each stem is then matched as a
word prefix in the same ``simple`` index as the word, so no column or index
depends on the language.
"""

from __future__ import annotations

import bisect
import itertools
import re
import time
from dataclasses import dataclass

import psycopg

from actors.lru import Lru
from actors.search_query import ParsedQuery, Term, TermKind
from storage.errors import map_errors
from storage.pg import TrioConnection

UNKNOWN_FREQ = 1e-4  # a term the statistics do not track is taken as rare


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the statement's strategy choice knows of the terms: the share of
    documents they match (None: unknown), and whether a text index can find
    them (a substring needs three characters in a row for trigrams)."""

    freq: float | None
    indexable: bool


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
                or bool(pair_lookup(t.text))
                or bool(symbol_lookup(t.text))
            )
        if not parsed.terms:
            freq = 1.0  # filters and exclusions only: nearly everything matches
        return Estimate(freq, indexable)

    def _share(self, t: Term) -> float | None:
        if t.kind is TermKind.WORD:
            return min(1.0, sum(self.word(needle) for needle in t.needles))
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


def symbol_lookup(text: str) -> list[str]:
    """The symbols to find a substring term by: only when neither trigrams nor
    CJK pairs find it."""
    return [] if _trigrams(text) or cjk_bigrams(text) else symbols(text)


def pair_lookup(text: str) -> list[str]:
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


# ------------------------------------------------------------------ stems

DEFAULT_LANGUAGE = "english"
MIN_STEM = 3  # a shorter stem, as a word prefix, would match far too much
STEMS_KEPT = 20_000
_STEMS = """
SELECT w, tsvector_to_array(to_tsvector(%(language)s::regconfig, w))
FROM unnest(%(words)s::text[]) AS w
"""
_CHECK_LANGUAGE = "SELECT %s::regconfig::text"
# (language, word) -> its stems: words recur, and their stems never change.
_stems: Lru[tuple[str, str], tuple[str, ...]] = Lru("search_stems", STEMS_KEPT)


class UnknownLanguage(ValueError):
    """The database has no text search configuration of that name."""


async def check_language(conn: TrioConnection, language: str) -> str:
    """The configuration's name as the database spells it; raises
    :class:`UnknownLanguage` when there is none (a node must not start then)."""
    try:
        row = await (await conn.execute(_CHECK_LANGUAGE, (language,), prepare=False)).fetchone()
    except psycopg.Error:
        raise UnknownLanguage(f"no text search configuration {language!r}") from None
    assert row is not None
    return str(row[0])


def _kept(word: str, lexemes: list[str]) -> tuple[str, ...]:
    # One lexeme of letters: a stop word has none, and a word the parser
    # splits is not stemmed (each part would widen the search alone).
    if len(lexemes) != 1:
        return ()
    stem = lexemes[0]
    if stem == word or len(stem) < MIN_STEM or not stem.isalpha():
        return ()
    return (stem,)


async def stems(
    conn: TrioConnection, language: str, words: list[str]
) -> dict[str, tuple[str, ...]]:
    """Each word's stem in ``language`` (a text search configuration), when it
    differs from the word; one statement for the words not seen before."""
    found = {w: known for w in words if (known := _stems.get((language, w))) is not None}
    missing = [w for w in words if w not in found]
    if missing:
        with map_errors():
            cur = await conn.execute(_STEMS, {"language": language, "words": missing})
            rows = await cur.fetchall()
        for word, lexemes in rows:
            found[word] = _kept(word, list(lexemes or []))
            _stems.put((language, word), found[word])
    return found
