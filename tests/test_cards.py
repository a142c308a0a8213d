"""Share cards and app cards over the protocol (docs/cards.md).

One node for the module's two tests. Share cards: a reader who may see the
shared private channel (and message) is shown them through the card, one who
may not never receives their name, description or text in any frame (every
byte its session got is searched); a revoke reaches both as ``messageUpdated``
within a second, and ``history`` agrees. App cards: two humans act on the
same revision at once and exactly one applies; the service is told; ten
updates keep the card's id and seq, move no reader's read state and raise no
unread.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from node.client import Client, ClientError
from storage import directory, services
from storage.pg import connect
from tests.nodes import Person, World, make_channel, running_node

SECRET_NAME = "Zephyr launch room"
SECRET_TOPIC = "quokka-payload-7731"
SECRET_TEXT = "the launch code is marmalade-4412"
LIVE = 1.0  # a revoke reaches every reader within this
EVENT = 10.0  # any other event: a bound on a hang, on a machine the whole suite shares


def record_wire(client: Client) -> list[bytes]:
    """Every frame the session receives from now on, as sent."""
    wire: list[bytes] = []
    route: Callable[[str | bytes], Any] = client._route

    def recorded(data: str | bytes) -> Any:
        wire.append(data.encode() if isinstance(data, str) else data)
        return route(data)

    client._route = recorded  # type: ignore[method-assign]
    return wire


async def until_updated(client: Client, message_id: str) -> dict[str, Any]:
    events = await client.events_until(
        lambda e: e.get("type") == "messageUpdated" and e["message"]["id"] == message_id, EVENT
    )
    message: dict[str, Any] = events[-1]["message"]
    return message


def card_of(page: dict[str, Any], message_id: str) -> dict[str, Any]:
    found = [m for m in page["messages"] if m["id"] == message_id]
    assert found, page
    card: dict[str, Any] = found[0]["card"]
    return card


async def service(world: World, handle: str) -> Person:
    async with await connect(world.node.database_url, autocommit=True) as conn:
        made = await services.create_service(
            conn, workspace_id=world.workspace_id, handle=handle, display_name=None
        )
        token = await directory.issue_token(conn, made.member.id)
    return Person(made.member, token)


async def share_cards(world: World) -> None:
    ann, bob, cat = await world.members("ann", "bob", "cat")
    async with AsyncExitStack() as stack:
        a, b, c = [await stack.enter_async_context(world.client(p)) for p in (ann, bob, cat)]
        lobby = await make_channel(a, "lobby", b, c)
        secret = (
            await a.request(
                "createChannel",
                slug="zephyr",
                name=SECRET_NAME,
                visibility="private",
                description=SECRET_TOPIC,
            )
        )["scopeId"]
        await a.request("invite", scopeId=secret, memberId=bob.id)
        public = await make_channel(a, "open")
        said = await a.send(f"scope:{secret}", SECRET_TEXT)
        wire = record_wire(c)

        channel_card = await a.request("shareChannel", channelId=secret, target="#lobby")
        message_card = await a.request("shareMessage", messageId=said["messageId"], target="#lobby")
        open_card = await a.request("shareChannel", channelId=public, target="#lobby")
        assert channel_card["cardId"] != message_card["cardId"]
        # A replay of a clientMessageId answers the first card.
        first = await a.request(
            "shareChannel", channelId=public, target="#lobby", clientMessageId="share-open"
        )
        again = await a.request(
            "shareChannel", channelId=public, target="#lobby", clientMessageId="share-open"
        )
        assert again == first
        # Sharing needs sight of the source: cat cannot share what it cannot see.
        for op, fields in (
            ("shareChannel", {"channelId": secret}),
            ("shareMessage", {"messageId": said["messageId"]}),
        ):
            with pytest.raises(ClientError) as refused:
                await c.request(op, target="#lobby", **fields)
            assert refused.value.code in ("not_found", "forbidden"), op

        seen_b = await b.history(f"scope:{lobby}")
        seen_c = await c.history(f"scope:{lobby}")
        card = card_of(seen_b, channel_card["messageId"])
        assert card["source"]["name"] == SECRET_NAME
        assert card["source"]["description"] == SECRET_TOPIC
        assert card["source"]["memberCount"] == 2
        assert card_of(seen_b, message_card["messageId"])["source"]["content"] == SECRET_TEXT
        for mid in (channel_card["messageId"], message_card["messageId"]):
            hidden = card_of(seen_c, mid)
            assert "source" not in hidden, hidden
            assert hidden["unavailable"] is True
        opened = card_of(seen_c, open_card["messageId"])["source"]
        assert opened["visibility"] == "public"
        assert opened["joined"] is False

        # A revoke: by someone else refused, by the creator seen live by both readers.
        with pytest.raises(ClientError) as not_theirs:
            await b.request("revokeShare", cardId=channel_card["cardId"])
        assert not_theirs.value.code == "forbidden"
        with trio.fail_after(LIVE):
            await a.request("revokeShare", cardId=channel_card["cardId"])
            for reader in (b, c):
                live = await until_updated(reader, channel_card["messageId"])
                assert live["card"]["revoked"] is True
                assert "source" not in live["card"]
        again = await a.request("revokeShare", cardId=channel_card["cardId"])
        assert again == {"cardId": channel_card["cardId"], "revoked": True}
        after = card_of(await b.history(f"scope:{lobby}"), channel_card["messageId"])
        assert after == {"cardId": channel_card["cardId"], "kind": "channel", "revoked": True}

        everything = b"".join(wire)
        assert wire, "the outsider's session received nothing"
        # Nor the ids of what it may not see.
        for secret_word in (SECRET_NAME, SECRET_TOPIC, SECRET_TEXT, secret, said["messageId"]):
            assert secret_word.encode() not in everything, secret_word


async def app_cards(world: World) -> None:
    ann, bob = await world.members("dee", "eve")
    deploys = await service(world, "deploys")
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(world.client(ann))
        b = await stack.enter_async_context(world.client(bob))
        s = await stack.enter_async_context(world.client(deploys, kind="daemon"))
        scope = (await a.request("scopes"))["scopes"]
        convo = next(x["id"] for x in scope if x.get("type") == "service_account")
        card = {
            "title": "Approve deploy #42?",
            "actions": [
                {"id": "approve", "label": "Approve", "style": "primary"},
                {"id": "reject", "label": "Reject", "style": "danger"},
            ],
        }
        with pytest.raises(ClientError) as human:
            await a.request(
                "postCard", target=f"scope:{convo}", fallback="x", card=card, clientMessageId="p0"
            )
        assert human.value.code == "forbidden"
        posted = await s.request(
            "postCard",
            target=f"scope:{convo}",
            fallback="Approve deploy #42?",
            card=card,
            clientMessageId="deploy-42",
        )
        mid = posted["messageId"]
        assert posted["revision"] == 1
        live = (await a.events_until(lambda e: e.get("type") == "message", EVENT))[-1]
        assert live["message"]["card"]["title"] == "Approve deploy #42?"
        await b.events_until(lambda e: e.get("type") == "message", EVENT)
        # Two service updates take the card to revision 3.
        for rev in (1, 2):
            up = await s.request("updateCard", messageId=mid, revision=rev, card=card)
            assert up == {"revision": rev + 1}
        await a.request("markRead", scopeId=convo, seq=posted["seq"])
        # Two humans on revision 3 at once: one applies, the other is a conflict.
        answers: dict[str, Any] = {}

        async def act(name: str, client: Client) -> None:
            try:
                answers[name] = await client.request(
                    "cardAction", messageId=mid, actionId="approve", revision=3
                )
            except ClientError as exc:
                answers[name] = exc.frame

        async with trio.open_nursery() as nursery:
            nursery.start_soon(act, "a", a)
            nursery.start_soon(act, "b", b)
        won = [k for k, v in answers.items() if v == {"revision": 4}]
        lost = [v for v in answers.values() if v.get("code") == "conflict"]
        assert len(won) == 1, answers
        assert len(lost) == 1, answers
        assert lost[0]["details"]["revision"] == 4
        told = (await s.events_until(lambda e: e.get("type") == "cardAction", EVENT))[-1]
        assert told["messageId"] == mid
        assert told["revision"] == 4
        assert told["memberId"] == (ann.id if won == ["a"] else bob.id)
        # Ten updates: same id and seq, no unread, read state kept.
        rev = 4
        for n in range(10):
            body = {**card, "text": f"step {n}", "actions": []}
            rev = (await s.request("updateCard", messageId=mid, revision=rev, card=body))[
                "revision"
            ]
        stale = await s.request_frame(
            {"type": "updateCard", "id": "stale", "messageId": mid, "revision": 3, "card": card}
        )
        assert stale["code"] == "conflict"
        assert stale["details"]["revision"] == rev
        page = await a.history(f"scope:{convo}")
        shown = [m for m in page["messages"] if m["id"] == mid]
        assert len(shown) == 1
        assert shown[0]["seq"] == posted["seq"]
        assert shown[0]["card"]["revision"] == rev == 14
        assert shown[0]["card"]["text"] == "step 9"
        assert page["latestSeq"] == posted["seq"]
        listed = {x["id"]: x for x in (await a.request("scopes"))["scopes"]}
        assert listed[convo]["lastReadSeq"] == posted["seq"]
        assert listed[convo].get("unread", 0) == 0
        # An action on a card with no buttons left, and by the service itself.
        refused = await s.request_frame(
            {
                "type": "cardAction",
                "id": "svc",
                "messageId": mid,
                "actionId": "approve",
                "revision": rev,
            }
        )
        assert refused["code"] == "forbidden"
        # A card past its expiry takes no action.
        old = await s.request(
            "postCard",
            target=f"scope:{convo}",
            fallback="Approve deploy #41?",
            card=card,
            clientMessageId="deploy-41",
            expiresAt="2020-01-01T00:00:00Z",
        )
        late = await a.request_frame(
            {
                "type": "cardAction",
                "id": "late",
                "messageId": old["messageId"],
                "actionId": "approve",
                "revision": 1,
            }
        )
        assert late["code"] == "conflict"
        assert late["details"]["expired"] is True
        # A select: a choice it offers is an action, any other value is refused.
        chosen = {
            "title": "Which region?",
            "select": {
                "id": "region",
                "label": "Region",
                "options": [{"value": "eu", "label": "Europe"}, {"value": "us", "label": "US"}],
            },
        }
        asked = await s.post_card(f"scope:{convo}", "Which region?", chosen)
        picked = await b.card_action(asked["messageId"], "region", 1, value="eu")
        assert picked == 2
        wrong = await b.request_frame(
            {
                "type": "cardAction",
                "id": "wrong",
                "messageId": asked["messageId"],
                "actionId": "region",
                "value": "mars",
                "revision": 2,
            }
        )
        assert wrong["details"]["path"] == "$.value"
        assert late["details"]["revision"] == 1


async def test_cards(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            await share_cards(world)
            await app_cards(world)
