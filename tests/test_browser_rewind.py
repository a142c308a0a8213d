"""Rewind in a real browser (docs/rewind.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. Ann owns #plans, where she and Bob wrote four messages (seeded over
the protocol). Bob may mark a rewind point but is not offered "Rewind to
here"; Ann rewinds to the first message from its actions. Both open pages
read the conversation again on ``invalidate``: the three later messages are
greyed and collapsed ("rewound"), the notice says who rewound, and reloading
shows the same.
"""

from __future__ import annotations

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
    node_client,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

LIVE_MS = 10_000  # a bound on a hang: the suite's browsers share the machine
LATER = ("second idea", "third idea", "fourth idea")


async def test_rewind_to_here_greys_the_later_messages_for_everyone(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as a, node_client(node, bob) as b:
                made = await a.request("createChannel", slug="plans", name="Plans")
                await b.request("join", scopeId=made["scopeId"])
                await a.send("#plans", "first idea")
                await b.send("#plans", LATER[0])
                await a.send("#plans", LATER[1])
                await b.send("#plans", LATER[2])
            await browser.run(lambda br: rewind_flow(br, node, ann, bob))
            assert DIALOGS == []


def _rewound(page: Page) -> None:
    from playwright.sync_api import expect

    for text in LATER:
        later = (
            messages(page)
            .filter(has_text="Rewound message")
            .filter(has=page.locator(f"text={text}"))
        )
        expect(later).to_have_count(1, timeout=LIVE_MS)
        expect(later.get_by_text(text)).to_be_hidden()  # collapsed
    first = messages(page).filter(has_text="first idea")
    expect(first.get_by_text("Rewound message")).to_have_count(0)
    notice = messages(page).filter(has_text="ann rewound this conversation to message 1")
    expect(notice).to_have_count(1, timeout=LIVE_MS)


def rewind_flow(browser: Browser, node: RunningNode, ann: Person, bob: Person) -> None:
    from playwright.sync_api import expect

    bob_context, reader = open_page(browser, node.http, bob.token)
    ann_context, owner = open_page(browser, node.http, ann.token)
    for page in (reader, owner):
        conversation(page, "#plans").click()
        expect(messages(page).last).to_contain_text(LATER[-1])

    # Bob reads and marks, but the channel is Ann's to rewind.
    theirs = messages(reader).filter(has_text="first idea")
    theirs.hover()
    expect(theirs.get_by_role("button", name="Mark rewind point")).to_be_visible()
    expect(theirs.get_by_role("button", name="Rewind to here")).to_have_count(0)

    first = messages(owner).filter(has_text="first idea")
    first.hover()
    first.get_by_role("button", name="Rewind to here").click()
    dialog = owner.get_by_role("dialog", name="Rewind this conversation to here?")
    dialog.get_by_role("button", name="Rewind").click()

    # Both pages read the conversation again on invalidate.
    for page in (owner, reader):
        _rewound(page)
    # A collapsed message opens on request, still readable.
    hidden = messages(reader).filter(has=reader.locator(f"text={LATER[1]}"))
    hidden.get_by_text("Rewound message").click()
    expect(hidden.get_by_text(LATER[1])).to_be_visible()

    reader.reload()
    conversation(reader, "#plans").click()
    _rewound(reader)
    ann_context.close()
    bob_context.close()
