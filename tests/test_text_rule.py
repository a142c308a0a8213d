"""The one text rule at the door (protocol/text.py, docs/protocol.md#text).

- the rule per kind (pure): what content keeps, what names, emoji and
  identifiers refuse, and the emoji sequences that survive;
- every string field of every client frame is checked, at its own path
  (frames synthesised from the msgspec types, so a new field is covered);
- against a live node: a NUL in content is refused and nothing is stored,
  pushed or woken; the three inputs that used to end in ``internal``; and
  every Unicode control and format character through ``send``, ``edit``,
  ``createChannel``, ``react`` and ``search``, each answer checked against the
  rule, everything accepted the same in the live events, ``history``,
  ``search`` and resume.
"""

from __future__ import annotations

import base64
import itertools
import json
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from msgspec import inspect

from actors.model import MemberType
from actors.policy import reaction_emoji_error
from node.client import Client
from protocol.codec import decode_client_frame
from protocol.errors import FrameError, OperationError
from protocol.frames import ClientFrame
from protocol.text import TextKind, check_text, text_problem
from storage.search import BadCursor, decode_cursor
from tests.nodes import make_channel, running_world

TIMEOUT = 20.0
_ids = itertools.count(100_000)

# Every control (Cc) and format (Cf) character, direction controls included,
# and the two separators that break a line without being a control.
SWEEP = [
    chr(code)
    for code in range(0x110000)
    if unicodedata.category(chr(code)) in ("Cc", "Cf") or code in (0x2028, 0x2029)
]
DIRECTION = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F)]
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u3164", "\u034f"]
# Emoji whose invisible parts a name and an emoji keep.
EMOJI_SEQUENCES = [
    "\U0001f469\u200d\U0001f4bb",  # woman technologist (ZWJ)
    "\U0001f3f3\ufe0f\u200d\U0001f308",  # rainbow flag (VS16 + ZWJ)
    "\U0001f468\U0001f3fd\u200d\U0001f9b0",  # skin tone + ZWJ
    "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1",  # two ZWJ
    "\u2764\ufe0f\u200d\U0001f525",  # heart on fire
    "\u2764\ufe0f",  # text heart as emoji (VS16)
    "1\ufe0f\u20e3",  # keycap
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # Scotland
]


# ---------------------------------------------------------------- the rule, pure


def test_every_kind_refuses_nul_and_the_c0_c1_controls_but_tab_and_line_breaks() -> None:
    for kind in TextKind:
        assert text_problem("harmless\x00 secret tail", kind) is not None
        for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]:
            char = chr(code)
            refused = text_problem(f"a{char}b", kind) is not None
            keeps = kind in (TextKind.CONTENT, TextKind.TERM) and char in "\t\n\r"
            assert refused is not keeps, (kind, hex(code))


def test_content_and_search_keep_what_writing_needs() -> None:
    for text in [
        "line one\n\tline two\r\n",
        "\u05e9\u05dc\u05d5\u05dd \u200fabc\u200e",  # Hebrew with direction marks
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian with ZWNJ
        "quote \u202bembedded\u202c and \u2067isolated\u2069 and \u202eoverride\u202c",
        *EMOJI_SEQUENCES,
        "\ufeffbom\u2060joiner\u00adhyphen",
    ]:
        assert text_problem(text, TextKind.CONTENT) is None, ascii(text)
        assert text_problem(text, TextKind.TERM) is None, ascii(text)


def test_names_emoji_and_identifiers_refuse_invisible_and_direction_characters() -> None:
    for kind in (TextKind.NAME, TextKind.EMOJI, TextKind.KEY):
        for char in [*DIRECTION, *INVISIBLE, "\u2028", "\u2029", "\t", "\n"]:
            for text in (char, f"ab{char}", f"{char}ab", f"a{char}b"):
                assert text_problem(text, kind) is not None, (kind, ascii(text))
        for sequence in EMOJI_SEQUENCES:
            assert text_problem(sequence, kind) is None, (kind, ascii(sequence))
            assert text_problem(f"team {sequence}", kind) == (
                "an emoji has no whitespace" if kind is TextKind.EMOJI else None
            )
        # The emoji exceptions hold only inside an emoji.
        for text in ("\ufe0f", "\u200d\U0001f4bb", "\U0001f469\u200d", "a\u200db"):
            assert text_problem(text, kind) is not None, (kind, ascii(text))
        for text in ("\U0001f3f4\U000e0067", "\U0001f3f4\U000e007f", "a\U000e0067\U000e007f"):
            assert text_problem(text, kind) is not None, (kind, ascii(text))


