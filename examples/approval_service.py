"""A service that asks for a deploy approval with an interactive card.

    scopenode admin create-service --workspace W --handle deploys --display-name Deploys
    scopenode admin issue-service-token --service deploys
    python examples/approval_service.py 'ws://127.0.0.1:8765/v1/ws' TOKEN

It posts "Approve deploy #42?" with Approve and Reject buttons to its own
conversation (or ``--target '#ops'``, a channel it was invited into), waits
for someone to press one (the ``cardAction`` event its session gets), and
updates the card in place to "Approved by ann" (or "Rejected by …"): same
message, no new unread. One JSON line per step goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from node.client import Client, ClientError, open_client

DEPLOY = "#42"
QUESTION = f"Approve deploy {DEPLOY}?"
BUTTONS = [
    {"id": "approve", "label": "Approve", "style": "primary"},
    {"id": "reject", "label": "Reject", "style": "danger"},
]
VERDICT = {"approve": "Approved", "reject": "Rejected"}


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def own_conversation(client: Client) -> str:
    scopes = (await client.request("scopes"))["scopes"]
    return next(f"scope:{s['id']}" for s in scopes if s.get("type") == "service_account")


async def handle_of(client: Client, member_id: str) -> str:
    people = (await client.request("people"))["people"]
    return next((p["handle"] for p in people if p["id"] == member_id), "someone")


async def ask(client: Client, target: str) -> dict[str, Any]:
    """Post the question (once: a restart finds the same card by its clientMessageId)."""
    return await client.post_card(
        target,
        QUESTION,
        {"title": QUESTION, "text": "Production, 3 services.", "actions": BUTTONS},
        client_message_id=f"deploy-{DEPLOY.lstrip('#')}",
    )


async def decide(client: Client, message_id: str) -> str:
    """Wait for the first action on the card and close it with the verdict."""
    while True:
        event = await client.next_event()
        if event.get("type") != "cardAction" or event.get("messageId") != message_id:
            continue
        verdict = VERDICT.get(str(event.get("actionId")), "Answered")
        text = f"{verdict} by {await handle_of(client, str(event['memberId']))}"
        try:
            await client.update_card(
                message_id,
                event["revision"],
                {"title": f"Deploy {DEPLOY}", "text": text},
                fallback=text,
            )
        except ClientError as exc:
            # Someone else's action moved the card on first: wait for that one.
            if exc.code == "conflict":
                continue
            raise
        emit("decided", messageId=message_id, text=text)
        return text


async def run(url: str, token: str, target: str | None = None) -> str:
    async with open_client(url, token, kind="daemon", name="approval-service") as client:
        where = target or await own_conversation(client)
        posted = await ask(client, where)
        emit("asked", messageId=posted["messageId"], seq=posted["seq"])
        return await decide(client, posted["messageId"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", help="the node's WebSocket URL (add ?workspace=W if needed)")
    parser.add_argument("token", help="a token of the service (admin issue-service-token)")
    parser.add_argument("--target", help="a channel the service was invited into")
    args = parser.parse_args()
    trio.run(run, args.url, args.token, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
