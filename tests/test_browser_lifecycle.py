"""The message lifecycle in a real browser: reactions, edits, deletes, quotes
and forwards, attachments, the moderation boundary and search.

The same harness as tests/test_browser.py (Playwright's sync API on a thread
of its own, Debian's Chromium); pages are found through their accessibility
contract only: "Add reaction", "Edit", "Delete", "Search" and the rest.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from tests.nodes import running_node
from tests.test_browser import (
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
    from playwright.sync_api import Browser, FilePayload, Locator, Page


SEARCH_READY_TRIES = 20
SEARCH_READY_PAUSE_MS = 500  # 20 tries: ten seconds for the index to be ready


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A small solid-colour PNG (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def message(page: Page, text: str) -> Locator:
    """The message whose own text (not a message it quotes) contains ``text``."""
    own = page.locator(":scope > .content, :scope > .tombstone", has_text=text)
    found: Locator = messages(page).filter(has=own)
    return found


def action(page: Page, text: str, name: str) -> Locator:
    """A message's action button (shown on hover, like a mouse user meets it)."""
    article = message(page, text)
    article.hover()
    return article.get_by_role("button", name=name, exact=True)


def reaction(page: Page, text: str, label: str) -> Locator:
    return (
        message(page, text)
        .get_by_role("group", name="Reactions")
        .get_by_role("button", name=label, exact=True)
    )


