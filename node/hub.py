"""Live sessions by member, and the actor's Publisher: fan-out after commit.

A ``message`` event is encoded once per send and the same bytes are queued on
every reader's sessions; queuing never awaits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import structlog

from actors.planner import MessagePlan
from actors.ports import CommittedSend
from node.outbound import coalesced_writes
from node.views import committed_message_view
from node.wsframe import frame
from protocol.codec import encode
from protocol.frames import Deliver, MembershipEvent, MessageEvent

log = structlog.get_logger(__name__)


class LiveSession(Protocol):
    member_id: str
    is_daemon: bool

    def deliver_events(self, scope_id: str, events: list[tuple[int, bytes]]) -> None: ...

    def push(self, payload: bytes) -> None: ...

    def push_frame(self, framed: bytes) -> None: ...


def delivery_id(message_id: str, agent_id: str) -> str:
    return f"dlv_{message_id.removeprefix('msg_')}.{agent_id.removeprefix('mem_')}"


def wake_dedupe_key(message_id: str, agent_id: str) -> str:
    return f"wake:{message_id}:{agent_id}"


class Hub:
    def __init__(self, on_delivered: Callable[[Sequence[str]], None]) -> None:
        self._sessions: dict[str, set[LiveSession]] = defaultdict(set)
        self._on_delivered = on_delivered
        self.events_published = 0

    def add(self, session: LiveSession) -> None:
        self._sessions[session.member_id].add(session)

    def discard(self, session: LiveSession) -> None:
        sessions = self._sessions.get(session.member_id)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self._sessions[session.member_id]

    def sessions_of(self, member_id: str) -> set[LiveSession]:
        return self._sessions.get(member_id, set())

    def __len__(self) -> int:
        return sum(len(s) for s in self._sessions.values())

    # ------------------------------------------------------------ Publisher

    def batch(self) -> AbstractContextManager[None]:
        return coalesced_writes()

    def publish_messages(
        self, scope_id: str, sends: Sequence[tuple[MessagePlan, CommittedSend]]
    ) -> None:
        """Queue each committed message on its readers' sessions, framed once.

        A batch (group commit) goes to a session as one write.
        """
        delivered: list[str] = []
        batches: dict[LiveSession, list[tuple[int, bytes]]] = {}
        wakes: list[tuple[LiveSession, bytes]] = []
        for plan, commit in sends:
            view = committed_message_view(plan, commit)
            framed = frame(encode(MessageEvent(scope_id=scope_id, message=view)))
            for member_id in plan.readers:
                for session in self._sessions.get(member_id, ()):
                    batches.setdefault(session, []).append((commit.seq, framed))
            delivered.append(f"rt:{commit.message_id}")
            for agent_id, reason in plan.wakes:
                wake = frame(
                    encode(
                        Deliver(
                            delivery_id=delivery_id(commit.message_id, agent_id),
                            agent_id=agent_id,
                            target_key=scope_id,
                            target_seq=commit.seq,
                            reason=reason,
                            message=view,
                        )
                    )
                )
                wakes.extend(
                    (session, wake)
                    for session in self._sessions.get(agent_id, ())
                    if session.is_daemon
                )
        for session, events in batches.items():
            session.deliver_events(scope_id, events)
            self.events_published += len(events)
        for session, wake in wakes:
            session.push_frame(wake)
        self._on_delivered(delivered)

    def publish_membership(
        self, scope_id: str, member_id: str, op: str, visibility: str, audience: frozenset[str]
    ) -> None:
        payload = encode(
            MembershipEvent(
                scope_id=scope_id,
                member_id=member_id,
                op=op,  # type: ignore[arg-type]
                visibility=visibility,  # type: ignore[arg-type]
            )
        )
        for reader in audience:
            for session in self._sessions.get(reader, ()):
                session.push(payload)
