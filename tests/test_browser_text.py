"""Right-to-left text in a real browser: each message takes the direction of
its own first strong character, and a direction override in one message ends
with it (each content is its own ``dir="auto"`` isolate).

The same harness as tests/test_browser.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import running_node
from tests.test_browser import (
    browser_thread,
    messages,
    new_person,
    new_workspace,
    node_client,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser


HEBREW_FIRST = "שלום לכולם, the deploy is done"
LATIN_FIRST = "the deploy is done, שלום לכולם"
OVERRIDE = "\u202eevil text that runs backwards"
AFTER_OVERRIDE = "plain words after it"
SENT = (HEBREW_FIRST, LATIN_FIRST, OVERRIDE, AFTER_OVERRIDE)


async def test_each_message_is_its_own_direction_isolate(database_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            async with node_client(node, ann) as client:
                for n, text in enumerate(SENT):
                    await client.send("#general", text, clientMessageId=f"m{n}")

            def directions(browser: Browser) -> None:
                _, page = open_page(browser, node.http, ann.token)
                expect(messages(page)).to_have_count(len(SENT))
                # An override is not a strong character: its message, and the
                # one after it, take the direction of their own words.
                for text, direction in zip(SENT, ("rtl", "ltr", "ltr", "ltr"), strict=True):
                    # Expectations retry: the timeline may render a message again.
                    content = messages(page).filter(has_text=text).locator(".content")
                    expect(content).to_have_attribute("dir", "auto")
                    expect(content).to_have_css("direction", direction)

            await browser.run(directions)
