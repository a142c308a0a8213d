"""The search query language, and where a query matches a message (docs/design.md#search).

Pure: the storage layer turns a :class:`ParsedQuery` into SQL conditions, and
the node computes ``highlights`` here from the same parse, so the two cannot
disagree about what a term means and the web client never needs HTML from the
server.

A term is one of two kinds. A *word* (letters only, of a script written with
spaces between words) matches every word of the message that starts with it,
case-insensitively: the database answers it from the ``simple`` tsvector with
a prefix query, so ``deploy`` finds "deployment" as the user types. Anything
else (digits, punctuation, identifiers like ``ERR-4312``, emoji, Chinese,
Japanese or Korean text, and every ``"quoted phrase"``) matches as a
case-insensitive substring anywhere in the message, answered from the trigram
index: unsegmented scripts have no word boundaries to rely on.

A word also matches the words sharing its stem in the node's search language
(``roadmaps`` finds "roadmap", ``deploying`` finds "deployed"): the database
stems the query's words (``storage/search_terms.py``) and :func:`with_stems`
adds each stem to its term, matched as a word prefix like the word itself.
Unsegmented text and substrings are never stemmed.

Filters narrow where and when: ``from:@handle``, ``in:#channel`` (with its
threads), ``in:@handle`` (the viewer's direct messages with that person),
``before:YYYY-MM-DD``, ``after:YYYY-MM-DD`` and ``on:YYYY-MM-DD``, days in UTC.
``before:`` and ``after:`` exclude the day named, ``on:`` is that day.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from enum import Enum

MAX_TERMS = 16
_TOKEN = re.compile(r'(-?)"([^"]*)"|(\S+)')
_HANDLE = re.compile(r"from:@([a-z0-9][a-z0-9_.-]{0,63})")
_CHANNEL = re.compile(r"in:#([a-z0-9][a-z0-9_-]{0,79})")
_PERSON = re.compile(r"in:@([a-z0-9][a-z0-9_.-]{0,63})")
_DAY_OPERATOR = re.compile(r"(before|after|on):(.*)")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
# Scripts written without spaces between words (and Hangul, whose words carry
# attached particles): their terms match as substrings.
_UNSEGMENTED = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003ffff]"
)


class TermKind(Enum):
    WORD = "word"  # a word of the message starts with it
    SUBSTRING = "substring"  # it occurs anywhere in the message


@dataclass(frozen=True, slots=True)
class Term:
    text: str  # folded (lower case, see fold())
    kind: TermKind
    # Words sharing the word's stem start with one of these (a word term only).
    stems: tuple[str, ...] = ()

    @property
    def needles(self) -> tuple[str, ...]:
        """What a word of the message may start with to match."""
        return (self.text, *self.stems)


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    terms: tuple[Term, ...] = ()  # all must match
    excluded: tuple[Term, ...] = ()  # none may match
    from_handles: tuple[str, ...] = ()  # any of them wrote it
    in_channels: tuple[str, ...] = ()  # it is in one of them (or their threads)
    in_people: tuple[str, ...] = ()  # or in the viewer's DM with one of them
    since: datetime | None = None  # created at or after (UTC)
    until: datetime | None = None  # created before (UTC)

    @property
    def in_scopes(self) -> bool:
        """Whether ``in:`` names where to look."""
        return bool(self.in_channels or self.in_people)

    @property
    def empty(self) -> bool:
        return not (
            self.terms
            or self.excluded
            or self.from_handles
            or self.in_scopes
            or self.since
            or self.until
        )

    def described(self) -> dict[str, object]:
        """What was searched, as the reply tells it (``searched``)."""
        return {
            "terms": [t.text for t in self.terms],
            "excluded": [t.text for t in self.excluded],
            "from": [f"@{h}" for h in self.from_handles],
            "in": [f"#{c}" for c in self.in_channels] + [f"@{p}" for p in self.in_people],
            "since": self.since.date().isoformat() if self.since else None,
            "until": self.until.date().isoformat() if self.until else None,
        }


class QueryError(ValueError):
    """The query cannot be searched (nothing in it, too many terms, a bad
    date); ``path`` is the frame field at fault."""

    def __init__(self, message: str, path: str = "$.query") -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True, slots=True)
class Refinements:
    """The search frame's explicit filters: the same as the operators in the
    query text (``fromMember`` is ``from:``, ``inScope`` is ``in:``)."""

    from_member: str | None = None  # "@ann" or "ann"
    in_scope: str | None = None  # "#ops", "ops" or "@ann" (a DM)
    before: str | None = None  # YYYY-MM-DD
    after: str | None = None
    on: str | None = None


_PATHS = {
    "from": "$.fromMember",
    "in": "$.inScope",
    "before": "$.before",
    "after": "$.after",
    "on": "$.on",
}


def parse_day(text: str, operator: str, path: str = "$.query") -> date:
    """A UTC day ``YYYY-MM-DD``; anything else is a :class:`QueryError`."""
    try:
        if _DAY.fullmatch(text) is None:
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise QueryError(f"{operator}: takes a date YYYY-MM-DD, not {text!r}", path) from None


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


@dataclass(slots=True)
class _Window:
    since: datetime | None = None
    until: datetime | None = None

    def narrow(self, operator: str, day: date) -> None:
        """Several bounds keep the narrowest window (an empty one finds nothing)."""
        start = _midnight(day)
        end = start + timedelta(days=1) if day < date.max else None
        if operator == "before":
            self._below(start)
        elif operator == "on":
            self._from(start)
            if end is not None:
                self._below(end)
        elif end is not None:  # after
            self._from(end)
        else:  # nothing comes after the last day there is
            self._below(start)
            self._from(start)

    def _from(self, at: datetime) -> None:
        self.since = at if self.since is None else max(self.since, at)

    def _below(self, at: datetime) -> None:
        self.until = at if self.until is None else min(self.until, at)


def fold(text: str) -> str:
    """Lower case, one character for one, so offsets in the folded text are
    offsets in the original (a character whose lower case is longer stays)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _is_word(text: str) -> bool:
    return all(c.isalpha() for c in text) and not _UNSEGMENTED.search(text)


