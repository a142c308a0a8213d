"""Joining by invite link in a real browser: the link the admin command prints
opens a form, the new member lands in #general with its history and chats
live with the member who was there; a bad link shows why and no form.

The same harness as tests/test_browser.py: one node and one browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tests.nodes import running_node
from tests.test_browser import (
    STEP_MS,
    admin,
    browser_thread,
    conversation,
    messages,
    new_person,
    new_workspace,
    node_client,
    open_page,
    send,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page


def open_link(browser: Browser, url: str) -> tuple[BrowserContext, Page]:
    """A fresh context whose first page load is ``url`` (a fragment change on a
    loaded page would not start the client again)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(STEP_MS)
    page = context.new_page()
    page.goto(url)
    return context, page


async def test_a_person_joins_by_invite_link_and_chats(database_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "Acme Rockets")
            ann = await new_person(node, workspace, "ann")
            async with node_client(node, ann) as client:
                await client.send("#general", "history from before the invite")
            invite = await admin(node, "create-invite", "--workspace", workspace, "--uses", "1")
            # Where the node serving this database is: the link opens it.
            assert invite["inviteUrl"].startswith(node.http + "/#invite=")
            revoked = await admin(node, "create-invite", "--workspace", workspace)
            await admin(node, "revoke-invite", "--invite", revoked["inviteId"])

            def join(browser: Browser) -> None:
                _, ann_page = open_page(browser, node.http, ann.token)
                expect(conversation(ann_page, "#general")).to_be_visible()

                context, page = open_link(browser, invite["inviteUrl"])
                expect(page.get_by_role("heading", name="Join Acme Rockets")).to_be_visible()
                assert "invite" not in page.url  # the code leaves the address bar
                page.get_by_role("textbox", name="Handle").fill("bob")
                page.get_by_role("textbox", name="Display name").fill("Bob Builder")
                page.get_by_role("button", name="Join").click()
                expect(conversation(page, "#general")).to_be_visible()
                expect(page.get_by_role("heading", name="#general")).to_be_visible()
                expect(
                    messages(page).filter(has_text="history from before the invite")
                ).to_have_count(1)

                send(page, "hi ann, bob joined by link")
                expect(
                    messages(ann_page).filter(has_text="hi ann, bob joined by link")
                ).to_have_count(1)
                send(ann_page, "welcome bob")
                expect(messages(page).filter(has_text="welcome bob")).to_have_count(1)
                # Signed in for good: a reload keeps the session.
                page.reload()
                expect(messages(page).filter(has_text="welcome bob")).to_have_count(1)
                context.close()

                # The link had one use; a revoked one and a made-up one are refused too.
                for url, reason in (
                    (invite["inviteUrl"], "already been used"),
                    (node.http + "/#invite=" + revoked["inviteUrl"].split("=", 1)[1], "withdrawn"),
                    (node.http + "/#invite=sni_made_up", "not valid"),
                ):
                    other, bad = open_link(browser, url)
                    expect(bad.get_by_role("alert")).to_contain_text(reason)
                    expect(bad.get_by_role("textbox", name="Handle")).to_have_count(0)
                    expect(bad.get_by_role("button", name="Join")).to_have_count(0)
                    bad.get_by_role("button", name="Go to sign in").click()
                    expect(bad.get_by_role("button", name="Sign in")).to_be_visible()
                    other.close()

            await browser.run(join)

            async with node_client(node, ann) as client:
                page = await client.history("#general")
            authors = {m["content"]: m["author"]["handle"] for m in page["messages"]}
            assert authors["hi ann, bob joined by link"] == "bob"
