"""Profiles over the protocol: ``updateProfile`` and the ``memberUpdated`` event.

One node: ann renames herself and bob, her co-member, sees it live and on
her next message; eve, of another workspace, is told nothing. Bad names,
someone else's profile and another owner's private agent are refused with
typed errors; an owner renames its private agent and only it is told.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from tests.nodes import World, running_node

STEP = 5


def is_update(event: dict[str, Any]) -> bool:
    return event.get("type") == "memberUpdated"


async def refused(client: Any, **fields: Any) -> dict[str, Any]:
    answer = await client.request_frame({"type": "updateProfile", "id": "x", **fields})
    assert answer["type"] == "error", answer
    return answer


async def test_rename_is_pushed_to_co_members_and_refused_elsewhere(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node, "acme")
            elsewhere = await World.create(node, "other")
            ann, bob = await world.members("ann", "bob")
            agent = await world.member("helper", MemberType.AGENT, owner=ann, private=True)
            eve = await elsewhere.member("eve")
            async with (
                world.client(ann) as a,
                world.client(bob) as b,
                elsewhere.client(eve) as e,
            ):
                before = await a.send(f"dm:{bob.id}", "before the rename")

                renamed = await a.update_profile("  Ann Example ", avatar_color="teal")
                assert renamed == {
                    "memberId": ann.id,
                    "displayName": "Ann Example",
                    "avatarColor": "teal",
                }
                event = (await b.events_until(is_update, STEP))[-1]
                assert event["member"] == {
                    "id": ann.id,
                    "handle": "ann",
                    "displayName": "Ann Example",
                    "type": "human",
                    "avatarColor": "teal",
                }

                # Her next message carries the new name live; history renames the old one.
                await a.send(f"dm:{bob.id}", "after the rename")
                live = await b.events_until(lambda ev: ev.get("type") == "message", STEP)
                assert live[-1]["message"]["author"]["displayName"] == "Ann Example"
                page = await b.history(f"scope:{before['targetKey']}")
                assert {m["author"]["displayName"] for m in page["messages"]} == {"Ann Example"}
                people = {p["id"]: p for p in (await b.request("people"))["people"]}
                assert people[ann.id]["displayName"] == "Ann Example"
                assert people[ann.id]["avatarColor"] == "teal"
                assert "avatarColor" not in people[bob.id]
                # The colour stays when only the name changes.
                again = await a.update_profile("Ann Example")
                assert again["avatarColor"] == "teal"
                await b.events_until(is_update, STEP)

                for bad in ("\u202eevil", "a\u200bb", "   ", "x" * 81, ""):
                    answer = await refused(a, displayName=bad)
                    assert answer["code"] == "validation_failed", (bad, answer)
                    assert answer["details"]["path"] == "$.displayName", answer

                answer = await refused(a, displayName="Ann", avatarColor="chartreuse")
                assert answer["code"] == "validation_failed", answer
                assert answer["details"]["path"] == "$.avatarColor", answer
                answer = await refused(a, displayName="Bobby", memberId=bob.id)
                assert answer["code"] == "forbidden", answer
                for hidden in (eve.id, agent.id):
                    answer = await refused(b, displayName="Mine", memberId=hidden)
                    assert answer["code"] == "not_found", answer
                answer = await refused(e, displayName="Ann", memberId=ann.id)
                assert answer["code"] == "not_found", answer

                # A private agent's new name goes to its owner only.
                await a.update_profile("Helper Bot", member_id=agent.id)
                for_agent = await a.events_until(
                    lambda ev: is_update(ev) and ev["member"]["id"] == agent.id, STEP
                )
                event = for_agent[-1]
                assert event["member"]["ownerMemberId"] == ann.id
                # Every push above was queued before these answers: nothing more came.
                await b.request("scopes")
                await e.request("scopes")
                assert not [ev for ev in await _drain(b) if is_update(ev)]
                assert not [ev for ev in await _drain(e) if is_update(ev)]


async def _drain(client: Any) -> list[dict[str, Any]]:
    """The events already received (none is waited for)."""
    return [await client.next_event(STEP) for _ in range(client.pending_events())]