def term(text: str, *, phrase: bool = False) -> Term:
    folded = fold(text)
    kind = TermKind.WORD if not phrase and _is_word(folded) else TermKind.SUBSTRING
    return Term(folded, kind)


def parse(query: str, refinements: Refinements | None = None) -> ParsedQuery:
    """Words (all must match), ``"exact phrase"``, ``-excluded`` (a word or a
    phrase), ``from:@handle``, ``in:#channel``, ``in:@handle``, ``before:``,
    ``after:`` and ``on:`` a day; anything else is a literal term (``--dry-run``
    too: a second dash is not an exclusion). ``refinements`` add the frame's
    explicit filters."""
    terms: list[Term] = []
    excluded: list[Term] = []
    handles: list[str] = []
    channels: list[str] = []
    people: list[str] = []
    window = _Window()
    for match in _TOKEN.finditer(query):
        negated, phrase, bare = match.group(1), match.group(2), match.group(3)
        if phrase is not None:
            if phrase.strip():
                (excluded if negated else terms).append(term(phrase, phrase=True))
            continue
        if (found := _HANDLE.fullmatch(bare)) is not None:
            handles.append(found.group(1))
        elif (found := _CHANNEL.fullmatch(bare)) is not None:
            channels.append(found.group(1))
        elif (found := _PERSON.fullmatch(bare)) is not None:
            people.append(found.group(1))
        elif (found := _DAY_OPERATOR.fullmatch(bare)) is not None:
            operator = found.group(1)
            window.narrow(operator, parse_day(found.group(2), operator))
        elif bare.startswith("-") and len(bare) > 1 and bare[1] != "-":  # not --flag
            excluded.append(term(bare[1:]))
        else:
            terms.append(term(bare))
    if refinements is not None:
        _refine(refinements, handles, channels, people, window)
    if len(terms) + len(excluded) > MAX_TERMS:
        raise QueryError(f"at most {MAX_TERMS} search terms")
    parsed = ParsedQuery(
        tuple(terms),
        tuple(excluded),
        tuple(dict.fromkeys(handles)),
        tuple(dict.fromkeys(channels)),
        tuple(dict.fromkeys(people)),
        window.since,
        window.until,
    )
    if parsed.empty:
        raise QueryError("the query has nothing to search for")
    return parsed


def _refine(
    fields: Refinements,
    handles: list[str],
    channels: list[str],
    people: list[str],
    window: _Window,
) -> None:
    if fields.from_member is not None:
        handle = fields.from_member.removeprefix("@").lower()
        if _HANDLE.fullmatch(f"from:@{handle}") is None:
            raise QueryError("fromMember is not a handle", _PATHS["from"])
        handles.append(handle)
    if fields.in_scope is not None:
        where = fields.in_scope.lower()
        token = f"in:{where}" if where[:1] in ("#", "@") else f"in:#{where}"
        if (found := _CHANNEL.fullmatch(token)) is not None:
            channels.append(found.group(1))
        elif (found := _PERSON.fullmatch(token)) is not None:
            people.append(found.group(1))
        else:
            raise QueryError("inScope is not #channel or @handle", _PATHS["in"])
    for operator, text in (("before", fields.before), ("after", fields.after), ("on", fields.on)):
        if text is not None:
            window.narrow(operator, parse_day(text, operator, _PATHS[operator]))


def with_stems(parsed: ParsedQuery, stems: Mapping[str, tuple[str, ...]]) -> ParsedQuery:
    """The query with each word term's stems (words sharing them match too)."""
    terms = tuple(
        replace(t, stems=stems.get(t.text, ())) if t.kind is TermKind.WORD else t
        for t in parsed.terms
    )
    return replace(parsed, terms=terms)


def stem_words(parsed: ParsedQuery) -> list[str]:
    """The words whose stems the search needs (exclusions stay exact)."""
    return sorted({t.text for t in parsed.terms if t.kind is TermKind.WORD})


def _word_start(text: str, at: int) -> bool:
    return at == 0 or not text[at - 1].isalnum()


def occurrences(content: str, t: Term) -> list[tuple[int, int]]:
    """``[start, end)`` character offsets where the term matches the content."""
    folded = fold(content)
    found: list[tuple[int, int]] = []
    for needle in t.needles if t.kind is TermKind.WORD else (t.text,):
        at = folded.find(needle)
        while at >= 0:
            if t.kind is TermKind.SUBSTRING or _word_start(folded, at):
                found.append((at, at + len(needle)))
            at = folded.find(needle, at + 1)
    return sorted(found)


def matches(content: str, parsed: ParsedQuery) -> bool:
    """Whether the text terms of the query match the content (filters aside)."""
    return all(occurrences(content, t) for t in parsed.terms) and not any(
        occurrences(content, t) for t in parsed.excluded
    )


def highlights(content: str, parsed: ParsedQuery) -> list[tuple[int, int]]:
    """Merged, sorted ``[start, end)`` ranges of every matched term in the content."""
    spans = sorted(span for t in parsed.terms for span in occurrences(content, t))
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
