"""Hostile values in every client frame, against a live node: never ``internal``.

The frames are built from the fields of the client frames in
:mod:`protocol.frames` (read with ``msgspec.inspect``), so an op added there
is driven here without a change. Unlike ``tests/test_protocol_fuzz.py``,
which mostly breaks the frames' shape, the values here mostly pass the
decoder and reach the handlers: extreme integers (0, 2**31, 2**63 - 1, 2**63,
2**64 and beyond), NUL, control, direction and invisible characters, strings
of the largest allowed length, timestamps far in the past and the future,
ids of every kind that exist nowhere or belong to another workspace or to a
scope the caller cannot read, and search cursors carrying the right
fingerprint around forged keys (ranks of 1e308, years 1 and 9999, huge ints).
Most frames carry one hostile field among plausible ones (ids the session
may use, plain words, values in range), so that the hostile value gets past
the decoder and the handler's first checks; some are hostile throughout.

One node process (its log written to a file) serves every example over
three sessions of one workspace: a human, an agent daemon and the human's
private agent. ``hello`` is driven on fresh connections (its ``resume``
reaches the resume path). Every request must be answered by its id with a
``reply`` or an ``error`` whose code is documented and not ``internal``;
every ``hello`` with ``resume`` gets its ``resumed``; no session is closed;
and the node logs no traceback and no failed request, actor or scope load
(each is a client's input meeting a failure it is not told about).
"""

from __future__ import annotations

import base64
import itertools
import json
import math
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import msgspec.inspect as mi
import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from actors.model import MemberType
from bench.nodeproc import open_node
from node.client import Client, ConnectionClosed, open_client
from node.config import Settings
from node.hub import delivery_id
from protocol.errors import CloseCode, ErrorCode
from protocol.frames import ClientFrame, Hello, Pong
from storage import directory
from storage.pg import connect
from storage.search import BadCursor, decode_cursor
from tests.nodes import World, make_channel, running_node

EXAMPLES = 80  # each a frame of every op, sent by each of three sessions: 5,280 requests
IN_FLIGHT = 2  # batches sent at once
HELLO_EXAMPLES = 40  # fresh connections, each with a generated hello
MIN_REQUESTS = 5_000
MAX_FRAME_BYTES = Settings().max_frame_bytes
ANSWER_TIMEOUT = 30.0
ERROR_CODES = frozenset(code.value for code in ErrorCode)
DOCUMENTED_CLOSE_CODES = frozenset(int(code) for code in CloseCode)
# Log events that stand for a request the node could not handle: each one is
# a client's input reaching a failure the client is not told about.
FAILURE_EVENTS = frozenset(
    {
        "request_failed",
        "connection_failed",
        "actor_crashed",
        "actor_start_failed",
        "resume_failed",
        "redeliver_failed",
        "scope_commit_failed",
        "scope_mutation_failed",
        "scope_roster_failed",
        "scope_reaction_failed",
        "scope_reload_failed",
        "scope_generation_read_failed",
    }
)

# Every frame a client sends after hello and expects an answer to.
REQUEST_TYPES = [cls for cls in ClientFrame.__args__ if cls not in (Hello, Pong)]

_encoder = msgspec.json.Encoder()
_MISSING = object()

# ---------------------------------------------------------------- hostile values

# What the text rule refuses (protocol/text.py): controls everywhere, and
# direction and invisible characters in names, emoji and identifiers.
CONTROL = "".join(chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)))
INVISIBLE = (
    "\u00ad\u034f\u061c\u115f\u180e\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d"
    "\u202e\u2028\u2029\u2060\u2066\u2067\u2068\u2069\u3164\ufeff\ufff9\ufffc"
)
# What it lets through and SQL, LIKE patterns, format strings, JSON, markdown,
# mentions and targets make something of; combining marks, RTL and CJK letters,
# emoji with modifiers, the longest ligature, a tag character.
SPECIAL = (
    "%_\\'\"`{}$:#@<>&;*?!~^|/[]()=+,. \t\n\r"
    "\u0301\u05d0\u0627\u4e2d\uac00\U0001f44d\U0001f3fb\ufdfd\U000e0041\U0010fffd"
)
# Any code point but a surrogate (JSON text cannot carry a lone one). Named
# categories rather than hypothesis's default codec, whose table takes seconds
# to build when no .hypothesis directory holds it yet.
_any_char = st.characters(exclude_categories=["Cs"])
_passing_chars = st.one_of(st.sampled_from(SPECIAL), st.characters(categories=["L", "N", "P", "S"]))
_hostile_chars = st.one_of(st.sampled_from(CONTROL + INVISIBLE), _passing_chars, _any_char)
NUMERIC_TEXT = [
    "0",
    "-1",
    "1e308",
    "-1e308",
    "NaN",
    "Infinity",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "0x7fffffff",
    "1.5",
    "",
    " ",
    "null",
    "true",
    "[]",
    "{}",
    "%s",
    "%(x)s",
    "{0}",
    "'; --",
    "\\",
    "../..",
]
EXTREME_INTS = [
    -(2**64),
    -(2**63) - 1,
    -(2**63),
    -(2**31) - 1,
    -1,
    0,
    1,
    2,
    49,
    50,
    51,
    199,
    200,
    201,
    2**15,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    10**30,
    2**200,
]
EXTREME_FLOATS = [1e308, -1e308, 5e-324, -0.0, 3.5e38, math.inf, -math.inf, math.nan]
# For strings without a declared maximum: around the row limit (16,000) and
# past it, within the frame limit even when every character is escaped.
HUGE_LENGTHS = [15_999, 16_001, 40_000]
# Reactions that pass, so a reaction's message and rights are reached too.
EMOJI = ["\U0001f44d", ":+1:", "\u2764\ufe0f", "\U0001f469\u200d\U0001f4bb", "\U0001f1fa\U0001f1f8"]


