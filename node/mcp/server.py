"""The MCP server: the tools of :mod:`node.mcp.catalog` and one resource per conversation.

Built on the SDK's low-level ``Server``, so the argument schemas and the
descriptions are ours, word for word. Every call runs as the agent, through
its one session: the node decides what the agent may read and do, and a tool
the node refuses answers ``isError`` with the node's code and message.

Resources: ``scopenode://conversation/<id>`` is the conversation's latest
messages as text. A client that subscribes to one (``resources/subscribe``,
or a ``subscriptions/listen`` stream naming its URI) gets
``notifications/resources/updated`` whenever a message arrives there.
Reading a resource does not move the agent's frontier: a client may read it
without showing it to the model.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import structlog
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from node.client import ClientError
from node.mcp import render
from node.mcp.agent import Agent, ToolFailure
from node.mcp.catalog import BY_NAME, INSTRUCTIONS, TOOLS

log = structlog.get_logger(__name__)

RESOURCE_PREFIX = "scopenode://conversation/"
RESOURCE_MESSAGES = 30


def resource_uri(scope_id: str) -> str:
    return f"{RESOURCE_PREFIX}{scope_id}"


class Subscriptions:
    """Who follows which conversation, told of each message the agent's session gets:
    sessions that subscribed (``resources/subscribe``) and listen streams
    (``subscriptions/listen``, which filter the bus's events by URI themselves)."""

    def __init__(self) -> None:
        self._followers: dict[str, set[ServerSession]] = {}
        self.bus = InMemorySubscriptionBus()

    def add(self, scope_id: str, session: ServerSession) -> None:
        self._followers.setdefault(scope_id, set()).add(session)

    def remove(self, scope_id: str, session: ServerSession) -> None:
        self._followers.get(scope_id, set()).discard(session)

    async def changed(self, scope_id: str) -> None:
        # Only conversations the agent reads have messages on its session, so a
        # listener never learns of activity the agent could not see.
        await self.bus.publish(ResourceUpdated(uri=resource_uri(scope_id)))
        for session in list(self._followers.get(scope_id, ())):
            try:
                await session.send_resource_updated(resource_uri(scope_id))
            except Exception as exc:  # the client went away: it follows nothing any more
                log.info("subscriber_gone", scopeId=scope_id, error=repr(exc))
                self.remove(scope_id, session)


def _scope_of(uri: str) -> str:
    if not uri.startswith(RESOURCE_PREFIX) or len(uri) == len(RESOURCE_PREFIX):
        raise MCPError(types.INVALID_PARAMS, f"not a conversation resource: {uri}")
    return uri[len(RESOURCE_PREFIX) :]


def _failure_result(failure: ToolFailure) -> types.CallToolResult:
    error = {"code": failure.code, "message": failure.message, **failure.details}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{failure.code}: {failure.message}")],
        structured_content={"error": error},
        is_error=True,
    )


def build_server(agent: Agent, subscriptions: Subscriptions) -> Server[Any]:
    """The MCP server of ``agent``: its tools, its conversations as resources."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=t.schema)
                for t in TOOLS
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None:
            return _failure_result(ToolFailure("not_found", f"no tool named {params.name}"))
        try:
            text, structured = await tool.handler(agent, dict(params.arguments or {}))
        except ToolFailure as failure:
            log.info("tool_refused", tool=params.name, code=failure.code)
            return _failure_result(failure)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=json.loads(json.dumps(structured, default=str)),
        )

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        found = await agent.directory.conversations()
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=resource_uri(c.scope_id),
                    name=c.name,
                    title=c.title,
                    description=f"the latest messages of {c.name} ({c.unread} unread)",
                    mime_type="text/plain",
                )
                for c in found
            ]
        )

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="conversation",
            uri_template=RESOURCE_PREFIX + "{id}",
            description="the latest messages of the conversation with this id",
            mime_type="text/plain",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        scope_id = _scope_of(uri)
        try:
            page = await agent.client.history(f"scope:{scope_id}", limit=RESOURCE_MESSAGES)
        except ClientError as exc:
            raise MCPError(
                types.INVALID_PARAMS, f"{exc.code}: {exc.message}", {"code": exc.code}
            ) from None
        text = render.messages_text(list(page.get("messages") or []))
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)]
        )

    async def subscribe(
        ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        scope_id = _scope_of(str(params.uri))
        try:
            # Following needs reading: the node says whether the agent may.
            await agent.client.history(f"scope:{scope_id}", limit=1)
        except ClientError as exc:
            raise MCPError(
                types.INVALID_PARAMS, f"{exc.code}: {exc.message}", {"code": exc.code}
            ) from None
        subscriptions.add(scope_id, ctx.session)
        return types.EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        subscriptions.remove(_scope_of(str(params.uri)), ctx.session)
        return types.EmptyResult()

    return Server(
        "scopenode",
        version="1",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=ListenHandler(subscriptions.bus),
    )
