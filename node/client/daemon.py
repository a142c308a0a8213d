"""The agent daemon's side: deliveries, acknowledgements, fresh sends and replies.

A daemon is a :class:`~node.client.connection.Client` session opened with
``kind="daemon"`` and the capabilities ``freshness`` and ``ack``, wrapped
(composition, not inheritance) in a :class:`DaemonClient`. The wrapper keeps
the runtime's :class:`~node.client.frontier.Frontier`, hands out deliveries
one at a time, and sends with ``freshness.seenUpToSeq`` = observed, so the
node holds a send written without having seen the newest messages.

Stale-delivery suppression runs in :meth:`DaemonClient.next_wake`, the one
entry by which deliveries reach the runtime, when a delivery is dequeued
rather than when it arrives: one that waited in the local queue while
:meth:`DaemonClient.read_history` covered it is stale by the time it would
wake the runtime. A stale delivery is acknowledged (so the node never
redelivers it) and dropped, with a log line, before any wake.

:meth:`DaemonClient.reply` is the loop most daemons want: answer, handle
``held``, and only then acknowledge. ``docs/agents.md`` walks through it.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from node.client.connection import Client, ClientError, open_client
from node.client.frontier import Delivery, Frontier, as_seq
from node.client.reconnect import Backoff, open_reconnecting_client

__all__ = [
    "DAEMON_CAPABILITIES",
    "REPLY_ATTEMPTS",
    "DaemonClient",
    "Replied",
    "ReplyNotSent",
    "Revise",
    "open_daemon",
    "reply_client_message_id",
]

log = structlog.get_logger(__name__)

DAEMON_CAPABILITIES = ("freshness", "ack")
_ACCEPTED_STATES = ("sent", "already_sent")

# Sends per reply before giving up: the first, and two more after a refresh.
# A scope busy enough to move under the agent three times in a row is one
# where the runtime should think again rather than keep pushing.
REPLY_ATTEMPTS = 3
# History pages one refresh reads at most (200 messages each).
REFRESH_PAGES = 10

# Given the messages a refresh found, the content to send instead (or None to withdraw).
Revise = Callable[[list[dict[str, Any]]], Awaitable[str | None]]


def reply_client_message_id(delivery: Delivery) -> str:
    """The default ``clientMessageId`` of the reply to ``delivery`` (stable across retries)."""
    return f"reply-{delivery.delivery_id}"


@dataclass(frozen=True, slots=True)
class Replied:
    """A stored reply; the delivery it answers is acknowledged."""

    delivery: Delivery
    # The final send result: state ``sent`` or ``already_sent``.
    result: dict[str, Any]
    attempts: int
    # False only when the node had consumed the delivery already (acked by
    # another session, or pruned): the reply is stored all the same.
    acked: bool

    @property
    def state(self) -> str:
        return str(self.result.get("state"))

    @property
    def message_id(self) -> str:
        return str(self.result.get("messageId", ""))


class ReplyNotSent(Exception):
    """:meth:`DaemonClient.reply` gave up; the delivery is not acknowledged.

    ``reason`` is ``held`` or ``partial_held`` (still held after the last
    attempt; a partial reply's accepted rows are stored, and a later
    ``reply`` with the same ``clientMessageId`` and content finishes it) or
    ``withdrawn`` (``revise`` returned None). ``result`` is the last send result.
    """

    def __init__(
        self, delivery: Delivery, result: Mapping[str, Any], attempts: int, reason: str
    ) -> None:
        self.delivery = delivery
        self.result: dict[str, Any] = dict(result)
        self.attempts = attempts
        self.reason = reason
        super().__init__(
            f"reply to delivery {delivery.delivery_id} not sent after {attempts} attempt(s): "
            f"{reason}"
        )


def _earlier_answer(
    exc: ClientError, client_message_id: str, delivery: Delivery
) -> dict[str, Any] | None:
    """For ``idempotency_conflict`` on a reply id: the stored answer, as an ``already_sent``."""
    if exc.code != "idempotency_conflict":
        return None
    message_id, seq = exc.details.get("messageId"), as_seq(exc.details.get("acceptedSeq"))
    if not isinstance(message_id, str) or seq is None:
        return None
    return {
        "state": "already_sent",
        "targetKey": delivery.target_key,
        "clientMessageId": client_message_id,
        "messageId": message_id,
        "acceptedSeq": seq,
        "differentContent": True,
    }


def _retry_delay(exc: ClientError, attempt: int) -> float:
    retry_after = exc.details.get("retryAfterMs")
    if isinstance(retry_after, int | float) and retry_after >= 0:
        return float(retry_after) / 1000
    return float(0.1 * 2 ** (attempt - 1))


class DaemonClient:
    """An agent daemon's session: deliveries, acks and fresh sends. Use :func:`open_daemon`.

    Read deliveries with :meth:`next_wake` and every other event with
    :meth:`next_event`; each keeps what it is not after for the other, so
    nothing is lost. Do not read events from the wrapped :attr:`client`
    directly (deliveries would bypass suppression). Other requests may go
    through :attr:`client`; sends and history should go through :meth:`send`
    and :meth:`read_history`, which keep :attr:`frontier`.
    """

    client: Client
    frontier: Frontier
    suppressed: list[dict[str, Any]]

    def __init__(
        self, client: Client, frontier: Frontier | None = None, *, keep_events: bool = True
    ) -> None:
        self.client = client
        self.frontier = Frontier() if frontier is None else frontier
        # A daemon that only ever calls next_wake would otherwise keep every
        # message event of its scopes in memory for as long as it runs.
        self._keep_events = keep_events
        # One record per suppressed delivery, oldest first (the fields of the log line).
        self.suppressed = []
        self._deliveries: deque[Delivery] = deque()
        self._events: deque[dict[str, Any]] = deque()
        # Returned by next_wake, not yet acknowledged: a repeated push of one of
        # these (the outbox retries unacknowledged deliveries) must not wake again.
        self._outstanding: set[str] = set()

    # --- deliveries -----------------------------------------------------------

    async def next_wake(self, timeout: float | None = None) -> Delivery:
        """The next delivery to wake the runtime for, in arrival order.

        On the way, a stale delivery (``targetSeq`` at or below the observed
        frontier of its targetKey) is acknowledged and dropped without a wake,
        and a repeat of a delivery already returned and not yet acknowledged is
        dropped. The returned delivery is not observed yet: call
        :meth:`handed_to_runtime` once the runtime has the message, then
        :meth:`ack`. Raises ``trio.TooSlowError`` after ``timeout`` seconds and
        :class:`ConnectionClosed` once the connection closed and no delivery
        remains. Cancellation loses nothing: a delivery being suppressed when
        cancelled is checked again by the next call.
        """
        with trio.fail_after(math.inf if timeout is None else timeout):
            while True:
                delivery = await self._take_wake()
                if delivery is not None:
                    return delivery
                self._sort(await self.client.next_event())

    async def next_wake_or_event(self, timeout: float | None = None) -> Delivery | dict[str, Any]:
        """Whichever comes first: the next wake (as :meth:`next_wake` gives it) or
        the next other event (as :meth:`next_event` gives it).

        For a daemon with one task reading its session, which :meth:`next_wake`
        and :meth:`next_event` in two tasks cannot be: a delivery the event
        reader sorted would wait for the wake reader's next frame.
        """
        with trio.fail_after(math.inf if timeout is None else timeout):
            while True:
                delivery = await self._take_wake()
                if delivery is not None:
                    return delivery
                if self._events:
                    return self._events.popleft()
                self._sort(await self.client.next_event())

    async def _take_wake(self) -> Delivery | None:
        """The next queued delivery to wake the runtime for (None: the queue is empty),
        suppressing stale ones and dropping repeats of outstanding ones on the way."""
        while self._deliveries:
            delivery = self._deliveries.popleft()
            if delivery.task_id is None and self.frontier.is_stale(
                delivery.target_key, delivery.target_seq
            ):
                try:
                    await self._suppress(delivery)
                except BaseException:
                    self._deliveries.appendleft(delivery)
                    raise
                continue
            if delivery.delivery_id in self._outstanding:
                log.debug(
                    "delivery_repeat_dropped",
                    deliveryId=delivery.delivery_id,
                    targetKey=delivery.target_key,
                    targetSeq=delivery.target_seq,
                )
                continue
            self._outstanding.add(delivery.delivery_id)
            return delivery
        return None

    def handed_to_runtime(self, delivery: Delivery) -> None:
        """The runtime has the delivery's message: advance observed to its ``targetSeq``.

        Call it only once the handoff succeeded: observed never moves back.
        """
        self.frontier.advance(delivery.target_key, delivery.target_seq)

    async def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery`` so that the node never redelivers it."""
        await self.client.request("ack", deliveryId=delivery.delivery_id)
        self._outstanding.discard(delivery.delivery_id)

    def pending_deliveries(self) -> int:
        """Deliveries received and not yet through :meth:`next_wake`."""
        return len(self._deliveries)

    # --- other events -----------------------------------------------------------

    async def next_event(self, timeout: float | None = None) -> dict[str, Any]:
        """The next event that is not a ``deliver`` (those wait for :meth:`next_wake`)."""
        with trio.fail_after(math.inf if timeout is None else timeout):
            while not self._events:
                self._sort(await self.client.next_event())
            return self._events.popleft()

    async def events_until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> list[dict[str, Any]]:
        """Like :meth:`Client.events_until`, over the events of :meth:`next_event`."""
        collected: list[dict[str, Any]] = []
        with trio.fail_after(timeout):
            while True:
                event = await self.next_event()
                collected.append(event)
                if predicate(event):
                    return collected

    # --- runtime-visible reads and fresh sends -------------------------------------

    async def read_history(self, target: str, **fields: Any) -> dict[str, Any]:
        """The ``history`` op; the runtime sees the page, so observed advances to
        ``coversThroughSeq`` of the returned targetKey (and ``latestSeq`` is a hint)."""
        result = await self.client.history(target, **fields)
        target_key = result.get("targetKey")
        if isinstance(target_key, str):
            covers = as_seq(result.get("coversThroughSeq"))
            if covers is not None:
                self.frontier.advance(target_key, covers)
            latest = as_seq(result.get("latestSeq"))
            if latest is not None:
                self.frontier.hint(target_key, latest)
        return result

    async def mark_recovery_point(self, message_id: str) -> str:
        """A recovery point at a message this runtime reached (docs/rewind.md): its
        owner may later rewind the conversation there. History marks what a rewind
        set aside ``rewound: true``; a runtime may leave those out of its context."""
        result = await self.client.mark_recovery_point(message_id)
        return str(result["recoveryPointId"])

    async def send(
        self,
        target: str,
        content: str,
        *,
        target_key: str,
        client_message_id: str | None = None,
        source_message_ids: Sequence[str] = (),
        **fields: Any,
    ) -> dict[str, Any]:
        """A fresh ``send``: ``seenUpToSeq`` is the observed frontier of ``target_key``.

        ``sent`` / ``already_sent`` advance observed to ``acceptedSeq``; ``held``
        records ``latestSeq`` as the refresh hint and leaves observed alone —
        refresh (:meth:`refresh`) before deciding to send again. Content over
        the node's row limit is split by the node (``chunks.py``): rows accepted
        before a hold (``partial_held``) advance observed too, and a retry with
        the same ``client_message_id`` and content continues the logical send.
        Returns the reply's ``result``; errors raise :class:`ClientError`. To
        answer a delivery, use :meth:`reply`, which retries and acks for you.
        """
        freshness: dict[str, Any] = {
            "targetKey": target_key,
            "seenUpToSeq": self.frontier.observed(target_key),
        }
        if source_message_ids:
            freshness["sourceMessageIds"] = list(source_message_ids)
        result = await self.client.send(
            target,
            content,
            clientMessageId=client_message_id or f"c-{uuid.uuid4().hex}",
            freshness=freshness,
            **fields,
        )
        self._record_send(result, target_key)
        return result

    async def refresh(self, target: str, *, target_key: str) -> list[dict[str, Any]]:
        """Read ``target`` forward from the observed frontier up to its latest seq.

        Returns the messages the runtime had not seen (oldest first; at most
        :data:`REFRESH_PAGES` pages of 200) and advances observed over them, so
        the next fresh send is not held for them.
        """
        newer: list[dict[str, Any]] = []
        for _ in range(REFRESH_PAGES):
            cursor = self.frontier.observed(target_key)
            page = await self.read_history(target, afterSeq=cursor, limit=200)
            messages = page.get("messages")
            if isinstance(messages, list):
                newer.extend(m for m in messages if isinstance(m, dict))
            covers = as_seq(page.get("coversThroughSeq")) or 0
            if not page.get("hasMore") or covers <= cursor:
                break
        return newer

    async def reply(
        self,
        delivery: Delivery,
        content: str,
        *,
        client_message_id: str | None = None,
        attempts: int = REPLY_ATTEMPTS,
        revise: Revise | None = None,
        target: str | None = None,
        **fields: Any,
    ) -> Replied:
        """Answer ``delivery`` in its scope, then acknowledge it. The policy:

        1. The runtime has the delivery's message: observed advances to its
           ``targetSeq`` (:meth:`handed_to_runtime`).
        2. Send with freshness. ``clientMessageId`` defaults to
           ``reply-<deliveryId>``, so a retry, or a repeat after a crash and
           redelivery, is ``already_sent`` instead of a second answer.
        3. ``held`` / ``partial_held``: newer messages exist. :meth:`refresh`
           reads them (observed advances), ``revise`` (if given) sees them and
           returns the content to send instead, or None to withdraw; then the
           send is tried again. A partially stored reply is completed as first
           written (its rows are on the record), so ``revise`` is not asked then.
        4. ``idempotency_conflict``: an answer under this ``clientMessageId``
           is stored already, with other content (say the daemon crashed before
           its ack and the runtime answered the redelivery differently). That
           answer stands: the result is ``already_sent`` with its ``messageId``
           and ``differentContent: true``, and the delivery is acknowledged.
        5. A retryable error (``rate_limited``, ``unavailable``, ``overloaded``)
           waits ``details.retryAfterMs`` (else 0.1 s, doubling) and tries again.
        6. At most ``attempts`` sends (default :data:`REPLY_ATTEMPTS`). Only a
           ``sent`` / ``already_sent`` reply is acknowledged, after it is stored.

        Returns :class:`Replied`. Every other end raises, and the delivery
        stays unacknowledged: :class:`ReplyNotSent` (still held after the last
        attempt, or withdrawn), :class:`ClientError` (refused, or still
        failing), :class:`ConnectionClosed`. Decide what to do — reply again
        later, or :meth:`ack` to drop it on purpose. Do not count on a
        redelivery: this runtime has seen the message now, so a re-push of the
        delivery would be suppressed as stale.
        """
        if attempts < 1:
            raise ValueError("reply needs at least one attempt")
        self.handed_to_runtime(delivery)
        target = target or f"scope:{delivery.target_key}"
        client_message_id = client_message_id or reply_client_message_id(delivery)
        result: dict[str, Any] = {}
        for attempt in range(1, attempts + 1):
            try:
                result = await self.send(
                    target,
                    content,
                    target_key=delivery.target_key,
                    client_message_id=client_message_id,
                    **fields,
                )
            except ClientError as exc:
                earlier = _earlier_answer(exc, client_message_id, delivery)
                if earlier is not None:
                    # Answered before with other words (a crash before the ack,
                    # then a runtime that thought differently): that answer
                    # stands, one per delivery.
                    self._record_send(earlier, delivery.target_key)
                    result = earlier
                    acked = await self._ack_replied(delivery)
                    return Replied(delivery, result, attempt, acked)
                if not exc.retryable or attempt == attempts:
                    raise
                await trio.sleep(_retry_delay(exc, attempt))
                continue
            state = result.get("state")
            if state in _ACCEPTED_STATES:
                acked = await self._ack_replied(delivery)
                log.info(
                    "delivery_replied",
                    deliveryId=delivery.delivery_id,
                    targetKey=delivery.target_key,
                    state=state,
                    messageId=result.get("messageId"),
                    attempts=attempt,
                    acked=acked,
                )
                return Replied(delivery, result, attempt, acked)
            if attempt == attempts:
                break
            newer = await self.refresh(target, target_key=delivery.target_key)
            if revise is not None and state == "held":
                revised = await revise(newer)
                if revised is None:
                    raise ReplyNotSent(delivery, result, attempt, "withdrawn")
                content = revised
        raise ReplyNotSent(delivery, result, attempts, str(result.get("state", "held")))

    # --- internals ------------------------------------------------------------

    def _sort(self, event: dict[str, Any]) -> None:
        """Queue ``event`` for :meth:`next_wake` (a delivery) or :meth:`next_event`."""
        if event.get("type") == "deliver":
            try:
                self._deliveries.append(Delivery.from_event(event))
            except ValueError:
                log.warning("malformed_delivery", event=event)
                self._keep(event)
            return
        self._keep(event)

    def _keep(self, event: dict[str, Any]) -> None:
        if self._keep_events:
            self._events.append(event)
        elif event.get("type") == "error":
            log.warning("daemon_error_event", event=event)

    async def _suppress(self, delivery: Delivery) -> None:
        """Acknowledge and drop a stale delivery, with a ``delivery_suppressed`` log line."""
        record: dict[str, Any] = {
            "deliveryId": delivery.delivery_id,
            "messageId": delivery.message_id,
            "target": delivery.message.get("scopeId"),
            "targetKey": delivery.target_key,
            "targetSeq": delivery.target_seq,
            "observedSeq": self.frontier.observed(delivery.target_key),
            "latestKnownSeq": self.frontier.latest_known(delivery.target_key),
            "deliveryReason": delivery.reason,
            "reason": "stale",
        }
        try:
            await self.client.request("ack", deliveryId=delivery.delivery_id)
        except ClientError as exc:
            if exc.code != "not_found":
                raise
            record["ack"] = "not_found"  # already consumed (acked elsewhere, pruned)
        self._outstanding.discard(delivery.delivery_id)
        self.suppressed.append(record)
        log.info("delivery_suppressed", **record)

    async def _ack_replied(self, delivery: Delivery) -> bool:
        """Acknowledge an answered delivery; False when the node had already consumed it."""
        try:
            await self.ack(delivery)
        except ClientError as exc:
            if exc.code != "not_found":
                raise
            self._outstanding.discard(delivery.delivery_id)
            return False
        return True

    def _record_send(self, result: Mapping[str, Any], target_key: str) -> None:
        """Fold one send result into the frontier (own accepted seq, refresh hint)."""
        key = result.get("targetKey")
        key = key if isinstance(key, str) else target_key
        state = result.get("state")
        if state in _ACCEPTED_STATES:
            accepted = as_seq(result.get("acceptedSeq"))
            if accepted is not None:
                self.frontier.advance(key, accepted)
        elif state == "partial_held":
            for row in result.get("accepted") or ():
                seq = as_seq(row.get("acceptedSeq")) if isinstance(row, Mapping) else None
                if seq is not None:
                    self.frontier.advance(key, seq)
        for field_name in ("latestSeq", "needsRefreshUntilSeq"):
            latest = as_seq(result.get(field_name))
            if latest is not None:
                self.frontier.hint(key, latest)
        if state in ("held", "partial_held"):
            log.info(
                "send_held",
                state=state,
                targetKey=key,
                clientMessageId=result.get("clientMessageId"),
                seenUpToSeq=result.get("seenUpToSeq"),
                observedSeq=self.frontier.observed(key),
                latestKnownSeq=self.frontier.latest_known(key),
            )


