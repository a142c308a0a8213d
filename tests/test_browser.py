"""The web client in a real browser: Playwright (sync API) driving Debian's Chromium.

The node runs on trio in the test's thread; Playwright's sync API needs a
thread of its own (it runs an asyncio loop underneath), so every browser step
is a function handed to one dedicated browser thread (:class:`BrowserThread`).
The client is found only through its accessibility contract: roles and names
a screen-reader user meets.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import queue
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import trio

from tests.conftest import require_tool
from tests.nodes import RunningNode, running_node

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Dialog, Page, Playwright

T = TypeVar("T")


# Debian's headless build of its Chromium first: the same engine without the
# desktop browser around it, which took about 40 % less CPU over the browser
# tests here (they ran in 45-50 s instead of 80-87 s on 2 cores).
CHROMIUM_COMMANDS = ("chromium-headless-shell", "chromium")


def chromium_path() -> str | None:
    """``SCOPENODE_CHROMIUM``, else Debian's ``chromium-headless-shell`` or
    ``chromium``; never a Playwright download."""
    override = os.environ.get("SCOPENODE_CHROMIUM")
    if override and os.access(override, os.X_OK):
        return override
    for command in CHROMIUM_COMMANDS:
        if found := shutil.which(command):
            return found
    return None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return "no Chromium found (apt-get install chromium-headless-shell)"
    return None


pytestmark = [
    pytest.mark.browser,
    require_tool("chromium", browser_missing()),
]

# One browser expectation; the node restart below waits longer. Generous: the
# full suite keeps both cores busy, and Chromium gets its share of them late.
STEP_MS = 30_000
DIALOGS: list[str] = []  # alert/confirm/prompt seen by any page: none is expected


class BrowserThread:
    """One thread owning Playwright and a headless Chromium; runs jobs in order."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[Browser], Any], Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="playwright", daemon=True)
        self._ready: Future[None] = Future()

    def _run(self) -> None:
        from playwright.sync_api import sync_playwright

        playwright: Playwright | None = None
        browser: Browser | None = None
        try:
            playwright = sync_playwright().start()
            browser = playwright.chromium.launch(
                executable_path=chromium_path(),
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            )
            self._ready.set_result(None)
        except BaseException as exc:
            self._ready.set_exception(exc)
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if browser is None or not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(browser))
            except BaseException as exc:
                future.set_exception(exc)
        if browser is not None:
            browser.close()
        if playwright is not None:
            playwright.stop()

    async def start(self) -> None:
        self._thread.start()
        await trio.to_thread.run_sync(self._ready.result, abandon_on_cancel=True)

    async def run(self, fn: Callable[[Browser], T]) -> T:
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(30)


_SHARED: list[BrowserThread] = []


def _close_contexts(browser: Browser) -> None:
    for context in browser.contexts:
        context.close()


def _stop_shared() -> None:
    for thread in _SHARED:
        thread.close()


@asynccontextmanager
async def browser_thread() -> AsyncIterator[BrowserThread]:
    """The test process's one browser (launched by its first browser test and
    stopped at exit: a launch per test was seconds of the suite); every context
    a test opened is closed when it ends, so no page outlives its test."""
    if not _SHARED:
        thread = BrowserThread()
        await thread.start()
        _SHARED.append(thread)
        atexit.register(_stop_shared)
    try:
        yield _SHARED[0]
    finally:
        with trio.CancelScope(shield=True):
            await _SHARED[0].run(_close_contexts)


@dataclass
class Person:
    id: str
    handle: str
    token: str


async def admin(node: RunningNode, *args: str) -> dict[str, Any]:
    """An admin command next to a live node, parsed as the CLI parses it but run
    in this process (the CLI's own process is tested in tests/test_cli.py)."""
    from node.admin_commands import execute
    from node.cli import build_parser

    parsed = build_parser().parse_args(["admin", *args, "--database-url", node.database_url])
    return await execute(parsed)


async def new_workspace(node: RunningNode, name: str) -> str:
    workspace_id: str = (await admin(node, "create-workspace", "--name", name))["workspaceId"]
    return workspace_id


async def new_person(node: RunningNode, workspace_id: str, handle: str) -> Person:
    created = await admin(
        node, "create-member", "--workspace", workspace_id, "--type", "human", "--handle", handle
    )
    token = await admin(node, "issue-token", "--member", created["memberId"])
    return Person(created["memberId"], handle, token["token"])