def test_a_name_needs_a_visible_character_and_every_kind_is_bounded() -> None:
    assert text_problem("   ", TextKind.NAME) == "a name needs a visible character"
    assert text_problem("\u3000", TextKind.NAME) == "a name needs a visible character"
    assert text_problem("release notes \u3000 2026", TextKind.NAME) is None
    assert text_problem("   ", TextKind.KEY) is None
    assert text_problem("a b", TextKind.EMOJI) == "an emoji has no whitespace"
    assert text_problem("\U0001f44d\u00a0", TextKind.EMOJI) == "an emoji has no whitespace"
    for kind, limit in [(TextKind.NAME, 256), (TextKind.EMOJI, 64), (TextKind.KEY, 1024)]:
        assert text_problem("x" * limit, kind) is None
        assert text_problem("x" * (limit + 1), kind) == f"at most {limit} characters"


def test_check_text_raises_validation_failed_at_the_path() -> None:
    assert check_text("general", TextKind.NAME, "$.name") == "general"
    with pytest.raises(OperationError) as refused:
        check_text("gen\x00", TextKind.NAME, "$.name")
    assert refused.value.code == "validation_failed"
    assert refused.value.path == "$.name"
    assert refused.value.details == {"path": "$.name"}
    assert "U+0000" in refused.value.message


# ------------------------------------------------- every string field of every frame


class _Sample:
    """A valid client frame with a distinct marker in every string, and each
    marker's path and kind (the kinds the frame's types declare)."""

    def __init__(self) -> None:
        self.markers: dict[str, tuple[str, TextKind]] = {}
        self._count = itertools.count()

    def marker(self, path: str, kind: TextKind) -> str:
        # Lower-case letters and digits: a slug's pattern takes it too.
        marker = f"m{next(self._count)}x"
        self.markers[marker] = (path, kind)
        return marker

    def value(self, info: Any, path: str, kind: TextKind = TextKind.KEY) -> Any:
        match info:
            case inspect.Metadata():
                text = (info.extra or {}).get("text")
                return self.value(info.type, path, TextKind(text) if text else kind)
            case inspect.StrType():
                return self.marker(path, kind)
            case inspect.IntType():
                return info.ge if info.ge is not None else 1
            case inspect.BoolType():
                return False
            case inspect.LiteralType():
                return info.values[0]
            case inspect.DateTimeType():
                return "2999-01-01T00:00:00Z"
            case inspect.ListType():
                return [self.value(info.item_type, f"{path}[0]")]
            case inspect.DictType():
                # A bad key is reported at its object.
                return {self.value(info.key_type, path): self.value(info.value_type, path)}
            case inspect.UnionType():
                arms = [t for t in info.types if not isinstance(t, inspect.NoneType)]
                strings = [t for t in arms if _is_str(t)]
                return self.value((strings or arms)[0], path, kind)
            case inspect.StructType():
                fields = {
                    f.encode_name: self.value(f.type, f"{path}.{f.encode_name}")
                    for f in info.fields
                }
                if info.tag_field is not None:
                    fields[info.tag_field] = info.tag
                return fields
        raise TypeError(f"no sample for {info!r}")


def _is_str(info: Any) -> bool:
    while isinstance(info, inspect.Metadata):
        info = info.type
    return isinstance(info, inspect.StrType)


def _samples() -> Iterator[tuple[str, str, dict[str, tuple[str, TextKind]]]]:
    union = inspect.type_info(ClientFrame)
    assert isinstance(union, inspect.UnionType)
    for arm in union.types:
        sample = _Sample()
        frame = sample.value(arm, "$")
        yield str(frame["type"]), msgspec.json.encode(frame).decode(), sample.markers


def test_every_string_of_every_client_frame_passes_the_rule_at_its_path() -> None:
    checked = 0
    for frame_type, text, markers in _samples():
        decode_client_frame(text)
        for marker, (path, kind) in markers.items():
            for char, kept in [
                ("\x00", False),
                ("\u202e", kind in (TextKind.CONTENT, TextKind.TERM)),
            ]:
                bad = text.replace(f'"{marker}"', json.dumps(marker + char))
                # A client's pong is dropped unread, so it is never refused.
                if kept or frame_type == "pong":
                    decode_client_frame(bad)
                    continue
                with pytest.raises(FrameError) as refused:
                    decode_client_frame(bad)
                assert refused.value.code == "validation_failed", (frame_type, path)
                assert refused.value.path == path, (frame_type, path, refused.value.message)
                # The request id is echoed, even when it is what broke the rule.
                assert refused.value.request_id == json.loads(bad).get("id")
                checked += 1
    # Some 60 strings in all (send alone has a dozen), each refused twice but
    # for the four that keep a direction override.
    assert checked > 100


