"""Running the MCP server: the agent's session, and the MCP transport around it.

stdio for an MCP client that starts the server itself; streamable HTTP on
127.0.0.1 for one that connects to a running server (every connected client
is the same agent, through the same session). HTTP is served by hypercorn,
an ASGI server that runs on trio like the rest of the node.
"""

from __future__ import annotations

import sys

import trio
from mcp.server.stdio import stdio_server

from node.mcp.agent import open_agent
from node.mcp.server import Subscriptions, build_server

HTTP_HOST = "127.0.0.1"
HTTP_PATH = "/mcp"


async def serve_stdio(url: str, token: str) -> None:
    """Serve the agent of ``token`` on stdin/stdout until the MCP client goes away."""
    async with open_agent(url, token) as agent:
        subscriptions = Subscriptions()
        agent.listeners.append(subscriptions.changed)
        server = build_server(agent, subscriptions)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_http(
    url: str, token: str, port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the agent of ``token`` over streamable HTTP on 127.0.0.1:``port`` (0: any free
    port); ``task_status`` gets the endpoint's URL once it listens."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    async with open_agent(url, token) as agent:
        subscriptions = Subscriptions()
        agent.listeners.append(subscriptions.changed)
        app = build_server(agent, subscriptions).streamable_http_app(
            host=HTTP_HOST, streamable_http_path=HTTP_PATH
        )
        config = Config()
        config.bind = [f"{HTTP_HOST}:{port}"]
        config.accesslog = None
        config.errorlog = "-"
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(serve, app, config)
            endpoint = binds[0] + HTTP_PATH
            print(f"scopenode mcp: listening on {endpoint}", file=sys.stderr, flush=True)
            task_status.started(endpoint)