async def test_reactions_edit_delete_quote_forward_and_search(
    database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(100):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            base = node.http
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as client:
                design = await client.request("createChannel", slug="design", name="Design")
                await client.send("#general", "lunch at noon?")
            async with node_client(node, bob) as client:
                await client.request("join", scopeId=design["scopeId"])
                await client.send("#design", "bob's draft of the spec")

            def sign_in(browser: Browser) -> tuple[Page, Page]:
                _, ann_page = open_page(browser, base, ann.token)
                _, bob_page = open_page(browser, base, bob.token)
                for page in (ann_page, bob_page):
                    expect(message(page, "lunch at noon?")).to_have_count(1)
                return ann_page, bob_page

            ann_page, bob_page = await browser.run(sign_in)

            def reactions(_: Browser) -> None:
                text = "lunch at noon?"
                action(bob_page, text, "Add reaction").click()
                bob_page.get_by_role("group", name="Pick a reaction").get_by_role(
                    "button", name="React with 👍"
                ).click()
                expect(reaction(bob_page, text, "👍 1")).to_have_attribute("aria-pressed", "true")
                # Live on the other page, not pressed there: it is bob's.
                expect(reaction(ann_page, text, "👍 1")).to_have_attribute("aria-pressed", "false")
                reaction(ann_page, text, "👍 1").click()
                for page in (ann_page, bob_page):
                    expect(reaction(page, text, "👍 2")).to_be_visible()
                expect(reaction(ann_page, text, "👍 2")).to_have_attribute("aria-pressed", "true")
                reaction(ann_page, text, "👍 2").click()  # toggles ann's own off
                for page in (ann_page, bob_page):
                    expect(reaction(page, text, "👍 1")).to_be_visible()
                expect(reaction(ann_page, text, "👍 1")).to_have_attribute("aria-pressed", "false")
                expect(reaction(bob_page, text, "👍 1")).to_have_attribute("aria-pressed", "true")

            await browser.run(reactions)

            def edit(_: Browser) -> None:
                send(ann_page, "the review is at 3pm")
                expect(message(bob_page, "the review is at 3pm")).to_have_count(1)
                # Only the author is offered Edit.
                message(bob_page, "the review is at 3pm").hover()
                expect(
                    message(bob_page, "the review is at 3pm").get_by_role(
                        "button", name="Edit", exact=True
                    )
                ).to_have_count(0)
                action(ann_page, "the review is at 3pm", "Edit").click()
                box = ann_page.get_by_role("textbox", name="Edit message")
                expect(box).to_have_value("the review is at 3pm")
                box.fill("the review is at 4pm")
                ann_page.get_by_role("button", name="Save").click()
                for page in (ann_page, bob_page):
                    edited = message(page, "the review is at 4pm")
                    expect(edited).to_have_count(1)
                    expect(edited).to_contain_text("(edited)")
                    expect(message(page, "3pm")).to_have_count(0)

            await browser.run(edit)

            def delete(_: Browser) -> None:
                send(ann_page, "oops, wrong channel")
                expect(message(bob_page, "oops, wrong channel")).to_have_count(1)
                action(ann_page, "oops, wrong channel", "Delete").click()
                dialog = ann_page.get_by_role("dialog", name="Delete this message?")
                expect(dialog).to_contain_text("oops, wrong channel")
                dialog.get_by_role("button", name="Cancel").click()
                expect(message(ann_page, "oops, wrong channel")).to_have_count(1)
                action(ann_page, "oops, wrong channel", "Delete").click()
                dialog.get_by_role("button", name="Delete message").click()
                for page in (ann_page, bob_page):
                    expect(message(page, "oops, wrong channel")).to_have_count(0)
                    expect(message(page, "message deleted")).to_have_count(1)
                # bob may not delete ann's message in #general: no button.
                message(bob_page, "lunch at noon?").hover()
                expect(
                    message(bob_page, "lunch at noon?").get_by_role(
                        "button", name="Delete", exact=True
                    )
                ).to_have_count(0)
                # ann owns #design: she is offered Delete on bob's message there.
                conversation(ann_page, "#design").click()
                expect(action(ann_page, "bob's draft", "Delete")).to_have_count(1)
                expect(action(ann_page, "bob's draft", "Edit")).to_have_count(0)
                conversation(ann_page, "#general").click()
                expect(message(ann_page, "lunch at noon?")).to_have_count(1)

            await browser.run(delete)

            def quote_and_forward(_: Browser) -> None:
                action(bob_page, "lunch at noon?", "Quote").click()
                expect(bob_page.get_by_role("group", name="Quoting")).to_contain_text(
                    "lunch at noon?"
                )
                send(bob_page, "yes please, the usual place")
                for page in (bob_page, ann_page):
                    reply = message(page, "yes please")
                    expect(reply).to_have_count(1)
                    quoted = reply.locator("blockquote.source")
                    expect(quoted).to_contain_text("lunch at noon?")
                    expect(quoted).to_contain_text("ann")

                action(bob_page, "lunch at noon?", "Forward").click()
                dialog = bob_page.get_by_role("dialog", name="Forward message")
                dialog.get_by_role("textbox", name="Add a comment (optional)").fill("FYI")
                dialog.get_by_role("button", name="Forward to #design").click()
                expect(bob_page.get_by_role("heading", name="#design")).to_be_visible()
                conversation(ann_page, "#design").click()
                forwarded = message(ann_page, "FYI")
                expect(forwarded).to_have_count(1)
                expect(forwarded.locator("blockquote.source")).to_contain_text("lunch at noon?")
                expect(forwarded.locator("blockquote.source")).to_contain_text(
                    "Forwarded from #general"
                )

            await browser.run(quote_and_forward)

            def search(_: Browser) -> None:
                messages(ann_page).last.press("/")  # Ctrl+K switches conversations
                box = ann_page.get_by_role("searchbox", name="Search")
                expect(box).to_be_focused()
                box.fill("noon")
                results = ann_page.get_by_role("list", name="Search results")
                not_ready = ann_page.get_by_text("Search is not ready yet")
                # A new workspace's index is ready from the start; "not ready"
                # may only be a moment's, so it is asked again for a bounded time.
                for _ in range(SEARCH_READY_TRIES):
                    box.press("Enter")
                    expect(results.or_(not_ready)).to_be_visible()
                    if results.is_visible():
                        break
                    ann_page.wait_for_timeout(SEARCH_READY_PAUSE_MS)
                else:
                    pytest.fail("search stayed not ready in a new workspace")
                hit = results.get_by_role("button").filter(has_text="lunch at noon?")
                expect(hit).to_have_count(1)
                expect(hit.locator("mark")).to_have_text(["noon"])
                expect(hit).to_contain_text("#general")
                expect(hit).to_contain_text("ann")
                hit.click()
                expect(ann_page.get_by_role("heading", name="#general")).to_be_visible()
                expect(message(ann_page, "lunch at noon?")).to_be_in_viewport()

            await browser.run(search)


async def test_a_click_survives_a_message_arriving_between_press_and_release(
    database_url: str, tmp_path: Path
) -> None:
    """A message that reaches the open conversation while a button on another
    message is held down does not swallow the click: the timeline's redraw
    waits for the release (redrawn at once, the pressed button was replaced
    and the browser gave the click to no one)."""
    from playwright.sync_api import expect

    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as client:
                created = await client.request("createChannel", slug="design", name="design")
                await client.send("#design", "first words")
            async with node_client(node, bob) as client:
                await client.request("join", scopeId=created["scopeId"])
            frames: list[str] = []

            def press(browser: Browser) -> Page:
                _, page = open_page(browser, node.http, bob.token, frames)
                conversation(page, "#design").click()
                quote = action(page, "first words", "Quote")
                expect(quote).to_be_visible()
                box = quote.bounding_box()
                assert box is not None
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                expect(quote).to_be_visible()  # still under the pointer after any redraw
                page.mouse.down()
                return page

            page = await browser.run(press)
            async with node_client(node, ann) as client:
                await client.send("#design", "arriving mid-press")

            def release(_: Browser) -> None:
                for _ in range(200):
                    if any("arriving mid-press" in frame for frame in frames):
                        break
                    page.wait_for_timeout(50)
                else:
                    raise AssertionError("the message never reached the page")
                page.wait_for_timeout(300)  # the page handles the frame before the release
                page.mouse.up()
                expect(page.get_by_role("group", name="Quoting")).to_contain_text("first words")
                expect(message(page, "arriving mid-press")).to_have_count(1)

            await browser.run(release)


async def test_attachments_by_button_and_drop_and_the_moderation_message(
    database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    words = tmp_path / "moderation.txt"
    words.write_text("# blocked in this workspace\ndarn\n", encoding="utf-8")
    image = png(48, 24, (220, 40, 40))
    with trio.fail_after(90):
        async with (
            browser_thread() as browser,
            running_node(database_url, tmp_path, moderation_file=words) as node,
        ):
            base = node.http
            ann, bob = await acme(node, "ann", "bob")

            def sign_in(browser: Browser) -> tuple[Page, Page]:
                _, ann_page = open_page(browser, base, ann.token)
                _, bob_page = open_page(browser, base, bob.token)
                for page in (ann_page, bob_page):
                    expect(conversation(page, "#general")).to_be_visible()
                    expect(page.get_by_role("textbox", name="Message")).to_be_enabled()
                return ann_page, bob_page

            ann_page, bob_page = await browser.run(sign_in)

            def upload_by_button(_: Browser) -> None:
                with ann_page.expect_file_chooser() as chooser:
                    ann_page.get_by_role("button", name="Attach files").click()
                chart: FilePayload = {"name": "chart.png", "mimeType": "image/png", "buffer": image}
                chooser.value.set_files(files=[chart])
                expect(ann_page.get_by_text("ready")).to_be_visible()
                send(ann_page, "the chart")
                for page in (ann_page, bob_page):
                    posted = message(page, "the chart")
                    expect(posted).to_have_count(1)
                    preview = posted.get_by_role("img", name="chart.png")
                    expect(preview).to_have_attribute("src", re.compile("^blob:"))
                    page.wait_for_function(
                        "img => img.complete && img.naturalWidth === 48",
                        arg=preview.element_handle(),
                    )
                with bob_page.expect_download() as download:
                    message(bob_page, "the chart").get_by_role(
                        "link", name="Download chart.png"
                    ).click()
                assert download.value.suggested_filename == "chart.png"
                saved = download.value.path()
                assert Path(saved).read_bytes() == image

            await browser.run(upload_by_button)

            def upload_by_drop(_: Browser) -> None:
                data = ann_page.evaluate_handle(
                    """() => {
                        const data = new DataTransfer();
                        data.items.add(new File(["minutes of the day"], "notes.txt",
                                                {type: "text/plain"}));
                        return data;
                    }"""
                )
                ann_page.dispatch_event("section.main", "dragover", {"dataTransfer": data})
                expect(ann_page.get_by_text("Drop files to attach them")).to_be_visible()
                ann_page.dispatch_event("section.main", "drop", {"dataTransfer": data})
                expect(ann_page.get_by_text("Drop files to attach them")).to_be_hidden()
                expect(ann_page.get_by_text("ready")).to_be_visible()
                send(ann_page, "notes attached")
                posted = message(bob_page, "notes attached")
                expect(posted.get_by_role("link", name="Download notes.txt")).to_be_visible()
                assert posted.get_by_role("img").count() == 0  # not an image: no preview

            await browser.run(upload_by_drop)

            def moderation(_: Browser) -> None:
                send(bob_page, "well darn it")
                note = bob_page.locator("#composer-note")
                expect(note).to_contain_text("not allow")
                expect(note).to_contain_text("darn")
                expect(bob_page.get_by_role("textbox", name="Message")).to_have_value(
                    "well darn it"
                )
                expect(message(bob_page, "well darn it")).to_have_count(0)
                expect(message(ann_page, "well darn it")).to_have_count(0)
                box = bob_page.get_by_role("textbox", name="Message")
                box.fill("well, never mind")
                bob_page.get_by_role("button", name="Send").click()
                expect(message(ann_page, "never mind")).to_have_count(1)
                # An edit to a blocked word is refused in place; the old text stays.
                action(bob_page, "never mind", "Edit").click()
                bob_page.get_by_role("textbox", name="Edit message").fill("well, darn")
                bob_page.get_by_role("button", name="Save").click()
                refused = messages(bob_page).get_by_role("alert")
                expect(refused).to_contain_text("Not saved")
                expect(refused).to_contain_text("darn")
                expect(bob_page.get_by_role("textbox", name="Edit message")).to_have_value(
                    "well, darn"
                )
                bob_page.get_by_role("button", name="Cancel").click()
                expect(message(bob_page, "well, never mind")).to_have_count(1)
                expect(message(ann_page, "well, never mind")).not_to_contain_text("(edited)")

            await browser.run(moderation)
