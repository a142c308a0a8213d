"""The agent's session behind the MCP tools: wakes, reads, fresh sends, acks.

One :class:`Agent` per MCP server process: one daemon session of the client
library (one WebSocket, reconnect with backoff, resume), one
:class:`~node.client.Frontier` for as long as the process lives (the model's
context is what it has been shown through these tools), and the wakes handed
to the model and not yet acknowledged.

The rules are the daemon's (docs/agents.md), with the model as the runtime:

* what the model is shown (a history page, a wake with its context, the
  messages a ``held`` answer missed) moves the frontier; nothing else does;
* a send carries that frontier as freshness; ``held`` is handed back to the
  model with what it missed, never resent on its behalf;
* a wake is acknowledged only once a reply in its conversation is stored, or
  the model dismisses it. A server that dies in between leaves it pending, and
  the node hands it to the next server.
"""

from __future__ import annotations

import math
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from node.client import (
    Backoff,
    ClientError,
    DaemonClient,
    Delivery,
    Frontier,
    open_client,
    open_daemon,
    reply_client_message_id,
)
from node.mcp.names import Directory, Resolved, UnknownConversation

log = structlog.get_logger(__name__)

# Messages of context around a wake, and the default page of read_messages.
CONTEXT_MESSAGES = 10
# Wakes remembered for `explain` after they were handled.
EXPLAINED_WAKES = 500
# The node refuses freshness for a scope it does not name and says which one it is.
KEY_MISMATCH = "target_key_mismatch"
# A key for a conversation the node has not created yet (a new DM or thread).
UNKNOWN_KEY = "unknown"


class ToolFailure(Exception):
    """A tool call the node (or the tool's own input check) refused: code and message."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        self.code = code
        self.message = message
        self.details = details or {}
        super().__init__(f"{code}: {message}")

    @classmethod
    def of(cls, exc: ClientError | UnknownConversation) -> ToolFailure:
        if isinstance(exc, UnknownConversation):
            return cls("not_found", str(exc))
        return cls(exc.code, exc.message, exc.details)


@dataclass
class Sent:
    """What became of a send: stored (``sent``/``already_sent``) or ``held`` with what was missed."""

    state: str
    conversation: str
    result: dict[str, Any]
    missed: list[dict[str, Any]] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)

    @property
    def stored(self) -> bool:
        return self.state in ("sent", "already_sent")


@dataclass
class Wake:
    """A wake handed to the model, with the conversation's latest messages."""

    delivery: Delivery
    conversation: str
    context: list[dict[str, Any]]


MessageListener = Callable[[str], Awaitable[None]]


