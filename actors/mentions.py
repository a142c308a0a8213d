"""The canonical live-mention parser (docs/design.md#mentions).

Theory of operation
-------------------
A *routing token* is ``@handle``. It is *live* — it may route, wake or admit
— only when it sits in ordinary text. Tokens inside fenced code blocks, inline
code spans and blockquote lines are inert text. The forward shape of a message
decides the mode before any parsing happens: ``normal`` and ``single_forward``
run the parser, ``multi_forward`` and ``explicit_context`` yield no live
mentions at all.

Parsing runs in two linear passes and never raises on any ``str``:

1. *Block pass*: split the content into lines (``\\n``, ``\\r\\n`` or
   ``\\r``) and mark inert intervals. A fence opens on a line whose first
   non-space character (at most three spaces of indent) starts a run of at
   least three backticks or tildes (a backtick fence's info string may not
   contain a backtick); it runs to a line holding only a run of the same
   character at least as long (same indent rule, trailing blanks allowed), or
   to the end of the text when unclosed. A line whose first non-space
   character (at most three spaces of indent) is ``>`` is a blockquote line.
   Any other non-blank lines form paragraphs.
2. *Inline pass*, per paragraph (code spans never cross a blank line, a
   fence or a blockquote line): a run of N backticks opens a code span that
   closes at the next run of exactly N backticks; a run with no such partner is
   literal text. Backslash escapes are not interpreted.

Then every ``@`` outside the inert intervals is tested as a token: the handle
is the longest run of ``[A-Za-z0-9_.-]`` after the ``@``, starting with a
letter or digit, with trailing ``.``/``-`` stripped (``@bob.`` ends a
sentence), at most 64 characters, lower-cased. The ``@`` must follow the start
of the text or a character that cannot belong to the local part of an
email-like ``user@host`` or to a URL path: ASCII letters and digits and
``_ . + - % / @`` disqualify it (so ``a@b.com`` and ``https://x/@bob`` are not
mentions). Non-ASCII characters do not disqualify it, so ``请@bob看一下``
mentions ``bob`` — CJK text does not put a space before ``@``.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from actors.model import Member

__all__ = [
    "Mention",
    "MentionMode",
    "live_handles",
    "mode_for_forward",
    "not_in_scope",
    "parse_mentions",
]

MAX_HANDLE_LENGTH = 64


class MentionMode(enum.StrEnum):
    """How a message's text is turned into live mentions (``routingMentionMode``)."""

    NORMAL = "normal"
    SINGLE_FORWARD = "single_forward"
    MULTI_FORWARD = "multi_forward"
    EXPLICIT_CONTEXT = "explicit_context"


@dataclass(frozen=True, slots=True)
class Mention:
    """One live token: ``content[start:end]`` is ``"@" + handle`` up to case."""

    handle: str
    start: int
    end: int


_FORWARD_MODES: dict[str | None, MentionMode] = {
    None: MentionMode.NORMAL,
    "normal": MentionMode.NORMAL,
    "quote": MentionMode.NORMAL,
    "single": MentionMode.SINGLE_FORWARD,
    "multi": MentionMode.MULTI_FORWARD,
    "explicit_context": MentionMode.EXPLICIT_CONTEXT,
}

_INERT_MODES = frozenset({MentionMode.MULTI_FORWARD, MentionMode.EXPLICIT_CONTEXT})

# Every pattern below is a single character class under a quantifier, anchored
# by the caller's position: no nested quantifiers, so no backtracking blow-up.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
_QUOTE = re.compile(r" {0,3}>")
_BACKTICKS = re.compile(r"`+")
_TOKEN = re.compile(r"@([A-Za-z0-9][A-Za-z0-9_.\-]*)")
_TRAILING_BLANK = " \t\r\n"
# Characters that, right before the '@', make the token part of an address or
# URL path rather than a mention.
_NOT_BEFORE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-%/@")


def mode_for_forward(forward_mode: str | None) -> MentionMode:
    """Map a ``send`` frame's ``forward.mode`` (or its absence) to a mode.

    Raises ``ValueError`` for an unknown forward mode: the frame validator is
    expected to have rejected it already.
    """
    try:
        return _FORWARD_MODES[forward_mode]
    except KeyError:
        raise ValueError(f"unknown forward mode: {forward_mode!r}") from None


