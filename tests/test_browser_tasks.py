"""Tasks in a real browser (docs/tasks.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. Ann turns a message of #general into a task from its actions (title
prefilled, linked to the channel) and assigns Bob; Bob finds it under "Tasks"
in his sidebar and opens it; Ann sets its status to Done and Bob's task view
shows it within a second; the discussion works both ways.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    DIALOGS,
    Person,
    acme,
    browser_thread,
    conversation,
    messages,
    open_page,
    send,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser

LIVE_MS = 1000  # a status change reaches the other context within a second


async def test_task_from_a_message_status_reaches_the_assignee_live(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            await browser.run(lambda b: hand_over(b, node, ann, bob))
            assert DIALOGS == []


def hand_over(browser: Browser, node: RunningNode, ann: Person, bob: Person) -> None:
    from playwright.sync_api import expect

    bob_context, assignee = open_page(browser, node.http, bob.token)
    ann_context, author = open_page(browser, node.http, ann.token)
    conversation(author, "#general").click()
    send(author, "Release notes for 2.0")
    message = messages(author).filter(has_text="Release notes for 2.0")
    message.hover()
    message.get_by_role("button", name="Create task").click()
    title = author.get_by_role("textbox", name="Title")
    expect(title).to_have_value("Release notes for 2.0")
    expect(author.get_by_text("Linked to #general")).to_be_visible()
    author.get_by_role("combobox", name="Assign to").select_option(label="bob")
    author.locator("#task-form").get_by_role("button", name="Create task").click()

    # Ann is in the task: its bar, and the task in her sidebar.
    status = author.get_by_role("combobox", name="Status")
    expect(status).to_have_value("open")
    expect(author.get_by_role("list", name="Assignees")).to_contain_text("bob")
    expect(author.get_by_role("heading", name="Release notes for 2.0")).to_be_visible()

    # Bob finds it under Tasks, without a reload, and opens it.
    task_link = assignee.get_by_role("list", name="Tasks").get_by_role(
        "link", name=re.compile("^Release notes for 2.0")
    )
    expect(task_link).to_be_visible()
    task_link.click()
    bob_status = assignee.get_by_role("combobox", name="Status")
    expect(bob_status).to_have_value("open")

    # A status change reaches Bob's open task view within a second.
    status.select_option("done")
    expect(bob_status).to_have_value("done", timeout=LIVE_MS)
    expect(task_link).to_contain_text("Done", timeout=LIVE_MS)

    # The discussion, both ways.
    send(assignee, "Drafted, please review")
    expect(messages(author).filter(has_text="Drafted, please review")).to_have_count(1)
    send(author, "Looks good")
    expect(messages(assignee).filter(has_text="Looks good")).to_have_count(1)

    # The task's card in #general opens the task.
    conversation(assignee, "#general").click()
    card = messages(assignee).filter(has_text="Task: Release notes for 2.0")
    expect(card).to_have_count(1)
    card.hover()
    card.get_by_role("button", name="Open task").click()
    expect(bob_status).to_have_value("done")
    ann_context.close()
    bob_context.close()
