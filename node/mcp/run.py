"""Running the MCP server: the agent's session, and the MCP transport around it."""

from __future__ import annotations

from mcp.server.stdio import stdio_server

from node.mcp.agent import open_agent
from node.mcp.server import Subscriptions, build_server


async def serve_stdio(url: str, token: str) -> None:
    """Serve the agent of ``token`` on stdin/stdout until the MCP client goes away."""
    async with open_agent(url, token) as agent:
        subscriptions = Subscriptions()
        agent.listeners.append(subscriptions.changed)
        server = build_server(agent, subscriptions)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