def _stamp(value: datetime) -> str:
    return value.isoformat()


def timestamps() -> st.SearchStrategy[str]:
    """Far past, just past, just ahead, far future, naive and odd offsets."""
    now = datetime.now(UTC)
    fixed = [
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00+14:00",
        "1970-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z",
        "9999-12-31T23:59:59-14:00",
        "2020-02-29T12:00:00",
        "2000-01-01T00:00:00.000001+23:59",
        "2000-01-01T00:00:00-23:59",
        _stamp(now - timedelta(seconds=1)),
        _stamp(now - timedelta(days=1)),
        _stamp(now - timedelta(days=3650)),
        _stamp(now + timedelta(seconds=2)),
        _stamp(now + timedelta(days=1)),
        _stamp(now + timedelta(days=365 * 500)),
    ]
    return st.one_of(
        st.sampled_from(fixed),
        st.datetimes(timezones=st.sampled_from([UTC, None])).map(_stamp),
    )


def ints(low: int | None, high: int | None, hostile: bool = True) -> st.SearchStrategy[int]:
    """The edges of the declared range and the extremes inside it; when
    hostile, sometimes outside."""
    lo = -(2**64) if low is None else low
    hi = 2**200 if high is None else high
    edges = {v for v in (lo, hi, lo + 1, hi - 1) if lo <= v <= hi}
    inside = sorted(edges | {v for v in EXTREME_INTS if lo <= v <= hi})
    outside = [v for v in EXTREME_INTS if not lo <= v <= hi]
    choices = [st.sampled_from(inside), st.sampled_from(inside), st.integers(lo, hi)]
    if outside and hostile:
        choices.append(st.sampled_from(outside))
    return st.one_of(choices)


def _salt(value: str, extra: str, where: int) -> str:
    """``value`` with ``extra`` put before, inside or after it."""
    at = (len(value) * where) // 2
    return value[:at] + extra + value[at:]


def strings(t: mi.StrType, known: st.SearchStrategy[str], name: str) -> st.SearchStrategy[str]:
    """Values for a string field: known ids and targets (also salted with control
    characters), hostile characters, the longest allowed strings and numbers as text."""
    if t.pattern is not None:
        matching = st.from_regex(t.pattern, fullmatch=True, alphabet=_any_char)
        return matching | st.text(_hostile_chars, max_size=8)
    low = t.min_length or 0
    cap = t.max_length
    lengths = sorted({cap, max(low, cap - 1), cap + 1}) if cap is not None else HUGE_LENGTHS
    huge = st.builds(
        lambda chunk, n: (chunk * n)[:n],
        st.text(_passing_chars | _hostile_chars, min_size=1, max_size=3),
        st.sampled_from(lengths),
    )
    short = max(low, min(cap or 16, 16))
    choices = [
        known,
        st.builds(_salt, known, st.text(_passing_chars, min_size=1, max_size=2), st.integers(0, 2)),
        st.builds(_salt, known, st.text(_hostile_chars, min_size=1, max_size=2), st.integers(0, 2)),
        st.text(_passing_chars, min_size=low, max_size=short),
        st.text(_passing_chars, min_size=low, max_size=short),
        st.text(_hostile_chars, min_size=low, max_size=short),
        huge,
        st.sampled_from(NUMERIC_TEXT),
    ]
    # Mostly what the field is for, so that most frames get past the decoder.
    if name.endswith(("Id", "Ids", "target", "resume")):
        choices += [known] * 8
    elif name == "emoji":
        choices += [st.sampled_from(EMOJI)] * 8
    return st.one_of(choices)


