"""A private agent's MCP server reads exactly what the node lets the agent read.

Owner O, O's private agent P (added to #c as O's private member), human H in
#c without a grant, and H's #hidden and private #closed, which P never joined. What P may read
(docs/design.md#private-agents): its owner's messages, not H's. Through
``scopenode mcp`` the same holds for every way in — ``read_messages``,
``search``, a conversation resource and its subscription — and where the node
refuses P, the tool error carries the very code the node gives P over the
protocol (the authorization matrix's private-agent column).
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from actors.model import MemberType
from node.client import ClientError
from node.mcp.run import serve_http
from tests.nodes import RunningNode, World, make_channel, running_node
from tests.test_authorization_matrix import COLUMNS, MATRIX, PRIVATE_CHANNEL, PUBLIC_CHANNEL
from tests.test_mcp import call, refused


@asynccontextmanager
async def http_session(node: RunningNode, token: str) -> AsyncIterator[ClientSession]:
    """``scopenode mcp --http 0`` for the agent of ``token``, in this process, and a
    client session on its streamable HTTP endpoint."""
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(serve_http, node.url, token, 0)
        async with (
            streamable_http_client(endpoint) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
        nursery.cancel_scope.cancel()


def matrix_cell(scope_kind: str, op: str = "history") -> str | None:
    """What the authorization matrix says a private agent of another owner gets."""
    return MATRIX[scope_kind][op][COLUMNS[scope_kind].index("other_agent")]


# The SDK's HTTP client leaves its response streams' async generators to the
# garbage collector when a session ends (client side only).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_private_agent_sees_only_what_the_predicate_gives(
    database_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node)
            owner = await world.member("owner")
            human = await world.member("h")
            agent = await world.member("p", MemberType.AGENT, owner=owner, private=True)
            async with (
                world.client(owner) as o,
                world.client(human) as h,
                world.client(agent) as p,
            ):
                scope = await make_channel(o, "c", h)
                await o.request("invite", scopeId=scope, memberId=agent.id, visibility="private")
                await h.send("#c", "zebra secret from h")
                await o.send("#c", "zebra plan from the owner")
                hidden = await h.request("createChannel", slug="hidden", name="Hidden")
                await h.send("#hidden", "zebra in hidden")
                closed = await h.request(
                    "createChannel", slug="closed", name="Closed", visibility="private"
                )
                await h.send("#closed", "zebra in closed")
                with pytest.raises(ClientError) as denied:
                    await p.history(f"scope:{hidden['scopeId']}")
                node_code = denied.value.code
                assert node_code == matrix_cell(PUBLIC_CHANNEL)

            async with http_session(node, agent.token) as mcp:
                text, page = await call(mcp, "read_messages", conversation="#c")
                assert [m["text"] for m in page["messages"]] == ["zebra plan from the owner"]
                assert "secret" not in text

                text, found = await call(mcp, "search", query="zebra")
                assert [hit["text"] for hit in found["hits"]] == ["zebra plan from the owner"]
                assert "secret" not in text
                assert "hidden" not in text

                uri = f"scopenode://conversation/{scope}"
                listed = await mcp.list_resources()
                assert [str(r.uri) for r in listed.resources] == [uri]
                read = await mcp.read_resource(uri)
                shown = "".join(getattr(c, "text", "") for c in read.contents)
                assert "zebra plan from the owner" in shown
                assert "secret" not in shown

                code = await refused(mcp, "read_messages", conversation=hidden["scopeId"])
                assert code == node_code
                code = await refused(mcp, "read_messages", conversation=closed["scopeId"])
                assert code == matrix_cell(PRIVATE_CHANNEL)
                code = await refused(mcp, "search", query="zebra", conversation=hidden["scopeId"])
                assert code == matrix_cell(PUBLIC_CHANNEL, "search")
                hidden_uri = f"scopenode://conversation/{hidden['scopeId']}"
                with warnings.catch_warnings():
                    # resources/subscribe is the handshake era's; the server serves both.
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    for attempt in (mcp.read_resource, mcp.subscribe_resource):
                        with pytest.raises(MCPError) as error:
                            await attempt(hidden_uri)
                        assert node_code in str(error.value)
