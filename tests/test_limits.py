"""Rate limits per member and per workspace, and the per-member session cap.

The buckets alone, the node's table of them, then over real WebSockets: over
a bucket the request is answered ``rate_limited`` with
``details.retryAfterMs``, is not executed, and the session stays open; after
the advertised wait it works again. A member's sessions share its buckets;
another member's are its own. One hello too many for a member gets an
``error`` ``rate_limited`` with id null, then close 4429.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Request, TextMessage

from node.client import Client
from node.limits import (
    MEMBERS_LIMITED,
    Kind,
    Limiter,
    Rate,
    Rates,
    TokenBucket,
    retry_after_ms,
)
from tests.nodes import RunningNode, make_channel, running_world

TIMEOUT = 10.0
_ids = itertools.count(10_000)


# ------------------------------------------------------------------ the bucket


def test_bucket_spends_its_burst_then_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(0.5)
    assert bucket.take(100.25) == pytest.approx(0.25)  # half a token came back
    assert bucket.take(100.5) == 0.0
    # A long idle period refills only up to the burst.
    assert [bucket.take(1000.0) for _ in range(4)][-1] == pytest.approx(0.5)


def test_looking_at_a_bucket_refills_it_and_takes_nothing() -> None:
    bucket = TokenBucket(rate=4.0, burst=2, now=0.0)
    assert bucket.take(0.0) == 0.0
    assert bucket.take(0.0) == 0.0
    assert bucket.wait(0.125) == pytest.approx(0.125)  # half a token is back
    assert bucket.wait(0.25) == 0.0
    assert bucket.wait(0.25) == 0.0  # still there: waiting took nothing
    assert bucket.take(0.25) == 0.0
    assert bucket.wait(0.25) == pytest.approx(0.25)


# ------------------------------------------------------------------ the node's table


Six = tuple[float, int, float, int, float, int]  # send, request, read: rate and burst


def _limiter(
    member: Six = (1, 2, 1, 3, 1, 2), workspace: Six = (100, 100, 100, 100, 100, 100)
) -> Limiter:
    def rates(values: Six) -> Rates:
        send, request, read = (Rate(values[i], int(values[i + 1])) for i in (0, 2, 4))
        return Rates(send=send, request=request, read=read)

    return Limiter(rates(member), rates(workspace), reads_at_once=2)


def _admitted(limiter: Limiter, kind: Kind, member: str, count: int, now: float = 0.0) -> int:
    return sum(limiter.admit(kind, member, "ws", now) is None for _ in range(count))


def test_one_member_has_one_send_bucket_whatever_its_sessions() -> None:
    limiter = _limiter()
    # The session does not appear in the key: every call for ann shares two sends.
    assert _admitted(limiter, Kind.SEND, "ann", 2) == 2
    refusal = limiter.admit(Kind.SEND, "ann", "ws", 0.0)
    assert refusal is not None
    assert (refusal.bucket, refusal.per) == ("send", "member")
    assert refusal.wait == pytest.approx(1.0)
    # Sends and other requests have separate buckets.
    assert _admitted(limiter, Kind.REQUEST, "ann", 1) == 1
    # A second later one send came back.
    assert _admitted(limiter, Kind.SEND, "ann", 3, now=1.0) == 1


def test_another_member_is_not_limited_by_the_first() -> None:
    limiter = _limiter()
    assert _admitted(limiter, Kind.SEND, "ann", 10) == 2
    assert _admitted(limiter, Kind.READ, "ann", 10) == 2
    assert _admitted(limiter, Kind.SEND, "bob", 10) == 2
    assert _admitted(limiter, Kind.READ, "bob", 10) == 2


def test_reads_take_from_the_request_bucket_and_their_own() -> None:
    limiter = _limiter()  # requests: 3, reads: 2
    assert _admitted(limiter, Kind.READ, "ann", 5) == 2
    refusal = limiter.admit(Kind.READ, "ann", "ws", 0.0)
    assert refusal is not None
    assert (refusal.bucket, refusal.per) == ("read", "member")
    # The two reads took two of the three request tokens; refused reads took none.
    assert _admitted(limiter, Kind.REQUEST, "ann", 5) == 1


def test_a_refused_request_takes_no_token_from_any_bucket() -> None:
    limiter = _limiter(member=(1, 5, 1, 5, 1, 5), workspace=(1, 5, 1, 5, 1, 2))
    assert _admitted(limiter, Kind.READ, "ann", 2) == 2
    # The workspace's read bucket is empty: ann's reads are refused...
    refusal = limiter.admit(Kind.READ, "ann", "ws", 0.0)
    assert refusal is not None
    assert (refusal.bucket, refusal.per) == ("read", "workspace")
    for _ in range(10):
        limiter.admit(Kind.READ, "ann", "ws", 0.0)
    # ...and took nothing of her request bucket: three of five are left.
    assert _admitted(limiter, Kind.REQUEST, "ann", 5) == 3


def test_the_workspace_ceiling_binds_its_members_together_and_no_other_workspace() -> None:
    limiter = _limiter(member=(1, 3, 1, 3, 1, 3), workspace=(1, 5, 1, 5, 1, 5))
    assert _admitted(limiter, Kind.SEND, "ann", 10) == 3
    assert _admitted(limiter, Kind.SEND, "bob", 10) == 2  # the workspace's last two
    refusal = limiter.admit(Kind.SEND, "cat", "ws", 0.0)
    assert refusal is not None
    assert (refusal.bucket, refusal.per) == ("send", "workspace")
    assert sum(limiter.admit(Kind.SEND, "dan", "other", 0.0) is None for _ in range(10)) == 3


def test_the_refusal_advertises_the_longest_wait() -> None:
    limiter = _limiter(member=(1, 1, 1, 1, 1, 1), workspace=(0.25, 1, 100, 100, 100, 100))
    assert limiter.admit(Kind.SEND, "ann", "ws", 0.0) is None
    refusal = limiter.admit(Kind.SEND, "ann", "ws", 0.0)
    # The member's token is back after 1 s, the workspace's after 4 s.
    assert refusal is not None
    assert (refusal.bucket, refusal.per) == ("send", "workspace")
    assert refusal.wait == pytest.approx(4.0)
    assert limiter.admit(Kind.SEND, "ann", "ws", 3.9) is not None
    assert limiter.admit(Kind.SEND, "ann", "ws", 4.0) is None
    error = refusal.error()
    assert error.code == "rate_limited"
    assert error.details == {"retryAfterMs": 4000, "bucket": "send", "per": "workspace"}


async def test_a_members_reads_run_two_at_a_time_whatever_its_sessions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = _limiter()
    running: list[str] = []
    most: dict[str, int] = {"ann": 0, "bob": 0}
    done: dict[str, float] = {}

    async def read(member: str) -> None:
        async with limiter.reading(member, trio.current_time()):
            running.append(member)
            most[member] = max(most[member], running.count(member))
            await trio.sleep(1.0)
            running.remove(member)
        done[member] = trio.current_time()

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(read, "ann")  # as from six sessions
        nursery.start_soon(read, "bob")
    # Nobody was refused: ann's reads took three turns of two, bob's did not wait.
    assert most == {"ann": 2, "bob": 1}
    assert (done["ann"] - started, done["bob"] - started) == (3.0, 1.0)
    assert limiter.reading("ann", 0.0) is limiter.reading("ann", 0.0)


def test_the_table_keeps_a_bounded_number_of_members_least_recent_out() -> None:
    limiter = _limiter(workspace=(1e9, 10**9, 1e9, 10**9, 1e9, 10**9))
    assert _admitted(limiter, Kind.SEND, "ann", 2) == 2
    for i in range(MEMBERS_LIMITED + 100):
        limiter.admit(Kind.SEND, f"m{i}", "ws", 0.0)
    assert len(limiter._members) == MEMBERS_LIMITED
    # ann was the least recently seen and is forgotten: full buckets again.
    assert _admitted(limiter, Kind.SEND, "ann", 5) == 2


def test_refused_callers_get_one_turn_each_at_most_a_bucketful_ahead() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    for _ in range(3):
        bucket.take(0.0)
    waits = [bucket.turn(0.0, bucket.wait(0.0)) for _ in range(5)]
    assert waits == pytest.approx([0.5, 1.0, 1.5, 1.5, 1.5])
    # The first turn comes: its caller finds a token, whatever came before.
    assert bucket.take(0.5) == 0.0
    # A caller refused later queues after the turns already promised.
    assert bucket.turn(0.6, bucket.wait(0.6)) == pytest.approx(1.5 - 0.6 + 0.5)
    # Turns long past are forgotten: the next token is the next turn again.
    for _ in range(3):
        bucket.take(10.0)
    assert bucket.turn(10.0, bucket.wait(10.0)) == pytest.approx(0.5)


def test_retry_after_is_rounded_up_to_whole_milliseconds() -> None:
    assert retry_after_ms(0.0004) == 1
    assert retry_after_ms(0.25) == 250
    assert retry_after_ms(0.2501) == 251


# ------------------------------------------------------------------ helpers


async def _answers(client: Client, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every frame back to back (no waiting in between) and collect the answers."""
    answers: list[dict[str, Any]] = [{} for _ in frames]

    async def one(index: int, frame: dict[str, Any]) -> None:
        answers[index] = await client.request_frame(frame)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for index, frame in enumerate(frames):
                nursery.start_soon(one, index, frame)
                await trio.lowlevel.checkpoint()
    return answers


