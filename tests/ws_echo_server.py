"""An echo application on the node's own WebSocket stack, for conformance runs.

A conformance suite cannot get past ``/v1/ws`` as it is: its first text frame
is not a ``hello``, so the session closes with 4401 before any framing case
is reached. This module serves the same stack with one difference: a text
message is echoed back instead of decoded as a request. Everything else is
the node's code, unchanged: the upgrade (``node.server._accept``), the
session's read loop, parser and limits (``InboundFrames`` with the default
``max_frame_bytes``), ping/pong, the close handshake, the outbound queue
(``Outbound``) and the sweeper that enforces the session deadlines. What the
node does with a binary or oversized message (an ``error`` frame) stays too.

Run by hand: ``python -m tests.ws_echo_server [PORT]`` serves
``ws://127.0.0.1:PORT/v1/ws`` until interrupted.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from types import SimpleNamespace
from typing import Any

import h11
import trio

from actors.ids import new_id
from node.app import sweep_sessions
from node.config import Settings
from node.metrics import Metrics
from node.server import _accept
from node.session import Session

PATH = "/v1/ws"


class EchoSession(Session):
    """A session whose application echoes each text message as it came."""

    async def _on_text(self, payload: bytes) -> None:
        self.services.metrics.frames_in += 1
        self.push(payload)


def echo_services(settings: Settings | None = None) -> Any:
    """What the upgrade, the session and the sweeper read of ``Services``.

    An echo session never sends ``hello``: the hello deadline is pushed past
    any run, while the heartbeat and slow-consumer deadlines stay in force.
    """
    settings = settings or Settings()
    return SimpleNamespace(
        settings=replace(settings, hello_timeout=float("inf")),
        metrics=Metrics(),
        sessions=set(),
        draining=False,
        ready=True,
    )


async def handle_echo_connection(services: Any, stream: trio.SocketStream) -> None:
    """One connection, as ``node.server.handle_connection`` serves it, with an echo session."""
    try:
        upgrade = await _accept(services, stream)
        if upgrade is None:
            return
        session = EchoSession(
            services,
            stream,
            upgrade.received,
            workspace_param=upgrade.workspace,
            session_id=new_id("ses"),
        )
        services.sessions.add(session)
        try:
            await session.run()
        finally:
            services.sessions.discard(session)
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        pass
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


async def serve_echo(
    port: int = 0,
    *,
    settings: Settings | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the echo application on 127.0.0.1; reports the port it listens on."""
    services = echo_services(settings)
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sweep_sessions, services)
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(partial(handle_echo_connection, services), listeners)


async def _main(port: int) -> None:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_echo, port))
        print(f"ws://127.0.0.1:{bound}{PATH}", flush=True)


if __name__ == "__main__":
    trio.run(_main, int(sys.argv[1]) if len(sys.argv) > 1 else 9001)
