"""A person asks an MCP-connected agent in a DM, in a real browser, and sees its answer.

The same harness as tests/test_browser.py, one node and one browser for the
module. The agent is ``python -m node mcp`` driven by a scripted MCP client
(the SDK's): it waits for attention and answers the wake in its
conversation, as a model behind any MCP client would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from mcp.client.session import ClientSession

from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    DIALOGS,
    Person,
    admin,
    browser_thread,
    conversation,
    messages,
    new_person,
    new_workspace,
    open_page,
    send,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed
from tests.test_mcp import call, mcp_session

if TYPE_CHECKING:
    from playwright.sync_api import Browser


async def new_agent(node: RunningNode, workspace_id: str, handle: str) -> Person:
    created = await admin(
        node, "create-member", "--workspace", workspace_id, "--type", "agent", "--handle", handle
    )
    token = await admin(node, "issue-token", "--member", created["memberId"])
    return Person(created["memberId"], handle, token["token"])


async def answer_one_wake(mcp: ClientSession) -> None:
    """The scripted model: wait, read the wake, answer it where it came from."""
    # A bound on a hang: the browser's steps share the machine with the suite
    # (one CI run took over 30 s to send the DM; alone it takes 3 s).
    text, woken = await call(mcp, "wait_for_attention", timeout_s=60)
    wake = woken["wake"]
    assert wake is not None, text
    assert wake["reason"] == "dm"
    asked = wake["message"]["text"]
    _, sent = await call(
        mcp,
        "send_message",
        conversation=wake["conversation"],
        text=f"{wake['message']['author']} asked “{asked}” — yes, the build is green.",
    )
    assert sent["wakesAcknowledged"] == [wake["wakeId"]]


def ask_in_a_dm(browser: Browser, node: RunningNode, ann: Person) -> None:
    from playwright.sync_api import expect

    context, page = open_page(browser, node.http, ann.token)
    page.get_by_role("button", name="New direct message").click()
    dialog = page.get_by_role("dialog", name="New direct message")
    dialog.get_by_role("button", name=re.compile("^helper")).click()
    expect(conversation(page, "helper")).to_be_visible()
    send(page, "is the build green?")
    answer = messages(page).filter(has_text="yes, the build is green")
    expect(answer).to_have_count(1)
    expect(answer).to_contain_text("@ann asked “is the build green?”")
    context.close()


async def test_a_person_asks_an_mcp_agent_in_a_dm(database_url: str, tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            helper = await new_agent(node, workspace, "helper")
            async with mcp_session(node, helper.token) as mcp, trio.open_nursery() as nursery:
                nursery.start_soon(answer_one_wake, mcp)
                await browser.run(lambda b: ask_in_a_dm(b, node, ann))
            assert DIALOGS == []
