"""Targets (docs/protocol.md, "Requests and replies") → scope ids, with a per-node cache.

A private scope the caller has never belonged to does not exist for it
(docs/authorization.md): every form that names a scope (``#slug``,
``#slug:<root>``, ``scope:<id>``, ``task:<id>``, a bare ``scopeId``) answers
such a scope with the very ``not_found`` a missing one gets, from the same one
statement (``storage.access.known_scope``).

Slugs, DM identities, thread roots and scope workspaces never change, and a
scope once known to a member stays known (memberships are never deleted), so
the caches need no invalidation. A scope every member of the workspace knows
(a public channel, a thread of one) is cached per workspace; any other, and
every DM and thread target, per member.
"""

from __future__ import annotations

import re

from actors.lru import Lru
from actors.model import Member, ScopeInfo
from actors.policy import can_open_dm, knows_member
from protocol.errors import ErrorCode, OperationError
from storage import access, directory, messages, scopes
from storage.access import KnownScope
from storage.pool import Pool

_SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,79}$")
# Threads and DMs are cached per member, so the targets a node has seen grow
# with every thread anyone posts in: the most recently used ones are kept.
TARGETS_CACHED = 5_000
SCOPES_CACHED = 20_000

TARGET = "$.target"
SCOPE_ID = "$.scopeId"


def no_such_scope(path: str) -> OperationError:
    """The one answer for a scope id that names nothing the caller may know of."""
    return OperationError(ErrorCode.NOT_FOUND, "no such scope", path=path)


def _no_such_channel(slug: str) -> OperationError:
    return OperationError(ErrorCode.NOT_FOUND, f"no channel #{slug}", path=TARGET)


def _no_such_member() -> OperationError:
    return OperationError(ErrorCode.NOT_FOUND, "no such member", path=TARGET)


class Resolver:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        # (workspace or member id, target) → scope id
        self._cache: Lru[tuple[str, str], str] = Lru("resolver_targets", TARGETS_CACHED)
        # (workspace or member id, scope id) → True: the scope exists for them
        self._known: Lru[tuple[str, str], bool] = Lru("resolver_scopes", SCOPES_CACHED)

    @staticmethod
    def _holder(member: Member, found: KnownScope) -> str:
        return member.workspace_id if found.shared else member.id

    def cached(self, member: Member, target: str) -> str | None:
        found = self._cache.get((member.workspace_id, target))
        return found if found is not None else self._cache.get((member.id, target))

    async def resolve(self, member: Member, target: str) -> str:
        """The scope id a target names, if that scope exists for the member."""
        found = self.cached(member, target)
        if found is not None:
            return found
        scope_id, holder = await self._lookup(member, target)
        self._cache.put((holder, target), scope_id)
        self._known.put((holder, scope_id), True)
        return scope_id

    async def scope(self, member: Member, scope_id: str, path: str = SCOPE_ID) -> ScopeInfo:
        """The scope, read now, if it exists for the member (``not_found`` otherwise)."""
        async with self._pool.connection() as conn:
            found = await access.known_scope(conn, scope_id, member)
        if found is None:
            raise no_such_scope(path)
        self._known.put((self._holder(member, found), scope_id), True)
        return found.info

    def knows_nowait(self, member: Member, scope_id: str) -> bool:
        """Whether the scope is known to exist for the member without asking the
        database (False: ask with :meth:`known`)."""
        known = self._known
        return (member.workspace_id, scope_id) in known or (member.id, scope_id) in known

    async def known(self, member: Member, scope_id: str, path: str = SCOPE_ID) -> None:
        """Check a bare scope id exists for the member (cached once it does)."""
        if not self.knows_nowait(member, scope_id):
            await self.scope(member, scope_id, path)

    def remember(self, member: Member, found: KnownScope) -> None:
        """Keep a scope found known to the member by another lookup (a message's scope)."""
        self._known.put((self._holder(member, found), found.info.id), True)

    async def _thread(self, member: Member, parent: ScopeInfo, root_id: str) -> str:
        """The reply thread of ``root_id`` in the parent channel, created on first use.

        The root must be a message of the parent (``not_found``) that the
        member can read there (the SQL readable predicate; ``forbidden``).
        The parent exists for the member: the caller looked it up as such.
        """
        async with self._pool.connection() as conn:
            if not await messages.message_in_scope(conn, parent.id, root_id):
                raise OperationError(
                    ErrorCode.NOT_FOUND, "no such root message in this channel", path=TARGET
                )
            viewer = await access.viewer_for(conn, parent, member)
            root = (
                await messages.readable_message(conn, parent.id, root_id, viewer)
                if viewer is not None
                else None
            )
            if root is None:
                raise OperationError(ErrorCode.FORBIDDEN, "the root message is not readable")
            return await scopes.get_or_create_thread(conn, parent, root_id, member)

    async def _lookup(self, member: Member, target: str) -> tuple[str, str]:
        """(scope id, cache holder: the workspace or the member) of a target."""
        kind, _, rest = target.partition(":")
        if target.startswith("#"):
            slug, _, root = target[1:].partition(":")
            if not _SLUG.match(slug):
                raise OperationError(ErrorCode.INVALID_TARGET, f"bad channel slug in {target!r}")
            async with self._pool.connection() as conn:
                found = await access.known_channel(conn, slug, member)
            if found is None:
                raise _no_such_channel(slug)
            if root:
                # Root readability is the member's own: thread targets are per member.
                return await self._thread(member, found.info, root), member.id
            return found.info.id, self._holder(member, found)
        if kind in ("scope", "task") and rest:
            async with self._pool.connection() as conn:
                found = await access.known_scope(conn, rest, member)
            if found is None:
                raise no_such_scope(TARGET)
            if kind == "task" and found.info.type.value != "task":
                raise OperationError(ErrorCode.INVALID_TARGET, "not a task scope")
            return found.info.id, self._holder(member, found)
        if kind == "dm" and rest:
            return await self._dm(member, rest), member.id
        raise OperationError(ErrorCode.INVALID_TARGET, f"unrecognised target {target!r}")

    async def _dm(self, member: Member, other_id: str) -> str:
        """``dm:<id>``: the member's DM with another, created on first use.

        Another owner's private agent is answered as no member at all.
        """
        async with self._pool.connection() as conn:
            other = await directory.get_member(conn, other_id)
            if (
                other is None
                or other.workspace_id != member.workspace_id
                or not knows_member(member, other)
            ):
                raise _no_such_member()
            allowed = can_open_dm(member, other)
            if not allowed:
                raise OperationError(
                    ErrorCode.FORBIDDEN,
                    "a private agent is in no DM but its owner's",
                    details={"reason": allowed.reason},
                )
            return await scopes.get_or_create_dm(conn, member, other)
