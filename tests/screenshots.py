"""Regenerate docs/screenshots/*.png: ``python -m tests.screenshots``.

The same conditions as tests/test_browser.py: a node on a throwaway embedded
PostgreSQL (or ``SCOPENODE_TEST_DATABASE_URL``'s server), members created by
the admin CLI, and Debian's Chromium driven by Playwright, headless, light
colour scheme, 1280×800 (and 375×667 for the phone layout).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import sys
import tempfile
import uuid
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import trio
from psycopg import sql

from storage import schema
from storage.embedded import EmbeddedPostgres
from storage.embedded_host import remove_orphaned_clusters
from storage.pg import dsn_for_database
from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    STEP_MS,
    BrowserThread,
    Person,
    admin,
    browser_missing,
    conversation,
    messages,
    new_person,
    new_workspace,
    node_client,
)
from tests.test_browser_admin import create_invite, open_admin

if TYPE_CHECKING:
    from playwright.sync_api import Browser

OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots"

CONVERSATION = [
    ("ann", "#general", "Morning all! The **v0.3** release candidate is up on staging."),
    ("bob", "#general", "Nice. I'll run the smoke suite against it after standup."),
    ("bob", "#general", "Found one thing: `scopenode serve --port 0` prints the real port now?"),
    (
        "ann",
        "#general",
        "It does — see [the changelog](https://example.com/changelog).\n> port 0 picks a free port",
    ),
    ("cleo", "#general", "@bob can you also check the login link on a phone?"),
]


def chart_png(width: int = 360, height: int = 180) -> bytes:
    """A little bar chart as a PNG, drawn pixel by pixel (no imaging library)."""
    bars = (0.35, 0.55, 0.5, 0.8, 0.92)
    slot = width // len(bars)
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")
        for x in range(width):
            bar = bars[min(x // slot, len(bars) - 1)]
            inside = slot * 0.2 < x % slot < slot * 0.8 and y > height * (1 - bar) - 1
            row += bytes((36, 86, 199) if inside else (244, 246, 248))
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


async def lifecycle(people: dict[str, Person], node: RunningNode) -> None:
    """#releases: a message with an image, reactions, an edit and a quote reply."""
    async with node_client(node, people["ann"]) as ann:
        uploaded = await ann.upload(chart_png(), "rc-latency.png", "image/png")
        sent = await ann.send(
            "#releases",
            "RC latency is down across the board, chart attached.",
            attachmentIds=[uploaded["attachmentId"]],
        )
        await ann.edit(sent["messageId"], "RC latency is down across the board — chart attached.")
    for handle, emoji in (("bob", "🎉"), ("cleo", "🎉"), ("cleo", "🚀"), ("ann", "🚀")):
        async with node_client(node, people[handle]) as client:
            await client.react(sent["messageId"], emoji)
    async with node_client(node, people["cleo"]) as cleo:
        await cleo.send(
            "#releases",
            "Ship it once the smoke suite is green.",
            forward={"mode": "quote", "sources": [{"messageId": sent["messageId"]}]},
        )