# The kind of id a field holds, by a word of its name (first match wins); a
# field none of them names gets any usable id.
ID_KINDS = [
    ("targetkey", "scope"),
    ("target", "target"),
    ("resume", "scope"),
    ("clientmessage", "client"),
    ("grantee", "member"),
    ("grant", "grant"),
    ("scope", "scope"),
    ("member", "member"),
    ("author", "member"),
    ("recipient", "member"),
    ("message", "message"),
    ("delivery", "delivery"),
    ("attachment", "attachment"),
]


def plausible_strings(
    t: mi.StrType, usable: dict[str, list[str]], name: str
) -> st.SearchStrategy[str]:
    """What a well-behaved client might send: an id or target it may use, an
    emoji, a slug, or a few words."""
    if t.pattern is not None:
        return st.from_regex(t.pattern, fullmatch=True, alphabet=_any_char)
    if name.endswith(("Id", "Ids", "target", "Key", "resume", "recipients")):
        lowered = name.lower()
        kind = next((kind for word, kind in ID_KINDS if word in lowered), None)
        return st.sampled_from(usable[kind] if kind else sorted(set().union(*usable.values())))
    if name == "emoji":
        return st.sampled_from(EMOJI)
    words = st.sampled_from([SEARCH_WORD, "hello", "@bot", "#general", "x", "text", "1"])
    return st.lists(words, min_size=1, max_size=4).map(" ".join)