def parse_mentions(content: str, mode: MentionMode = MentionMode.NORMAL) -> tuple[Mention, ...]:
    """Every live mention occurrence in ``content``, in order of appearance."""
    if mode in _INERT_MODES or "@" not in content:
        return ()
    starts, ends = _inert_intervals(content)
    found: list[Mention] = []
    for match in _TOKEN.finditer(content):
        at = match.start()
        if at > 0 and content[at - 1] in _NOT_BEFORE:
            continue
        # Inert intervals are disjoint and sorted; '@' is inert when it lies in
        # the last interval starting at or before it.
        i = bisect_right(starts, at) - 1
        if i >= 0 and at < ends[i]:
            continue
        handle = match.group(1).rstrip(".-")
        if len(handle) > MAX_HANDLE_LENGTH:
            continue
        found.append(Mention(handle.lower(), at, at + 1 + len(handle)))
    return tuple(found)


def live_handles(content: str, mode: MentionMode = MentionMode.NORMAL) -> frozenset[str]:
    """The distinct handles live in ``content`` (lower case, without ``@``)."""
    return frozenset(mention.handle for mention in parse_mentions(content, mode))


def not_in_scope(author: Member, mentioned: Iterable[tuple[Member, bool]]) -> tuple[Member, ...]:
    """Of the mentioned ``(member, in_scope)``, whom to tell the author about: the
    members of the author's workspace who will not read the message, by handle.

    A private agent is named only to its owner: to anyone else, that it exists
    at all is not theirs to learn (docs/design.md#private-agents).
    """
    found = {
        member.id: member
        for member, in_scope in mentioned
        if not in_scope
        and member.id != author.id
        and member.workspace_id == author.workspace_id
        and (not member.is_private_agent or member.owner_member_id == author.id)
    }
    return tuple(sorted(found.values(), key=lambda m: m.handle))


def _inert_intervals(content: str) -> tuple[list[int], list[int]]:
    """Sorted, disjoint ``[start, end)`` intervals of inert text, as two lists."""
    starts: list[int] = []
    ends: list[int] = []

    def mark(start: int, end: int) -> None:
        if starts and ends[-1] >= start:  # adjacent lines merge into one interval
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)

    fence_char = ""  # non-empty while inside a fenced block
    fence_len = 0
    para_start = -1  # start offset of the open paragraph, -1 when none
    para_end = 0
    pos = 0
    length = len(content)
    while pos < length:
        line_match = _LINE.match(content, pos)
        # _LINE matches at any position and consumes at least one character
        # whenever pos < length, so the loop advances.
        assert line_match is not None
        line_end = line_match.end()
        if fence_char:
            mark(pos, line_end)
            if _closes_fence(content, pos, line_end, fence_char, fence_len):
                fence_char = ""
            pos = line_end
            continue
        opener = _FENCE_OPEN.match(content, pos, line_end)
        if opener is not None and not (
            opener.group(1)[0] == "`" and "`" in content[opener.end() : line_end]
        ):
            if para_start >= 0:
                _mark_code_spans(content, para_start, para_end, mark)
                para_start = -1
            fence_char = opener.group(1)[0]
            fence_len = len(opener.group(1))
            mark(pos, line_end)
        elif _QUOTE.match(content, pos, line_end) is not None:
            if para_start >= 0:
                _mark_code_spans(content, para_start, para_end, mark)
                para_start = -1
            mark(pos, line_end)
        elif content[pos:line_end].strip(_TRAILING_BLANK) == "":
            if para_start >= 0:
                _mark_code_spans(content, para_start, para_end, mark)
                para_start = -1
        else:
            if para_start < 0:
                para_start = pos
            para_end = line_end
        pos = line_end
    if para_start >= 0:
        _mark_code_spans(content, para_start, para_end, mark)
    return starts, ends


def _closes_fence(content: str, start: int, end: int, char: str, min_len: int) -> bool:
    line = content[start:end].rstrip(_TRAILING_BLANK)
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3 or len(stripped) < min_len:
        return False
    return stripped == char * len(stripped)


def _mark_code_spans(content: str, start: int, end: int, mark: Callable[[int, int], None]) -> None:
    """Mark the inline code spans of the paragraph ``content[start:end]``."""
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(content, start, end)]
    if len(runs) < 2:
        return
    # next_same[i]: index of the next run with the same length as run i, or -1.
    # Precomputing it keeps the pass linear even for many unmatched runs.
    next_same = [-1] * len(runs)
    last_by_len: dict[int, int] = {}
    for i in range(len(runs) - 1, -1, -1):
        run_len = runs[i][1] - runs[i][0]
        next_same[i] = last_by_len.get(run_len, -1)
        last_by_len[run_len] = i
    i = 0
    while i < len(runs):
        j = next_same[i]
        if j < 0:
            i += 1  # an unmatched run is literal text
            continue
        mark(runs[i][0], runs[j][1])
        i = j + 1
