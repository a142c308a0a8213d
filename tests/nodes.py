"""Starting real nodes in-process for integration tests, and provisioning them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from actors.model import Member, MemberType
from node.app import serve_node
from node.client import Client, open_client
from node.config import Settings
from node.services import Services
from storage import directory
from storage.pg import TrioConnection, connect


@dataclass
class RunningNode:
    services: Services
    database_url: str

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.services.port}/v1/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.services.port}"


@asynccontextmanager
async def running_node(
    database_url: str, data_dir: Path, **overrides: Any
) -> AsyncIterator[RunningNode]:
    settings = replace(
        Settings(port=0, data_dir=data_dir, database_url=database_url, heartbeat_ms=20_000),
        **overrides,
    )
    async with trio.open_nursery() as nursery:
        services = await nursery.start(serve_node, settings)
        try:
            yield RunningNode(services, database_url)
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def running_world(
    database_url: str, data_dir: Path, **overrides: Any
) -> AsyncIterator[World]:
    """A node (``overrides``: its settings) with one workspace; the node is ``world.node``."""
    async with running_node(database_url, data_dir, **overrides) as node:
        yield await World.create(node)


@asynccontextmanager
async def provisioning(node: RunningNode) -> AsyncIterator[TrioConnection]:
    """An autocommit connection for provisioning: one of an in-process node's
    own (a connection per member was most of a small test's database CPU),
    else a new one (a node in a subprocess)."""
    if isinstance(node, RunningNode):
        async with node.services.pool.connection() as conn:
            yield conn
    else:
        async with await connect(node.database_url, autocommit=True) as conn:
            yield conn


@dataclass
class Person:
    member: Member
    token: str

    @property
    def id(self) -> str:
        return self.member.id


class World:
    """Provisioning straight through storage (the CLI is tested separately)."""

    def __init__(self, node: RunningNode, workspace_id: str) -> None:
        self.node = node
        self.workspace_id = workspace_id

    @classmethod
    async def create(cls, node: RunningNode, name: str = "test") -> World:
        async with provisioning(node) as conn:
            workspace_id = await directory.create_workspace(conn, name)
        return cls(node, workspace_id)

    async def member(
        self,
        handle: str,
        type_: MemberType = MemberType.HUMAN,
        *,
        owner: Person | None = None,
        private: bool = False,
    ) -> Person:
        async with provisioning(self.node) as conn:
            member = await directory.create_member(
                conn,
                workspace_id=self.workspace_id,
                type_=type_,
                handle=handle,
                owner_member_id=owner.id if owner else None,
                private=private,
            )
            token = await directory.issue_token(conn, member.id)
        return Person(member, token)

    async def members(self, *handles: str) -> list[Person]:
        """Human members, one per handle, in order."""
        return [await self.member(handle) for handle in handles]

    def client(self, person: Person, **kwargs: Any) -> Any:
        url = f"{self.node.url}?workspace={self.workspace_id}"
        return open_client(url, person.token, **kwargs)


async def make_channel(client: Client, slug: str, *members: Client) -> str:
    result = await client.request("createChannel", slug=slug, name=slug.title())
    scope_id: str = result["scopeId"]
    for other in members:
        await other.request("join", scopeId=scope_id)
    return scope_id