def test_the_kinds_of_the_fields_people_write() -> None:
    kinds = {
        (frame_type, path): kind
        for frame_type, _, markers in _samples()
        for path, kind in markers.values()
    }
    assert kinds[("send", "$.content")] is TextKind.CONTENT
    assert kinds[("edit", "$.content")] is TextKind.CONTENT
    assert kinds[("createChannel", "$.description")] is TextKind.CONTENT
    assert kinds[("createChannel", "$.name")] is TextKind.NAME
    assert kinds[("hello", "$.client.name")] is TextKind.NAME
    assert kinds[("react", "$.emoji")] is TextKind.EMOJI
    assert kinds[("search", "$.query")] is TextKind.TERM
    assert kinds[("search", "$.cursor")] is TextKind.KEY
    assert kinds[("send", "$.target")] is TextKind.KEY


def test_a_search_cursor_the_statement_cannot_hold_is_not_a_cursor() -> None:
    def forged(key: list[object]) -> str:
        raw = json.dumps({"f": "abc", "k": key}).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    at = "2026-01-01T00:00:00+00:00"
    assert decode_cursor(forged([0.5, at, "msg_1"]), "abc", "relevance")[0] == 0.5
    for key in (
        [1e308, at, "msg_1"],
        [-1e39, at, "msg_1"],
        [10**400, at, "msg_1"],
        ["NaN", at, "msg_1"],
        [0.5, at, "msg\x00"],
        [0.5, at, "msg\u202e"],
    ):
        with pytest.raises(BadCursor):
            decode_cursor(forged(key), "abc", "relevance")
    with pytest.raises(BadCursor):
        decode_cursor(forged([at, "msg\x00"]), "abc", "recent")


# ---------------------------------------------------------------- a live node


async def _answer(client: Client, op: str, **fields: Any) -> dict[str, Any]:
    """The whole answer (``reply`` or ``error``) to one request."""
    frame = {"type": op, "id": next(_ids), **fields}
    with trio.fail_after(TIMEOUT):
        answer = await client.request_frame(frame)
    assert answer["id"] == frame["id"], answer
    return answer


def _refused_at(answer: dict[str, Any], path: str) -> None:
    assert answer["type"] == "error", answer
    assert (answer["code"], answer["details"].get("path")) == ("validation_failed", path), answer


async def _drain(client: Client, until: str) -> list[dict[str, Any]]:
    """Every event up to the ``message`` event whose content is ``until``."""
    return await client.events_until(
        lambda e: e["type"] == "message" and e["message"]["content"] == until, timeout=TIMEOUT
    )


async def test_a_nul_in_content_is_refused_and_nothing_is_stored_pushed_or_woken(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path) as world:
        alice, bob = await world.members("alice", "bob")
        bot = await world.member("pubbot", MemberType.AGENT)
        async with (
            world.client(alice) as a,
            world.client(bob) as b,
            world.client(bot, kind="daemon") as agent,
        ):
            await make_channel(a, "general", b, agent)
            probe = "harmless\u0000 secret tail @pubbot"
            answer = await _answer(
                a, "send", target="#general", content=probe, clientMessageId="probe-1"
            )
            _refused_at(answer, "$.content")
            edit_base = await a.send("#general", "plain")
            _refused_at(
                await _answer(a, "edit", messageId=edit_base["messageId"], content=probe),
                "$.content",
            )

            # The next thing bob sees and the agent is woken by is what follows.
            await a.send("#general", "after @pubbot")
            events = await _drain(b, "after @pubbot")
            contents = [e["message"]["content"] for e in events if e["type"] == "message"]
            assert contents == ["plain", "after @pubbot"]
            assert not [e for e in events if e["type"] == "messageUpdated"]
            wakes = await agent.events_until(
                lambda e: e["type"] == "deliver" and e["message"]["content"] == "after @pubbot",
                timeout=TIMEOUT,
            )
            woken_by = [e["message"]["content"] for e in wakes if e["type"] == "deliver"]
            assert set(woken_by) <= {"plain", "after @pubbot"}, woken_by
            assert not [e for e in wakes if "secret" in json.dumps(e)]

            page = await b.history("#general")
            assert [m["content"] for m in page["messages"]] == ["plain", "after @pubbot"]
            assert (await b.search("secret tail"))["hits"] == []
            assert (await b.search("harmless"))["hits"] == []
            # The same client message id is still free: nothing was recorded under it.
            again = await a.send("#general", "harmless", clientMessageId="probe-1")
            assert again["state"] == "sent"
            assert page["latestSeq"] == 2
            assert again["acceptedSeq"] == 3