class Strategies:
    """Values of every wire type, derived from the frame types: hostile ones,
    and plausible ones (in range, known ids, plain text) for the other fields
    of a frame, so that the hostile field gets past the decoder."""

    def __init__(self, world: Seeded) -> None:
        self.known = st.sampled_from(world.strings)
        self.targets = st.sampled_from(world.targets)
        self.world = world

    def value(self, t: mi.Type, name: str, hostile: bool = True) -> st.SearchStrategy[Any]:
        if isinstance(t, mi.Metadata):
            # protocol.text's kind of a string (Meta(extra={"text": ...})) names it too.
            kind = (t.extra or {}).get("text")
            return self.value(t.type, kind or name, hostile)
        if isinstance(t, mi.IntType):
            low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else None)
            high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else None)
            return ints(low, high, hostile)
        if isinstance(t, mi.FloatType):
            return st.sampled_from(EXTREME_FLOATS) | st.floats()
        if isinstance(t, mi.StrType):
            known = self.targets if name == "target" else self.known
            if hostile:
                return strings(t, known, name)
            return plausible_strings(t, self.world.usable, name)
        if isinstance(t, mi.BoolType):
            return st.booleans()
        if isinstance(t, mi.NoneType):
            return st.none()
        if isinstance(t, mi.LiteralType):
            valid = st.sampled_from(t.values)
            return st.one_of(valid, valid, valid, self.known) if hostile else valid
        if isinstance(t, mi.DateTimeType):
            return timestamps()
        if isinstance(t, mi.UnionType):
            return st.one_of(*(self.value(member, name, hostile) for member in t.types))
        if isinstance(t, mi.ListType):
            return self.lists(t, name, hostile)
        if isinstance(t, mi.DictType):
            keys, values = self.value(t.key_type, name, hostile), self.value(t.value_type, name)
            return st.dictionaries(keys, values, max_size=4)
        if isinstance(t, mi.StructType):
            return self.struct(t, hostile)
        return st.one_of(self.known, st.integers(), st.none())

    def lists(self, t: mi.ListType, name: str, hostile: bool) -> st.SearchStrategy[list[Any]]:
        item = self.value(t.item_type, name, hostile)
        cap = t.max_length
        few = st.lists(item, max_size=min(cap or 3, 3))
        if cap is None or not hostile:
            return few
        # The longest allowed list (and one longer), every item the same.
        full = st.builds(lambda x, n: [x] * n, item, st.sampled_from([cap, cap + 1]))
        return st.one_of(few, few, full)

    def struct(
        self, t: mi.StructType, hostile: bool = True, focus: str | None = None
    ) -> st.SearchStrategy[dict[str, Any]]:
        """An object with the struct's fields: all hostile, all plausible, or
        only ``focus`` hostile. An optional field is often left out."""
        fields = {}
        for f in t.fields:
            if f.encode_name in ("type", "id"):
                continue
            value = self.value(f.type, f.encode_name, hostile or f.encode_name == focus)
            absent = st.just(_MISSING)
            if f.encode_name == focus:
                fields[f.encode_name] = value
            else:
                fields[f.encode_name] = value if f.required else st.one_of(absent, value)

        def build(values: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in values.items() if v is not _MISSING}

        return st.builds(build, st.fixed_dictionaries(fields))

    def frame(self, cls: type) -> st.SearchStrategy[dict[str, Any]]:
        """A frame with one hostile field (each field as often as the others),
        or with every field hostile, or with none."""
        info = _struct_info(cls)
        tag = info.tag
        assert isinstance(tag, str)
        names = [f.encode_name for f in info.fields if f.encode_name not in ("type", "id")]
        bodies = [self.struct(info, hostile=False, focus=name) for name in names]
        bodies += [self.struct(info), self.struct(info, hostile=False)]
        return st.one_of(bodies).map(lambda body: {"type": tag, **body})

    def forged_search(self) -> st.SearchStrategy[dict[str, Any]]:
        """A search whose cursor carries the right fingerprint for its query and
        sort around a forged key: the cursor passes its first checks and the key
        reaches the statement."""
        sorts = sorted(self.world.cursors)
        ranks = st.one_of(
            st.sampled_from(EXTREME_FLOATS),
            st.sampled_from([10**400, -(10**400), 0, 1, "1", None, [1]]),
            st.floats(),
        )
        stamps = timestamps() | st.sampled_from(["", "5", "yesterday", "+275760-09-13T00:00:00Z"])
        ids = self.known | st.text(_hostile_chars, max_size=8) | st.sampled_from([5, None, ""])

        def build(sort: str, rank: Any, at: Any, message_id: Any, limit: int) -> dict[str, Any]:
            fingerprint, key = self.world.cursors[sort]
            forged = [at, message_id] if len(key) == 2 else [rank, at, message_id]
            body = json.dumps({"f": fingerprint, "k": forged}).encode()
            return {
                "type": "search",
                "query": SEARCH_WORD,
                "sort": sort,
                "limit": limit,
                "cursor": base64.urlsafe_b64encode(body).decode().rstrip("="),
            }

        return st.builds(build, st.sampled_from(sorts), ranks, stamps, ids, ints(1, 50))

    def requests(self) -> st.SearchStrategy[Frames]:
        """One frame of every request op of the protocol (and ping), and a search
        with a forged cursor."""
        ops = [self.frame(cls) for cls in REQUEST_TYPES]
        return st.tuples(*ops, self.forged_search()).map(Frames)

    def hellos(self) -> st.SearchStrategy[Frames]:
        """A hello, mostly with a session's own token and a resume."""
        tokens = st.sampled_from(self.world.tokens)
        resume = st.dictionaries(
            self.known | strings(mi.StrType(max_length=1024), self.known, "resume"),
            ints(0, None),
            min_size=1,
            max_size=6,
        )

        def build(hello: dict[str, Any], token: str | None, resumed: Any) -> dict[str, Any]:
            frame = {"type": "hello", **hello}
            if token is not None:
                frame["token"] = token
            if resumed is not _MISSING:
                frame["resume"] = resumed
            return frame

        return st.builds(
            build,
            self.struct(_struct_info(Hello)),
            tokens | tokens | st.none(),  # a session's own token, mostly
            resume | resume | st.just(_MISSING),
        ).map(lambda hello: Frames([hello]))


def _struct_info(cls: type) -> mi.StructType:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return info


# ---------------------------------------------------------------- the world

SEARCH_WORD = "hostileword"
# (handle, the daemon capabilities it connects with, or None for a browser)
SESSIONS: list[tuple[str, Any]] = [
    ("alice", None),
    ("bot", ["freshness", "ack"]),
    ("alicepa", ["freshness", "ack"]),
]


@dataclass
class Seeded:
    """What exists before the first example: every id a hostile client could name."""

    workspace_id: str
    tokens: list[str]
    strings: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    # sort -> (fingerprint, key) of a real next-page cursor for SEARCH_WORD
    cursors: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)
    # kind of id (see ID_KINDS) -> ids the sessions may use
    usable: dict[str, list[str]] = field(default_factory=dict)


