"""Revocation bites: a revoked token's live sessions close with 4401 within a second.

The revoking process (``scopenode admin revoke-token``, or anything calling
``storage.directory.revoke_token``) never talks to the node; the node hears
it from PostgreSQL. Also: a hello with a revoked token is refused, a hello
racing a revocation is refused when it registers, a revocation the listener
missed is found by its re-check, and ``Hub.stop_scope_events`` stops a
member's events of one scope at once.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import trio

from node import revocation
from node.client import ConnectionClosed, open_client
from node.hub import Hub
from storage import directory
from storage.pg import connect
from tests.nodes import World, make_channel, running_node
from tests.test_cli import admin

CLOSE_WITHIN = 1.0


async def test_cli_revoke_token_closes_live_sessions_with_4401_within_a_second(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as first, world.client(ann) as second:
            # A second token of the same member is a different credential.
            async with await connect(database_url, autocommit=True) as conn:
                other_token = await directory.issue_token(conn, ann.id)
            url = f"{node.url}?workspace={world.workspace_id}"
            async with open_client(url, other_token) as untouched:
                result = await admin(database_url, "revoke-token", "--token", ann.token)
                assert result.json() == {"revoked": True}
                revoked_at = trio.current_time()
                assert await first.wait_closed(CLOSE_WITHIN) == 4401
                assert await second.wait_closed(CLOSE_WITHIN) == 4401
                assert trio.current_time() - revoked_at < CLOSE_WITHIN
                assert (await untouched.request("ping")) == {}
        # A new hello with the revoked token is refused.
        with pytest.raises(ConnectionClosed) as refused:
            async with world.client(ann):
                pass
        assert refused.value.code == 4401


async def test_storage_revoke_closes_the_session_and_the_member_can_sign_in_again(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as client, world.client(bob) as bystander:
            async with await connect(database_url, autocommit=True) as conn:
                assert await directory.revoke_token(conn, ann.token)
                assert not await directory.revoke_token(conn, ann.token)  # already revoked
                fresh = await directory.issue_token(conn, ann.id)
            assert await client.wait_closed(CLOSE_WITHIN) == 4401
            assert bystander.close_code is None
            async with open_client(f"{node.url}?workspace={world.workspace_id}", fresh) as again:
                assert again.member_id == ann.id
        assert not node.services.hub.credential_ids()


async def test_a_revocation_the_listener_missed_is_found_by_the_recheck(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(revocation, "RECHECK_INTERVAL", 0.2)
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        async with world.client(ann) as client:
            # Revoked behind the node's back: no notification is sent.
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE credentials SET revoked_at = now() WHERE member_id = %s", (ann.id,)
                )
            assert await client.wait_closed(CLOSE_WITHIN) == 4401


class _FakeSession:
    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.is_daemon = False
        self.closed: list[int] = []

    def deliver_events(self, scope_id: str, events: list[tuple[int, bytes]]) -> None: ...

    def push(self, payload: bytes) -> None: ...

    def push_frame(self, framed: bytes) -> None: ...

    def push_wake(self, delivery_id: str, framed: bytes) -> None: ...

    def close(self, code: int, reason: str) -> None:
        self.closed.append(code)

    def mute_scope(self, scope_id: str, muted: bool) -> None: ...

    def is_muted(self, scope_id: str) -> bool:
        return False

    def release_held(self) -> None: ...


def test_a_hello_that_authenticated_before_the_revocation_is_refused_when_it_registers() -> None:
    hub = Hub(lambda keys: None)
    live, late = _FakeSession("mem_a"), _FakeSession("mem_a")
    assert hub.add(live, 7)
    assert hub.close_credential_sessions(7) == 1
    assert live.closed == [4401]
    assert not hub.add(late, 7)
    assert not hub.sessions_of("mem_a") - {live}
    assert hub.add(_FakeSession("mem_a"), 8)


async def test_stop_scope_events_mutes_one_scope_for_one_member_until_allowed(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann, bob = await world.member("ann"), await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            muted = await make_channel(a, "muted", b)
            other = await make_channel(a, "other", b)
            node.services.hub.stop_scope_events(muted, bob.id)
            await a.send("#muted", "not for bob")
            await a.send("#other", "for bob")
            events = await b.events_until(lambda e: e.get("type") == "message", timeout=5)
            messages = [e for e in events if e.get("type") == "message"]
            assert [(m["scopeId"], m["message"]["content"]) for m in messages] == [
                (other, "for bob")
            ]
            node.services.hub.allow_scope_events(muted, bob.id)
            await a.send("#muted", "for bob again")
            events = await b.events_until(lambda e: e.get("type") == "message", timeout=5)
            assert events[-1]["message"]["content"] == "for bob again"