async def test_the_inputs_that_ended_in_internal_are_validation_failed(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path) as world:
        alice, bob = await world.members("alice", "bob")
        async with world.client(alice) as a:
            scope_id = await make_channel(a, "general")
            for i in range(3):
                await a.send("#general", f"cursor word {i}")

            # A cursor whose rank a real cannot hold.
            page = await a.search("cursor", sort="relevance", limit=1)
            assert page["hasMore"]
            body = json.loads(base64.urlsafe_b64decode(page["nextCursor"] + "=="))
            for rank in (1e308, -1e308, 10**400):
                body["k"][0] = rank
                raw = json.dumps(body).encode()
                forged = base64.urlsafe_b64encode(raw).decode().rstrip("=")
                answer = await _answer(
                    a, "search", query="cursor", sort="relevance", limit=1, cursor=forged
                )
                _refused_at(answer, "$.cursor")

            # A NUL in a channel's name.
            answer = await _answer(a, "createChannel", slug="nul", name="gen\u0000eral")
            _refused_at(answer, "$.name")
            assert "U+0000" in answer["message"]

            # A grant that expired before it was made, or has no offset.
            past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
            for expires_at in (past, "2020-01-01T00:00:00Z", "2999-01-01T00:00:00"):
                answer = await _answer(
                    a, "grant", scopeId=scope_id, granteeMemberId=bob.id, expiresAt=expires_at
                )
                _refused_at(answer, "$.expiresAt")
            future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
            answer = await _answer(
                a, "grant", scopeId=scope_id, granteeMemberId=bob.id, expiresAt=future
            )
            assert answer["type"] == "reply", answer

            channels = (await a.request("channels"))["channels"]
            assert [c["slug"] for c in channels] == ["general"]
        assert world.node.services.metrics.render()  # the node is still serving


async def test_every_control_and_format_character_through_every_op(
    database_url: str, tmp_path: Path
) -> None:
    """Each of the ~230 characters, in the middle of text, through every op
    that takes text; each answer is what the rule says, and everything accepted
    reads the same live, in history, in search and on resume."""
    async with running_world(database_url, tmp_path) as world:
        people = await world.members("alice", "carol", "bob")
        async with (
            world.client(people[0]) as alice,
            world.client(people[1]) as carol,
            world.client(people[2]) as bob,
        ):
            authors = [alice, carol]
            scope_id = await make_channel(alice, "sweep", carol, bob)
            base = [(await author.send("#sweep", "base"))["messageId"] for author in authors]
            sweep = _Sweep(authors, base)
            async with trio.open_nursery() as nursery:
                for n in range(len(authors)):
                    nursery.start_soon(sweep.run, n)
            await _check_channels(alice, sweep)

            # Everything accepted, four ways.
            await alice.send("#sweep", "end of sweep")
            live = await _drain(bob, "end of sweep")
            page = await bob.history("#sweep", limit=200)
            assert not page["hasMore"]
            stored = {m["id"]: m for m in page["messages"] if m["content"] != "end of sweep"}
            expected = {message_id: content for message_id, (content, _) in sweep.final.items()}
            expected.update(dict.fromkeys(base, "base"))
            assert {i: m["content"] for i, m in stored.items()} == expected

            created = {
                e["message"]["id"]: e["message"]["content"] for e in live if e["type"] == "message"
            }
            for message_id, (first, _) in sweep.sent.items():
                assert created[message_id] == first
            updated = {
                e["message"]["id"]: e["message"]["content"]
                for e in live
                if e["type"] == "messageUpdated"
            }
            assert updated == {
                i: content for i, (content, _) in sweep.final.items() if i in sweep.edited
            }
            reactions = {
                (e["messageId"], e["emoji"])
                for e in live
                if e["type"] == "reaction" and e["op"] == "add"
            }
            assert reactions == sweep.reactions
            assert {
                (m["id"], r["emoji"]) for m in stored.values() for r in m["reactions"]
            } == sweep.reactions

            for message_id, (content, index) in sweep.final.items():
                hits = sweep.found[index]
                assert [h["message"]["id"] for h in hits] == [message_id]
                assert hits[0]["message"]["content"] == content

            async with world.client(people[2], resume={scope_id: 0}) as again:
                events = await again.events_until(lambda e: e["type"] == "resumed", timeout=TIMEOUT)
                resumed = {
                    e["message"]["id"]: e["message"] for e in events if e["type"] == "message"
                }
                assert not events[-1]["scopes"][scope_id]["hasMore"]
                assert {i: m["content"] for i, m in resumed.items() if i in stored} == expected
                assert {
                    (i, r["emoji"]) for i, m in resumed.items() for r in m["reactions"]
                } == sweep.reactions
            assert sweep.refused
            assert sweep.accepted