async def _members(database_url: str) -> tuple[str, dict[str, tuple[str, str]], dict[str, Any]]:
    """Two workspaces; handle -> (member id, token)."""
    people: dict[str, tuple[str, str]] = {}
    async with await connect(database_url, autocommit=True) as conn:
        home = await directory.create_workspace(conn, "hostile")
        other = await directory.create_workspace(conn, "elsewhere")
        specs: list[tuple[str, str, MemberType, str | None]] = [
            ("alice", home, MemberType.HUMAN, None),
            ("bob", home, MemberType.HUMAN, None),
            ("carol", home, MemberType.HUMAN, None),
            ("bot", home, MemberType.AGENT, None),
            ("alicepa", home, MemberType.AGENT, "alice"),
            ("carolpa", home, MemberType.AGENT, "carol"),
            ("mallory", other, MemberType.HUMAN, None),
            ("mo", other, MemberType.HUMAN, None),
        ]
        for handle, workspace, type_, owner in specs:
            member = await directory.create_member(
                conn,
                workspace_id=workspace,
                type_=type_,
                handle=handle,
                owner_member_id=people[owner][0] if owner else None,
                private=owner is not None,
            )
            people[handle] = (member.id, await directory.issue_token(conn, member.id))
    return home, people, {"other": other}


def _forged_ids() -> list[str]:
    """Ids of every kind that exist nowhere."""
    prefixes = ["scp", "mem", "msg", "grt", "att", "ws", "dlv", "ses", "act"]
    return [f"{p}_{fill * 28}" for p in prefixes for fill in ("0", "f")] + [
        "scp_",
        "mem_",
        "msg_",
        "dlv_.",
        "dlv_0.0",
        "_",
    ]


async def seed(node_url: str, database_url: str) -> Seeded:
    home, people, extra = await _members(database_url)
    ids = {handle: member_id for handle, (member_id, _) in people.items()}

    def url(workspace: str) -> str:
        return f"{node_url}/v1/ws?workspace={quote(workspace)}"

    def client(handle: str, workspace: str = home, **kwargs: Any) -> Any:
        return open_client(url(workspace), people[handle][1], **kwargs)

    strings: list[str] = [*ids.values(), home, extra["other"], *_forged_ids()]
    scopes: list[str] = []
    async with (
        client("alice") as alice,
        client("bob") as bob,
        client("carol") as carol,
        client("bot", kind="daemon", capabilities=["freshness", "ack"]) as bot,
        client("mallory", extra["other"]) as mallory,
    ):
        general = (await alice.request("createChannel", slug="general", name="General"))["scopeId"]
        for member in (bob, bot):
            await member.request("join", scopeId=general)
        await alice.request("invite", scopeId=general, memberId=ids["alicepa"])
        mention = await alice.send("#general", f"{SEARCH_WORD} first @bot")
        for n in range(3):
            await alice.send("#general", f"{SEARCH_WORD} {n}")
        thread = await alice.send(f"#general:{mention['messageId']}", "a reply")
        dm = await alice.send(f"dm:{ids['bob']}", "hello bob")
        granted = await alice.request("grant", scopeId=general, granteeMemberId=ids["bob"])
        secret = (
            await carol.request("createChannel", slug="secret", name="S", visibility="private")
        )["scopeId"]
        await carol.request("invite", scopeId=secret, memberId=ids["bob"])
        hidden = await carol.send("#secret", f"{SEARCH_WORD} secret")
        carol_grant = await carol.request("grant", scopeId=secret, granteeMemberId=ids["bob"])
        bobs = (await bob.request("createChannel", slug="bobs", name="Bob's"))["scopeId"]
        unjoined = await bob.send("#bobs", f"{SEARCH_WORD} not joined")
        upload = await alice.upload(b"x", "x.txt", "text/plain")
        other_upload = await carol.upload(b"y", "y.txt", "text/plain")
        far = (await mallory.request("createChannel", slug="general", name="Far"))["scopeId"]
        far_message = await mallory.send("#general", f"{SEARCH_WORD} far away")
        far_grant = await mallory.request("grant", scopeId=far, granteeMemberId=ids["mo"])
        scopes = [general, secret, bobs, far, thread["targetKey"], dm["targetKey"]]
        messages = [
            mention["messageId"],
            thread["messageId"],
            dm["messageId"],
            hidden["messageId"],
            unjoined["messageId"],
            far_message["messageId"],
        ]
        strings += scopes + messages
        strings += [granted["grantId"], carol_grant["grantId"], far_grant["grantId"]]
        strings += [upload["attachmentId"], other_upload["attachmentId"]]
        strings += [
            delivery_id(message, agent)
            for message in (mention["messageId"], hidden["messageId"], "msg_0")
            for agent in (ids["bot"], ids["alicepa"], ids["carolpa"])
        ]
        cursors = await _cursors(alice)
    # What the fuzzing sessions may well use: their workspace's scopes they
    # are in, its members, messages they can read, alice's grant and upload.
    usable = {
        "scope": [general, thread["targetKey"], dm["targetKey"]],
        "member": [ids[handle] for handle in ("alice", "bob", "carol", "bot", "alicepa")],
        "message": [mention["messageId"], thread["messageId"], dm["messageId"]],
        "grant": [granted["grantId"]],
        "delivery": [delivery_id(mention["messageId"], ids["bot"])],
        "attachment": [upload["attachmentId"]],
        "client": ["c-1", "c-2", "c-3"],  # a few, so that some sends repeat one
        "target": [
            "#general",
            f"#general:{mention['messageId']}",
            f"dm:{ids['bob']}",
            f"dm:{ids['bot']}",
            f"scope:{general}",
        ],
    }
    targets = [
        "#general",
        "#secret",
        "#bobs",
        "#nope",
        "#GENERAL",
        "#",
        "dm:",
        "scope:",
        "task:",
        f"#general:{mention['messageId']}",
        f"#general:{hidden['messageId']}",
        f"#secret:{hidden['messageId']}",
        f"#general:{far_message['messageId']}",
        *(f"{kind}:{scope}" for scope in scopes for kind in ("scope", "task")),
        *(f"dm:{member_id}" for member_id in ids.values()),
        *(f"#general:{message}" for message in messages),
    ]
    return Seeded(
        workspace_id=home,
        tokens=[people[handle][1] for handle, _ in SESSIONS],
        strings=strings + targets,
        targets=targets + strings,
        cursors=cursors,
        usable=usable,
    )


