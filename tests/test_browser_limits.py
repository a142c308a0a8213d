"""The web client against the node's rate limits, in a real browser.

The same harness as tests/test_browser.py. A node with a small read bucket
refuses most of a burst of reads; the client waits for each refused read's
turn (``details.retryAfterMs``) and asks again, so every read is answered.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import running_node
from tests.test_browser import (
    browser_thread,
    conversation,
    new_person,
    new_workspace,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser


# Eight reads at once against a bucket of two that refills five a second: six
# are refused at first, and the last is answered about a second later.
READS = 8
BURST_OF_READS = """async (count) => {
    const { request } = await import("/connection.js");
    const reads = Array.from({ length: count }, () =>
        request("history", { target: "#general", limit: 1 }).then(
            (page) => (Array.isArray(page.messages) ? "answered" : "odd"),
            (error) => error.code,
        ),
    );
    return Promise.all(reads);
}"""


async def test_a_refused_read_is_asked_again_at_its_turn(database_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with (
            browser_thread() as browser,
            running_node(database_url, tmp_path, read_rate=5.0, read_burst=2) as node,
        ):
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")

            def burst(browser: Browser) -> list[str]:
                _, page = open_page(browser, node.http, ann.token)
                expect(conversation(page, "#general")).to_be_visible()
                # The client's own start-up reads have spent the bucket by now.
                answers: list[str] = page.evaluate(BURST_OF_READS, READS)
                return answers

            assert await browser.run(burst) == ["answered"] * READS
            refused = node.services.metrics.errors
            assert sum(n for code, n in refused.items() if "rate_limited" in code) >= READS - 2