async def acme(node: RunningNode, *handles: str) -> list[Person]:
    """The browser tests' usual cast: a human per handle in a new workspace "acme"."""
    workspace = await new_workspace(node, "acme")
    return [await new_person(node, workspace, handle) for handle in handles]


def _refuse_dialog(dialog: Dialog) -> None:
    DIALOGS.append(dialog.message)
    dialog.dismiss()


def open_page(
    browser: Browser, base: str, token: str | None = None, frames: list[str] | None = None
) -> tuple[BrowserContext, Page]:
    """A fresh context (its own storage); with a token, signed in by the login
    link; with ``frames``, every WebSocket frame the page receives is added to it."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(STEP_MS)
    page = context.new_page()
    page.on("dialog", _refuse_dialog)
    if frames is not None:
        page.on(
            "websocket", lambda ws: ws.on("framereceived", lambda data: frames.append(str(data)))
        )
    page.goto(base + "/" + (f"#token={token}" if token else ""))
    return context, page


def messages(page: Page) -> Any:
    return page.get_by_role("log", name="Messages").get_by_role("article")


def conversation(page: Page, name: str) -> Any:
    return page.get_by_role("navigation", name="Conversations").get_by_role(
        "link", name=re.compile("^" + re.escape(name) + r"(\s|$)")
    )


def send(page: Page, text: str) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("button", name="Send").click()


def count_text(page: Page, text: str) -> int:
    count: int = messages(page).filter(has_text=text).count()
    return count


async def test_two_members_chat_reload_and_survive_a_restart(
    database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(100):
        async with browser_thread() as browser:
            async with running_node(database_url, tmp_path) as node:
                port = node.services.port
                base = node.http
                workspace = await new_workspace(node, "acme")
                ann = await new_person(node, workspace, "ann")
                async with node_client(node, ann) as client:
                    await client.send("#general", "history from before bob")
                # Created by the admin CLI while the node runs: joins #general by default.
                bob = await new_person(node, workspace, "bob")

                def sign_in(browser: Browser) -> tuple[Page, Page]:
                    _, ann_page = open_page(browser, base, ann.token)
                    expect(ann_page.get_by_role("status").first).to_have_text("Connected")
                    assert "token" not in ann_page.url  # the login link's fragment is cleared
                    _, bob_page = open_page(browser, base)
                    bob_page.get_by_label("Token").fill(bob.token)
                    bob_page.get_by_role("button", name="Sign in").click()
                    expect(conversation(bob_page, "#general")).to_be_visible()
                    expect(
                        messages(bob_page).filter(has_text="history from before bob")
                    ).to_have_count(1)
                    return ann_page, bob_page

                ann_page, bob_page = await browser.run(sign_in)

                def chat(_: Browser) -> None:
                    send(bob_page, "hi ann, bob here")
                    expect(messages(ann_page).filter(has_text="hi ann, bob here")).to_have_count(1)
                    send(ann_page, "welcome bob")
                    expect(messages(bob_page).filter(has_text="welcome bob")).to_have_count(1)
                    bob_page.reload()
                    expect(messages(bob_page).filter(has_text="welcome bob")).to_have_count(1)
                    for text in ("history from before bob", "hi ann, bob here"):
                        assert count_text(bob_page, text) == 1, text
                    expect(messages(bob_page)).to_have_count(3)

                await browser.run(chat)

            # The node is down: both pages say so in words, and bob types anyway.
            def offline(_: Browser) -> None:
                for page in (ann_page, bob_page):
                    expect(page.get_by_role("status").first).to_have_text(
                        re.compile(r"Reconnect"), timeout=STEP_MS
                    )
                    expect(page.get_by_role("button", name="Retry now")).to_be_visible()
                send(bob_page, "typed while the node was down")

            await browser.run(offline)
            # Long enough for a failed retry or two, short enough that the
            # automatic reconnect is seconds away when the node is back.
            await trio.sleep(1)

            async with running_node(database_url, tmp_path, port=port) as node:

                def back(_: Browser) -> None:
                    from playwright.sync_api import TimeoutError as PlaywrightTimeout

                    # Bob does not wait for his backoff; ann reconnects on her own.
                    # On a loaded machine the node may come up after bob's own
                    # next attempt, which hides the button before the click.
                    try:
                        bob_page.get_by_role("button", name="Retry now").click(timeout=5_000)
                    except PlaywrightTimeout:
                        expect(bob_page.get_by_role("status").first).to_have_text("Connected")
                    for page in (bob_page, ann_page):
                        expect(page.get_by_role("status").first).to_have_text(
                            "Connected", timeout=40_000
                        )
                    text = "typed while the node was down"
                    expect(messages(ann_page).filter(has_text=text)).to_have_count(
                        1, timeout=STEP_MS
                    )
                    expect(messages(bob_page).filter(has_text=text)).to_have_count(1)
                    bob_page.reload()
                    expect(messages(bob_page)).to_have_count(4)
                    assert count_text(bob_page, text) == 1

                await browser.run(back)
                async with node_client(node, ann) as client:
                    page = await client.request("history", target="#general", limit=50)
                contents = [m["content"] for m in page["messages"]]
                assert contents.count("typed while the node was down") == 1


async def test_a_dialog_opened_before_the_first_connection_fills_once_connected(
    database_url: str, tmp_path: Path
) -> None:
    """The page is up before its WebSocket: here the node's socket is refused
    until the test lets it through, and the people dialog opened meanwhile
    says it is connecting, then lists everyone when the welcome comes."""
    from playwright.sync_api import WebSocketRoute, expect

    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            await new_person(node, workspace, "bob")

            def before_and_after(browser: Browser) -> None:
                let_through: list[bool] = []

                def socket(route: WebSocketRoute) -> None:
                    if let_through:
                        route.connect_to_server()
                    else:
                        route.close(code=1011)

                context = browser.new_context(viewport={"width": 1280, "height": 800})
                context.set_default_timeout(STEP_MS)
                page = context.new_page()
                page.route_web_socket(re.compile(r"/v1/ws"), socket)
                page.goto(f"{node.http}/#token={ann.token}")
                expect(page.get_by_role("button", name="Retry now")).to_be_visible()
                page.get_by_role("button", name="New direct message").click()
                people = page.get_by_role("dialog", name="New direct message")
                expect(people).to_contain_text("Connecting…")

                # The dialog is modal: the client's own retry gets through.
                let_through.append(True)
                expect(page.get_by_role("status").first).to_have_text("Connected", timeout=40_000)
                expect(people.get_by_role("button", name=re.compile("^bob"))).to_be_visible()
                expect(people).not_to_contain_text("Connecting…")

            await browser.run(before_and_after)
            assert DIALOGS == []


async def test_a_sidebar_item_that_did_not_change_keeps_its_node(
    database_url: str, tmp_path: Path
) -> None:
    """The conversation list is redrawn whenever an unread count moves: the
    items that look the same stay the same nodes (a click in progress on one
    is not lost), the one that changed is drawn anew."""
    from playwright.sync_api import expect

    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            ann, bob = await acme(node, "ann", "bob")
            scope_ids = {}
            async with node_client(node, ann) as client:
                for slug in ("design", "random"):
                    created = await client.request("createChannel", slug=slug, name=slug)
                    scope_ids[slug] = created["scopeId"]
            async with node_client(node, bob) as client:
                for scope_id in scope_ids.values():
                    await client.request("join", scopeId=scope_id)

            def before(browser: Browser) -> Any:
                _, page = open_page(browser, node.http, bob.token)
                expect(page.get_by_role("status").first).to_have_text("Connected")
                expect(conversation(page, "#random")).to_be_visible()
                links = {
                    slug: page.locator(f'a[data-scope="{scope_id}"]').element_handle()
                    for slug, scope_id in scope_ids.items()
                }
                return page, links

            page, links = await browser.run(before)
            async with node_client(node, ann) as client:
                await client.send("#random", "news for bob")

            def after(_: Browser) -> None:
                expect(conversation(page, "#random")).to_contain_text("1 unread")
                assert links["design"].evaluate("node => node.isConnected") is True
                assert links["random"].evaluate("node => node.isConnected") is False

            await browser.run(after)
            assert DIALOGS == []


@asynccontextmanager
async def node_client(node: RunningNode, person: Person) -> AsyncIterator[Any]:
    from node.client import open_client

    async with open_client(node.url, person.token) as client:
        yield client


MARKDOWN = (
    "**bold words** and _italic words_ with `inline code` and "
    "[a link](https://example.com/docs) for @bob\n"
    "> quoted line\n"
    "```\nfenced <b>code</b>\n```"
)
PAYLOAD = (
    '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
    "<b>not bold</b> [click](javascript:window.__pwned=3) "
    '<a href="javascript:alert(1)" onclick="alert(1)">evil</a>'
)


async def test_browse_join_dm_thread_markdown_and_inert_html(
    database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            base = node.http
            ann, bob = await acme(node, "ann", "bob")
            async with node_client(node, ann) as client:
                created = await client.request("createChannel", slug="design", name="Design")
                await client.send("#design", "Launch plan: who takes the **copy**?")

            def browse_and_join(browser: Browser) -> tuple[Page, Page]:
                _, ann_page = open_page(browser, base, ann.token)
                _, bob_page = open_page(browser, base, bob.token)
                expect(conversation(bob_page, "#general")).to_be_visible()
                bob_page.get_by_role("button", name="Browse channels").click()
                dialog = bob_page.get_by_role("dialog", name="Browse channels")
                expect(dialog.get_by_text("#design")).to_be_visible()
                dialog.get_by_role("button", name="Join #design").click()
                expect(conversation(bob_page, "#design")).to_be_visible()
                expect(bob_page.get_by_role("heading", name="#design")).to_be_visible()
                expect(messages(bob_page).filter(has_text="Launch plan")).to_have_count(1)
                return ann_page, bob_page

            ann_page, bob_page = await browser.run(browse_and_join)

            def direct_message(_: Browser) -> None:
                bob_page.get_by_role("button", name="New direct message").click()
                dialog = bob_page.get_by_role("dialog", name="New direct message")
                dialog.get_by_role("button", name=re.compile("^ann")).click()
                expect(conversation(bob_page, "ann")).to_be_visible()
                send(bob_page, "a private word, ann")
                expect(conversation(ann_page, "bob")).to_be_visible()
                conversation(ann_page, "bob").click()
                expect(messages(ann_page).filter(has_text="a private word")).to_have_count(1)

            await browser.run(direct_message)

            def thread(_: Browser) -> None:
                conversation(bob_page, "#design").click()
                root = messages(bob_page).filter(has_text="Launch plan")
                root.hover()
                root.get_by_role("button", name="Reply in thread").click()
                bob_page.get_by_role("textbox", name="Reply").fill("I can take the copy")
                bob_page.get_by_role("button", name="Reply", exact=True).click()
                replies = bob_page.get_by_role("log", name="Thread replies")
                expect(
                    replies.get_by_role("article").filter(has_text="I can take the copy")
                ).to_have_count(1)
                expect(root.get_by_role("button", name=re.compile("^1 reply"))).to_be_visible()

                # The root's author learns of the reply: the thread is unread for ann.
                thread_link = ann_page.get_by_role("navigation", name="Conversations").get_by_role(
                    "link", name=re.compile("Launch plan.*1 unread")
                )
                expect(thread_link).to_be_visible()
                conversation(ann_page, "#design").click()
                ann_root = messages(ann_page).filter(has_text="Launch plan")
                ann_root.get_by_role("button", name=re.compile("^1 reply")).click()
                expect(
                    ann_page.get_by_role("group", name="Thread root").get_by_role("article")
                ).to_contain_text("Launch plan")
                expect(
                    ann_page.get_by_role("log", name="Thread replies").get_by_role("article")
                ).to_have_text(re.compile("I can take the copy"))
                expect(thread_link).to_have_count(0)  # read now: no badge

            await browser.run(thread)

            async with node_client(node, ann) as client:
                await client.send("#design", MARKDOWN)
                await client.send("#design", PAYLOAD)

            def rendering(_: Browser) -> None:
                md = messages(bob_page).filter(has_text="bold words")
                expect(md).to_have_count(1)
                expect(md.locator("strong")).to_have_text("bold words")
                expect(md.locator("em")).to_have_text("italic words")
                expect(md.locator(":not(pre) > code")).to_have_text("inline code")
                link = md.get_by_role("link", name="a link")
                expect(link).to_have_attribute("href", "https://example.com/docs")
                expect(link).to_have_attribute("rel", "noopener noreferrer")
                expect(link).to_have_attribute("target", "_blank")
                expect(md.locator("blockquote")).to_have_text("quoted line")
                expect(md.locator("pre code")).to_have_text("fenced <b>code</b>")
                mention = md.locator(".mention.me")
                expect(mention).to_have_text("@bob")

                inert = messages(bob_page).filter(has_text="onerror")
                expect(inert).to_have_count(1)
                expect(inert).to_contain_text("<script>window.__pwned=2</script>")
                for tag in ("img", "script", "b", "a[onclick]"):
                    assert inert.locator(tag).count() == 0, tag
                assert inert.get_by_role("link").count() == 0  # javascript: is no link
                bob_page.wait_for_timeout(300)
                assert bob_page.evaluate("window.__pwned") is None
                assert bob_page.locator("img").count() == 0
                assert DIALOGS == []

            await browser.run(rendering)
            assert created["scopeId"]


# Installed before any page script (Playwright's init scripts are not subject to
# the page's CSP): every violation the page reports, as "directive blocked-uri".
CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.violatedDirective} ${event.blockedURI}`);
}, true);
"""


