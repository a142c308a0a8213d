"""Typing and presence in a real browser (docs/presence.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. Ann types in a DM: within a second bob's page says "ann is typing…"
under the conversation, and it goes within 5 s of her stopping, or at once
when her message arrives. Bob sees ann's presence dot "ann, online" in the
DM list and the members panel; when ann's browser closes, it says offline.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import RunningNode, World, running_node
from tests.test_browser import DIALOGS, browser_thread, conversation, messages, open_page
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

TYPING = "ann is typing…"


def typing_line(page: Page) -> Locator:
    return page.get_by_role("status").filter(has_text=TYPING)


def dm_dot(page: Page, state: str) -> Locator:
    nav = page.get_by_role("navigation", name="Conversations")
    return nav.get_by_role("img", name=f"ann, {state}")


def typing_and_presence(browser: Browser, node: RunningNode, ann: str, bob: str) -> None:
    from playwright.sync_api import expect

    bob_context, reader = open_page(browser, node.http, bob)
    ann_context, writer = open_page(browser, node.http, ann)
    conversation(reader, "ann").click()
    conversation(writer, "bob").click()
    expect(messages(reader).last).to_contain_text("hello bob")
    expect(messages(writer).last).to_contain_text("hello bob")
    expect(dm_dot(reader, "online")).to_be_visible()

    composer = writer.get_by_role("textbox", name="Message")
    composer.press_sequentially("on my w", delay=30)
    expect(typing_line(reader)).to_be_visible(timeout=1_000)
    stopped = time.monotonic()
    expect(typing_line(reader)).to_be_hidden(timeout=5_000)
    assert time.monotonic() - stopped <= 5.0
    expect(typing_line(writer)).to_have_count(0)  # never told of herself

    # Typing again, then the send: the line goes with the message.
    composer.press_sequentially("ay", delay=30)
    expect(typing_line(reader)).to_be_visible(timeout=1_000)
    writer.get_by_role("button", name="Send").click()
    expect(messages(reader).last).to_contain_text("on my way")
    expect(typing_line(reader)).to_be_hidden(timeout=500)

    reader.get_by_role("button", name="Members").click()
    panel = reader.get_by_role("complementary", name="Members")
    expect(panel.get_by_role("img", name="ann, online")).to_be_visible()

    ann_context.close()
    expect(dm_dot(reader, "offline")).to_be_visible(timeout=3_000)
    expect(panel.get_by_role("img", name="ann, offline")).to_be_visible()
    bob_context.close()


async def test_typing_and_presence_between_two_browsers(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            world = await World.create(node, "acme")
            ann = await world.member("ann")
            bob = await world.member("bob")
            async with world.client(ann) as client:
                await client.send(f"dm:{bob.id}", "hello bob")
            await browser.run(lambda b: typing_and_presence(b, node, ann.token, bob.token))
            assert DIALOGS == []