class Agent:
    """The agent's side of every tool; see the module docstring for the rules."""

    def __init__(self, daemon: DaemonClient, directory: Directory) -> None:
        self.daemon = daemon
        self.directory = directory
        self._wakes_in, self._wakes_out = trio.open_memory_channel[Delivery](math.inf)
        # Taken from the channel but not shown to the model: handed out first.
        self._backlog: deque[Delivery] = deque()
        # Handed to the model, not yet acknowledged, by delivery id.
        self.open_wakes: dict[str, Delivery] = {}
        self._explained: OrderedDict[str, Delivery] = OrderedDict()
        self.listeners: list[MessageListener] = []

    @property
    def client(self) -> Any:
        return self.daemon.client

    @property
    def handle(self) -> str:
        return str(self.daemon.client.welcome["member"]["handle"])

    # --- the session ---------------------------------------------------------------

    async def pump(self) -> None:
        """Read the session: wakes queue for :meth:`wait`, messages go to the listeners."""
        while True:
            item = await self.daemon.next_wake_or_event()
            if isinstance(item, Delivery):
                log.info("wake_queued", deliveryId=item.delivery_id, reason=item.reason)
                self._wakes_in.send_nowait(item)
                continue
            scope_id = item.get("scopeId")
            if isinstance(scope_id, str):
                for listener in list(self.listeners):
                    await listener(scope_id)

    # --- wakes ----------------------------------------------------------------------

    async def wait(self, timeout: float) -> Wake | None:
        """The next wake within ``timeout`` seconds, shown to the model with its context."""
        delivery: Delivery | None = None
        if self._backlog:
            delivery = self._backlog.popleft()
        else:
            with trio.move_on_after(timeout):
                delivery = await self._wakes_out.receive()
        if delivery is None:
            return None
        try:
            where = await self._name_of(delivery.target_key)
            try:
                page = await self.daemon.read_history(
                    f"scope:{delivery.target_key}", limit=CONTEXT_MESSAGES
                )
            except ClientError as exc:
                log.info("wake_context_unreadable", code=exc.code, targetKey=delivery.target_key)
                page = {}
        except BaseException:
            # Not shown to the model (the call was cancelled, the session is
            # gone): the next wait hands it out again.
            self._backlog.appendleft(delivery)
            raise
        self.daemon.handed_to_runtime(delivery)
        self.open_wakes[delivery.delivery_id] = delivery
        self._remember(delivery)
        return Wake(delivery, where, list(page.get("messages") or []))

    async def _name_of(self, scope_id: str) -> str:
        if self.directory.name_of(scope_id) == scope_id:
            await self.directory.conversations()
        return self.directory.name_of(scope_id)

    async def dismiss(self, wake_id: str | None) -> list[Delivery]:
        """Acknowledge a wake without answering it (all open ones when ``wake_id`` is None)."""
        if wake_id is None:
            chosen = list(self.open_wakes.values())
        elif wake_id in self.open_wakes:
            chosen = [self.open_wakes[wake_id]]
        else:
            raise ToolFailure(
                "not_found",
                f"{wake_id} is not an open wake (open: {', '.join(self.open_wakes) or 'none'})",
            )
        for delivery in chosen:
            await self._ack(delivery)
        return chosen

    def explain(self, message_id: str) -> Delivery | None:
        """The wake this session handed the model for ``message_id``, if any."""
        return self._explained.get(message_id)

    # --- reading and sending --------------------------------------------------------

    async def read(self, conversation: str, since: int | None, limit: int) -> dict[str, Any]:
        """A page of history the model is shown: the frontier and read state move over it."""
        resolved = await self._resolve(conversation)
        fields: dict[str, Any] = {"limit": limit}
        if since is not None:
            fields["afterSeq"] = since
        try:
            page = await self.daemon.read_history(resolved.target, **fields)
            covers = page.get("coversThroughSeq")
            if isinstance(covers, int) and covers > 0:
                await self.client.request("markRead", scopeId=page["scopeId"], seq=covers)
        except ClientError as exc:
            raise ToolFailure.of(exc) from None
        page["conversation"] = resolved.name
        return page

    async def send(
        self, conversation: str, text: str, *, reply_to: str | None, thread: str | None
    ) -> Sent:
        """A fresh send; a stored one acknowledges the wakes it answers."""
        resolved = await self._resolve(conversation)
        if thread:
            resolved = self._thread_of(resolved, thread)
        answering = self._answering(resolved.scope_id, reply_to)
        client_message_id = (
            reply_client_message_id(answering) if answering else f"mcp-{uuid.uuid4().hex}"
        )
        key = resolved.scope_id or UNKNOWN_KEY
        try:
            result = await self._send_fresh(resolved.target, text, key, client_message_id)
        except ClientError as exc:
            earlier = _earlier_reply(exc, key) if answering else None
            if earlier is None:
                raise ToolFailure.of(exc) from None
            # A server before this one stored an answer to the wake and died
            # before its ack: that answer stands, one per wake.
            result = earlier
        key = str(result.get("targetKey") or key)
        sent = Sent(str(result.get("state")), resolved.name, result)
        if sent.stored:
            for delivery in self._answered_by(key, reply_to):
                await self._ack(delivery)
                sent.acked.append(delivery.delivery_id)
        else:
            # The model is shown what it missed now: the next send is fresh over it.
            try:
                sent.missed = await self.daemon.refresh(resolved.target, target_key=key)
            except ClientError as exc:
                raise ToolFailure.of(exc) from None
        return sent

    async def _send_fresh(
        self, target: str, text: str, key: str, client_message_id: str
    ) -> dict[str, Any]:
        """A send with the frontier of ``key``; a key the node corrects (a DM or a thread
        it creates on first use) is learned and the send made once more."""
        try:
            return await self.daemon.send(
                target, text, target_key=key, client_message_id=client_message_id
            )
        except ClientError as exc:
            learned = exc.details.get("targetKey")
            if exc.code != KEY_MISMATCH or not isinstance(learned, str):
                raise
        return await self.daemon.send(
            target, text, target_key=learned, client_message_id=client_message_id
        )

    # --- internals --------------------------------------------------------------------

    async def _resolve(self, conversation: str) -> Resolved:
        try:
            return await self.directory.resolve(conversation)
        except UnknownConversation as exc:
            raise ToolFailure.of(exc) from None
        except ClientError as exc:
            raise ToolFailure.of(exc) from None

    def _thread_of(self, resolved: Resolved, root_message_id: str) -> Resolved:
        channel = resolved.name if resolved.name.startswith("#") else None
        if channel is None and resolved.scope_id is not None:
            channel = self.directory.name_of(resolved.scope_id)
        if channel is None or not channel.startswith("#") or ":" in channel:
            raise ToolFailure(
                "validation_failed",
                "threads hang off channel messages: name the channel ('#general') "
                "and the root message id as thread",
                {"path": "$.thread"},
            )
        target = f"{channel}:{root_message_id}"
        return Resolved(target, None, target)

    def _answering(self, scope_id: str | None, reply_to: str | None) -> Delivery | None:
        """The open wake a send answers: the one about ``reply_to``, else the oldest
        open wake of the conversation."""
        for delivery in self.open_wakes.values():
            if reply_to is not None and delivery.message_id == reply_to:
                return delivery
        for delivery in self.open_wakes.values():
            if scope_id is not None and delivery.target_key == scope_id:
                return delivery
        return None

    def _answered_by(self, scope_id: str, reply_to: str | None) -> list[Delivery]:
        return [
            d
            for d in self.open_wakes.values()
            if d.target_key == scope_id or (reply_to is not None and d.message_id == reply_to)
        ]

    async def _ack(self, delivery: Delivery) -> None:
        try:
            await self.daemon.ack(delivery)
        except ClientError as exc:
            if exc.code != "not_found":  # consumed already: the wake is done either way
                raise ToolFailure.of(exc) from None
        self.open_wakes.pop(delivery.delivery_id, None)
        log.info("wake_acked", deliveryId=delivery.delivery_id)

    def _remember(self, delivery: Delivery) -> None:
        self._explained[delivery.message_id] = delivery
        while len(self._explained) > EXPLAINED_WAKES:
            self._explained.popitem(last=False)


