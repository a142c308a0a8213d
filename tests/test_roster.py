"""Memberships over time and notification settings (docs/design.md#memberships)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from actors.model import MemberType
from node.client import ClientError
from tests.nodes import World, make_channel, running_node


def roster_state(database_url: str, scope_id: str, member_id: str) -> tuple[object, ...]:
    with psycopg.connect(database_url) as conn:
        generation = conn.execute(
            "SELECT roster_generation FROM scopes WHERE id = %s", (scope_id,)
        ).fetchone()
        intervals = conn.execute(
            "SELECT effective_from_seq, effective_to_seq FROM scope_memberships"
            " WHERE scope_id = %s AND member_id = %s ORDER BY id",
            (scope_id, member_id),
        ).fetchall()
        setting = conn.execute(
            "SELECT state FROM scope_notification_settings WHERE scope_id = %s AND member_id = %s",
            (scope_id, member_id),
        ).fetchone()
    assert generation is not None
    return generation[0], intervals, setting[0] if setting else None


async def test_intervals_settings_and_roster_generation(database_url: str, tmp_path: Path) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bot = await world.member("bot", MemberType.AGENT)
        async with world.client(ann) as a, world.client(bot) as b:
            scope_id = await make_channel(a, "roster", b)
            generation, intervals, setting = roster_state(database_url, scope_id, bot.id)
            assert intervals == [(1, None)]
            assert setting == "active"
            await a.send("#roster", "one")
            assert await b.request("setNotification", scopeId=scope_id, state="auto-wake") == {
                "state": "auto-wake"
            }
            after_setting, _, setting = roster_state(database_url, scope_id, bot.id)
            assert setting == "auto-wake"
            assert after_setting == generation + 1
            # Leaving closes the interval and drops the setting; re-joining opens a new one.
            await b.request("leave", scopeId=scope_id)
            await a.send("#roster", "two")
            after_leave, intervals, setting = roster_state(database_url, scope_id, bot.id)
            assert intervals == [(1, 2)]
            assert setting is None
            assert after_leave == after_setting + 1
            with pytest.raises(ClientError) as forbidden:
                await b.send("#roster", "not a member")
            assert forbidden.value.code == "forbidden"
            await b.request("join", scopeId=scope_id)
            rejoined, intervals, setting = roster_state(database_url, scope_id, bot.id)
            assert intervals == [(1, 2), (3, None)]
            assert setting == "active"
            assert rejoined == after_leave + 1
            # Joining twice and leaving twice are not errors.
            assert await b.request("join", scopeId=scope_id) == {}
            with pytest.raises(ClientError) as human_only:
                await a.request("setNotification", scopeId=scope_id, state="auto-wake")
            assert human_only.value.code == "validation_failed"
