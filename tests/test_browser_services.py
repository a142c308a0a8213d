"""Service accounts in a real browser (docs/services.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. A service's conversation is listed under "Apps" for every human; its
manager posts from a composer that says "Posting as deploys" and everyone
else gets no composer; a webhook post (as curl would make it, Slack's
payload) shows live to a reader with the APP badge and the link converted;
a human created afterwards sees the conversation at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    DIALOGS,
    Person,
    admin,
    browser_thread,
    conversation,
    messages,
    new_person,
    new_workspace,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed
from tests.test_services import post_hook

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

SLACK = {"text": "Deploy <https://ci.example/42|#42> *succeeded*"}


async def test_apps_list_manager_composer_and_live_webhook_posts(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            bob = await new_person(node, workspace, "bob")
            made = await admin(
                node,
                "create-service",
                "--workspace",
                workspace,
                "--handle",
                "deploys",
                "--display-name",
                "Deploys",
                "--manager",
                ann.id,
            )
            assert made["handle"] == "deploys"
            token = (await admin(node, "issue-service-token", "--service", "deploys"))["token"]

            reader = await browser.run(lambda b: manager_posts(b, node, ann, bob))
            status, _ = await post_hook(node, "deploys", SLACK, token)
            assert status == 201
            await browser.run(lambda b: webhook_post_arrives(reader))
            cara = await new_person(node, workspace, "cara")
            await browser.run(lambda b: newcomer_sees_the_app(b, node, cara))
            assert DIALOGS == []


def manager_posts(browser: Browser, node: RunningNode, ann: Person, bob: Person) -> Page:
    from playwright.sync_api import expect

    _, reader = open_page(browser, node.http, bob.token)
    nav = reader.get_by_role("navigation", name="Conversations")
    expect(nav.get_by_role("heading", name="Apps")).to_be_visible()
    conversation(reader, "Deploys").click()
    expect(reader.get_by_role("heading", name="Deploys", level=2)).to_be_visible()
    # A reader who does not manage the service has no composer at all.
    expect(reader.get_by_role("textbox", name="Posting as deploys")).to_have_count(0)
    expect(reader.get_by_role("textbox", name="Message")).to_be_hidden()

    _, author = open_page(browser, node.http, ann.token)
    conversation(author, "Deploys").click()
    box = author.get_by_role("textbox", name="Posting as deploys")
    box.fill("Release **ready**")
    author.get_by_role("button", name="Send").click()
    for page in (author, reader):
        posted = messages(page).filter(has_text="Release ready")
        expect(posted).to_have_count(1)
        expect(posted).to_contain_text("Deploys")
        expect(posted).to_contain_text("APP")
    return reader


def webhook_post_arrives(reader: Page) -> None:
    from playwright.sync_api import expect

    posted = messages(reader).filter(has_text="Deploy #42 succeeded")
    expect(posted).to_have_count(1, timeout=5_000)
    expect(posted.get_by_role("link", name="#42")).to_have_attribute(
        "href", "https://ci.example/42"
    )
    expect(posted.locator("strong")).to_have_text("succeeded")


def newcomer_sees_the_app(browser: Browser, node: RunningNode, cara: Person) -> None:
    from playwright.sync_api import expect

    _, page = open_page(browser, node.http, cara.token)
    conversation(page, "Deploys").click()
    expect(messages(page).filter(has_text="Deploy #42 succeeded")).to_have_count(1)
    expect(messages(page).filter(has_text="Release ready")).to_have_count(1)