async def _cursors(client: Client) -> dict[str, tuple[str, list[Any]]]:
    """A real second-page cursor per sort, decoded: fingerprint and key."""
    found = {}
    with trio.fail_after(30):
        for sort in ("recent", "relevance"):
            for attempt in itertools.count():
                frame = {"type": "search", "query": SEARCH_WORD, "sort": sort, "limit": 1}
                answer = await client.request_frame({**frame, "id": f"seed-{sort}-{attempt}"})
                if answer.get("code") != ErrorCode.SEARCH_UNAVAILABLE:
                    break
                await trio.sleep(0.1)  # the workspace's index is being built
            assert answer["type"] == "reply", answer
            cursor = answer["result"]["nextCursor"]
            assert cursor, answer
            body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
            found[sort] = (body["f"], body["k"])
    return found


# ---------------------------------------------------------------- the exchange


class Frames(list[dict[str, Any]]):
    """Generated frames, shown short: hypothesis renders an example's arguments
    (and warns, an error here, past 30 kB), and these run to hundreds of
    kilobytes. The assertions show the frames that failed."""

    def __repr__(self) -> str:
        return f"<{len(self)} frames: {', '.join(str(f.get('type')) for f in self)}>"


@dataclass
class Outcome:
    frame: dict[str, Any]
    answer: dict[str, Any]


