"""An agent in a real browser, as in Slack: a DM to it is answered without a
mention, and mentioning it in a channel it is not in says so under the
composer with an Invite button; once invited, the next mention is answered.

The same harness as tests/test_browser.py; the agent is a minimal daemon
driven with node.client.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from node.client import open_client
from tests.nodes import RunningNode, running_node
from tests.test_browser import (
    Person,
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
    from playwright.sync_api import Browser, Page


async def new_agent(node: RunningNode, workspace_id: str, handle: str) -> Person:
    created = await admin(
        node, "create-member", "--workspace", workspace_id, "--type", "agent", "--handle", handle
    )
    token = await admin(node, "issue-token", "--member", created["memberId"])
    return Person(created["memberId"], handle, token["token"])


async def echo_daemon(node: RunningNode, agent: Person, task_status: trio.TaskStatus[None]) -> None:
    """Answers every wake with ``echo: <text>`` and acknowledges it."""
    async with open_client(node.url, agent.token, kind="daemon", capabilities=["ack"]) as daemon:
        task_status.started()
        while True:
            event = await daemon.next_event()
            if event["type"] != "deliver":
                continue
            text = event["message"]["content"].replace(f"@{agent.handle}", "").strip()
            await daemon.send(f"scope:{event['targetKey']}", f"echo: {text}")
            await daemon.request("ack", deliveryId=event["deliveryId"])


async def test_an_agent_answers_dms_and_a_mention_outside_offers_an_invite(
    database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with trio.fail_after(90):
        async with browser_thread() as browser, running_node(database_url, tmp_path) as node:
            workspace = await new_workspace(node, "acme")
            ann = await new_person(node, workspace, "ann")
            echo = await new_agent(node, workspace, "echo")
            async with node_client(node, ann) as client:
                await client.request("createChannel", slug="design", name="Design")
            async with trio.open_nursery() as nursery:
                await nursery.start(echo_daemon, node, echo)

                def dm(browser: Browser) -> Page:
                    _, page = open_page(browser, node.http, ann.token)
                    expect(conversation(page, "#design")).to_be_visible()
                    page.get_by_role("button", name="New direct message").click()
                    dialog = page.get_by_role("dialog", name="New direct message")
                    dialog.get_by_role("button", name=re.compile("echo")).click()
                    expect(
                        page.get_by_role("heading", name=re.compile("echo", re.I))
                    ).to_be_visible()
                    send(page, "hello without a mention")
                    expect(
                        messages(page).filter(has_text="echo: hello without a mention")
                    ).to_have_count(1)
                    return page

                page = await browser.run(dm)

                def hint_and_invite(_: Browser) -> None:
                    conversation(page, "#design").click()
                    expect(page.get_by_role("heading", name="#design")).to_be_visible()
                    send(page, "@echo are you there")
                    expect(messages(page).filter(has_text="@echo are you there")).to_have_count(1)
                    note = page.locator("#composer-note")
                    expect(note).to_contain_text("@echo is not in #design")
                    note.get_by_role("button", name="Invite?").click()
                    expect(note).to_contain_text("Invited @echo to #design")
                    send(page, "@echo now you are here")
                    expect(messages(page).filter(has_text="echo: now you are here")).to_have_count(
                        1
                    )
                    expect(messages(page).filter(has_text="echo: are you there")).to_have_count(0)

                await browser.run(hint_and_invite)
                nursery.cancel_scope.cancel()