def _earlier_reply(exc: ClientError, key: str) -> dict[str, Any] | None:
    """For ``idempotency_conflict`` on a wake's reply id: the stored reply, as ``already_sent``."""
    message_id = exc.details.get("messageId")
    if exc.code != "idempotency_conflict" or not isinstance(message_id, str):
        return None
    return {
        "state": "already_sent",
        "targetKey": exc.details.get("targetKey", key),
        "messageId": message_id,
        "acceptedSeq": exc.details.get("acceptedSeq"),
        "differentContent": True,
    }


@asynccontextmanager
async def open_agent(url: str, token: str) -> AsyncIterator[Agent]:
    """The agent's session, read by a background task for as long as the block runs.

    A wrong URL or token fails here at once: the session below reconnects
    through any outage, so its first connect would retry for ever.
    """
    async with open_client(url, token, name="scopenode-mcp"):
        pass
    async with (
        open_daemon(
            url,
            token,
            frontier=Frontier(),
            name="scopenode-mcp",
            heartbeat=True,
            reconnect=Backoff(base=0.1, cap=10.0),
        ) as daemon,
        trio.open_nursery() as nursery,
    ):
        me = str(daemon.client.welcome["member"]["id"])
        agent = Agent(daemon, Directory(daemon.client, me))
        nursery.start_soon(agent.pump)
        try:
            yield agent
        finally:
            nursery.cancel_scope.cancel()
