"""The web client's ES modules, loaded in a real browser without a node.

Every request of the page is answered by :func:`node.http.static` itself (the
node's static file server, with its Content-Security-Policy), through
Playwright's request routing: no database, no socket. The page loads every
module of node/web under its policy, and markdown.js is imported on its own
and checked as the one place message text becomes page content.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from node.http import static
from tests.conftest import require_tool
from tests.test_browser import browser_missing, chromium_path

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route

WEB = Path(__file__).resolve().parent.parent / "node" / "web"
ORIGIN = "http://scopenode.test"
needs_browser = require_tool("chromium", browser_missing())


# ---------------------------------------------------------------- the static server


def test_static_serves_the_views_folder_and_nothing_outside_web() -> None:
    for path in ("/app.js", "/markdown.js", "/views/message.js"):
        reply = static(path, b"127.0.0.1")
        assert reply.status == 200, path
        assert reply.content_type.startswith("text/javascript"), path
        assert reply.body == (WEB / path.lstrip("/")).read_bytes(), path
        assert "script-src 'self'" in reply.policy, path
    for path in (
        "/views/../app.js",
        "/views/../../http.py",
        "/../http.py",
        "/views/",
        "/views",
        "/views//message.js",
        "/views/.message.js",
        "/.hidden",
        "/views/%2e%2e/app.js",
        "/views\\..\\app.js",
    ):
        assert static(path, b"127.0.0.1").status == 404, path


# ---------------------------------------------------------------- in the browser


def serve(route: Route) -> None:
    reply = static(urlsplit(route.request.url).path, b"scopenode.test")
    route.fulfill(
        status=reply.status,
        headers={"Content-Type": reply.content_type, **dict(reply.headers())},
        body=reply.body,
    )


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    """The client's login page, every file fetched through node.http.static."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            context = chromium.new_context()
            context.set_default_timeout(15_000)
            context.route(f"{ORIGIN}/**", serve)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on(
                "console",
                lambda message: errors.append(message.text) if message.type == "error" else None,
            )
            response = page.goto(ORIGIN + "/")
            assert response is not None
            assert "script-src 'self'" in response.headers["content-security-policy"]
            page.get_by_role("button", name="Sign in").wait_for()
            assert errors == []
            yield page
            assert errors == []
        finally:
            chromium.close()


def loaded_scripts(page: Page) -> set[str]:
    names: list[str] = page.evaluate(
        """() => performance.getEntriesByType("resource")
                 .map((entry) => new URL(entry.name).pathname)
                 .filter((path) => path.endsWith(".js"))"""
    )
    return set(names)


@pytest.mark.browser
@needs_browser
def test_the_page_loads_every_module_under_its_policy(page: Page) -> None:
    on_disk = {"/" + path.relative_to(WEB).as_posix() for path in WEB.rglob("*.js")}
    assert "/views/message.js" in on_disk
    assert loaded_scripts(page) == on_disk


# Markdown in, the page's HTML out (as the browser serialises it): elements for
# markup, text for everything else; the same cases the client met before it was
# split into modules.
MARKDOWN_CASES: list[tuple[str, dict[str, Any] | None, str]] = [
    (
        '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> & "q"',
        None,
        '<p>&lt;img src=x onerror="window.__pwned=1"&gt;'
        '&lt;script&gt;window.__pwned=2&lt;/script&gt; &amp; "q"</p>',
    ),
    (
        "**bold** and _em_ and *also em*",
        None,
        "<p><strong>bold</strong> and <em>em</em> and <em>also em</em></p>",
    ),
    ("snake_case __init__ ***", None, "<p>snake_case __init__ ***</p>"),
    ("**nested _em_ inside**", None, "<p><strong>nested <em>em</em> inside</strong></p>"),
    ("use `a <b> **c**` here", None, "<p>use <code>a &lt;b&gt; **c**</code> here</p>"),
    (
        "[docs](https://example.com/a?b=1&c=2)",
        None,
        '<p><a href="https://example.com/a?b=1&amp;c=2" target="_blank" '
        'rel="noopener noreferrer">docs</a></p>',
    ),
    (
        "[x](javascript:alert) [y](data:text/html,hi)",
        None,
        "<p>[x](javascript:alert) [y](data:text/html,hi)</p>",
    ),
    (
        "see https://example.com/x. or mailto:ann@example.com",
        None,
        '<p>see <a href="https://example.com/x" target="_blank" rel="noopener noreferrer">'
        "https://example.com/x</a>. or "
        '<a href="mailto:ann@example.com" target="_blank" rel="noopener noreferrer">'
        "mailto:ann@example.com</a></p>",
    ),
    (
        "```js\n<b>x</b> **y**\n```",
        None,
        '<pre data-lang="js"><code>&lt;b&gt;x&lt;/b&gt; **y**</code></pre>',
    ),
    (
        "> quoted **q** @bob\nafter @bob",
        {"mentions": ["bob"]},
        "<blockquote><p>quoted <strong>q</strong> @bob</p></blockquote>"
        '<p>after <span class="mention" data-handle="bob">@bob</span></p>',
    ),
    (
        "hi @Bob. and @carol, mail a@bob.example",
        {"mentions": ["bob"]},
        '<p>hi <span class="mention" data-handle="bob">@Bob</span>. and @carol, '
        "mail a@bob.example</p>",
    ),
    ("a\nb\n\nc", None, "<p>a\nb</p><p>c</p>"),
]


@pytest.mark.browser
@needs_browser
def test_markdown_module_renders_text_safely(page: Page) -> None:
    rendered: list[str] = page.evaluate(
        """async (cases) => {
            const { renderMarkdown } = await import("/markdown.js");
            return cases.map(([text, message]) => {
                const box = document.createElement("div");
                box.append(renderMarkdown(text, message));
                return box.innerHTML;
            });
        }""",
        [[text, message] for text, message, _ in MARKDOWN_CASES],
    )
    for (text, _, expected), html in zip(MARKDOWN_CASES, rendered, strict=True):
        assert html == expected, text
    # Rendering inserted nothing that runs: the payload stayed text.
    assert page.evaluate("window.__pwned") is None


@pytest.mark.browser
@needs_browser
def test_markdown_module_marks_my_mentions_and_is_the_pages_own(page: Page) -> None:
    # The module the page imported is the same instance: its state is the page's.
    found: list[Any] = page.evaluate(
        """async () => {
            const { renderMarkdown, mentionsMe } = await import("/markdown.js");
            const { state } = await import("/store.js");
            state.me = { id: "m1", handle: "Ann" };
            try {
                const message = { mentions: ["ann", "bob"] };
                const box = document.createElement("div");
                box.append(renderMarkdown("@ann and @bob", message));
                return [box.innerHTML, mentionsMe(message), mentionsMe({ mentions: ["bob"] })];
            } finally {
                state.me = null;
            }
        }"""
    )
    assert found == [
        '<p><span class="mention me" data-handle="ann">@ann</span> and '
        '<span class="mention" data-handle="bob">@bob</span></p>',
        True,
        False,
    ]
