"""Reading back through a conversation in a real browser.

The same harness as tests/test_browser.py, one node and one browser for the
module. Reaching the top of a long channel loads the page before it, again and
again until its first message, without moving what the reader was looking at;
a conversation opened with unread messages shows a "New messages" line before
the first of them (older pages fetched first when it is further back); a send
longer than the node's row limit, stored as several rows, reads as one message
for its author and a reader, live and after reload.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
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
    send,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

ARCHIVE = 400  # the first page and four older ones (node/web/store.js: PAGE, OLDER_PAGE)
READ = 20
UNREAD = 30
BACKLOG = 80  # more unread than the first page holds
LONG = "LONGSTART " + "word " * 8000 + "LONGEND"  # about 40,000 characters: three rows

SEQS = "as => as.map(a => Number(a.dataset.seq))"


async def seed(client: Any, target: str, texts: list[str], at_once: int = 16) -> None:
    # Sends on one connection are answered out of order; a few in flight
    # keep the archive's setup to a second or two.
    limit = trio.Semaphore(at_once)

    async def one(text: str) -> None:
        async with limit:
            result = await client.send(target, text)
            assert result["state"] == "sent", result

    async with trio.open_nursery() as nursery:
        for text in texts:
            nursery.start_soon(one, text)


def seqs(page: Page) -> list[int]:
    shown: list[int] = messages(page).evaluate_all(SEQS)
    return shown


# One evaluation finds the first message and scrolls to it: a locator's element
# can be replaced by a re-render (a read mark's answer) between being found and
# being scrolled, and a detached element scrolls nothing.
SCROLL_TO_FIRST = """() => {
  const first = document.querySelector("#messages article");
  first.scrollIntoView({block: "start"});
  return Number(first.dataset.seq);
}"""


AROUND_LINE = """() => {
  const line = document.querySelector("#messages .new-line");
  return [line.previousElementSibling.textContent, line.nextElementSibling.textContent];
}"""


def scroll_to_top(page: Page) -> int:
    top: int = page.evaluate(SCROLL_TO_FIRST)
    return top


def scrolls_to_message_one(page: Page) -> None:
    from playwright.sync_api import expect

    conversation(page, "#archive").click()
    expect(messages(page).last).to_contain_text(f"archived {ARCHIVE:04d}")
    loads = 0
    while seqs(page)[0] != 1:
        before = messages(page).count()
        top = scroll_to_top(page)
        expect(messages(page)).not_to_have_count(before)
        # What was at the top stays on screen: the page came in above it.
        expect(page.locator(f'#messages article[data-seq="{top}"]')).to_be_in_viewport()
        loads += 1
        assert loads < ARCHIVE // 50 + 3
    shown = seqs(page)
    assert shown == list(range(1, len(shown) + 1)), "every message exactly once, in order"
    assert len(shown) >= ARCHIVE
    expect(messages(page).filter(has_text="archived 0001")).to_have_count(1)
    expect(page.get_by_role("button", name="Load older messages")).to_be_hidden()

    # Far from the newest: a button brings it back.
    jump = page.get_by_role("button", name="Jump to latest")
    expect(jump).to_be_visible()
    jump.click()
    expect(messages(page).filter(has_text=f"archived {ARCHIVE:04d}")).to_be_in_viewport()
    expect(jump).to_be_hidden()


def new_messages_line(page: Page, last_read: str, first_unread: str) -> None:
    from playwright.sync_api import expect

    line = page.get_by_role("log", name="Messages").get_by_role("separator", name="New messages")
    expect(line).to_have_count(1)
    expect(line).to_be_in_viewport()
    # Read in one evaluation of the live page, as SCROLL_TO_FIRST does.
    before, after = page.evaluate(AROUND_LINE)
    assert first_unread in after, after
    assert last_read in before, before


def one_article(page: Page) -> None:
    from playwright.sync_api import expect

    long = messages(page).filter(has_text="LONGSTART")
    expect(long).to_have_count(1)
    expect(long).to_contain_text("LONGEND")
    expect(messages(page).filter(has_text="word word")).to_have_count(1)


@pytest.mark.runs_for(17)
async def test_history_scrolls_marks_unread_and_folds_long_sends(
    database_url: str, tmp_path: Path
) -> None:
    # Bounded, with room for a busy machine (alone it takes about 12 s).
    with trio.fail_after(150):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as client:
                await client.request("createChannel", slug="archive", name="Archive")
                texts = [f"archived {n:04d}" for n in range(1, ARCHIVE + 1)]
                await seed(client, "#archive", texts[:-1])
                # The newest is sent last so it is the one at the bottom.
                await client.send("#archive", texts[-1])
                for n in range(1, READ + 1):
                    await client.send("#general", f"read {n:02d}")
                last = (await client.history("#general", limit=1))["messages"][-1]
                backlog = await client.request("createChannel", slug="backlog", name="Backlog")
                for n in range(1, READ + 1):
                    await client.send("#backlog", f"seen before {n:02d}")
            async with node_client(node, bob) as client:
                await client.request("markRead", scopeId=last["scopeId"], seq=last["seq"])
                await client.request("join", scopeId=backlog["scopeId"])
            async with node_client(node, ann) as client:
                for n in range(1, UNREAD + 1):
                    await client.send("#general", f"unread {n:02d}")
                for n in range(1, BACKLOG + 1):
                    await client.send("#backlog", f"backlog {n:02d}")

            await browser.run(lambda b: unread_then_long(b, node, ann, bob))
            await browser.run(
                lambda b: scrolls_to_message_one(open_page(b, node.http, ann.token)[1])
            )
            assert DIALOGS == []


def unread_then_long(browser: Browser, node: RunningNode, ann: Person, bob: Person) -> None:
    from playwright.sync_api import expect

    bob_context, reader = open_page(browser, node.http, bob.token)
    expect(messages(reader).last).to_contain_text(f"unread {UNREAD:02d}")
    new_messages_line(reader, f"read {READ:02d}", "unread 01")

    ann_context, author = open_page(browser, node.http, ann.token)
    expect(messages(author).last).to_contain_text(f"unread {UNREAD:02d}")
    send(author, LONG)
    for page in (author, reader):
        one_article(page)
    for page in (author, reader):
        page.reload()
        expect(messages(page).last).to_contain_text("LONGEND")
        one_article(page)
    ann_context.close()

    # The first unread is pages back: the line waits until it is loaded.
    conversation(reader, "#backlog").click()
    expect(messages(reader).last).to_contain_text(f"backlog {BACKLOG:02d}")
    new_messages_line(reader, f"seen before {READ:02d}", "backlog 01")
    bob_context.close()