def _limited(answers: list[dict[str, Any]], token_ms: int = 1000) -> list[dict[str, Any]]:
    """The refusals among ``answers`` (``token_ms``: a token comes back that often)."""
    limited = [a for a in answers if a.get("type") == "error"]
    for answer in limited:
        assert answer["code"] == "rate_limited", answer
        assert answer["retryable"] is True
        assert isinstance(answer["details"]["retryAfterMs"], int), answer
    if limited:
        # Each refused request is given a turn of its own: the next token, the
        # one after, and so on.
        retries = sorted(a["details"]["retryAfterMs"] for a in limited)
        assert len(set(retries)) == len(retries), retries
        assert 0 < retries[0] <= token_ms, retries
        assert retries[-1] <= len(retries) * token_ms + 1, retries
    return limited


def _send_frame(target: str, content: str) -> dict[str, Any]:
    return {
        "type": "send",
        "id": next(_ids),
        "target": target,
        "content": content,
        "clientMessageId": f"c-{content}",
    }


async def _wait_turn(answers: list[dict[str, Any]]) -> None:
    """Until the first of the refused requests' turns."""
    await trio.sleep(min(a["details"]["retryAfterMs"] for a in answers) / 1000 + 0.05)


# ------------------------------------------------------------------ sends


async def test_a_burst_over_the_send_bucket_is_refused_and_not_stored(
    database_url: str, tmp_path: Path
) -> None:
    # A token every 5 s: none comes back before the first turn, though a
    # refused session is not read for up to a second after each refusal.
    async with running_world(database_url, tmp_path, send_rate=0.2, send_burst=5) as world:
        ann = await world.member("ann")
        async with world.client(ann) as client:
            scope_id = await make_channel(client, "burst")
            frames = [_send_frame("#burst", f"m{i}") for i in range(8)]
            answers = await _answers(client, frames)
            accepted = [
                f["content"] for f, a in zip(frames, answers, strict=True) if a["type"] == "reply"
            ]
            limited = _limited(answers, token_ms=5000)
            assert (len(accepted), len(limited)) == (5, 3), answers
            # Only the accepted sends were stored.
            page = await client.history("#burst", limit=50)
            assert sorted(m["content"] for m in page["messages"]) == sorted(accepted)
            # The session stayed open: other requests and pings still work now...
            await client.request("members", scopeId=scope_id)
            # ...and at the first turn a send is accepted again.
            await _wait_turn(limited)
            reply = await client.send("#burst", "after the wait")
            assert reply["state"] == "sent"
            page = await client.history("#burst", limit=50)
            assert len(page["messages"]) == 6
        assert world.node.services.metrics.errors["rate_limited"] == 3


