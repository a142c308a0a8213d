"""Quotes, forwards and explicit context (docs/design.md#sources).

Every source is readable by the sender when it sends; every reader sees each
source re-checked against itself (unreadable: ``unavailable``); an
explicit-context send opens exactly the cited messages to the private agents
it addresses, through durable ``recipient_context`` rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.model import MemberType
from node.client import Client, ClientError
from node.client.sources import context, forward_of, quote
from storage.pg import connect
from tests.nodes import World, make_channel, running_node

TIMEOUT = 10


def cite(mode: str, *ids: str) -> dict[str, Any]:
    return {"mode": mode, "sources": [{"messageId": i} for i in ids]}


async def sources_of(client: Client, target: str, message_id: str) -> list[dict[str, Any]]:
    page = await client.history(target)
    (found,) = [m for m in page["messages"] if m["id"] == message_id]
    return list(found["sources"])


async def test_quotes_and_forwards_are_rechecked_per_viewer(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        bob = await world.member("bob")
        async with world.client(ann) as a, world.client(bob) as b:
            open_id = await make_channel(a, "open", b)
            secret_id = (
                await a.request("createChannel", slug="secret", name="S", visibility="private")
            )["scopeId"]
            hidden = await a.send("#secret", "only ann reads this", clientMessageId="h")
            seen = await a.send("#open", "everyone reads this", clientMessageId="s")

            # A quote of a message bob cannot read: unavailable to bob, resolved for ann.
            quote = await a.send(
                "#open",
                "as I said",
                clientMessageId="q",
                forward=cite("quote", hidden["messageId"]),
            )
            live = await b.events_until(
                lambda e: e["type"] == "message" and e["message"]["id"] == quote["messageId"],
                timeout=TIMEOUT,
            )
            # Live events carry the shape only: the reader resolves through history.
            assert live[-1]["message"]["sources"] == [
                {"messageId": None, "kind": "quote", "pending": True}
            ]
            assert await sources_of(b, "#open", quote["messageId"]) == [
                {"messageId": None, "kind": "quote", "unavailable": True}
            ]
            assert await sources_of(a, "#open", quote["messageId"]) == [
                {"messageId": hidden["messageId"], "scopeId": secret_id, "seq": 1, "kind": "quote"}
            ]

            # A multi forward mixing what bob reads and what he does not, on resume too.
            multi = await a.send(
                "#open",
                "fwd",
                clientMessageId="m",
                forward=cite("multi", seen["messageId"], hidden["messageId"]),
            )
            expected_for_bob = [
                {"messageId": seen["messageId"], "scopeId": open_id, "seq": 1, "kind": "forward"},
                {"messageId": None, "kind": "forward", "unavailable": True},
            ]
            assert await sources_of(b, "#open", multi["messageId"]) == expected_for_bob
            async with world.client(bob, resume={open_id: quote["acceptedSeq"]}) as again:
                events = await again.events_until(lambda e: e["type"] == "resumed", timeout=TIMEOUT)
            (resumed,) = [e for e in events if e.get("message", {}).get("id") == multi["messageId"]]
            assert resumed["message"]["sources"] == expected_for_bob

            # Bob may not forward what he cannot read (a message of a private
            # channel he never joined does not exist for him); nothing is stored.
            with pytest.raises(ClientError) as caught:
                await b.send(
                    "#open", "x", clientMessageId="f", forward=cite("single", hidden["messageId"])
                )
            assert caught.value.code == "not_found"
            assert caught.value.details["path"] == "$.forward.sources[0].messageId"
            with pytest.raises(ClientError) as caught:
                await a.send(
                    "#open",
                    "x",
                    clientMessageId="q2",
                    forward=cite("quote", seen["messageId"], hidden["messageId"]),
                )
            assert caught.value.code == "validation_failed"
            assert caught.value.details["path"] == "$.forward.sources"

            # Ann leaves the secret channel: her own quote turns unavailable to her too.
            await a.request("leave", scopeId=secret_id)
            assert await sources_of(a, "#open", quote["messageId"]) == [
                {"messageId": None, "kind": "quote", "unavailable": True}
            ]
        async with await connect(database_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT message_id, ordinal, source_kind, source_scope_id, source_seq"
                " FROM scope_message_sources WHERE target_scope_id = %s ORDER BY 1, 2",
                (open_id,),
            )
            rows = await cur.fetchall()
        assert sorted(rows) == sorted(
            [
                (quote["messageId"], 0, "quote", secret_id, 1),
                (multi["messageId"], 0, "multi_forward", open_id, 1),
                (multi["messageId"], 1, "multi_forward", secret_id, 1),
            ]
        )


async def test_explicit_context_opens_exactly_the_cited_messages(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        ann = await world.member("ann")
        carol = await world.member("carol")
        bob = await world.member("bob")
        helper = await world.member("helper", MemberType.AGENT, owner=ann, private=True)
        other = await world.member("other", MemberType.AGENT, owner=ann, private=True)
        async with (
            world.client(ann) as a,
            world.client(carol) as c,
            world.client(bob) as b,
            world.client(helper) as h,
            world.client(other) as o,
        ):
            work_id = await make_channel(a, "work", b)
            for agent in (helper, other):
                await a.request("invite", scopeId=work_id, memberId=agent.id, visibility="private")
            ops_id = await make_channel(c, "ops", a)
            cited = []
            for n in range(4):
                sent = await c.send("#ops", f"ops {n}", clientMessageId=f"ops-{n}")
                cited.append(sent["messageId"])
            bobs = await b.send("#work", "bob's note", clientMessageId="bob")

            # Before: the agent reads nothing of #ops and not bob's note.
            with pytest.raises(ClientError) as caught:
                await h.history(f"scope:{ops_id}")
            assert caught.value.code == "forbidden"

            ask = await a.send(
                "#work",
                "please look at these",
                clientMessageId="ask",
                recipients=[helper.id],
                forward=cite("explicit_context", cited[0], cited[2], bobs["messageId"]),
            )
            page = await h.history(f"scope:{ops_id}")
            assert [m["id"] for m in page["messages"]] == [cited[0], cited[2]]
            work = await h.history("#work")
            # Bob's note is now readable to the helper too (it was cited to it), nothing else of bob.
            assert [m["id"] for m in work["messages"]] == [bobs["messageId"], ask["messageId"]]
            (message,) = [m for m in work["messages"] if m["id"] == ask["messageId"]]
            assert message["sources"] == [
                {"messageId": cited[0], "scopeId": ops_id, "seq": 1, "kind": "context"},
                {"messageId": cited[2], "scopeId": ops_id, "seq": 3, "kind": "context"},
                {"messageId": bobs["messageId"], "scopeId": work_id, "seq": 1, "kind": "context"},
            ]
            # The same owner's other agent was not addressed: it reads none of them.
            with pytest.raises(ClientError):
                await o.history(f"scope:{ops_id}")
            other_work = await o.history("#work")
            assert [m["id"] for m in other_work["messages"]] == [ask["messageId"]]
            assert [s.get("unavailable") for s in other_work["messages"][0]["sources"]] == [
                True,
                True,
                True,
            ]
            # Bob reads the work message; the #ops sources are unavailable to him.
            assert [s["messageId"] for s in await sources_of(b, "#work", ask["messageId"])] == [
                None,
                None,
                bobs["messageId"],
            ]


def test_client_helpers_build_the_forward_shapes() -> None:
    assert quote("msg_a") == {"mode": "quote", "sources": [{"messageId": "msg_a"}]}
    assert forward_of("msg_a")["mode"] == "single"
    assert forward_of("msg_a", "msg_b")["mode"] == "multi"
    assert context("msg_a", "msg_b") == cite("explicit_context", "msg_a", "msg_b")
    with pytest.raises(ValueError, match="at least one"):
        forward_of()