@asynccontextmanager
async def open_daemon(
    url: str,
    token: str,
    *,
    frontier: Frontier | None = None,
    name: str = "scopenode-daemon",
    capabilities: Sequence[str] = DAEMON_CAPABILITIES,
    keep_events: bool = True,
    reconnect: Backoff | None = None,
    **kwargs: Any,
) -> AsyncIterator[DaemonClient]:
    """:func:`open_client` as a daemon (``kind="daemon"``, capabilities freshness and ack).

    Pass the runtime's ``frontier`` when reconnecting so that deliveries the
    runtime already covered are suppressed. With ``keep_events=False`` every
    event but ``deliver`` is dropped (``error`` events are logged), for a
    daemon that never calls :meth:`DaemonClient.next_event`. Other keywords go
    to :func:`open_client`.

    With ``reconnect`` the daemon outlives its sessions
    (:func:`~node.client.reconnect.open_reconnecting_client`): a retryable loss
    reconnects after a ``Backoff`` delay, pending deliveries come back on the
    new session and each reaches :meth:`DaemonClient.next_wake` once; ``ack``,
    ``reply`` and reads whose answer was lost are sent again on the next
    session. When the loop ends every call raises ``SessionEnded`` (4401 …)
    or ``ReconnectGaveUp``. ``message`` events are resumed from the last seq
    seen per scope, unless ``keep_events`` is False.
    """
    opened: AbstractAsyncContextManager[Client]
    if reconnect is None:
        opened = open_client(
            url, token, kind="daemon", name=name, capabilities=capabilities, **kwargs
        )
    else:
        opened = open_reconnecting_client(
            url,
            token,
            backoff=reconnect,
            track_resume=keep_events,
            kind="daemon",
            name=name,
            capabilities=capabilities,
            **kwargs,
        )
    async with opened as client:
        yield DaemonClient(client, frontier, keep_events=keep_events)
