"""Search operators in a real browser.

The same harness as tests/test_browser.py, one node and one browser for the
module. Typing ``from:@ann in:#ops deploy`` in the search box lists only ann's
messages in #ops with the word (or its stem); a search that finds nothing
says what it looked for, filters included, and how to narrow one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import running_node
from tests.test_browser import (
    DIALOGS,
    acme,
    browser_thread,
    node_client,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

SEARCH_TRIES = 5  # "not ready" may be a moment's in a new workspace


def search(page: Page, query: str) -> Locator:
    """Type a query in the search box; the results panel's status line."""
    from playwright.sync_api import expect

    box = page.get_by_role("searchbox", name="Search")
    box.fill(query)
    status = page.locator("#panel-body").get_by_role("status")
    not_ready = page.get_by_text("Search is not ready yet")
    for _ in range(SEARCH_TRIES):
        box.press("Enter")
        expect(status.or_(not_ready)).to_be_visible()
        if status.is_visible():
            return status
        page.wait_for_timeout(200)
    raise AssertionError("search stayed not ready")


async def test_operators_in_the_search_box(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(45):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as a, node_client(node, bob) as b:
                ops = await a.request("createChannel", slug="ops", name="Ops")
                await a.request("createChannel", slug="dev", name="Dev")
                await b.request("join", scopeId=ops["scopeId"])
                await a.send("#ops", "deploying the api now")
                await a.send("#ops", "deployed the worker")
                await a.send("#ops", "lunch at noon")
                await b.send("#ops", "deploy from bob in ops")
                await a.send("#dev", "deploy from ann in dev")

            def operators(browser: Browser) -> None:
                from playwright.sync_api import expect

                context, page = open_page(browser, node.http, ann.token)
                status = search(page, "from:@ann in:#ops deploy")
                results = page.get_by_role("list", name="Search results")
                expect(results.get_by_role("listitem")).to_have_count(2)
                texts = results.get_by_role("button").all_inner_texts()
                assert any("deploying the api now" in t for t in texts), texts
                assert any("deployed the worker" in t for t in texts), texts
                assert all("#ops" in t and "ann" in t for t in texts), texts
                expect(results).not_to_contain_text("bob")
                expect(results).not_to_contain_text("in dev")
                expect(status).to_contain_text("from @ann in #ops")

                # An empty page says what was searched and how to narrow one.
                status = search(page, "from:@bob in:#dev deploy before:2020-01-01")
                expect(status).to_have_text(
                    "Nothing found: searched “deploy” from @bob in #dev before 2020-01-01."
                )
                expect(page.get_by_text("Narrow with from:@name")).to_be_visible()
                expect(page.get_by_role("list", name="Search results")).to_have_count(0)
                context.close()

            await browser.run(operators)
            assert DIALOGS == []
