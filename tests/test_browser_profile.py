"""A profile rename and Markdown blocks, in a real browser.

The same harness as tests/test_browser.py, one node and one browser for the
module. Ann renames herself and picks an avatar colour from the Profile
dialog; Bob, with their channel
open and its members panel showing, sees her new name on her messages, in
the panel and in his DM list, without a reload. Before that, lists, headings
and fenced code that starts mid-line render as such, no content runs, and
"Open" on an attachment shows the file in a new tab through a signed link.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import Person, RunningNode, World, running_node
from tests.test_browser import DIALOGS, browser_thread, conversation, messages, open_page
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

NEW_NAME = "Ann Example"
LISTS = "Steps:\n- first\n- second\n  - nested\n* starred\n\n1. one\n2. two"
HEADINGS = "# Big title\n## Smaller\n### Smallest\nplain after"
FENCE = "look at this: ```python\nprint('hi')\n```\nand after"
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201a2d1a0b60000000049454e44ae426082"
)
HOSTILE = '- <img src=x onerror="window.__pwned=1">\n# <script>window.__pwned=2</script>'


SLOW_LINES = r"""async () => {
  const { renderMarkdown } = await import("/markdown.js");
  const n = 50000;
  const texts = [
    "# a" + " ".repeat(n) + "b",
    "x " + "`".repeat(n) + "y`",
    "- a" + " ".repeat(n) + "\u2028",
    "`".repeat(n) + "a\u2028",
    "a ~~~\n".repeat(5000),
  ];
  const start = performance.now();
  for (const text of texts) renderMarkdown(text, null);
  return performance.now() - start;
}"""


async def test_rename_shows_live_and_markdown_blocks_render(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            world = await World.create(node, "acme")
            ann, bob = await world.members("ann", "bob")
            async with world.client(ann) as client:
                team = await client.request("createChannel", slug="team", name="Team")
                await client.request("invite", scopeId=team["scopeId"], memberId=bob.id)
                await client.send("#team", "hello from ann")
                await client.send(f"dm:{bob.id}", "a direct hello")
                for text in (LISTS, HEADINGS, FENCE, HOSTILE):
                    await client.send("#team", text)
                dot = await client.upload(PNG, "dot.png", "image/png")
                await client.send("#team", "a picture", attachmentIds=[dot["attachmentId"]])
            await browser.run(lambda b: rename_live(b, node, ann, bob))
            assert DIALOGS == []


def rename_live(browser: Browser, node: RunningNode, ann: Person, bob: Person) -> None:
    from playwright.sync_api import expect

    bob_context, reader = open_page(browser, node.http, bob.token)
    conversation(reader, "#team").click()
    hello = messages(reader).filter(has_text="hello from ann")
    expect(hello).to_have_accessible_name(re.compile("^ann @ann"))
    expect(conversation(reader, "ann")).to_be_visible()
    reader.get_by_role("button", name="Members", exact=True).click()
    panel = reader.get_by_role("complementary")
    expect(panel.get_by_role("listitem").filter(has_text="@ann")).to_contain_text("ann")
    markdown_blocks(reader)
    opens_in_a_tab(reader)

    ann_context, author = open_page(browser, node.http, ann.token)
    author.get_by_role("button", name="Profile").click()
    dialog = author.get_by_role("dialog", name="Profile")
    name = dialog.get_by_role("textbox", name="Display name")
    name.fill("\u202eevil")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.get_by_role("alert")).to_contain_text("not accepted")
    name.fill(NEW_NAME)
    dialog.get_by_role("combobox", name="Avatar colour").select_option("teal")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(author.get_by_text(f"{NEW_NAME} (@ann)")).to_be_visible()

    # Bob never reloads.
    expect(hello).to_have_accessible_name(re.compile(f"^{NEW_NAME} @ann"))
    avatar = hello.locator(".avatar")  # decoration, hidden from assistive technology
    expect(avatar).to_have_class(re.compile(r"\bavatar-teal\b"))
    expect(avatar).to_have_text("AE")
    expect(panel.get_by_role("listitem").filter(has_text="@ann")).to_contain_text(NEW_NAME)
    expect(conversation(reader, NEW_NAME)).to_be_visible()
    ann_context.close()
    bob_context.close()


def opens_in_a_tab(page: Page) -> None:
    """ "Open" shows the file in a new tab: a signed link, not a 401."""
    with page.context.expect_page() as opened:
        page.get_by_role("link", name="Open dot.png").click()
    tab = opened.value
    tab.wait_for_url("**/v1/attachments/**signature=**")
    tab.wait_for_load_state()
    assert tab.evaluate("() => document.contentType") == "image/png"
    tab.close()


def markdown_blocks(page: Page) -> None:
    from playwright.sync_api import expect

    listed = messages(page).filter(has_text="Steps:")
    top = listed.get_by_role("list").first
    expect(top.get_by_role("listitem")).to_have_count(4)  # the nested one counted inside
    expect(top.get_by_role("list").get_by_role("listitem")).to_have_text(["nested"])
    expect(listed.locator("ol > li")).to_have_text(["one", "two"])

    headed = messages(page).filter(has_text="Big title")
    # Styled text, not headings of the page's outline.
    expect(headed.get_by_role("heading")).to_have_count(0)
    expect(headed.locator("p.md-heading strong")).to_have_text(["Big title", "Smaller", "Smallest"])
    expect(headed).to_contain_text("plain after")

    fenced = messages(page).filter(has_text="look at this")
    expect(fenced.locator("pre")).to_have_count(1)
    expect(fenced.locator("pre code")).to_have_text("print('hi')")
    expect(fenced.locator("pre")).to_have_attribute("data-lang", "python")
    expect(fenced.locator("p").last).to_have_text("and after")

    # A message is rendered on every reader's page: no pattern may backtrack
    # over a long run of one character (each of these took seconds that way).
    took = page.evaluate(SLOW_LINES)
    assert took < 1500, f"rendering long runs took {took:.0f} ms"

    hostile = messages(page).filter(has_text="onerror")
    expect(hostile.locator("li")).to_contain_text('<img src=x onerror="window.__pwned=1">')
    expect(hostile.locator("img, script")).to_have_count(0)
    assert page.evaluate("() => window.__pwned") is None
