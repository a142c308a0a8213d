"""The web client on a phone-sized screen, in a real browser.

The same harness as tests/test_browser.py. At 375, 320 and 414 px wide the
client shows one pane at a time (the conversation list, a conversation, the
side panel) with a Back button between them, and on every screen, the dialogs
included, nothing is wider than the viewport and the controls that matter can
be clicked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from tests.nodes import running_node
from tests.test_browser import (
    STEP_MS,
    browser_thread,
    conversation,
    messages,
    new_person,
    new_workspace,
    node_client,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

WIDTHS = (375, 320, 414)
HEIGHT = 740
LONG_WORD = "Supercalifragilistic" * 6
LONG_URL = "https://example.com/" + "a-very-long-path-segment/" * 8 + "end"
CODE = "```\n" + "x = compute(" + ", ".join(f"argument_{n}" for n in range(30)) + ")\n```"
ROOT = "Who reviews the deploy checklist?"

# Every element on screen lies within the viewport, save what a code block
# scrolls sideways inside itself and the visually hidden screen-reader text.
OVERFLOW = """() => {
    const width = window.innerWidth;
    const wide = [];
    for (const node of document.querySelectorAll("body *")) {
        if (node.closest("pre, .skip, .sr-only")) continue;
        const rect = node.getBoundingClientRect();
        if (!rect.width || !rect.height) continue;
        if (rect.left < -1 || rect.right > width + 1) {
            wide.push(`${node.tagName.toLowerCase()}.${node.className} ${Math.round(rect.left)}..${Math.round(rect.right)}`);
        }
    }
    return { scrollWidth: document.documentElement.scrollWidth, width, wide: wide.slice(0, 5) };
}"""


def fits(page: Page, screen: str) -> None:
    found: dict[str, Any] = page.evaluate(OVERFLOW)
    assert found["scrollWidth"] <= found["width"], (screen, found)
    assert found["wide"] == [], (screen, found)


def reachable(page: Page, control: Locator) -> None:
    """On screen, inside the viewport's width, and nothing covers it."""
    from playwright.sync_api import expect

    expect(control).to_be_visible()
    box = control.bounding_box()
    assert box is not None
    width = page.viewport_size["width"] if page.viewport_size else 0
    assert box["x"] >= 0, box
    assert box["x"] + box["width"] <= width + 1, box
    control.click(trial=True)


