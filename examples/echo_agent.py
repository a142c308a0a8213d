"""An agent daemon that answers every wake (a mention, any DM) with an echo.

    scopenode admin create-member --workspace W --type agent --handle echo
    scopenode admin issue-token --member MEM
    python examples/echo_agent.py 'ws://127.0.0.1:8765/v1/ws' TOKEN

Add the agent to a channel (``join`` as the agent, or invite it), then write
``@echo hello`` there: it answers ``echo: hello`` in the same conversation.
In a DM with it, ``hello`` is enough.

The loop is the one ``docs/agents.md`` describes: wait for a wake, answer it
with :meth:`DaemonClient.reply` (fresh send; on ``held`` read what is new and
try again; acknowledge only once the answer is stored), and reconnect with
backoff, keeping the runtime's frontier across connections. One JSON line per
step goes to stdout; logs go to stderr.

``ECHO_AGENT_GATE_DIR`` is a test hook: when set, the agent writes
``<dir>/<deliveryId>.woken`` after each wake and waits for
``<dir>/<deliveryId>.go`` before answering, so that a test can post a
message in between (``tests/test_echo_agent.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import trio
import trio_websocket

from node import logs
from node.client import (
    ClientError,
    ConnectionClosed,
    DaemonClient,
    Delivery,
    Frontier,
    ReplyNotSent,
    open_daemon,
)

RECONNECT_FIRST = 0.5
RECONNECT_MAX = 30.0
# Closes that a reconnect cannot fix: bad or revoked token, wrong workspace.
FATAL_CLOSE_CODES = {4401, 4403}


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def echo_of(content: str, handle: str) -> str:
    # Strip our own mention: echoing "@echo" back would mention ourselves. Word
    # by word, not by a pattern: the node's parser is the only mention parser.
    own = f"@{handle}".lower()
    words = [w for w in content.split() if w.rstrip(".,;:!?").lower() != own]
    return f"echo: {' '.join(words)}"


async def wait_at_gate(gate: trio.Path, delivery: Delivery) -> None:
    await (gate / f"{delivery.delivery_id}.woken").write_text(delivery.message_id)
    go = gate / f"{delivery.delivery_id}.go"
    # Another process opens the gate: there is no event to wait on but the file.
    while not await go.exists():  # noqa: ASYNC110
        await trio.sleep(0.02)


async def answer(daemon: DaemonClient, delivery: Delivery, handle: str) -> None:
    emit("woken", deliveryId=delivery.delivery_id, targetSeq=delivery.target_seq)
    gate = os.environ.get("ECHO_AGENT_GATE_DIR")
    if gate:
        await wait_at_gate(trio.Path(gate), delivery)
    content = str(delivery.message.get("content", ""))
    try:
        replied = await daemon.reply(delivery, echo_of(content, handle))
    except ReplyNotSent as exc:
        # The conversation kept moving under us for every attempt: an echo of
        # a message everyone has moved past is noise, so drop it, loudly.
        emit("gave_up", deliveryId=delivery.delivery_id, reason=exc.reason, attempts=exc.attempts)
        await daemon.ack(delivery)
        return
    except ClientError as exc:
        if exc.retryable:
            raise  # unacknowledged: the reconnect gets it back
        # The node refused the answer (no longer a member, say): it never will.
        emit("refused", deliveryId=delivery.delivery_id, code=exc.code)
        await daemon.ack(delivery)
        return
    emit(
        "replied",
        deliveryId=delivery.delivery_id,
        state=replied.state,
        attempts=replied.attempts,
        acked=replied.acked,
        messageId=replied.message_id,
    )


async def serve(url: str, token: str) -> int:
    # The runtime's memory of what it has seen outlives each connection, so a
    # redelivery of something already answered is recognised as stale.
    frontier = Frontier()
    delay = RECONNECT_FIRST
    while True:
        try:
            async with open_daemon(
                url, token, frontier=frontier, name="echo-agent", heartbeat=True, keep_events=False
            ) as daemon:
                delay = RECONNECT_FIRST
                handle = str(daemon.client.welcome["member"]["handle"])
                emit("ready", memberId=daemon.client.member_id, handle=handle)
                while True:
                    # Pending deliveries come first after each connect, oldest first.
                    await answer(daemon, await daemon.next_wake(), handle)
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
    parser = argparse.ArgumentParser(description="An agent that echoes its mentions.")
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
