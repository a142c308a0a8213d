"""Regenerate docs/screenshots/*.png: ``python -m tests.screenshots``.

The same conditions as tests/test_browser.py: a node on a throwaway embedded
PostgreSQL (or ``SCOPENODE_TEST_DATABASE_URL``'s server), members created by
the admin CLI, and Debian's Chromium driven by Playwright, headless, light
colour scheme, 1280×800.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import trio
from psycopg import sql

from storage import schema
from storage.embedded import EmbeddedPostgres, remove_orphaned_clusters
from storage.pg import dsn_for_database
from tests.nodes import running_node
from tests.test_browser import (
    STEP_MS,
    BrowserThread,
    browser_missing,
    conversation,
    messages,
    new_person,
    new_workspace,
    node_client,
)

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
                await client.request("createChannel", slug="releases", name="Releases")
            for handle, target, text in CONVERSATION:
                async with node_client(node, people[handle]) as client:
                    await client.send(target, text)
            async with node_client(node, ann) as client:
                page = await client.request("history", target="#general", limit=10)
                root = page["messages"][0]["id"]
                await client.send(f"#general:{root}", "Checklist: smoke suite, login link, docs.")
            async with node_client(node, bob) as client:
                await client.send(f"#general:{root}", "Smoke suite is green.")
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
                context.close()

            await thread.run(shoot)
    finally:
        await thread.stop()


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
