"""Protocol fuzzing over one live session (hypothesis).

Frames are JSON objects built from the real field names and types of the
client frames in :mod:`protocol.frames` (read with ``msgspec.inspect``), with
wrong types, missing and unknown fields, unknown ops, ids of every JSON shape
(ints far beyond 64 bits, strings, null, floats, nested), huge numbers,
unicode, and non-objects. Batches go to one node process over one WebSocket,
and for every batch:

- every frame whose ``type`` is a request (or ``ping``) and whose ``id`` is an
  int or a string is answered exactly once, by a ``reply``/``error``/``pong``
  carrying that id; every other frame (not an object, unknown or missing
  ``type``, an id that is not an int or a string, ``hello`` again, oversized)
  gets exactly one ``error`` with id null, except a well-formed ``pong``,
  which gets none. Nothing else is answered;
- the session stays open, or is closed only with a code of
  :class:`protocol.errors.CloseCode`;
- the node process's resident memory grows by less than :data:`RSS_BOUND`
  over the whole run (measured from ``/proc/<pid>/status`` after a warm-up).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import msgspec.inspect as mi
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.model import MemberType
from bench.nodeproc import open_node
from node.client import Client, ConnectionClosed, open_client
from node.config import Settings
from protocol.codec import decode_client_frame
from protocol.errors import CloseCode, FrameError
from protocol.frames import CLIENT_FRAME_TYPES, ClientFrame
from storage import directory
from storage.pg import connect

MAX_EXAMPLES = 100  # batches of MIN_BATCH..BATCH frames
MIN_BATCH, BATCH = 5, 30
REPLAYS = 2  # every generated batch is sent again (fresh ids): a few thousand frames in all
# Hypothesis versions differ in how many distinct batches 100 examples yield
# (newer ones skip duplicates): replay more, bounded, until this many went out.
MIN_FRAMES, MAX_REPLAYS = 3000, 8
ANSWER_TIMEOUT = 30.0
RSS_BOUND = 16 * 1024 * 1024  # node RSS growth allowed over the run (observed: < 1 MiB)
MAX_FRAME_BYTES = Settings().max_frame_bytes
DOCUMENTED_CLOSE_CODES = frozenset(int(code) for code in CloseCode)
# What the client library reports when the connection ended before it read a
# close frame: a batch pipelined behind a frame that closes the session sees
# this now and then, as the node drops the socket once its close frame is out.
# The next batch, on a new session, must still be answered in full.
ABNORMAL_CLOSURE = 1006
ANSWER_TYPES = frozenset({"reply", "error", "pong"})

_encoder = msgspec.json.Encoder()

# ---------------------------------------------------------------- strategies

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=6,
)
request_ids: st.SearchStrategy[Any] = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.text(max_size=24),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _typed(t: mi.Type, known: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Values of the wire type ``t`` (mostly inside its constraints, sometimes not)."""
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else None)
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else None)
        return st.integers(min_value=low, max_value=high) | st.integers(
            min_value=-(2**70), max_value=2**70
        )
    if isinstance(t, mi.StrType):
        if t.pattern is not None:
            return st.from_regex(t.pattern, fullmatch=True) | st.text(max_size=20)
        high = min(t.max_length or 60, 60)
        return st.text(min_size=t.min_length or 0, max_size=high) | known
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.UnionType):
        return st.one_of(*(_typed(member, known) for member in t.types))
    if isinstance(t, mi.ListType):
        return st.lists(_typed(t.item_type, known), max_size=min(t.max_length or 4, 4))
    if isinstance(t, mi.DictType):
        return st.dictionaries(_typed(t.key_type, known), _typed(t.value_type, known), max_size=3)
    if isinstance(t, mi.StructType):
        return _object(t, known)
    if isinstance(t, mi.DateTimeType):
        return st.datetimes().map(lambda d: d.isoformat() + "Z") | st.text(max_size=10)
    return json_values


