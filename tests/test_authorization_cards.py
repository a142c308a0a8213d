"""The card rows of the authorization matrix (docs/cards.md, docs/authorization.md).

One node, real WebSockets, real PostgreSQL. The cards live in a public
channel, ``#lobby``; the shared channel is a private one, ``#src``, owned by
the *source owner*. Every cell that changes a card (revoke, act, update) gets
a card of its own, so no answer depends on the order in which cells run. The
rendering is appended to ``docs/authorization.md`` by
``tests/test_authorization_matrix.py``.
"""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from actors.model import MemberType
from storage import directory, services
from storage.pg import connect
from tests.matrix_section import ask_every_cell, assert_cells, open_sessions, section_lines
from tests.nodes import Person, World, running_node

OK, F, NF = "ok", "forbidden", "not_found"

CARD_ACTORS: dict[str, tuple[str, str]] = {
    "sharer": ("sharer", "a human member of `#lobby` and `#src` who shares (and made the card)"),
    "owner": ("source owner", "the owner of `#src`, a member of `#lobby`"),
    "reader": ("reader", "a human member of `#lobby` only"),
    "agent": ("agent", "a public agent, a member of `#lobby` only"),
    "service": ("service", "the service that posts the app cards, a member of `#lobby`"),
    "other_service": ("other service", "another service of the workspace, in no channel"),
    "outsider": ("outsider", "a human of the workspace in neither channel"),
    "foreign": ("other workspace", "a human of another workspace"),
}
CARD_OPS: dict[str, str] = {
    "shareChannel": "`shareChannel` of `#src` into `#lobby`",
    "shareMessage": "`shareMessage` of a `#lobby` message into `#lobby`",
    "revokeShare": "`revokeShare` of a card of `#src` the *sharer* posted",
    "postCard": "`postCard` into `#lobby`",
    "cardAction": "`cardAction` on an app card in `#lobby`, its current revision",
    "updateCard": "`updateCard` of an app card in `#lobby`, its current revision",
}
# fmt: off
CARD_MATRIX: dict[str, tuple[str, ...]] = {
    #                sharer owner reader agent service other_service outsider foreign
    "shareChannel": (OK,    OK,   NF,    NF,   NF,     NF,           NF,      NF),
    "shareMessage": (OK,    OK,   OK,    OK,   OK,     F,            F,       NF),
    "revokeShare":  (OK,    OK,   F,     F,    F,      NF,           NF,      NF),
    "postCard":     (F,     F,    F,     F,    OK,     F,            F,       F),
    "cardAction":   (OK,    OK,   OK,    F,    F,      F,            F,       NF),
    "updateCard":   (F,     F,    F,     F,    OK,     F,            F,       NF),
}
# fmt: on

_INTRO = """\
Share cards and app cards (docs/cards.md). A share card is posted like a
send by whoever may see what it shares (a private channel only by its
members; an unseen one answers as a missing one) and may send to the target;
it is revoked by its creator or the shared channel's owner, and a card the
caller cannot read answers as a missing one. App cards are posted and
updated by a service only (its own cards); people who read a card act on it;
agents and services never do."""

_CARD = {
    "title": "Approve deploy?",
    "actions": [{"id": "approve", "label": "Approve", "style": "primary"}],
}


def _cell(answer: str) -> str:
    return "**ok**" if answer == OK else f"`{answer}`"


def card_lines() -> list[str]:
    return section_lines("Cards", _INTRO, CARD_ACTORS, CARD_OPS, CARD_MATRIX, _cell)


async def _service(world: World, handle: str) -> Person:
    async with await connect(world.node.database_url, autocommit=True) as conn:
        made = await services.create_service(
            conn, workspace_id=world.workspace_id, handle=handle, display_name=None
        )
        token = await directory.issue_token(conn, made.member.id)
    return Person(made.member, token)


async def test_card_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(CARD_ACTORS)
    fresh = itertools.count(1)
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "card matrix")
            elsewhere = await World.create(node, "elsewhere")
            people = {
                "sharer": await world.member("sharer"),
                "owner": await world.member("owner"),
                "reader": await world.member("reader"),
                "agent": await world.member("bot", MemberType.AGENT),
                "service": await _service(world, "deploys"),
                "other_service": await _service(world, "alerts"),
                "outsider": await world.member("outsider"),
                "foreign": await elsewhere.member("stranger"),
            }
            clients = await open_sessions(hold, people, world, elsewhere)
            owner = clients["owner"]
            lobby = (await owner.request("createChannel", slug="lobby", name="Lobby"))["scopeId"]
            src = (
                await owner.request("createChannel", slug="src", name="Src", visibility="private")
            )["scopeId"]
            for who in ("sharer", "reader", "agent", "service"):
                await owner.request("invite", scopeId=lobby, memberId=people[who].id)
            await owner.request("invite", scopeId=src, memberId=people["sharer"].id)
            said = await owner.send("#lobby", "something to share")
            # Each changing cell's own card.
            revokable = {
                actor: (
                    await clients["sharer"].request("shareChannel", channelId=src, target="#lobby")
                )["cardId"]
                for actor in columns
            }
            app_cards = {
                (op, actor): (
                    await clients["service"].request(
                        "postCard",
                        target="#lobby",
                        fallback="Approve deploy?",
                        card=_CARD,
                        clientMessageId=f"{op}-{actor}",
                    )
                )["messageId"]
                for op in ("cardAction", "updateCard")
                for actor in columns
            }

            def fields(op: str, actor: str, n: int) -> dict[str, Any]:
                if op == "shareChannel":
                    return {"channelId": src, "target": "#lobby", "clientMessageId": f"c{n}"}
                if op == "shareMessage":
                    return {"messageId": said["messageId"], "target": "#lobby"}
                if op == "revokeShare":
                    return {"cardId": revokable[actor]}
                if op == "postCard":
                    return {
                        "target": "#lobby",
                        "fallback": "hello",
                        "card": _CARD,
                        "clientMessageId": f"p{n}",
                    }
                mid = app_cards[(op, actor)]
                if op == "cardAction":
                    return {"messageId": mid, "actionId": "approve", "revision": 1}
                return {"messageId": mid, "revision": 1, "card": _CARD}

            async def answer(op: str, actor: str) -> str:
                n = next(fresh)
                frame = {"type": op, "id": f"k{n}", **fields(op, actor, n)}
                reply = await clients[actor].request_frame(frame)
                return OK if reply["type"] == "reply" else str(reply["code"])

            got = await ask_every_cell(CARD_MATRIX, columns, answer)

    assert_cells(CARD_MATRIX, columns, got)
