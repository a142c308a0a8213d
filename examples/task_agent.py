"""An agent daemon that works on the tasks assigned to it (docs/tasks.md).

    scopenode admin create-member --workspace W --type agent --handle worker
    scopenode admin issue-token --member MEM
    python examples/task_agent.py 'ws://127.0.0.1:8765/v1/ws' TOKEN

Assign a task to it (``createTask`` with its member id among ``assignees``,
or "Create task" in the web client): it posts "On it." into the task's
discussion, sets the task ``in_progress``, posts "Done." and sets it
``done``, then acknowledges the wake. Any other wake (a mention, a DM) is
acknowledged and left alone. One JSON line per step goes to stdout.

Each post is a fresh send (``freshness`` from the discussion's latest seq)
with a clientMessageId derived from the delivery, so a reconnect that gets the
same wake again replays the posts as ``already_sent`` instead of repeating them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio
import trio_websocket

from node import logs
from node.client import Client, ClientError, ConnectionClosed, DaemonClient, Delivery, open_daemon

RECONNECT_FIRST = 0.5
RECONNECT_MAX = 30.0
FATAL_CLOSE_CODES = {4401, 4403}
SEND_ATTEMPTS = 5


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def post(client: Client, task_id: str, text: str, client_message_id: str) -> str:
    """Post into the task's discussion; a ``held`` send (someone wrote meanwhile) is
    tried again from the new latest seq. Returns the final state."""
    state = "held"
    for _ in range(SEND_ATTEMPTS):
        page = await client.history(f"task:{task_id}", limit=1)
        seen = max((int(m["seq"]) for m in page["messages"]), default=0)
        result = await client.send(
            f"task:{task_id}",
            text,
            clientMessageId=client_message_id,
            freshness={"targetKey": task_id, "seenUpToSeq": seen},
        )
        state = str(result["state"])
        if state != "held":
            break
    return state


async def work_on(daemon: DaemonClient, delivery: Delivery) -> None:
    task_id = delivery.task_id
    if delivery.reason != "task_assigned" or task_id is None:
        emit("ignored", deliveryId=delivery.delivery_id, reason=delivery.reason)
        await daemon.ack(delivery)
        return
    client = daemon.client
    title = str(delivery.message.get("content", ""))
    emit("assigned", taskId=task_id, title=title)
    key = delivery.delivery_id
    try:
        await post(client, task_id, "On it.", f"{key}:start")
        await client.update_task(task_id, status="in_progress")
        await post(client, task_id, f"Done: {title}", f"{key}:done")
        await client.update_task(task_id, status="done")
    except ClientError as exc:
        if exc.retryable:
            raise  # unacknowledged: the reconnect gets it back
        # Unassigned or no longer a member meanwhile: nothing left to do.
        emit("refused", taskId=task_id, code=exc.code)
    else:
        emit("done", taskId=task_id)
    await daemon.ack(delivery)


async def serve(url: str, token: str) -> int:
    delay = RECONNECT_FIRST
    while True:
        try:
            async with open_daemon(
                url, token, name="task-agent", heartbeat=True, keep_events=False
            ) as daemon:
                delay = RECONNECT_FIRST
                emit("ready", memberId=daemon.client.member_id)
                while True:
                    await work_on(daemon, await daemon.next_wake())
        except ConnectionClosed as exc:
            if exc.code in FATAL_CLOSE_CODES:
                emit("rejected", code=exc.code)
                return 2
            emit("disconnected", code=exc.code, retryInS=delay)
        except ClientError as exc:
            emit("disconnected", code=exc.code, retryInS=delay)
        except (OSError, trio_websocket.HandshakeError) as exc:
            emit("unreachable", error=str(exc), retryInS=delay)
        await trio.sleep(delay)
        delay = min(delay * 2, RECONNECT_MAX)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An agent that works on its assigned tasks.")
    parser.add_argument("url", help="the node's WebSocket URL, e.g. ws://127.0.0.1:8765/v1/ws")
    parser.add_argument("token", help="the agent member's token")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    try:
        return trio.run(serve, args.url, args.token)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
