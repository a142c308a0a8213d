"""The one rule for text a client sends, by what the text is for.

Every string that arrives in a frame or an HTTP request passes
:func:`text_problem` for its :class:`TextKind` before anything else sees it,
so what is stored, pushed, searched and replayed is the same text. No I/O.

What every kind refuses: U+0000 (PostgreSQL text cannot hold it, so the stored
row would end where the live event goes on) and the C0/C1 controls other than
tab, line feed and carriage return. Surrogates never get this far: a frame
that is not valid UTF-8 or has a lone ``\\uD800`` escape is not decoded.

``CONTENT`` (messages, edits, descriptions) and ``TERM`` (search queries) keep
every format character: right-to-left writing needs its marks and
embeddings, Persian and Indic scripts need the zero-width (non-)joiner, and
a query must be able to find what a message holds.

``NAME``, ``EMOJI`` and ``KEY`` are shown as a label or compared as a key,
where an invisible or direction-changing character passes one string off as
another. They refuse every control, every format character (direction
overrides and isolates U+202A–U+202E and U+2066–U+2069, the marks
U+200E/U+200F, zero-width U+200B–U+200D, U+2060, U+FEFF, soft hyphen, …),
line and paragraph separators, and the other default-ignorable code points
(Hangul fillers, U+034F), with the exceptions that emoji are made of: a
variation selector after a visible character, a zero-width joiner between
two emoji (``👩‍💻``, ``🏳️‍🌈``) and the tag sequence of a subdivision flag
(``🏴`` followed by tags and U+E007F). ``NAME`` also needs a visible
character; ``EMOJI`` has no whitespace at all; ``TAB``/``LF``/``CR`` are
content, never part of a name or key.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections.abc import Callable

from protocol.errors import ErrorCode, OperationError


class TextKind(enum.Enum):
    """What a string is for, which decides what it may hold."""

    CONTENT = "content"  # a message, an edit, a channel description
    TERM = "term"  # a search query
    NAME = "name"  # a channel or display name, a file name, a client's name
    EMOJI = "emoji"  # a reaction
    KEY = "key"  # ids, targets, slugs, tokens, cursors, capabilities


# Code points, the longest each kind may be; the frame's own field bounds are
# usually tighter. Content is further bounded by the frame and row limits.
MAX_LENGTH: dict[TextKind, int] = {
    TextKind.CONTENT: 1 << 20,
    TextKind.TERM: 1024,
    TextKind.NAME: 256,
    TextKind.EMOJI: 64,
    TextKind.KEY: 1024,
}

# NUL and the C0/C1 controls that are not tab, line feed or carriage return.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Default-ignorable code points (Unicode's Default_Ignorable_Code_Point): drawn
# as nothing. Most are Cf, which str.isprintable() already refuses; this
# catches the others (U+034F, Hangul fillers, variation selectors).
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
_ZWJ = "\u200d"
_BLACK_FLAG = "\U0001f3f4"
_CANCEL_TAG = "\U000e007f"
_SKIN_TONES = range(0x1F3FB, 0x1F400)
_DIRECTION = frozenset([*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C])
_LABELS = {TextKind.NAME: "a name", TextKind.EMOJI: "an emoji", TextKind.KEY: "an identifier"}


def text_problem(value: str, kind: TextKind) -> str | None:
    """Why ``value`` is not acceptable as ``kind``, or None."""
    return _FINDERS[kind](value)


def problem_finder(kind: TextKind) -> Callable[[str], str | None]:
    """:func:`text_problem` for one kind, for a caller that checks many strings."""
    return _FINDERS[kind]


def check_text(value: str, kind: TextKind, path: str) -> str:
    """``value`` when acceptable as ``kind``, else ``validation_failed`` at ``path``."""
    problem = text_problem(value, kind)
    if problem is not None:
        raise OperationError(ErrorCode.VALIDATION_FAILED, f"{path}: {problem}", path=path)
    return value


def _text_finder(kind: TextKind) -> Callable[[str], str | None]:
    limit = MAX_LENGTH[kind]
    control = _CONTROL.search

    def find(value: str) -> str | None:
        if len(value) > limit:
            return f"at most {limit} characters"
        bad = control(value)
        return None if bad is None else f"{_describe(bad.group())} is not allowed in text"

    return find


def _label_finder(kind: TextKind) -> Callable[[str], str | None]:
    limit = MAX_LENGTH[kind]
    ignorable = _IGNORABLE.search
    emoji = kind is TextKind.EMOJI
    name = kind is TextKind.NAME

    def find(value: str) -> str | None:
        if len(value) > limit:
            return f"at most {limit} characters"
        if value.isprintable() and ignorable(value) is None:
            if emoji and " " in value:
                return "an emoji has no whitespace"
            if name and value.isspace():
                return "a name needs a visible character"
            return None
        return _label_problem(value, kind)

    return find


def _label_problem(value: str, kind: TextKind) -> str | None:
    """The slow path for a name, emoji or key holding something non-printable."""
    label = _LABELS[kind]
    in_tags = False
    visible = False
    for i, char in enumerate(value):
        code = ord(char)
        category = unicodedata.category(char)
        if in_tags:
            if char == _CANCEL_TAG:
                in_tags = False
                continue
            if 0xE0020 <= code <= 0xE007E:
                continue
            return "a tag sequence ends with U+E007F"
        if _allowed_in_emoji(value, i):
            in_tags = char != _ZWJ and 0xE0020 <= code <= 0xE007E
            continue
        if category in ("Cc", "Cf", "Zl", "Zp", "Cs") or _IGNORABLE.match(char):
            return f"{label} may not contain {_describe(char)}"
        if char.isspace():
            if kind is TextKind.EMOJI:
                return "an emoji has no whitespace"
            continue
        visible = True
    if in_tags:
        return "a tag sequence ends with U+E007F"
    if kind is TextKind.NAME and not visible:
        return "a name needs a visible character"
    return None


def _allowed_in_emoji(value: str, i: int) -> bool:
    """Is ``value[i]`` one of the invisible parts of an emoji sequence?"""
    char = value[i]
    code = ord(char)
    previous = value[i - 1] if i > 0 else ""
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:
        return previous != "" and previous.isprintable() and not previous.isspace()
    if char == _ZWJ:
        following = value[i + 1] if i + 1 < len(value) else ""
        return _emoji_end(previous) and unicodedata.category(following or " ") == "So"
    if 0xE0020 <= code <= 0xE007E:
        return previous == _BLACK_FLAG
    return False


def _emoji_end(char: str) -> bool:
    """Can ``char`` end an emoji that a zero-width joiner extends?"""
    if not char:
        return False
    return unicodedata.category(char) == "So" or char == "\ufe0f" or ord(char) in _SKIN_TONES


def _describe(char: str) -> str:
    code = ord(char)
    if code == 0:
        return "U+0000 (NUL)"
    if code in _DIRECTION:
        return f"U+{code:04X} (a direction control)"
    name = unicodedata.name(char, "")
    return f"U+{code:04X} ({name.lower()})" if name else f"U+{code:04X} (a control character)"


_FINDERS: dict[TextKind, Callable[[str], str | None]] = {
    TextKind.CONTENT: _text_finder(TextKind.CONTENT),
    TextKind.TERM: _text_finder(TextKind.TERM),
    TextKind.NAME: _label_finder(TextKind.NAME),
    TextKind.EMOJI: _label_finder(TextKind.EMOJI),
    TextKind.KEY: _label_finder(TextKind.KEY),
}