# ------------------------------------------------------------------ other requests


async def test_a_burst_over_the_request_bucket_is_refused_and_pings_are_free(
    database_url: str, tmp_path: Path
) -> None:
    # A token every 5 s: none comes back while this test runs, though a
    # refused session is not read for up to a second after each refusal.
    async with running_world(database_url, tmp_path, request_rate=0.2, request_burst=6) as world:
        ann, bob = await world.members("ann", "bob")
        async with world.client(ann) as client:
            await make_channel(client, "asks")  # one request token
            frames = [
                {"type": "history", "id": next(_ids), "target": "#asks", "limit": 10}
                for _ in range(8)
            ]
            answers = await _answers(client, frames)
            ghost = {"type": "createChannel", "id": next(_ids), "slug": "ghost", "name": "Ghost"}
            answers.append(await client.request_frame(ghost))
            limited = _limited(answers, token_ms=5000)
            assert len(limited) == 4, answers
            assert len([a for a in answers if a.get("type") == "reply"]) == 5
            assert answers[-1]["type"] == "error", answers[-1]
            # Pings are not counted; sends have their own bucket.
            pongs = await _answers(client, [{"type": "ping", "id": next(_ids)} for _ in range(20)])
            assert all(p["type"] == "pong" for p in pongs), pongs
            assert (await client.send("#asks", "sends are separate"))["state"] == "sent"
            # A refused request is not executed: there is no channel #ghost
            # (bob asks, with buckets of his own).
            async with world.client(bob) as other:
                listed = await other.request("channels")
            assert [c["slug"] for c in listed["channels"]] == ["asks"]


# ------------------------------------------------------------------ shared by a member