def _field(t: mi.Type, known: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """A field's value: usually typed, sometimes any JSON (a wrong type)."""
    return st.one_of(_typed(t, known), _typed(t, known), _typed(t, known), json_values)


_MISSING = object()


def _object(t: mi.StructType, known: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with the struct's fields (each sometimes left out) and stray fields."""
    fields = {
        f.encode_name: st.one_of(_field(f.type, known), st.just(_MISSING))
        if f.required
        else st.one_of(_field(f.type, known), st.just(_MISSING), st.just(_MISSING))
        for f in t.fields
        if f.encode_name != "id"
    }
    extras = st.dictionaries(st.text(max_size=10), json_values, max_size=2)

    def build(values: dict[str, Any], stray: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in stray.items() if k not in values}
        out.update({k: v for k, v in values.items() if v is not _MISSING})
        return out

    return st.builds(build, st.fixed_dictionaries(fields), extras)


def frames(known: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """One client frame: a real frame type filled in, an unknown op, or not an object."""
    per_type = []
    for cls in ClientFrame.__args__:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        assert isinstance(info.tag, str)
        has_id = any(f.encode_name == "id" for f in info.fields)
        body = _object(info, known)
        ids = (
            st.one_of(request_ids, request_ids, st.just(_MISSING)) if has_id else st.just(_MISSING)
        )
        per_type.append(st.builds(_with(info.tag), body, ids))
    unknown_op = st.builds(
        _with_type,
        st.one_of(st.text(max_size=16), json_values, st.sampled_from(["Send", "SEND", "", "type"])),
        st.dictionaries(st.text(max_size=10), json_values, max_size=4),
        st.one_of(request_ids, st.just(_MISSING)),
    )
    not_object = st.one_of(_scalars, st.lists(json_values, max_size=3))
    return st.one_of(*per_type, unknown_op, not_object)


def _with(tag: str) -> Any:
    def build(body: dict[str, Any], request_id: Any) -> dict[str, Any]:
        return _with_type(tag, body, request_id)

    return build


def _with_type(tag: Any, body: dict[str, Any], request_id: Any) -> dict[str, Any]:
    frame = {"type": tag, **{k: v for k, v in body.items() if k not in ("type", "id")}}
    if request_id is not _MISSING:
        frame["id"] = request_id
    return frame


# ---------------------------------------------------------------- the session


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _key(value: Any) -> bytes:
    return _encoder.encode(value)


class Fuzzer:
    """Sends batches over the current session and checks every answer."""

    def __init__(self, url: str, token: str, nursery: trio.Nursery) -> None:
        self.url = url
        self.token = token
        self.nursery = nursery
        self.client: Client | None = None
        self.used: set[bytes] = set()
        self.fresh = itertools.count(1)
        self.frames_sent = 0
        self.closes: list[int | None] = []
        self.batches: list[list[Any]] = []
        self._reconnect = trio.Event()

    async def keep_session(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Hold one session open; open a new one after the node closed it."""
        first = True
        while True:
            async with open_client(self.url, self.token, max_pending_events=math.inf) as client:
                self.client = client
                self._reconnect = trio.Event()
                if first:
                    task_status.started()
                    first = False
                await self._reconnect.wait()

    async def _renew(self, closed: ConnectionClosed) -> None:
        assert closed.code in DOCUMENTED_CLOSE_CODES | {ABNORMAL_CLOSURE}, (
            f"session closed with {closed.code}"
        )
        self.closes.append(closed.code)
        old = self.client
        self._reconnect.set()
        with trio.fail_after(10):
            while self.client is old:
                await trio.sleep(0.01)

    def _unique(self, request_id: Any) -> Any:
        """A valid id never used before in this run (answers are counted per id)."""
        if _valid_id(request_id) and _key(request_id) in self.used:
            n = next(self.fresh)
            request_id = (
                f"{request_id}~{n}" if isinstance(request_id, str) else request_id * 7 + n * 10**25
            )
        if _valid_id(request_id):
            self.used.add(_key(request_id))
        return request_id

    async def exchange(self, batch: list[Any]) -> None:
        """Send one batch; every answer arrives exactly once and nothing else is answered."""
        expected: Counter[bytes] = Counter()
        maybe: set[bytes] = set()  # hello ids: answered with that id, or with null
        nulls = hellos = 0
        texts = []
        for frame in batch:
            if isinstance(frame, dict) and "id" in frame:
                frame["id"] = self._unique(frame["id"])
            text = _encoder.encode(frame).decode()
            texts.append(text)
            request_id = frame.get("id") if isinstance(frame, dict) else None
            kind = frame.get("type") if isinstance(frame, dict) else None
            if (
                len(text.encode()) > MAX_FRAME_BYTES
                or not isinstance(kind, str)
                or kind not in CLIENT_FRAME_TYPES
            ):
                nulls += 1
            elif kind == "hello":
                hellos += 1
                if _valid_id(request_id):
                    maybe.add(_key(request_id))
            elif kind == "pong":
                if not _valid_id(request_id):
                    nulls += 1
            elif _valid_id(request_id):
                expected[_key(request_id)] += 1
            else:
                nulls += 1
        client = self.client
        assert client is not None
        total = sum(expected.values()) + nulls + hellos
        got: Counter[bytes] = Counter()
        try:
            for text in texts:
                await client.send_raw(text)
                self.frames_sent += 1
            with trio.fail_after(ANSWER_TIMEOUT):
                while sum(got.values()) < total:
                    event = await client.next_event()
                    if event.get("type") in ANSWER_TYPES:
                        got[_key(event.get("id"))] += 1
        except ConnectionClosed as closed:
            await self._renew(closed)  # a documented close: nothing more to check here
            return
        except trio.TooSlowError:
            raise AssertionError(
                f"{sum(got.values())} of {total} answers within {ANSWER_TIMEOUT}s for {texts!r}"
            ) from None
        null = _key(None)
        hello_ids = sum(got[k] for k in maybe)
        assert got[null] == nulls + hellos - hello_ids, (got, nulls, hellos, texts)
        for key in set(got) | set(expected):
            if key == null:
                continue
            if key in maybe:
                assert got[key] <= 1, (key, got[key], texts)
                continue
            assert got[key] == expected[key], (key.decode(), got[key], expected[key], texts)

    async def quiet(self) -> None:
        """Nothing answered beyond what was asked: a last ping's pong is the next answer."""
        client = self.client
        assert client is not None
        sentinel = f"sentinel-{next(self.fresh)}"
        await client.send_raw(_encoder.encode({"type": "ping", "id": sentinel}).decode())
        with trio.fail_after(ANSWER_TIMEOUT):
            while True:
                event = await client.next_event()
                if event.get("type") in ANSWER_TYPES:
                    assert event == {"type": "pong", "id": sentinel}, event
                    return


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _provision(database_url: str) -> tuple[str, str, dict[str, str]]:
    async with await connect(database_url, autocommit=True) as conn:
        workspace = await directory.create_workspace(conn, "fuzz")
        member = await directory.create_member(
            conn, workspace_id=workspace, type_=MemberType.HUMAN, handle="fuzzer"
        )
        other = await directory.create_member(
            conn, workspace_id=workspace, type_=MemberType.HUMAN, handle="other"
        )
        token = await directory.issue_token(conn, member.id)
    return workspace, token, {"member": member.id, "other": other.id}


def test_deep_nesting_is_a_bad_frame() -> None:
    """msgspec refuses deep nesting with RecursionError: the codec turns it into bad_frame."""
    for text in (
        '{"type":"ping","id":1,"x":' + "[" * 5000 + "]" * 5000 + "}",
        '{"type":"send","id":' + '{"a":' * 5000 + "1" + "}" * 5000 + "}",
    ):
        with pytest.raises(FrameError) as raised:
            decode_client_frame(text)
        assert raised.value.code == "bad_frame"
        assert raised.value.request_id is None


async def test_protocol_fuzz(database_url: str, tmp_path: Path) -> None:
    async with open_node(None, data_dir=str(tmp_path / "data"), database_url=database_url) as node:
        assert node.pid is not None
        workspace, token, ids = await _provision(database_url)
        url = f"{node.base_url}/v1/ws?workspace={quote(workspace)}"
        async with trio.open_nursery() as nursery:
            fuzzer = Fuzzer(url, token, nursery)
            await nursery.start(fuzzer.keep_session)
            assert fuzzer.client is not None
            channel = await fuzzer.client.request("createChannel", slug="general", name="General")
            sent = await fuzzer.client.send("#general", "hello")
            known = st.sampled_from(
                [
                    channel["scopeId"],
                    ids["member"],
                    ids["other"],
                    sent["messageId"],
                    "#general",
                    f"#general:{sent['messageId']}",
                    f"dm:{ids['other']}",
                    f"scope:{channel['scopeId']}",
                    "general",
                ]
            )
            batches = st.lists(frames(known), min_size=MIN_BATCH, max_size=BATCH)

            # Warm-up: every frame type once, well formed, and the edge cases.
            warm: list[Any] = [{"type": t, "id": f"warm-{t}"} for t in sorted(CLIENT_FRAME_TYPES)]
            warm += [
                "[" * 5000 + "]" * 5000,
                {
                    "type": "ping",
                    "id": 1,
                    "x": [[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]],
                },
                {
                    "type": "send",
                    "id": 2**200,
                    "target": "#general",
                    "content": "big id",
                    "clientMessageId": "big",
                },
                {"type": "history", "id": "\U0001f600\u202e\x00", "target": "#general"},
                {"type": "ping", "id": "x" * (MAX_FRAME_BYTES + 1)},
            ]
            await fuzzer.exchange(warm)
            await fuzzer.exchange(["[" * 100_000 + "]" * 100_000])  # RecursionError in msgspec
            before = rss_bytes(node.pid)

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(batches)
            def fuzz(batch: list[Any]) -> None:
                fuzzer.batches.append(batch)
                trio.from_thread.run(fuzzer.exchange, batch)

            await trio.to_thread.run_sync(fuzz)
            # Generating is the slow part: send them all again.
            for replay in range(MAX_REPLAYS):
                if replay >= REPLAYS and fuzzer.frames_sent >= MIN_FRAMES:
                    break
                for batch in list(fuzzer.batches):
                    await fuzzer.exchange(batch)
            await fuzzer.quiet()
            after = rss_bytes(node.pid)
            nursery.cancel_scope.cancel()
    assert fuzzer.frames_sent > 2000, fuzzer.frames_sent
    assert after - before < RSS_BOUND, (
        f"node RSS grew {(after - before) / 2**20:.1f} MiB over {fuzzer.frames_sent} frames"
    )
    print(
        f"fuzz: {fuzzer.frames_sent} frames, node RSS {before / 2**20:.1f} -> "
        f"{after / 2**20:.1f} MiB, documented closes {fuzzer.closes}"
    )
