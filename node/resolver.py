"""Targets (docs/protocol.md, "Requests and replies") → scope ids, with a per-node cache.

Slugs, DM identities, thread roots and scope workspaces never change, so the
cache needs no invalidation. DM and reply-thread targets are cached per member:
a thread target is resolved only for a member that could read its root once
(the actor and the read paths check rights on every use anyway).
"""

from __future__ import annotations

import re

from actors.lru import Lru
from actors.model import Member, ScopeInfo
from actors.policy import can_open_dm
from protocol.errors import ErrorCode, OperationError
from storage import directory, messages, scopes
from storage.pg import Pool

_SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,79}$")
# Threads and DMs are cached per member, so the targets a node has seen grow
# with every thread anyone posts in: the most recently used ones are kept.
TARGETS_CACHED = 5_000
SCOPES_CACHED = 20_000


class Resolver:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._cache: Lru[tuple[str, str], str] = Lru("resolver_targets", TARGETS_CACHED)
        self._workspace_of: Lru[str, str] = Lru("resolver_scopes", SCOPES_CACHED)

    @staticmethod
    def _key(member: Member, target: str) -> tuple[str, str]:
        per_member = target.startswith("dm:") or (target.startswith("#") and ":" in target)
        return (member.id if per_member else member.workspace_id, target)

    def cached(self, member: Member, target: str) -> str | None:
        return self._cache.get(self._key(member, target))

    async def resolve(self, member: Member, target: str) -> str:
        """The scope id a target names, in the member's workspace."""
        key = self._key(member, target)
        found = self._cache.get(key)
        if found is not None:
            return found
        scope_id = await self._lookup(member, target)
        self._cache.put(key, scope_id)
        return scope_id

    async def scope(self, member: Member, scope_id: str) -> ScopeInfo:
        """A scope of the member's workspace (``not_found`` otherwise)."""
        async with self._pool.connection() as conn:
            info = await scopes.get_scope(conn, scope_id)
        if info is None or info.workspace_id != member.workspace_id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such scope")
        return info

    async def workspace_of(self, member: Member, scope_id: str) -> None:
        """Check a bare scope id belongs to the member's workspace (cached)."""
        workspace = self._workspace_of.get(scope_id)
        if workspace is None:
            workspace = (await self.scope(member, scope_id)).workspace_id
            self._workspace_of.put(scope_id, workspace)
        if workspace != member.workspace_id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such scope")

    async def _thread(self, member: Member, parent_id: str, root_id: str) -> str:
        """The reply thread of ``root_id`` in the parent channel, created on first use.

        The root must be a message of the parent (``not_found``) that the
        member can read there (the SQL readable predicate; ``forbidden``).
        """
        async with self._pool.connection() as conn:
            parent = await scopes.get_scope(conn, parent_id)
            assert parent is not None
            if not await messages.message_in_scope(conn, parent_id, root_id):
                raise OperationError(ErrorCode.NOT_FOUND, "no such root message in this channel")
            viewer = await scopes.viewer_for(conn, parent, member)
            root = (
                await messages.readable_message(conn, parent_id, root_id, viewer)
                if viewer is not None
                else None
            )
            if root is None:
                raise OperationError(ErrorCode.FORBIDDEN, "the root message is not readable")
            return await scopes.get_or_create_thread(conn, parent, root_id, member)

    async def _lookup(self, member: Member, target: str) -> str:
        kind, _, rest = target.partition(":")
        if target.startswith("#"):
            slug, _, root = target[1:].partition(":")
            if not _SLUG.match(slug):
                raise OperationError(ErrorCode.INVALID_TARGET, f"bad channel slug in {target!r}")
            async with self._pool.connection() as conn:
                scope_id = await scopes.channel_by_slug(conn, member.workspace_id, slug)
            if scope_id is None:
                raise OperationError(ErrorCode.NOT_FOUND, f"no channel #{slug}")
            if root:
                return await self._thread(member, scope_id, root)
            return scope_id
        if kind in ("scope", "task") and rest:
            info = await self.scope(member, rest)
            if kind == "task" and info.type.value != "task":
                raise OperationError(ErrorCode.INVALID_TARGET, "not a task scope")
            return info.id
        if kind == "dm" and rest:
            async with self._pool.connection() as conn:
                other = await directory.get_member(conn, rest)
                if other is None or other.workspace_id != member.workspace_id:
                    raise OperationError(ErrorCode.NOT_FOUND, "no such member")
                allowed = can_open_dm(member, other)
                if not allowed:
                    raise OperationError(
                        ErrorCode.FORBIDDEN,
                        "a private agent is in no DM but its owner's",
                        details={"reason": allowed.reason},
                    )
                return await scopes.get_or_create_dm(conn, member, other)
        raise OperationError(ErrorCode.INVALID_TARGET, f"unrecognised target {target!r}")