async def test_two_sessions_of_a_member_share_its_bucket_and_another_member_has_its_own(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path, send_rate=0.1, send_burst=6) as world:
        ann, bob = await world.members("ann", "bob")
        async with world.client(ann) as first, world.client(ann) as second:
            scope_id = await make_channel(first, "shared")
            frames = [_send_frame("#shared", f"a{i}") for i in range(8)]
            answers = await _answers(first, frames[:4])
            answers += await _answers(second, frames[4:])
            # Six tokens for ann, however many sessions she opens; one comes
            # back every 10 s, more than this test takes.
            limited = _limited(answers, token_ms=10_000)
            assert len(limited) == 2, answers
            assert {(a["details"]["bucket"], a["details"]["per"]) for a in limited} == {
                ("send", "member")
            }
            # bob, in the same channel, sends his own six while ann is out of tokens.
            async with world.client(bob) as other:
                await other.request("join", scopeId=scope_id)
                mine = [_send_frame("#shared", f"b{i}") for i in range(6)]
                assert all(a["type"] == "reply" for a in await _answers(other, mine))
            refused = await second.request_frame(_send_frame("#shared", "still ann"))
            assert refused["type"] == "error", refused
            assert refused["code"] == "rate_limited", refused


async def test_searches_and_history_have_a_smaller_bucket_of_their_own(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path, read_rate=0.1, read_burst=3) as world:
        ann = await world.member("ann")
        async with world.client(ann) as client, world.client(ann) as again:
            scope_id = await make_channel(client, "reads")
            frames = [
                {"type": "search", "id": next(_ids), "query": "hello"},
                {"type": "history", "id": next(_ids), "target": "#reads"},
                {"type": "search", "id": next(_ids), "query": "again"},
                {"type": "history", "id": next(_ids), "target": "#reads"},
            ]
            answers = await _answers(client, frames)
            limited = _limited(answers, token_ms=10_000)
            assert len(limited) == 1, answers
            assert limited[0]["details"]["bucket"] == "read"
            # The other session of the same member finds the read bucket empty too...
            refused = await again.request_frame(
                {"type": "history", "id": next(_ids), "target": "#reads"}
            )
            assert refused["type"] == "error", refused
            assert refused["details"]["bucket"] == "read"
            # ...while other requests and sends go on.
            await again.request("members", scopeId=scope_id)
            assert (await again.send("#reads", "reads are separate"))["state"] == "sent"


async def test_a_refused_session_is_not_read_until_its_turn(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path, send_rate=2.0, send_burst=1) as world:
        ann = await world.member("ann")
        async with world.client(ann) as client:
            await make_channel(client, "pause")
            assert (await client.send("#pause", "one"))["state"] == "sent"
            refused = await client.request_frame(_send_frame("#pause", "two"))
            refused_at = trio.current_time()
            (turn,) = _limited([refused], token_ms=500)
            # Asked again at once: the node reads it only at the turn, and then
            # a token is there.
            again = await client.request_frame(_send_frame("#pause", "two"))
            assert again["type"] == "reply", again
            waited = trio.current_time() - refused_at
            assert waited >= turn["details"]["retryAfterMs"] / 1000 - 0.05, waited
        assert world.node.services.metrics.errors["rate_limited"] == 1


# ------------------------------------------------------------------ sessions per member


async def _hello_frames(node: RunningNode, token: str) -> tuple[list[dict[str, Any]], int | None]:
    """Open a WebSocket by hand, say hello; the frames received and the close code."""
    ws = WSConnection(ConnectionType.CLIENT)
    hello = {
        "type": "hello",
        "token": token,
        "client": {"kind": "browser", "name": "t", "version": "1"},
    }
    received: list[dict[str, Any]] = []
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", node.services.port)
        async with stream:
            await stream.send_all(ws.send(Request(host="127.0.0.1", target="/v1/ws")))
            while data := await stream.receive_some(65536):
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        text = msgspec.json.encode(hello).decode()
                        await stream.send_all(ws.send(Message(data=text)))
                    elif isinstance(event, TextMessage):
                        received += [msgspec.json.decode(line) for line in event.data.splitlines()]
                    elif isinstance(event, CloseConnection):
                        await stream.send_all(ws.send(event.response()))
                        return received, event.code
    return received, None


async def test_one_session_over_the_cap_gets_rate_limited_then_4429(
    database_url: str, tmp_path: Path
) -> None:
    async with running_world(database_url, tmp_path, max_sessions_per_member=2) as world:
        ann, bob = await world.members("ann", "bob")
        async with world.client(ann) as first, world.client(ann):
            frames, code = await _hello_frames(world.node, ann.token)
            assert code == 4429
            assert frames == [
                {
                    "type": "error",
                    "id": None,
                    "code": "rate_limited",
                    "message": "too many sessions for this member",
                    "retryable": True,
                    "details": {"maxSessions": 2},
                }
            ]
            # Other members are not affected, and the two sessions still work.
            async with world.client(bob) as other:
                assert other.member_id == bob.id
            await first.request("ping")
        # Once ann's sessions are gone she may connect again.
        with trio.fail_after(TIMEOUT):
            while world.node.services.hub.sessions_of(ann.id):
                await trio.sleep(0.02)
        async with world.client(ann) as again:
            assert again.member_id == ann.id
