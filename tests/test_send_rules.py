"""What a sender may set and what a send shows to whom.

Explain names only the members the author may see in ``members``;
``metadata.recipients`` is for the author and the recipients; ``messageType``,
``recipients``, ``forward.sources``, ``attachmentIds`` and the chunk suffix of
``clientMessageId`` are checked before a send reaches its scope actor. The pure
rules first, then the node over real WebSockets and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from actors.model import Member, Membership, MemberType
from actors.scope_state import chunk_client_message_id
from actors.send_rules import (
    CHUNK_SUFFIX,
    check_send_fields,
    recipient_authority_error,
    recipient_errors,
)
from actors.visibility import VisibilityContext
from node.client import Client, ClientError
from tests.nodes import Person, World, make_channel, running_node

TIMEOUT = 10
NOW = datetime(2026, 1, 1, tzinfo=UTC)
WS = "ws_1"


def member(
    mid: str, type_: MemberType = MemberType.HUMAN, owner: str | None = None, ws: str = WS
) -> Member:
    return Member(mid, ws, type_, mid, mid, owner, owner is not None)


HUMAN = member("human")
AGENT = member("bot", MemberType.AGENT)
SERVICE = member("svc", MemberType.SERVICE)
OWNER = member("owner")
PRIVATE = member("private", MemberType.AGENT, owner="owner")


def refused(author: Member, **fields: Any) -> tuple[str, str | None]:
    args: dict[str, Any] = {
        "message_type": "text",
        "client_message_id": "c-1",
        "attachment_ids": [],
    } | fields
    with pytest.raises(Exception) as caught:
        check_send_fields(author, **args)
    error = caught.value
    return getattr(error, "code", "?"), getattr(error, "path", None)


# ---------------------------------------------------------------- pure rules


@pytest.mark.parametrize("author", [HUMAN, AGENT, SERVICE])
def test_only_text_is_a_client_message_type(author: Member) -> None:
    check_send_fields(author, message_type="text", client_message_id="c", attachment_ids=[])
    for other in ("system", "app_interactive_card", "Text"):
        assert refused(author, message_type=other) == ("validation_failed", "$.messageType")


@pytest.mark.parametrize("cmid", ["x#1", "x#0", "#7", "a#b#12", f"c{CHUNK_SUFFIX}3"])
def test_chunk_suffix_is_reserved(cmid: str) -> None:
    assert refused(HUMAN, client_message_id=cmid) == ("validation_failed", "$.clientMessageId")


@pytest.mark.parametrize("cmid", ["x", "x#", "x#a", "#1x", "x-1", "issue #12 draft"])
def test_other_client_message_ids_pass(cmid: str) -> None:
    check_send_fields(HUMAN, message_type="text", client_message_id=cmid, attachment_ids=[])


def test_the_rule_covers_the_ids_chunks_are_stored_under() -> None:
    for index in (0, 1, 41):
        chunk_id = chunk_client_message_id("c-1", index)
        assert refused(HUMAN, client_message_id=chunk_id)[1] == "$.clientMessageId"


def test_attachments_and_malformed_sources() -> None:
    assert refused(HUMAN, attachment_ids=["upl_1"]) == ("validation_failed", "$.attachmentIds[0]")
    assert refused(HUMAN, source_ids=["msg_1", "nope"]) == (
        "validation_failed",
        "$.forward.sources[1].messageId",
    )
    check_send_fields(
        HUMAN, message_type="text", client_message_id="c", attachment_ids=[], source_ids=["msg_1"]
    )


def test_recipients_must_be_members_of_the_workspace() -> None:
    stranger = member("stranger", ws="ws_other")
    found = {m.id: m for m in (AGENT, stranger)}
    assert recipient_errors(HUMAN, ["bot"], found) is None
    unknown = recipient_errors(HUMAN, ["bot", "ghost"], found)
    assert unknown is not None
    assert (unknown.code, unknown.path) == ("validation_failed", "$.recipients[1]")
    elsewhere = recipient_errors(HUMAN, ["stranger"], found)
    assert elsewhere is not None
    # Another workspace's member is answered exactly like an unknown id.
    assert (elsewhere.code, elsewhere.message) == (unknown.code, unknown.message)


def test_private_agent_recipient_needs_authority() -> None:
    ctx = VisibilityContext(
        {"private": (Membership("private", "private", "owner", 1),)},
        {m.id: m for m in (OWNER, HUMAN, PRIVATE)},
        (),
    )
    assert recipient_authority_error(ctx, OWNER, [AGENT, PRIVATE], NOW) is None
    assert recipient_authority_error(ctx, HUMAN, [AGENT], NOW) is None
    denied = recipient_authority_error(ctx, HUMAN, [AGENT, PRIVATE], NOW)
    assert denied is not None
    assert (denied.code, denied.path) == ("forbidden", "$.recipients[1]")


# ---------------------------------------------------------------- over the wire


async def rejected(client: Client, target: str, content: str, **fields: Any) -> ClientError:
    with pytest.raises(ClientError) as caught:
        await client.send(target, content, **fields)
    return caught.value


async def test_explain_names_only_members_the_author_may_see(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        human = await world.member("h")
        gone = await world.member("gone")
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(gone) as g,
        ):
            await make_channel(o, "c", h, g)
            channel = (await o.request("scopes"))["scopes"][0]["id"]
            await o.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            await g.request("leave", scopeId=channel)

            by_human = await h.send("#c", "@p anyone?", explain=True)
            text = json.dumps(by_human["explain"])
            assert agent.id not in text  # not named, in any field
            assert gone.id not in text  # former members are not listed
            named = {r["memberId"] for r in by_human["explain"]["recipients"]}
            assert named == {owner.id}
            assert by_human["explain"]["hiddenPrivate"] == 1
            assert {m["id"] for m in (await h.request("members", scopeId=channel))["members"]} == {
                owner.id,
                human.id,
            }

            by_owner = await o.send("#c", "@p go", explain=True)
            named = {r["memberId"]: r for r in by_owner["explain"]["recipients"]}
            assert set(named) == {human.id, agent.id}  # its own private agent, by name
            assert named[agent.id]["wake"] is True
            assert by_owner["explain"]["hiddenPrivate"] == 0


async def test_metadata_recipients_only_for_author_and_recipients(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        bot = await world.member("bot", MemberType.AGENT)
        reader = await world.member("r")
        async with (
            world.client(owner) as o,
            world.client(bot) as b,
            world.client(reader) as r,
        ):
            channel = await make_channel(o, "c", b, r)
            sent = await o.send("#c", "for bot", recipients=[bot.id])
            plain = await o.send("#c", "for everyone")

            async def live(client: Client) -> dict[str, Any]:
                events = await client.events_until(
                    lambda e: e["type"] == "message" and e["message"]["id"] == plain["messageId"],
                    timeout=TIMEOUT,
                )
                (event,) = [
                    e for e in events if e.get("message", {}).get("id") == sent["messageId"]
                ]
                return dict(event["message"]["metadata"])

            async def stored(client: Client) -> dict[str, Any]:
                page = await client.history("#c")
                (message,) = [m for m in page["messages"] if m["id"] == sent["messageId"]]
                return dict(message["metadata"])

            live_views = {"o": await live(o), "b": await live(b), "r": await live(r)}
            history_views = {"o": await stored(o), "b": await stored(b), "r": await stored(r)}
            async with world.client(reader, resume={channel: 0}) as again:
                events = await again.events_until(lambda e: e["type"] == "resumed", timeout=TIMEOUT)
            (resumed,) = [e for e in events if e.get("message", {}).get("id") == sent["messageId"]]

            # The third reader sees the message but not whom it was addressed to:
            # not live, not in history, not on resume.
            assert [
                "recipients" in live_views["r"],
                "recipients" in history_views["r"],
                "recipients" in resumed["message"]["metadata"],
            ] == [False, False, False]
            for views in (live_views, history_views):
                assert views["o"]["recipients"] == [bot.id]
                assert views["b"]["recipients"] == [bot.id]
            plain_views = await o.history("#c")
            assert all(
                "recipients" not in m["metadata"]
                for m in plain_views["messages"]
                if m["id"] == plain["messageId"]
            )


@dataclass
class Setup:
    o: Client
    h: Client
    b: Client
    agent: Person
    bot: Person
    stranger: Person
    hidden_message_id: str


def forward(*ids: str) -> dict[str, Any]:
    return {"mode": "single", "sources": [{"messageId": i} for i in ids]}


# Each refused send: (who sends, fields of the send) → (error code, details.path).
REFUSED: dict[str, tuple[Callable[[Setup], tuple[Client, dict[str, Any]]], str, str]] = {
    "human_sends_system": (
        lambda s: (s.h, {"messageType": "system"}),
        "validation_failed",
        "$.messageType",
    ),
    "agent_sends_card": (
        lambda s: (s.b, {"messageType": "app_interactive_card"}),
        "validation_failed",
        "$.messageType",
    ),
    "unknown_recipient": (
        lambda s: (s.h, {"recipients": [s.bot.id, "mem_nobody"]}),
        "validation_failed",
        "$.recipients[1]",
    ),
    "recipient_of_another_workspace": (
        lambda s: (s.h, {"recipients": [s.stranger.id]}),
        "validation_failed",
        "$.recipients[0]",
    ),
    "private_agent_recipient_without_authority": (
        lambda s: (s.h, {"recipients": [s.agent.id]}),
        "forbidden",
        "$.recipients[0]",
    ),
    # A message in a private scope the sender never belonged to answers as a
    # message that does not exist: the error must not confirm it.
    "forward_of_unreadable_message": (
        lambda s: (s.h, {"forward": forward(s.hidden_message_id)}),
        "not_found",
        "$.forward.sources[0].messageId",
    ),
    "forward_of_unknown_message": (
        lambda s: (s.h, {"forward": forward("msg_0000")}),
        "not_found",
        "$.forward.sources[0].messageId",
    ),
    "forward_of_malformed_id": (
        lambda s: (s.h, {"forward": forward("scp_1")}),
        "validation_failed",
        "$.forward.sources[0].messageId",
    ),
    "attachment_without_upload": (
        lambda s: (s.h, {"attachmentIds": ["upl_1"]}),
        "validation_failed",
        "$.attachmentIds[0]",
    ),
    "chunk_suffix_in_client_message_id": (
        lambda s: (s.h, {"clientMessageId": "x#1"}),
        "validation_failed",
        "$.clientMessageId",
    ),
}


@asynccontextmanager
async def setup(database_url: str, tmp_path: Path) -> AsyncIterator[Setup]:
    """#c with owner O (and O's private agent P), human H and public agent B;
    a private channel of O's with one message; a member of another workspace."""
    async with running_node(database_url, tmp_path) as node:
        world = await World.create(node)
        elsewhere = await World.create(node, "elsewhere")
        owner = await world.member("owner")
        agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
        human = await world.member("h")
        bot = await world.member("bot", MemberType.AGENT)
        stranger = await elsewhere.member("stranger")
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(bot) as b,
        ):
            channel = await make_channel(o, "c", h, b)
            await o.request("invite", scopeId=channel, memberId=agent.id, visibility="private")
            secret = await o.request(
                "createChannel", slug="secret", name="Secret", visibility="private"
            )
            hidden = await o.send(f"scope:{secret['scopeId']}", "owner only")
            yield Setup(o, h, b, agent, bot, stranger, hidden["messageId"])


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_server_owned_fields_are_refused(
    database_url: str, tmp_path: Path, case: str
) -> None:
    build, code, path = REFUSED[case]
    async with setup(database_url, tmp_path) as s:
        client, fields = build(s)
        with pytest.raises(ClientError) as caught:
            await client.send("#c", "refused", **fields)
        assert (caught.value.code, caught.value.details.get("path")) == (code, path)
        # Nothing refused was stored.
        contents = [m["content"] for m in (await s.o.history("#c"))["messages"]]
        assert "refused" not in contents


async def test_what_a_sender_may_set_still_goes_through(database_url: str, tmp_path: Path) -> None:
    async with setup(database_url, tmp_path) as s:
        for client, fields in (
            (s.o, {"recipients": [s.agent.id, s.bot.id]}),  # its own private agent
            (s.h, {"recipients": [s.bot.id], "messageType": "text"}),
            (s.o, {"forward": forward(s.hidden_message_id)}),  # readable by O
            (s.h, {"clientMessageId": "x#one"}),
        ):
            assert (await client.send("#c", "allowed", **fields))["state"] == "sent"
