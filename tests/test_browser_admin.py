"""The workspace admin page in a real browser: an admin creates an invite
there, a person joins by it and chats with the admin; an invite revoked there
is refused and creates nothing; a member who is no admin has no Admin button;
the page fits a phone.

The same harness as tests/test_browser.py: one node and one browser.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from storage import directory, scopes
from storage.pg import connect
from tests.nodes import World, running_node
from tests.test_browser import browser_thread, conversation, messages, open_page, send
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed
from tests.test_browser_invite import open_link
from tests.test_browser_phone import fits

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page


def open_admin(page: Page) -> Locator:
    from playwright.sync_api import expect

    page.get_by_role("button", name="Admin").click()
    region = page.get_by_role("region", name="Workspace admin")
    expect(region.get_by_role("heading", name="Workspace admin")).to_be_focused()
    return region


def create_invite(region: Locator, uses: str = "") -> str:
    from playwright.sync_api import expect

    region.get_by_label("Uses (empty: unlimited)").fill(uses)
    region.get_by_role("button", name="Create invite").click()
    link = region.get_by_role("textbox", name="Invite link (shown once)")
    expect(link).to_have_value(re.compile(r"/#invite=sni_"))
    return link.input_value()


async def test_an_admin_invites_from_the_admin_page(database_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            world = await World.create(node, "Acme Rockets")
            ann, bob = await world.members("ann", "bob")
            async with await connect(node.database_url, autocommit=True) as conn:
                await directory.set_admin(conn, ann.id, True)
                for person in (ann, bob):  # the first one founds #general
                    await scopes.join_on_creation(conn, person.member, [])
            async with world.client(ann) as client:
                await client.send("#general", "history from before the invite")

            def steps(browser: Browser) -> None:
                _, page = open_page(browser, node.http, ann.token)
                expect(conversation(page, "#general")).to_be_visible()
                admin = open_admin(page)
                members = admin.get_by_role("list", name="Members")
                expect(members.get_by_role("listitem")).to_have_count(2)
                expect(admin.get_by_role("button", name="Make admin @bob")).to_be_visible()

                # An invite revoked from the page: its link is refused and makes nobody.
                revoked = create_invite(admin)
                admin.get_by_role("button", name=re.compile("^Revoke invite")).click()
                invites = admin.get_by_role("list", name="Invites")
                expect(invites.get_by_role("listitem")).to_contain_text("revoked")
                other, bad = open_link(browser, revoked)
                expect(bad.get_by_role("alert")).to_contain_text("withdrawn")
                expect(bad.get_by_role("textbox", name="Handle")).to_have_count(0)
                other.close()

                url = create_invite(admin, uses="1")
                assert url.startswith(node.http + "/#invite=")
                context, joiner = open_link(browser, url)
                joiner.get_by_role("textbox", name="Handle").fill("cara")
                joiner.get_by_role("textbox", name="Display name").fill("Cara Jones")
                joiner.get_by_role("button", name="Join").click()
                expect(joiner.get_by_role("heading", name="#general")).to_be_visible()
                expect(
                    messages(joiner).filter(has_text="history from before the invite")
                ).to_have_count(1)

                # The admin page shows her; the admin goes back to chat with her.
                admin.get_by_role("button", name="Close admin").click()
                expect(admin).to_be_hidden()
                conversation(page, "#general").click()
                send(joiner, "hi ann, cara here")
                expect(messages(page).filter(has_text="hi ann, cara here")).to_have_count(1)
                send(page, "welcome cara")
                expect(messages(joiner).filter(has_text="welcome cara")).to_have_count(1)
                context.close()

                admin = open_admin(page)
                expect(members.get_by_role("listitem")).to_have_count(3)
                expect(members).to_contain_text("Cara Jones")
                expect(admin.get_by_role("list", name="Invites")).to_contain_text("1 of 1 uses")
                # Keyboard: Escape closes the page and gives focus back to its button.
                page.keyboard.press("Escape")
                expect(admin).to_be_hidden()
                expect(page.get_by_role("button", name="Admin")).to_be_focused()

                # On a phone: behind the menu, and nothing wider than the screen.
                page.set_viewport_size({"width": 375, "height": 740})
                page.get_by_role("button", name="Menu").click()
                admin = open_admin(page)
                expect(admin.get_by_role("button", name="Create invite")).to_be_visible()
                fits(page, "admin page")

                _, member_page = open_page(browser, node.http, bob.token)
                expect(conversation(member_page, "#general")).to_be_visible()
                expect(member_page.get_by_role("button", name="Admin")).to_have_count(0)

            await browser.run(steps)

            async with world.client(ann) as client:
                listed = await client.request("adminMembers")
            assert sorted(m["handle"] for m in listed["members"]) == ["ann", "bob", "cara"]