class _Sweep:
    """The characters of :data:`SWEEP`, shared out among the authors."""

    def __init__(self, authors: list[Client], base: list[str]) -> None:
        self.authors = authors
        self.base = base
        self.sent: dict[str, tuple[str, int]] = {}  # message id -> (content, index)
        self.final: dict[str, tuple[str, int]] = {}
        self.edited: set[str] = set()
        self.reactions: set[tuple[str, str]] = set()
        self.found: dict[int, list[dict[str, Any]]] = {}
        self.descriptions: list[str] = []
        self.refused = 0
        self.accepted = 0

    def _expect(self, answer: dict[str, Any], ok: bool, path: str) -> bool:
        if ok:
            assert answer["type"] == "reply", answer
            self.accepted += 1
        else:
            _refused_at(answer, path)
            self.refused += 1
        return ok

    async def run(self, n: int) -> None:
        client = self.authors[n]
        batch: list[str] = []
        # Characters are independent of each other: a few at a time.
        limiter = trio.CapacityLimiter(8)

        async def one(i: int, char: str) -> None:
            async with limiter:
                await self._send_edit_react(client, self.base[n], i, char)
                await self._create_channel(client, i, char, batch)
                await self._search(client, i, char)

        async with trio.open_nursery() as nursery:
            for i, char in enumerate(SWEEP):
                if i % len(self.authors) == n:
                    nursery.start_soon(one, i, char)
        description = "|".join(batch)
        answer = await _answer(
            client, "createChannel", slug=f"batch{n}", name="Batch", description=description
        )
        self._expect(answer, True, "$.description")
        self.descriptions.append(description)

    async def _create_channel(self, client: Client, i: int, char: str, batch: list[str]) -> None:
        name = f"n{i}{char}x"
        answer = await _answer(client, "createChannel", slug=f"n{i:03d}", name=name)
        assert not self._expect(answer, text_problem(name, TextKind.NAME) is None, "$.name")
        description = f"a{char}b"
        if text_problem(description, TextKind.CONTENT) is None:
            # Accepted ones make one channel per author, checked in _check_channels.
            batch.append(description)
            return
        answer = await _answer(
            client, "createChannel", slug=f"d{i:03d}", name="D", description=description
        )
        self._expect(answer, False, "$.description")

    async def _search(self, client: Client, i: int, char: str) -> None:
        query = f"zqw{i:03d} a{char}b"
        answer = await _answer(client, "search", query=query, limit=5)
        if self._expect(answer, text_problem(query, TextKind.TERM) is None, "$.query"):
            self.found[i] = answer["result"]["hits"]

    async def _send_edit_react(self, client: Client, base: str, i: int, char: str) -> None:
        content = f"zqw{i:03d} a{char}b"
        answer = await _answer(
            client, "send", target="#sweep", content=content, clientMessageId=f"s{i}"
        )
        if self._expect(answer, text_problem(content, TextKind.CONTENT) is None, "$.content"):
            message_id = answer["result"]["messageId"]
            self.sent[message_id] = self.final[message_id] = (content, i)
        else:
            message_id = base
        edited = f"zqw{i:03d} edited a{char}b"
        answer = await _answer(client, "edit", messageId=message_id, content=edited)
        if self._expect(answer, text_problem(edited, TextKind.CONTENT) is None, "$.content"):
            self.final[message_id] = (edited, i)
            self.edited.add(message_id)
        for emoji in (char, f"\U0001f44d{char}\U0001f44d", f"\U0001f3f4{char}\U000e007f"):
            ok = text_problem(emoji, TextKind.EMOJI) is None and reaction_emoji_error(emoji) is None
            answer = await _answer(client, "react", messageId=message_id, emoji=emoji)
            if self._expect(answer, ok, "$.emoji"):
                self.reactions.add((message_id, emoji))


async def _check_channels(client: Client, sweep: _Sweep) -> None:
    channels = (await client.request("channels"))["channels"]
    by_slug = {c["slug"]: c for c in channels}
    assert sorted(by_slug) == sorted(["sweep", *(f"batch{n}" for n in range(len(sweep.authors)))])
    assert sorted(by_slug[f"batch{n}"]["description"] for n in range(len(sweep.authors))) == sorted(
        sweep.descriptions
    )