class Driver:
    """Sends generated requests over the seeded sessions and keeps every answer."""

    def __init__(self, sessions: list[Client], nursery: trio.Nursery) -> None:
        self.sessions = sessions
        self._nursery = nursery
        self._in_flight = trio.Semaphore(IN_FLIGHT)
        self.ids = itertools.count(1)
        self.outcomes: list[Outcome] = []
        self.sent: Counter[str] = Counter()
        self.hellos = 0
        self.oversize = 0

    def _request_id(self) -> int | str:
        """A fresh id the answer can echo: small and past int64, int and string.
        (A string id the text rule refuses is answered with id null, as
        tests/test_protocol_fuzz.py checks.)"""
        n = next(self.ids)
        return (n, 2**63 + n, f"r-{n}", f"{n}" * 3)[n % 4]

    async def submit(self, frames: Frames) -> None:
        """Start a batch once fewer than IN_FLIGHT are running: the next one is
        generated while the node answers this one."""
        await self._in_flight.acquire()
        self._nursery.start_soon(self._batch, frames)

    async def _batch(self, frames: Frames) -> None:
        """Every frame from every session, all at once."""
        try:
            async with trio.open_nursery() as nursery:
                for frame in frames:
                    for client in self.sessions:
                        nursery.start_soon(self._one, client, frame)
            for client in self.sessions:
                while client.pending_events():
                    event = await client.next_event()
                    if event.get("type") == "error":  # answers nothing we asked
                        self.outcomes.append(Outcome({"type": "(none)"}, event))
        finally:
            self._in_flight.release()

    async def _one(self, client: Client, frame: dict[str, Any]) -> None:
        frame = {**frame, "id": self._request_id()}
        if len(_encoder.encode(frame)) > MAX_FRAME_BYTES:
            # Answered payload_too_large with id null (tests/test_protocol_fuzz.py):
            # nothing here to match the answer to.
            self.oversize += 1
            return
        self.sent[frame["type"]] += 1
        try:
            with trio.fail_after(ANSWER_TIMEOUT):
                answer = await client.request_frame(frame)
        except (trio.TooSlowError, ConnectionClosed) as exc:
            answer = {"type": "no answer", "error": repr(exc)}
        self.outcomes.append(Outcome(frame, answer))

    async def hello(self, url: str, frame: dict[str, Any]) -> None:
        """One fresh connection: the hello, then a ping that must get its pong and,
        after a welcome to a hello with a ``resume``, the ``resumed``. Whatever
        is missing is recorded as the hello's answer."""
        if len(_encoder.encode(frame)) > MAX_FRAME_BYTES:
            # A first frame over the size limit waits out the hello timeout
            # (tests/test_hostile_input.py has that case).
            self.oversize += 1
            return
        self.hellos += 1
        expected = {"pong"} | ({"resumed"} if frame.get("resume") else set())
        seen: set[str] = set()
        try:
            with trio.fail_after(ANSWER_TIMEOUT):
                async with trio_websocket.open_websocket_url(url) as ws:
                    await ws.send_message(_encoder.encode(frame).decode())
                    while not expected <= seen:
                        got = json.loads(await ws.get_message())
                        kind = got.get("type")
                        seen.add(kind)
                        if kind == "welcome":
                            await ws.send_message('{"type":"ping","id":"after-hello"}')
                        elif kind == "error":
                            self.outcomes.append(Outcome(frame, got))
        except trio_websocket.ConnectionClosed as closed:
            code = closed.reason.code if closed.reason else None
            if "welcome" in seen or code not in DOCUMENTED_CLOSE_CODES:
                self.outcomes.append(Outcome(frame, {"type": f"closed {code}", "seen": seen}))
        except trio.TooSlowError:
            self.outcomes.append(Outcome(frame, {"type": "no answer", "seen": sorted(seen)}))


# ---------------------------------------------------------------- what is allowed