def watched_page(browser: Browser, base: str, console: list[str]) -> Page:
    """A fresh page that records CSP violation events and console messages,
    opened on the login screen; checks that the page came with its policy."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(STEP_MS)
    context.add_init_script(CSP_WATCH)
    page = context.new_page()
    page.on("dialog", _refuse_dialog)
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    response = page.goto(base + "/")
    assert response is not None
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["x-frame-options"] == "DENY"
    return page


async def test_the_client_works_under_its_content_security_policy(
    database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import FilePayload, expect

    from tests.test_browser_lifecycle import png

    image: FilePayload = {
        "name": "dot.png",
        "mimeType": "image/png",
        "buffer": png(8, 8, (0, 0, 0)),
    }
    console: list[str] = []
    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            base = node.http
            ann, bob = await acme(node, "ann", "bob")

            def chat(browser: Browser) -> list[Page]:
                pages = [watched_page(browser, base, console) for _ in (ann, bob)]
                for page, person in zip(pages, (ann, bob), strict=True):
                    page.get_by_label("Token").fill(person.token)
                    page.get_by_role("button", name="Sign in").click()
                    expect(page.get_by_role("status").first).to_have_text("Connected")
                    expect(page.get_by_role("textbox", name="Message")).to_be_enabled()
                ann_page, bob_page = pages
                send(ann_page, "hello under a strict policy")
                expect(
                    messages(bob_page).filter(has_text="hello under a strict policy")
                ).to_have_count(1)
                # An attachment preview is a blob: image (img-src blob:).
                with ann_page.expect_file_chooser() as chooser:
                    ann_page.get_by_role("button", name="Attach files").click()
                chooser.value.set_files(files=[image])
                expect(ann_page.get_by_text("ready")).to_be_visible()
                send(ann_page, "with a picture")
                posted = messages(bob_page).filter(has_text="with a picture")
                preview = posted.get_by_role("img", name="dot.png")
                expect(preview).to_have_attribute("src", re.compile("^blob:"))
                bob_page.wait_for_function(
                    "img => img.complete && img.naturalWidth === 8", arg=preview.element_handle()
                )
                return pages

            pages = await browser.run(chat)

            def violations(_: Browser) -> list[list[str]]:
                return [page.evaluate("window.__cspViolations") for page in pages]

            assert await browser.run(violations) == [[], []]
            assert [line for line in console if "Content Security Policy" in line] == []

            # The watch itself works: an inline script is refused and reported.
            def inline_script(_: Browser) -> list[str]:
                page = pages[0]
                with page.expect_console_message(
                    lambda message: "Content Security Policy" in message.text
                ):
                    page.evaluate(
                        """() => {
                            const script = document.createElement("script");
                            script.textContent = "window.__inlineRan = true";
                            document.head.append(script);
                        }"""
                    )
                page.wait_for_function("window.__cspViolations.length > 0")
                assert page.evaluate("window.__inlineRan") is None
                found: list[str] = page.evaluate("window.__cspViolations")
                return found

            found = await browser.run(inline_script)
            assert [entry.split()[0] for entry in found] == ["script-src-elem"]
            assert any("Content Security Policy" in line for line in console)
            assert DIALOGS == []
