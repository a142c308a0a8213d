"""Schedules in a real browser (docs/schedules.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. Ann writes a message in #ops and schedules it five seconds ahead
with "Schedule message"; it arrives live for her and for Bob, authored by
the schedule service with an APP badge and "Scheduled by ann" above it.
Meanwhile `/remind me in 5 seconds to stretch` arrives in her DM with the
schedule service. The "Scheduled" list shows what was sent and deletes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import RunningNode, make_channel, running_node
from tests.test_browser import (
    DIALOGS,
    Person,
    acme,
    browser_thread,
    conversation,
    messages,
    node_client,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser

ARRIVES_MS = 15_000  # five seconds ahead, a scheduler nap, and a loaded machine


async def test_schedule_a_message_and_a_reminder(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as a, node_client(node, bob) as b:
                await make_channel(a, "ops", b)
            await browser.run(lambda br: schedule_and_remind(br, node, ann, bob))
            assert DIALOGS == []


def schedule_and_remind(browser: Browser, node: RunningNode, ann: Person, bob: Person) -> None:
    from playwright.sync_api import expect

    _, reader = open_page(browser, node.http, bob.token)
    conversation(reader, "#ops").click()
    _, page = open_page(browser, node.http, ann.token)
    conversation(page, "#ops").click()
    page.get_by_role("textbox", name="Message").fill("Stand-up in the big room")
    page.get_by_role("button", name="Schedule message").click()
    dialog = page.get_by_role("dialog", name="Schedule message")
    expect(dialog.get_by_role("button", name="Tomorrow 9:00")).to_be_visible()
    soon = page.evaluate(
        """() => { const at = new Date(Date.now() + 5000); const p = (n) => String(n).padStart(2, "0");
        return `${at.getFullYear()}-${p(at.getMonth() + 1)}-${p(at.getDate())}T${p(at.getHours())}:${p(at.getMinutes())}:${p(at.getSeconds())}`; }"""
    )
    dialog.get_by_label("Send at").fill(soon)
    dialog.get_by_role("button", name="Schedule").click()
    expect(page.get_by_role("status").filter(has_text="Scheduled for")).to_be_visible()
    expect(page.get_by_role("textbox", name="Message")).to_have_value("")

    box = page.get_by_role("textbox", name="Message")
    box.fill("/remind me in 5 seconds to stretch")
    box.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Reminder set")).to_be_visible()

    for viewer in (page, reader):
        posted = messages(viewer).filter(has_text="Stand-up in the big room")
        expect(posted).to_have_count(1, timeout=ARRIVES_MS)
        expect(posted).to_contain_text("Schedule")
        expect(posted).to_contain_text("APP")
        expect(posted).to_contain_text("Scheduled by ann")

    conversation(page, "Schedule").click()
    reminder = messages(page).filter(has_text="stretch")
    expect(reminder).to_have_count(1, timeout=ARRIVES_MS)
    expect(reminder).to_contain_text("Scheduled by ann")

    page.get_by_text("Scheduled", exact=True).click()
    listed = page.get_by_role("list", name="Scheduled messages").get_by_role("listitem")
    expect(listed).to_have_count(2)
    first = listed.filter(has_text="Stand-up in the big room")
    expect(first).to_contain_text("in #ops")
    expect(first).to_contain_text("sent")
    first.get_by_role("button", name="Delete").click()
    expect(listed).to_have_count(1)