def bad_answers(outcomes: list[Outcome]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    bad = []
    for outcome in outcomes:
        frame, answer = outcome.frame, outcome.answer
        if answer.get("type") in ("reply", "pong"):
            continue
        code = answer.get("code")
        if (
            answer.get("type") != "error"
            or code not in ERROR_CODES
            or code == ErrorCode.INTERNAL
            or not isinstance(answer.get("message"), str)
        ):
            bad.append((_shown(frame), answer))
    return bad


def _shown(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame for a failure message: long strings cut short."""
    return {
        k: (v[:80] + f"...({len(v)})" if isinstance(v, str) and len(v) > 100 else v)
        for k, v in frame.items()
    }


def failures_logged(log_path: Path) -> list[str]:
    """Log lines with a traceback, or naming a failed request or actor."""
    failed = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if "Traceback" in line:
                failed.append(line)
            continue
        if not isinstance(entry, dict):
            continue
        if (
            "exception" in entry
            or entry.get("event") in FAILURE_EVENTS
            or entry.get("level") in ("error", "critical")
        ):
            failed.append(line[:2000])
    return failed


# ---------------------------------------------------------------- the test


async def test_hostile_values_in_every_op_get_typed_errors(
    database_url: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "node.log"
    async with open_node(
        None, data_dir=str(tmp_path / "data"), database_url=database_url, log_path=str(log_path)
    ) as node:
        world = await seed(node.base_url, database_url)
        url = f"{node.base_url}/v1/ws?workspace={quote(world.workspace_id)}"
        strategies = Strategies(world)
        common = settings(
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        async with AsyncExitStack() as stack:
            sessions = [
                await stack.enter_async_context(
                    open_client(
                        url,
                        token,
                        kind="browser" if capabilities is None else "daemon",
                        capabilities=capabilities or (),
                        max_pending_events=math.inf,
                        # No heartbeat: its pings draw from the global random
                        # state while hypothesis generates, which hypothesis
                        # refuses. The requests keep the sessions alive.
                    )
                )
                for token, (_, capabilities) in zip(world.tokens, SESSIONS, strict=True)
            ]
            async with trio.open_nursery() as nursery:
                driver = Driver(sessions, nursery)

                @settings(common, max_examples=EXAMPLES)
                @given(strategies.requests())
                def requests(frames: Frames) -> None:
                    trio.from_thread.run(driver.submit, frames)

                await trio.to_thread.run_sync(requests)

            @settings(common, max_examples=HELLO_EXAMPLES)
            @given(strategies.hellos())
            def hellos(hello: Frames) -> None:
                trio.from_thread.run(driver.hello, url, hello[0])

            await trio.to_thread.run_sync(hellos)
            for client in sessions:  # every session is still open and answers
                answer = await client.request_frame({"type": "ping", "id": "last"})
                assert answer == {"type": "pong", "id": "last"}, answer

    bad = bad_answers(driver.outcomes)
    assert not bad, f"{len(bad)} answers not typed: {bad[:10]}"
    logged = failures_logged(log_path)
    assert not logged, f"{len(logged)} failures logged by the node: {logged[:5]}"
    requests_sent = sum(driver.sent.values())
    assert requests_sent >= MIN_REQUESTS, driver.sent
    ops = {str(cls.__struct_config__.tag) for cls in REQUEST_TYPES}
    assert set(driver.sent) == ops, driver.sent
    # Past the decoder: every op was answered by its handler at least once (a
    # reply, or an error other than validation_failed).
    reached = Counter(
        o.frame["type"]
        for o in driver.outcomes
        if o.frame["type"] in ops
        and (
            o.answer.get("type") in ("reply", "pong")
            or o.answer.get("code") != ErrorCode.VALIDATION_FAILED
        )
    )
    assert set(reached) == ops, (reached, driver.sent)
    print(
        f"hostile: {requests_sent} requests, {driver.hellos} hellos; "
        f"reached handlers {dict(reached)}"
    )


# ---------------------------------------------------------------- what it found


def _relevance_cursor(rank: Any) -> tuple[str, str]:
    """A relevance cursor around ``rank``, and the fingerprint it carries."""
    key = [rank, "2026-01-01T00:00:00+00:00", "msg_0"]
    body = json.dumps({"f": "fingerprint", "k": key}).encode()
    return base64.urlsafe_b64encode(body).decode().rstrip("="), "fingerprint"


@pytest.mark.parametrize("rank", [5e-324, -2.9963101258475983e-134, 1e-46, 1e308, math.nan])
def test_a_rank_no_real_holds_is_not_a_cursor(rank: float) -> None:
    """The statement compares the rank as a ``real``: one that underflows to 0
    there was answered ``internal`` ("out of range for type real")."""
    cursor, fingerprint = _relevance_cursor(rank)
    with pytest.raises(BadCursor):
        decode_cursor(cursor, fingerprint, "relevance")


@pytest.mark.parametrize("rank", [0.0, -0.0, 1.401298464324817e-45, 0.0607927, 3.4e38])
def test_a_rank_a_real_holds_is_a_cursor(rank: float) -> None:
    cursor, fingerprint = _relevance_cursor(rank)
    assert decode_cursor(cursor, fingerprint, "relevance")[0] == rank


def _recent_cursor(at: str) -> str:
    body = json.dumps({"f": "fingerprint", "k": [at, "msg_0"]}).encode()
    return base64.urlsafe_b64encode(body).decode().rstrip("=")


def test_a_cursor_time_is_read_in_utc() -> None:
    """PostgreSQL refuses an offset past 15:59 (``internal`` when a cursor held
    +23:59); one that moves the time past the year 9999 is not a cursor."""
    at, _ = decode_cursor(_recent_cursor("2000-01-01T00:00:00+23:59"), "fingerprint", "recent")
    assert at == datetime(1999, 12, 31, 0, 1, tzinfo=UTC)
    assert at.utcoffset() == timedelta(0)
    for far in ("9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"):
        with pytest.raises(BadCursor):
            decode_cursor(_recent_cursor(far), "fingerprint", "recent")


async def test_a_grant_expiring_past_the_year_9999_in_utc_is_refused(
    database_url: str, tmp_path: Path
) -> None:
    """Stored, such a grant made every load of its scope fail: the channel
    answered ``unavailable`` to everyone until the grant was revoked."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        alice, bob = await world.member("alice"), await world.member("bob")
        async with world.client(alice) as a:
            scope_id = await make_channel(a, "general")
            for expires_at in ("9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"):
                answer = await a.request_frame(
                    {
                        "type": "grant",
                        "id": expires_at,
                        "scopeId": scope_id,
                        "granteeMemberId": bob.id,
                        "expiresAt": expires_at,
                    }
                )
                assert answer["code"] == "validation_failed", answer
                assert answer["details"]["path"] == "$.expiresAt", answer
            # The latest time there is: granted, and the scope (which the send
            # loads with its grants) still serves.
            await a.request(
                "grant", scopeId=scope_id, granteeMemberId=bob.id, expiresAt="9999-12-31T23:59:59Z"
            )
            assert (await a.send("#general", "still served"))["state"] == "sent"
