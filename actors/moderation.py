"""The deployment keyword list: a pure matcher (docs/design.md#moderation).

Every human-origin path that stores text a person typed calls
:meth:`KeywordList.matches` before anything is written: ``send`` today
(``node/ops/messages.py``) and ``edit`` too, which calls the same method on
the edited content. Agent and system paths are not checked.

Matching is case-insensitive, word-boundary aware and Unicode-normalised:
keywords and text both go through NFKC and ``casefold`` (so a full-width
"ＢＡＤ" or a ligature still matches), a keyword matches only where it is not
glued to a word character on either side (``ass`` does not match
``class``), and the whitespace inside a phrase matches any run of whitespace.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def parse_keyword_file(text: str) -> tuple[str, ...]:
    """One keyword or phrase per line; blank lines and lines starting with ``#`` are skipped."""
    out: list[str] = []
    for line in text.splitlines():
        keyword = line.strip()
        if keyword and not keyword.startswith("#"):
            out.append(keyword)
    return tuple(out)


def _pattern(keyword: str) -> str:
    words = normalise(keyword).split()
    return r"(?<!\w)" + r"\s+".join(re.escape(word) for word in words) + r"(?!\w)"


@dataclass(frozen=True)
class KeywordList:
    """An immutable list; reloading builds a new one and swaps it in whole."""

    keywords: tuple[str, ...] = ()
    _each: tuple[tuple[str, re.Pattern[str]], ...] = field(init=False, repr=False)
    _any: re.Pattern[str] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        each: list[tuple[str, re.Pattern[str]]] = []
        seen: set[str] = set()
        for keyword in self.keywords:
            key = " ".join(normalise(keyword).split())
            if not key or key in seen:
                continue
            seen.add(key)
            each.append((keyword, re.compile(_pattern(keyword))))
        object.__setattr__(self, "_each", tuple(each))
        # One alternation answers the common case (no match) in one scan.
        combined = "|".join(f"(?:{pattern.pattern})" for _, pattern in each)
        object.__setattr__(self, "_any", re.compile(combined) if each else None)

    @classmethod
    def of(cls, keywords: Iterable[str]) -> KeywordList:
        return cls(tuple(keywords))

    def __len__(self) -> int:
        return len(self._each)

    def matches(self, text: str) -> tuple[str, ...]:
        """The keywords (as listed) that occur in ``text``, in list order; () if none."""
        if self._any is None:
            return ()
        normal = normalise(text)
        if self._any.search(normal) is None:
            return ()
        return tuple(keyword for keyword, pattern in self._each if pattern.search(normal))