async def capture(dsn: str, work: Path) -> None:
    from playwright.sync_api import expect

    thread = BrowserThread()
    await thread.start()
    try:
        async with running_node(dsn, work / "node") as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            bob = await new_person(node, workspace, "bob")
            cleo = await new_person(node, workspace, "cleo")
            people = {"ann": ann, "bob": bob, "cleo": cleo}
            async with node_client(node, ann) as client:
                await client.request("createChannel", slug="design", name="Design")
                releases = await client.request("createChannel", slug="releases", name="Releases")
            for handle in ("bob", "cleo"):
                async with node_client(node, people[handle]) as client:
                    await client.request("join", scopeId=releases["scopeId"])
            for handle, target, text in CONVERSATION:
                async with node_client(node, people[handle]) as client:
                    await client.send(target, text)
            async with node_client(node, ann) as client:
                page = await client.request("history", target="#general", limit=10)
                root = page["messages"][0]["id"]
                await client.send(f"#general:{root}", "Checklist: smoke suite, login link, docs.")
            async with node_client(node, bob) as client:
                await client.send(f"#general:{root}", "Smoke suite is green.")
            await lifecycle(people, node)
            base = node.http

            def shoot(browser: Browser) -> None:
                context = browser.new_context(
                    viewport={"width": 1280, "height": 800}, color_scheme="light"
                )
                context.set_default_timeout(STEP_MS)
                page = context.new_page()
                page.goto(base + "/")
                expect(page.get_by_role("button", name="Sign in")).to_be_visible()
                page.screenshot(path=str(OUT / "sign-in.png"))

                page.get_by_label("Token").fill(bob.token)
                page.get_by_role("button", name="Sign in").click()
                expect(conversation(page, "#general")).to_be_visible()
                expect(messages(page)).to_have_count(len(CONVERSATION))
                expect(page.get_by_role("status").first).to_have_text("Connected")
                page.screenshot(path=str(OUT / "channel.png"))

                root = messages(page).first
                root.get_by_role("button", name="2 replies").click()
                replies = page.get_by_role("log", name="Thread replies").get_by_role("article")
                expect(replies).to_have_count(2)
                page.mouse.move(0, 0)
                page.screenshot(path=str(OUT / "thread.png"))

                page.get_by_role("button", name="Close panel").click()
                page.get_by_role("button", name="Browse channels").click()
                dialog = page.get_by_role("dialog", name="Browse channels")
                expect(dialog.get_by_role("button", name="Join #design")).to_be_visible()
                page.screenshot(path=str(OUT / "channel-browser.png"))
                dialog.get_by_role("button", name="Close").click()

                conversation(page, "#releases").click()
                chart = messages(page).first.get_by_role("img", name="rc-latency.png")
                expect(chart).to_have_attribute("src", re.compile("^blob:"))
                page.wait_for_function(
                    "img => img.complete && img.naturalWidth > 0", arg=chart.element_handle()
                )
                expect(messages(page).last.locator("blockquote.source")).to_contain_text(
                    "RC latency"
                )
                first = messages(page).first
                first.hover()
                first.get_by_role("button", name="Add reaction", exact=True).click()
                expect(page.get_by_role("group", name="Pick a reaction")).to_be_visible()
                page.screenshot(path=str(OUT / "reactions-attachment.png"))
                page.get_by_role("button", name="React with 👍").click()
                expect(first.get_by_role("button", name="👍 1", exact=True)).to_be_visible()
                page.mouse.move(0, 0)

                messages(page).last.press("/")
                page.get_by_role("searchbox", name="Search").fill("smoke suite")
                page.keyboard.press("Enter")
                results = page.get_by_role("list", name="Search results")
                expect(results.or_(page.get_by_text("Search is not ready yet"))).to_be_visible()
                page.screenshot(path=str(OUT / "search.png"))
                context.close()

                # A phone: one pane at a time.
                context = browser.new_context(
                    viewport={"width": 375, "height": 667}, color_scheme="light"
                )
                context.set_default_timeout(STEP_MS)
                page = context.new_page()
                page.goto(base + "/")
                page.get_by_label("Token").fill(bob.token)
                page.get_by_role("button", name="Sign in").click()
                expect(messages(page)).to_have_count(len(CONVERSATION))
                expect(page.get_by_role("status").first).to_have_text("Connected")
                page.get_by_role("textbox", name="Message").blur()
                page.screenshot(path=str(OUT / "phone-channel.png"))
                page.get_by_role("button", name="Back").click()
                expect(conversation(page, "#releases")).to_be_visible()
                page.screenshot(path=str(OUT / "phone-list.png"))
                context.close()

            await thread.run(shoot)
            await admin(node, "promote", "--member", ann.id)

            def invite(browser: Browser) -> None:
                # An admin creates an invite link; a newcomer opens it.
                context = browser.new_context(
                    viewport={"width": 1280, "height": 800}, color_scheme="light"
                )
                context.set_default_timeout(STEP_MS)
                page = context.new_page()
                page.goto(f"{base}/#token={ann.token}")
                expect(page.get_by_role("status").first).to_have_text("Connected")
                link = create_invite(open_admin(page))
                page.screenshot(path=str(OUT / "admin-invite.png"))
                joiner = browser.new_context(
                    viewport={"width": 1280, "height": 800}, color_scheme="light"
                )
                joiner.set_default_timeout(STEP_MS)
                newcomer = joiner.new_page()
                newcomer.goto(link)
                expect(newcomer.get_by_role("button", name="Join")).to_be_visible()
                newcomer.get_by_role("textbox", name="Handle").fill("dana")
                newcomer.get_by_role("textbox", name="Display name").fill("Dana Kim")
                newcomer.screenshot(path=str(OUT / "invite-join.png"))
                joiner.close()
                context.close()

            await thread.run(invite)
    finally:
        await trio.to_thread.run_sync(thread.close)


def main() -> int:
    if (why := browser_missing()) is not None:
        print(f"screenshots: {why}", file=sys.stderr)
        return 2
    from node import logs

    logs.configure("warning", json=False)
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scopenode-screens-"))
    server: EmbeddedPostgres | None = None
    try:
        if url := os.environ.get("SCOPENODE_TEST_DATABASE_URL"):
            maintenance = url
        else:
            server = EmbeddedPostgres(work / "pg", database="postgres")
            maintenance = server.start()
        name = f"screens_{uuid.uuid4().hex}"
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        dsn = dsn_for_database(maintenance, name)
        try:
            with psycopg.connect(dsn) as conn:
                schema.migrate(conn)
            trio.run(capture, dsn, work)
        finally:
            with psycopg.connect(maintenance, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
        remove_orphaned_clusters(discard_under=work)
    for png in sorted(OUT.glob("*.png")):
        print(png.relative_to(OUT.parent.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
