"""Cards in a real browser (docs/cards.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. A member of a shared private channel sees its name and description
on the card, a reader who is not sees "A channel you cannot see", and a
shared public channel offers "Join". A revoke turns both readers' cards into
"no longer available" within a second, without a reload, and so they stay
after one. Sharing from the
page: "Share" on a channel, then the conversation to post the card to. And
examples/approval_service.py: its "Approve deploy #42?" card's Approve
button, pressed in the page, becomes "Approved by ann"; a card past its
expiry says "expired" and its buttons are disabled.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import trio

from node.client import open_client
from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    DIALOGS,
    Person,
    admin,
    browser_thread,
    conversation,
    new_person,
    new_workspace,
    node_client,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "approval_service.py"
SECRET_NAME = "Zephyr launch room"
# A revoke shows on every reader's card within this: the node's part is held
# to a second in tests/test_cards.py; here the suite's browsers share the machine.
LIVE_MS = 3000
PAST = "2020-01-01T00:00:00Z"


def approval_service() -> ModuleType:
    spec = importlib.util.spec_from_file_location("approval_service", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_share_cards_revoke_live_and_the_approval_service(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann, bob, cat = [await new_person(node, workspace, h) for h in ("ann", "bob", "cat")]
            await admin(node, "create-service", "--workspace", workspace, "--handle", "deploys")
            token = (await admin(node, "issue-service-token", "--service", "deploys"))["token"]
            async with node_client(node, ann) as a, node_client(node, bob) as b:
                async with node_client(node, cat) as c:
                    lobby = (await a.request("createChannel", slug="lobby", name="Lobby"))[
                        "scopeId"
                    ]
                    await b.request("join", scopeId=lobby)
                    await c.request("join", scopeId=lobby)
                secret = (
                    await a.request(
                        "createChannel",
                        slug="zephyr",
                        name=SECRET_NAME,
                        visibility="private",
                        description="where the launch is planned",
                    )
                )["scopeId"]
                await a.request("invite", scopeId=secret, memberId=bob.id)
                public = (await a.request("createChannel", slug="open", name="Open"))["scopeId"]
                shared = await a.share_channel(secret, "#lobby")
                await a.share_channel(public, "#lobby")
                pages = await browser.run(lambda br: readers_see_cards(br, node, bob, cat))
                await a.revoke_share(shared["cardId"])
                await browser.run(lambda br: revoked_live(pages))
            await browser.run(lambda br: cat_joins_from_the_card(pages[1]))

            service = approval_service()
            async with trio.open_nursery() as nursery:
                decided: list[str] = []

                async def serve() -> None:
                    decided.append(await service.run(node.url, token))

                nursery.start_soon(serve)
                page = await browser.run(lambda br: ann_shares_and_approves(br, node, ann))
                with trio.fail_after(5):
                    while not decided:  # the service returns once it updated the card
                        await trio.sleep(0.02)
            assert decided == ["Approved by ann"]
            async with open_client(node.url, token, kind="daemon") as deploys:
                convo = await service.own_conversation(deploys)
                late = {"title": "Approve deploy #41?", "actions": service.BUTTONS}
                await deploys.post_card(convo, "Approve deploy #41?", late, expires_at=PAST)
            await browser.run(lambda br: an_expired_card(page))
            assert DIALOGS == []


def readers_see_cards(browser: Browser, node: RunningNode, bob: Person, cat: Person) -> list[Page]:
    from playwright.sync_api import expect

    pages = []
    for person in (bob, cat):
        _, page = open_page(browser, node.http, person.token)
        conversation(page, "#lobby").click()
        pages.append(page)
    member, outsider = pages
    card = member.get_by_role("group", name="Shared channel #zephyr")
    expect(card).to_contain_text(SECRET_NAME)
    expect(card.get_by_role("button", name="Open")).to_be_visible()
    expect(outsider.get_by_role("group", name="A channel you cannot see")).to_be_visible()
    expect(outsider.get_by_role("group", name="Shared channel #open")).to_be_visible()
    expect(outsider.get_by_text(SECRET_NAME)).to_have_count(0)
    return pages


def revoked_live(pages: list[Page]) -> None:
    from playwright.sync_api import expect

    for page in pages:
        gone = page.get_by_role("group", name="Shared channel, no longer available")
        expect(gone).to_be_visible(timeout=LIVE_MS)
    expect(pages[0].get_by_text(SECRET_NAME)).to_have_count(0)
    # And after a reload, read back from history.
    member = pages[0]
    member.reload()
    conversation(member, "#lobby").click()
    expect(member.get_by_role("group", name="Shared channel, no longer available")).to_be_visible()
    expect(member.get_by_role("group", name="Shared channel #open")).to_be_visible()
    expect(member.get_by_text(SECRET_NAME)).to_have_count(0)


def cat_joins_from_the_card(page: Page) -> None:
    from playwright.sync_api import expect

    card = page.get_by_role("group", name="Shared channel #open")
    card.get_by_role("button", name="Join").click()
    expect(page.get_by_role("heading", name="#open", level=2)).to_be_visible()


def ann_shares_and_approves(browser: Browser, node: RunningNode, ann: Person) -> Page:
    from playwright.sync_api import expect

    _, page = open_page(browser, node.http, ann.token)
    conversation(page, "#open").click()
    page.get_by_role("button", name="Share channel").click()
    page.get_by_role("dialog").get_by_role("button", name="Share to #lobby").click()
    expect(page.get_by_role("heading", name="#lobby", level=2)).to_be_visible()
    expect(page.get_by_role("group", name="Shared channel #open")).to_have_count(2)

    conversation(page, "deploys").click()
    card = page.get_by_role("group", name="Approve deploy #42?")
    expect(card.get_by_role("button", name="Reject")).to_be_visible()
    card.get_by_role("button", name="Approve").click()
    done = page.get_by_role("group", name="Approved by ann")
    expect(done).to_contain_text("Approved by ann")
    expect(done.get_by_role("button")).to_have_count(0)
    return page


def an_expired_card(page: Page) -> None:
    from playwright.sync_api import expect

    card = page.get_by_role("group", name="Approve deploy #41?")
    expect(card).to_contain_text("expired")
    expect(card.get_by_role("button", name="Approve")).to_be_disabled()