def walk(browser: Browser, base: str, token: str, width: int) -> list[str]:
    """Every screen at one width; returns the browser dialogs met (none expected)."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": width, "height": HEIGHT})
    context.set_default_timeout(STEP_MS)
    page = context.new_page()
    alerts: list[str] = []
    page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
    back = page.get_by_role("button", name="Back")
    nav = page.get_by_role("navigation", name="Conversations")
    try:
        page.goto(base + "/")
        reachable(page, page.get_by_label("Token"))
        fits(page, "sign-in")
        page.get_by_label("Token").fill(token)
        page.get_by_role("button", name="Sign in").click()

        # Signed in: the last conversation, alone on screen, long lines wrapped.
        expect(page.get_by_role("heading", name="#general")).to_be_visible()
        expect(messages(page).filter(has_text="argument_29")).to_have_count(1)
        expect(page.get_by_role("status").first).to_have_text("Connected")
        expect(nav).to_be_hidden()
        for name in ("Back", "Members", "Leave", "Send"):
            reachable(page, page.get_by_role("button", name=name, exact=True))
        reachable(page, page.get_by_role("textbox", name="Message"))
        reachable(page, page.get_by_role("searchbox", name="Search"))
        fits(page, "conversation")

        # A message's actions open under it when it is tapped.
        mine = messages(page).filter(has_text=LONG_WORD[:40])
        mine.click(position={"x": 6, "y": 6})
        reachable(page, mine.get_by_role("button", name="Delete", exact=True))
        fits(page, "message actions")
        mine.get_by_role("button", name="Delete", exact=True).click()
        confirm = page.get_by_role("dialog", name="Delete this message?")
        reachable(page, confirm.get_by_role("button", name="Cancel"))
        fits(page, "delete confirmation")
        confirm.get_by_role("button", name="Cancel").click()

        page.get_by_role("button", name="Leave", exact=True).click()
        confirm = page.get_by_role("dialog", name="Leave #general?")
        reachable(page, confirm.get_by_role("button", name="Leave channel"))
        fits(page, "leave confirmation")
        confirm.get_by_role("button", name="Cancel").click()

        page.get_by_role("button", name="Members", exact=True).click()
        remove = (
            page.get_by_role("listitem")
            .filter(has_text="@bob")
            .get_by_role("button", name="Remove")
        )
        reachable(page, remove)
        expect(page.get_by_role("textbox", name="Message")).to_be_hidden()
        fits(page, "members")
        remove.click()
        confirm = page.get_by_role("dialog", name="Remove @bob from #general?")
        reachable(page, confirm.get_by_role("button", name="Remove member"))
        fits(page, "remove confirmation")
        confirm.get_by_role("button", name="Cancel").click()
        back.click()
        expect(page.get_by_role("textbox", name="Message")).to_be_visible()

        # Back to the list: conversations, the dialogs that start one, the menu.
        back.click()
        expect(nav).to_be_visible()
        expect(page.get_by_role("textbox", name="Message")).to_be_hidden()
        for name in ("Browse channels", "New direct message", "Menu"):
            reachable(page, page.get_by_role("button", name=name, exact=True))
        fits(page, "conversation list")
        page.get_by_role("button", name="Browse channels").click()
        browse = page.get_by_role("dialog", name="Browse channels")
        reachable(page, browse.get_by_role("button", name="Open #design"))
        fits(page, "browse channels")
        browse.get_by_role("button", name="Close").click()
        page.get_by_role("button", name="New direct message").click()
        direct = page.get_by_role("dialog", name="New direct message")
        reachable(page, direct.get_by_role("button", name=re.compile("^bob")))
        fits(page, "new direct message")
        page.keyboard.press("Escape")
        expect(direct).to_be_hidden()
        page.get_by_role("button", name="Menu").click()
        reachable(page, page.get_by_role("button", name="Sign out"))
        fits(page, "menu")
        page.keyboard.press("Escape")
        expect(page.get_by_role("button", name="Sign out")).to_be_hidden()

        # List → conversation → thread, and back.
        conversation(page, "#design").click()
        expect(page.get_by_role("heading", name="#design")).to_be_visible()
        expect(nav).to_be_hidden()
        root = messages(page).filter(has_text=ROOT)
        root.get_by_role("button", name=re.compile("^1 reply")).click()
        replies = page.get_by_role("log", name="Thread replies")
        expect(replies.get_by_role("article")).to_have_count(1)
        expect(page.get_by_role("log", name="Messages")).to_be_hidden()
        reachable(page, page.get_by_role("textbox", name="Reply"))
        reachable(page, back)
        fits(page, "thread")
        back.click()
        expect(replies).to_be_hidden()
        expect(page.get_by_role("heading", name="#design")).to_be_visible()
        back.click()
        expect(nav).to_be_visible()

        # Search results take the screen too; Back leaves them.
        search = page.get_by_role("searchbox", name="Search")
        search.fill("deploy")
        search.press("Enter")
        results = page.get_by_role("list", name="Search results")
        expect(results.or_(page.get_by_text("Search is not ready yet"))).to_be_visible()
        reachable(page, back)
        fits(page, "search results")
        back.click()
        expect(results).to_be_hidden()

        if width == WIDTHS[-1]:
            # Saying yes: the channel is left and the list comes back without it.
            page.get_by_role("button", name="Leave", exact=True).click()
            page.get_by_role("dialog", name="Leave #design?").get_by_role(
                "button", name="Leave channel"
            ).click()
            expect(nav).to_be_visible()
            expect(conversation(page, "#design")).to_have_count(0)
            fits(page, "after leaving")

        page.get_by_role("button", name="Menu").click()
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("button", name="Sign in")).to_be_visible()
        return alerts
    finally:
        context.close()


@pytest.mark.runs_for(18)
async def test_one_pane_at_a_time_and_nothing_wider_than_a_phone(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            await new_person(node, workspace, "bob")
            async with node_client(node, ann) as client:
                await client.request("createChannel", slug="design", name="Design")
                await client.send("#design", ROOT)
                page = await client.request("history", target="#design", limit=10)
                root_id = page["messages"][0]["id"]
                await client.send(f"#design:{root_id}", "I will, after lunch.")
                await client.send("#general", f"A long word: {LONG_WORD} and a link {LONG_URL}")
                await client.send("#general", CODE)

            for width in WIDTHS:

                def at_width(browser: Browser, width: int = width) -> list[str]:
                    return walk(browser, node.http, ann.token, width)

                assert await browser.run(at_width) == [], width
