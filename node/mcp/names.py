"""Conversations named as the web client names them: ``#general``, ``@ann``, an id.

The node's targets (``#slug``, ``#slug:<rootId>``, ``dm:<memberId>``,
``scope:<id>``) are what a send or a history read names; a model names a
conversation the way people in it do. :class:`Directory` maps one to the
other through the agent's own ``scopes``, ``members`` and ``people`` answers,
so it only ever knows what the agent may know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.client import Client


class UnknownConversation(Exception):
    """A conversation name that names nothing this agent can reach."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """One of the agent's conversations, as ``list_conversations`` shows it."""

    scope_id: str
    type: str
    name: str
    title: str
    latest_seq: int
    unread: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.scope_id,
            "type": self.type,
            "title": self.title,
            "latestSeq": self.latest_seq,
            "unread": self.unread,
        }


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where a conversation name points: the node's target, and its scope id when known
    (a DM or a thread not yet written in has none until the node creates it)."""

    target: str
    scope_id: str | None
    name: str


class Directory:
    """The agent's conversations by name and id, refreshed from the node on demand."""

    def __init__(self, client: Client, me: str) -> None:
        self._client = client
        self._me = me
        self._dm_peers: dict[str, str] = {}  # DM scope id -> the other member's handle
        self._by_id: dict[str, Conversation] = {}

    async def conversations(self) -> list[Conversation]:
        """Every conversation the agent is a member of, most recent activity first."""
        result = await self._client.request("scopes")
        found = [await self._entry(scope) for scope in result.get("scopes", [])]
        self._by_id = {c.scope_id: c for c in found}
        return found

    def name_of(self, scope_id: str) -> str:
        known = self._by_id.get(scope_id)
        return known.name if known else scope_id

    async def resolve(self, name: str) -> Resolved:
        """The target of ``name``: ``#slug``, ``#slug:<rootMessageId>`` (a thread),
        ``@handle`` (the DM with them), ``task:<taskId>`` or a conversation id."""
        name = name.strip()
        if not name:
            raise UnknownConversation("name a conversation: '#general', '@ann' or an id")
        if name.startswith("#") and ":" in name:
            return Resolved(name, None, name)
        if name.startswith(("#", "@")):
            for conversation in await self.conversations():
                if conversation.name.lower() == name.lower():
                    return Resolved(f"scope:{conversation.scope_id}", conversation.scope_id, name)
            if name.startswith("@"):
                return Resolved(f"dm:{await self.member_id(name)}", None, name)
            raise UnknownConversation(
                f"{name} is not one of your conversations (list_conversations shows them)"
            )
        if name.startswith("task:"):
            return Resolved(name, None, name)
        scope_id = name.removeprefix("scope:")
        if scope_id not in self._by_id:
            await self.conversations()
        return Resolved(f"scope:{scope_id}", scope_id, self.name_of(scope_id))

    async def member_id(self, handle_or_id: str) -> str:
        """A member id from ``@handle`` (of the people this agent may name) or an id."""
        if not handle_or_id.startswith("@"):
            return handle_or_id
        handle = handle_or_id[1:].lower()
        result = await self._client.request("people")
        for person in result.get("people", []):
            if str(person.get("handle", "")).lower() == handle:
                return str(person["id"])
        raise UnknownConversation(f"nobody you can reach is called {handle_or_id}")

    async def _entry(self, scope: dict[str, Any]) -> Conversation:
        scope_id = str(scope["id"])
        kind = str(scope.get("type", ""))
        title = str(scope.get("name") or scope.get("slug") or scope_id)
        if kind == "channel":
            name = f"#{scope.get('slug') or scope_id}"
        elif kind == "dm":
            name = f"@{await self._dm_peer(scope_id)}"
        else:
            name = scope_id
        return Conversation(
            scope_id=scope_id,
            type=kind,
            name=name,
            title=title,
            latest_seq=int(scope.get("latestSeq", 0)),
            unread=int(scope.get("unread", 0)),
        )

    async def _dm_peer(self, scope_id: str) -> str:
        peer = self._dm_peers.get(scope_id)
        if peer is None:
            result = await self._client.request("members", scopeId=scope_id)
            others = [m for m in result.get("members", []) if m.get("id") != self._me]
            # A DM with oneself has no other member: it is named after the agent.
            peer = str((others or result.get("members", [{}]))[0].get("handle", scope_id))
            self._dm_peers[scope_id] = peer
        return peer
