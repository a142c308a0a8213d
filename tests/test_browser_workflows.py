"""Workflow plans in a real browser (docs/workflows.md).

The same harness as tests/test_browser.py, one node and one browser for the
module. Ann opens "Workflows", creates a plan for the agent bot and sends it a
request; bot (driven here over the protocol, as its daemon would) gets the
request's wake naming the plan and the request, answers with a progress note
and then its final reply; Ann's plan view shows both, the final one marked,
and the draft at revision 1; she archives the plan and restores it. The
plan's transcript is no conversation: it is not in her sidebar.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio

from node.client import open_client
from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    DIALOGS,
    Person,
    admin,
    browser_thread,
    new_person,
    new_workspace,
    open_page,
)
from tests.test_browser import pytestmark as pytestmark  # the browser mark, Chromium needed

if TYPE_CHECKING:
    from playwright.sync_api import Browser

REQUEST = "Set up a weekly release checklist"
FINAL = "1. Freeze main\n2. Tag the release\n3. Announce it"


async def new_agent(node: RunningNode, workspace_id: str, handle: str) -> Person:
    created = await admin(
        node, "create-member", "--workspace", workspace_id, "--type", "agent", "--handle", handle
    )
    token = await admin(node, "issue-token", "--member", created["memberId"])
    return Person(created["memberId"], handle, token["token"])


async def test_create_a_plan_request_and_see_the_final_reply(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            bot = await new_agent(node, workspace, "bot")
            async with (
                open_client(node.url, bot.token, kind="daemon") as agent,
                trio.open_nursery() as nursery,
            ):

                async def answer() -> None:
                    woke = await agent.events_until(lambda ev: ev["type"] == "deliver", 30)
                    wake = woke[-1]
                    assert wake["message"]["content"] == REQUEST
                    await agent.request("ack", deliveryId=wake["deliveryId"])
                    await agent.workflow_reply(wake["requestId"], "Drafting the steps")
                    await agent.workflow_reply(wake["requestId"], FINAL, final=True)

                nursery.start_soon(answer)
                await browser.run(lambda b: plan_and_ask(b, node, ann))
            assert DIALOGS == []


def plan_and_ask(browser: Browser, node: RunningNode, ann: Person) -> None:
    from playwright.sync_api import expect

    context, page = open_page(browser, node.http, ann.token)
    page.get_by_role("button", name="Workflows").click()
    dialog = page.get_by_role("dialog", name="Workflows")
    dialog.get_by_text("New plan").click()
    dialog.get_by_role("textbox", name="Plan title").fill("Release checklist")
    dialog.get_by_role("combobox", name="Agent").select_option(label="bot")
    dialog.get_by_role("button", name="Create plan").click()

    plan = dialog.get_by_role("region", name="Release checklist")
    expect(plan).to_be_visible()
    expect(dialog.get_by_role("list", name="Workflow plans")).to_contain_text("Release checklist")
    expect(plan.get_by_role("status")).to_have_text("Draft revision 0")

    plan.get_by_role("textbox", name="Request").fill(REQUEST)
    plan.get_by_role("button", name="Send request").click()
    transcript = plan.get_by_role("list", name="Transcript").get_by_role("listitem")
    expect(transcript.filter(has_text=REQUEST)).to_have_count(1)

    # The agent's note, then its final reply, marked; the draft one revision up.
    expect(transcript.filter(has_text="Drafting the steps")).to_have_count(1)
    final = transcript.filter(has_text="Tag the release")
    expect(final).to_contain_text("Final reply")
    expect(transcript.filter(has_text="Final reply")).to_have_count(1)
    expect(plan.get_by_role("status")).to_have_text("Draft revision 1")
    expect(plan.get_by_label("Current draft")).to_contain_text("Announce it")

    # Archived, the plan keeps its transcript and takes no request until restored.
    plan.get_by_role("button", name="Archive plan").click()
    expect(plan.get_by_role("status")).to_have_text("Draft revision 1 · archived")
    expect(plan.get_by_role("button", name="Send request")).to_be_disabled()
    expect(transcript).to_have_count(3)
    plan.get_by_role("button", name="Restore plan").click()
    expect(plan.get_by_role("button", name="Send request")).to_be_enabled()

    # The transcript is no conversation of hers.
    dialog.get_by_role("button", name="Close").click()
    nav = page.get_by_role("navigation", name="Conversations")
    expect(nav).not_to_contain_text("Release checklist")
    context.close()
