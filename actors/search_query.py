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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

MAX_TERMS = 16
_TOKEN = re.compile(r'(-?)"([^"]*)"|(\S+)')
_HANDLE = re.compile(r"from:@([a-z0-9][a-z0-9_.-]{0,63})")
_CHANNEL = re.compile(r"in:#([a-z0-9][a-z0-9_-]{0,79})")
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


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    terms: tuple[Term, ...] = ()  # all must match
    excluded: tuple[Term, ...] = ()  # none may match
    from_handles: tuple[str, ...] = ()  # any of them wrote it
    in_channels: tuple[str, ...] = ()  # it is in one of them (or their threads)

    @property
    def empty(self) -> bool:
        return not (self.terms or self.excluded or self.from_handles or self.in_channels)


class QueryError(ValueError):
    """The query cannot be searched (nothing in it, or too many terms)."""


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


def parse(query: str) -> ParsedQuery:
    """Words (all must match), ``"exact phrase"``, ``-excluded`` (a word or a
    phrase), ``from:@handle``, ``in:#channel``; anything else is a literal term
    (``--dry-run`` too: a second dash is not an exclusion)."""
    terms: list[Term] = []
    excluded: list[Term] = []
    handles: list[str] = []
    channels: list[str] = []
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
        elif bare.startswith("-") and len(bare) > 1 and bare[1] != "-":  # not --flag
            excluded.append(term(bare[1:]))
        else:
            terms.append(term(bare))
    if len(terms) + len(excluded) > MAX_TERMS:
        raise QueryError(f"at most {MAX_TERMS} search terms")
    parsed = ParsedQuery(tuple(terms), tuple(excluded), tuple(handles), tuple(channels))
    if parsed.empty:
        raise QueryError("the query has nothing to search for")
    return parsed


def _word_start(text: str, at: int) -> bool:
    return at == 0 or not text[at - 1].isalnum()


def occurrences(content: str, t: Term) -> list[tuple[int, int]]:
    """``[start, end)`` character offsets where the term matches the content."""
    folded = fold(content)
    found: list[tuple[int, int]] = []
    at = folded.find(t.text)
    while at >= 0:
        if t.kind is TermKind.SUBSTRING or _word_start(folded, at):
            found.append((at, at + len(t.text)))
        at = folded.find(t.text, at + 1)
    return found


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
