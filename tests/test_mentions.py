"""The canonical live-mention parser: rules by example, then properties."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.mentions import (
    Mention,
    MentionMode,
    live_handles,
    mode_for_forward,
    not_in_scope,
    parse_mentions,
)
from actors.model import Member, MemberType


def handles(content: str, mode: MentionMode = MentionMode.NORMAL) -> list[str]:
    return [m.handle for m in parse_mentions(content, mode)]


# --- tokens ---


def test_plain_mention_has_offsets_and_lowercase_handle() -> None:
    assert parse_mentions("hi @Bob and @alice_2") == (
        Mention("bob", 3, 7),
        Mention("alice_2", 12, 20),
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("@bob", ["bob"]),
        ("thanks @bob.", ["bob"]),
        ("ask @bob... later", ["bob"]),
        ("@bob- really", ["bob"]),
        ("@bob.smith is here", ["bob.smith"]),
        ("@a-b_c.d", ["a-b_c.d"]),
        ("@bob's idea", ["bob"]),
        ("(@bob), [@carol]: @dave!", ["bob", "carol", "dave"]),
        ("@bob,@carol", ["bob", "carol"]),
        ("请@bob看一下", ["bob"]),
        ("line\n@bob", ["bob"]),
    ],
)
def test_token_boundaries(content: str, expected: list[str]) -> None:
    assert handles(content) == expected


@pytest.mark.parametrize(
    "content",
    [
        "mail a@b.com",
        "first.last@example.org",
        "x+tag@example.org",
        "x_@example.org",
        "https://medium.com/@bob",
        "@@bob",
        "@ bob",
        "@_bob",
        "@.bob",
        "@-bob",
        "@",
        "",
        "@" + "a" * 65,
    ],
)
def test_not_a_mention(content: str) -> None:
    assert parse_mentions(content) == ()


def test_handle_of_64_characters_is_the_maximum() -> None:
    handle = "a" * 64
    assert handles(f"@{handle} ok") == [handle]


def test_parse_mentions_keeps_every_occurrence_and_live_handles_dedupes() -> None:
    content = "@Bob @alice @bob"
    assert handles(content) == ["bob", "alice", "bob"]
    assert live_handles(content) == frozenset({"bob", "alice"})


# --- fenced code ---


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("```\n@a\n```\n@b", ["b"]),
        ("~~~python\n@a\n~~~\n@b", ["b"]),
        ("   ```\n@a\n   ```\n@b", ["b"]),
        ("    ```\n@a", ["a"]),  # four spaces of indent: not a fence
        ("````\n@a\n```\n@b\n````\n@c", ["c"]),  # a shorter fence does not close
        ("```\n@a\n`````  \n@b", ["b"]),  # a longer one does, trailing blanks allowed
        ("```\n@a\n~~~\n@b", []),  # the other fence character does not close
        ("~~~\n@a\n```\n@b", []),
        ("```\n@a\n``` x\n@b", []),  # a closing fence has no info string
        ("```\n@a\n@b", []),  # unclosed: runs to the end of the text
        ("``` a`b\n@a", ["a"]),  # a backtick in a backtick fence's info: not a fence
        ("~~~ a`b\n@a", []),  # but allowed after a tilde fence
        ("text\n```\n@a\n```", []),  # a fence interrupts a paragraph
        ("```\r\n@a\r\n```\r\n@b", ["b"]),
        ("```\r@a\r```\r@b", ["b"]),
        ("a ``` @b", ["b"]),  # fences open only at line start
    ],
)
def test_fenced_code(content: str, expected: list[str]) -> None:
    assert handles(content) == expected


# --- inline code ---


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("`@a` @b", ["b"]),
        ("``@a ` @b`` @c", ["c"]),  # a run of two closes only at a run of two
        ("` @a", ["a"]),  # an unmatched run is literal
        ("`` @a ` @b", ["a", "b"]),
        ("`x`@a", ["a"]),  # a closing backtick is a boundary
        ("`a\n@b` @c", ["c"]),  # spans continue across lines in a paragraph
        ("`a\n\n@b` @c", ["b", "c"]),  # but not across a blank line
        ("`a\n> q\n@b` @c", ["b", "c"]),  # nor across a blockquote line
    ],
)
def test_inline_code(content: str, expected: list[str]) -> None:
    assert handles(content) == expected


# --- blockquotes ---


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("> @a\n@b", ["b"]),
        ("   > @a\n@b", ["b"]),
        ("    > @a", ["a"]),  # four spaces of indent: not a blockquote
        (">> @a", []),
        ("> q\nlazy @a", ["a"]),  # lazy continuation lines stay live
        ("a > @b", ["b"]),
    ],
)
def test_blockquote_lines(content: str, expected: list[str]) -> None:
    assert handles(content) == expected


# --- modes ---


@pytest.mark.parametrize(
    ("forward_mode", "mode"),
    [
        (None, MentionMode.NORMAL),
        ("normal", MentionMode.NORMAL),
        ("single", MentionMode.SINGLE_FORWARD),
        ("multi", MentionMode.MULTI_FORWARD),
        ("explicit_context", MentionMode.EXPLICIT_CONTEXT),
    ],
)
def test_mode_for_forward(forward_mode: str | None, mode: MentionMode) -> None:
    assert mode_for_forward(forward_mode) is mode


def test_mode_for_unknown_forward_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown forward mode"):
        mode_for_forward("bulk")


def test_modes_decide_before_parsing() -> None:
    content = "@bob please"
    assert handles(content, MentionMode.SINGLE_FORWARD) == ["bob"]
    assert parse_mentions(content, MentionMode.MULTI_FORWARD) == ()
    assert live_handles(content, MentionMode.EXPLICIT_CONTEXT) == frozenset()


# --- cost ---


@pytest.mark.parametrize(
    "unit",
    ["@a ", "` ", "\n", "@a`", "a@", "```\n", "> @a\n", "@a.", "\r\n @", "@" + "a-" * 40 + " "],
)
def test_256_kib_parses_in_linear_time(unit: str) -> None:
    """A guard against quadratic scans, not a speed target: a quadratic parse of
    256 KiB takes minutes, a linear one milliseconds, so the bound is loose
    enough for a loaded CI machine."""
    content = unit * (256 * 1024 // len(unit)) + "@end"
    started = time.perf_counter()
    parse_mentions(content)
    assert time.perf_counter() - started < 10.0


def test_many_unmatched_backtick_runs_stay_linear() -> None:
    content = "".join("`" * n + " @a " for n in range(1, 700))
    started = time.perf_counter()
    assert len(parse_mentions(content)) == 699
    assert time.perf_counter() - started < 0.5


# --- properties ---

# Free text: anything except the characters that open constructs (backticks and
# tildes), so the text around a construct cannot open or close one by accident.
# Complete, well-formed constructs are mixed in separately.
_FREE = st.text(st.characters(exclude_characters="`~"), max_size=40)
_FREE_LINE = st.text(st.characters(exclude_characters="`~\r\n"), max_size=20)
_HANDLE = (
    st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,63}", fullmatch=True)
    .filter(lambda h: h[-1] not in ".-")
    .flatmap(
        lambda h: st.lists(st.booleans(), min_size=len(h), max_size=len(h)).map(
            lambda upper: "".join(c.upper() if u else c for c, u in zip(h, upper, strict=True))
        )
    )
)
_INDENT = st.sampled_from(["", " ", "   "])


_TRAILING = st.sampled_from(["", " ", "\t"])


# Each construct strategy yields (text, offset of the body inside the text).
@st.composite
def _fenced(draw: st.DrawFn, body: str | None = None) -> tuple[str, int]:
    char = draw(st.sampled_from("`~"))
    opening = draw(st.integers(3, 6))
    closing = draw(st.integers(opening, 8))
    head = f"{draw(_INDENT)}{char * opening}{draw(_FREE_LINE)}\n"
    text = draw(_FREE) if body is None else body
    tail = f"\n{draw(_INDENT)}{char * closing}{draw(_TRAILING)}"
    return head + text + tail, len(head)


@st.composite
def _inline(draw: st.DrawFn, body: str | None = None) -> tuple[str, int]:
    head = f"{draw(_FREE_LINE)} `"
    # An empty span would be one double-backtick run, not a span.
    text = draw(_FREE_LINE.filter(bool)) if body is None else body
    return f"{head}{text}` {draw(_FREE_LINE)}", len(head)


@st.composite
def _quote(draw: st.DrawFn, body: str | None = None) -> tuple[str, int]:
    head = f"{draw(_INDENT)}>"
    text = draw(_FREE_LINE) if body is None else body
    return head + text, len(head)


_PIECE = st.one_of(
    _FREE, *(make().map(lambda built: built[0]) for make in (_fenced, _inline, _quote))
)
_PIECES = st.lists(_PIECE, max_size=6)

_HOSTILE = st.text(st.sampled_from(list("@aZ9_.-`~> \n\r\t请")), max_size=200)


@given(st.one_of(st.text(), _HOSTILE), st.sampled_from(MentionMode))
def test_parsing_never_raises(content: str, mode: MentionMode) -> None:
    assert isinstance(parse_mentions(content, mode), tuple)
    assert isinstance(live_handles(content, mode), frozenset)


@given(
    before=_PIECES,
    after=_PIECES,
    kind=st.sampled_from(["fenced", "inline", "quote"]),
    handle=_HANDLE,
    left=_FREE_LINE,
    right=_FREE_LINE,
    data=st.data(),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_token_inside_a_construct_is_never_live(
    before: list[str],
    after: list[str],
    kind: str,
    handle: str,
    left: str,
    right: str,
    data: st.DataObject,
) -> None:
    body = f"{left} @{handle} {right}"
    make = {"fenced": _fenced, "inline": _inline, "quote": _quote}[kind]
    construct, body_at = data.draw(make(body))
    head = "\n".join([*before, ""])
    content = head + construct + "\n" + "\n".join(after)
    inside = range(len(head) + body_at, len(head) + body_at + len(body))
    assert content[inside.start + len(left) + 1 :].startswith("@" + handle)
    assert not [m for m in parse_mentions(content) if m.start in inside]


@given(before=_PIECES, after=_PIECES, handle=_HANDLE)
def test_token_on_its_own_plain_line_is_live(
    before: list[str], after: list[str], handle: str
) -> None:
    head = "\n".join([*before, ""])
    content = head + "@" + handle + "\n" + "\n".join(after)
    mention = Mention(handle.lower(), len(head), len(head) + 1 + len(handle))
    assert mention in parse_mentions(content)
    assert handle.lower() in live_handles(content)


@given(st.one_of(st.text(), _HOSTILE, _PIECES.map("\n".join)))
def test_multi_forward_and_explicit_context_yield_nothing(content: str) -> None:
    for mode in (MentionMode.MULTI_FORWARD, MentionMode.EXPLICIT_CONTEXT):
        assert parse_mentions(content, mode) == ()
        assert live_handles(content, mode) == frozenset()


@given(st.one_of(st.text(), _HOSTILE, _PIECES.map("\n".join)))
def test_offsets_cover_exactly_the_token(content: str) -> None:
    mentions = parse_mentions(content)
    for m in mentions:
        assert content[m.start : m.end].lower() == "@" + m.handle
    assert [m.start for m in mentions] == sorted({m.start for m in mentions})
    assert live_handles(content) == {m.handle for m in mentions}


def test_not_in_scope_names_only_what_the_author_may_know() -> None:
    author = Member("a", "ws", MemberType.HUMAN, "ann", "Ann")
    agent = Member("e", "ws", MemberType.AGENT, "echo", "Echo")
    mine = Member("m", "ws", MemberType.AGENT, "mine", "Mine", "a", True)
    theirs = Member("t", "ws", MemberType.AGENT, "theirs", "Theirs", "x", True)
    member = Member("b", "ws", MemberType.HUMAN, "bob", "Bob")
    foreign = Member("f", "other", MemberType.HUMAN, "far", "Far")
    mentioned = [
        (agent, False),
        (mine, False),
        (theirs, False),
        (member, True),
        (foreign, False),
        (author, False),
    ]
    assert not_in_scope(author, mentioned) == (agent, mine)
