"""The web client from the keyboard alone, in a real browser.

The same harness as tests/test_browser.py. The composer has focus after
sign-in and after every switch; a long conversation is one Tab stop (its
messages are walked with the arrow keys, a message's buttons are reached from
the message), so Tab from the composer reaches the conversation list in three
presses; Up in the empty composer edits your last message; Escape closes the
thread and the search results; Ctrl+K switches conversations.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import running_node
from tests.test_browser import (
    DIALOGS,
    browser_thread,
    conversation,
    messages,
    new_person,
    new_workspace,
    node_client,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

COUNT = 40
IN_NAV = "() => Boolean(document.activeElement?.closest('nav[aria-label=Conversations]'))"
IN_LOG = "() => Boolean(document.activeElement?.closest('[role=log][aria-label=Messages]'))"
FOCUSED_TEXT = "() => document.activeElement?.closest('article')?.textContent ?? ''"


def presses_to_the_list(page: Page) -> int:
    for press in range(1, 6):
        page.keyboard.press("Tab")
        assert not page.evaluate(IN_LOG), press  # the long list is not walked by Tab
        if page.evaluate(IN_NAV):
            return press
    return 99


async def test_the_client_from_the_keyboard(database_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            async with node_client(node, ann) as client:
                await client.request("createChannel", slug="design", name="Design")
                await client.send("#design", "design kickoff at ten")
                for n in range(1, COUNT + 1):
                    await client.send("#general", f"status line {n:02d}")

            def keyboard(browser: Browser) -> None:
                _, page = open_page(browser, node.http, ann.token)
                composer = page.get_by_role("textbox", name="Message")
                expect(messages(page)).to_have_count(COUNT)
                expect(composer).to_be_focused()

                # Tab: past the attach and send buttons into the conversation list.
                assert presses_to_the_list(page) <= 3

                # Shift+Tab: the whole log is one stop, the newest message first.
                composer.focus()
                page.keyboard.press("Shift+Tab")
                assert "status line 40" in page.evaluate(FOCUSED_TEXT)
                page.keyboard.press("Shift+Tab")
                assert not page.evaluate(IN_LOG)
                composer.focus()
                page.keyboard.press("Shift+Tab")
                page.keyboard.press("ArrowUp")
                page.keyboard.press("ArrowUp")
                assert "status line 38" in page.evaluate(FOCUSED_TEXT)
                article = messages(page).filter(has_text="status line 38")
                expect(article).to_be_focused()

                # A message's buttons follow it in the Tab order while it has focus.
                page.keyboard.press("Tab")
                expect(article.get_by_role("button", name="Reply in thread")).to_be_focused()
                page.keyboard.press("Enter")
                reply = page.get_by_role("textbox", name="Reply")
                expect(reply).to_be_focused()
                page.keyboard.press("Escape")
                expect(reply).to_be_hidden()
                expect(composer).to_be_focused()

                # Up in the empty composer edits the last message of mine.
                page.keyboard.press("ArrowUp")
                editor = page.get_by_role("textbox", name="Edit message")
                expect(editor).to_be_focused()
                expect(editor).to_have_value(f"status line {COUNT}")
                page.keyboard.type(" (fixed)")
                page.keyboard.press("Enter")
                last = messages(page).filter(has_text="status line 40 (fixed)")
                expect(last).to_contain_text("(edited)")
                expect(composer).to_be_focused()

                # "/" searches; Escape closes the results and returns to the composer.
                page.keyboard.press("Shift+Tab")
                page.keyboard.press("/")
                search = page.get_by_role("searchbox", name="Search")
                expect(search).to_be_focused()
                search.fill("kickoff")
                search.press("Enter")
                panel = page.get_by_role("heading", name="Search", exact=True)
                expect(panel).to_be_visible()
                page.keyboard.press("Escape")
                expect(panel).to_be_hidden()
                expect(composer).to_be_focused()

                # Ctrl+K: type part of a name, Enter opens the first match.
                page.keyboard.press("Control+k")
                switcher = page.get_by_role("dialog", name="Switch conversation")
                expect(switcher).to_be_visible()
                expect(switcher.get_by_role("textbox", name="Find a conversation")).to_be_focused()
                page.keyboard.type("des")
                page.keyboard.press("Enter")
                expect(switcher).to_be_hidden()
                expect(page.get_by_role("heading", name="#design")).to_be_visible()
                expect(messages(page).filter(has_text="design kickoff")).to_have_count(1)
                expect(composer).to_be_focused()
                # Cmd+K as well; Escape closes the switcher where it was opened.
                page.keyboard.press("Meta+k")
                expect(switcher).to_be_visible()
                page.keyboard.press("Escape")
                expect(switcher).to_be_hidden()
                expect(composer).to_be_focused()

                # A switch by mouse lands in the composer too.
                conversation(page, "#general").click()
                expect(page.get_by_role("heading", name="#general")).to_be_visible()
                expect(composer).to_be_focused()
                assert presses_to_the_list(page) <= 3

            await browser.run(keyboard)
            assert DIALOGS == []
