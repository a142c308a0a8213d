"""Live sessions by member, and the actor's Publisher: fan-out after commit.

A ``message`` event is encoded once per send and the same bytes are queued on
every reader's sessions (twice when the send names recipients: they and the
author see ``metadata.recipients``, other readers do not); queuing never awaits.

Trust hooks, for the paths that end a member's access (and later for
cross-node notifications, which call the same methods):

- :meth:`Hub.close_credential_sessions` closes every live session that
  authenticated with a revoked credential (close 4401); the node's revocation
  listener (``node/revocation.py``) calls it.
- :meth:`Hub.stop_scope_events` (``scope_id``, ``member_id``): from now on
  that member's sessions on this node drop ``message`` events and wakes of the
  scope, including live events held back while a resume is served. It lasts
  until :meth:`Hub.allow_scope_events`, which ``publish_membership`` calls
  itself for ``joined``/``invited`` of that member, or until the session ends.
  A leave or remove through the scope's actor needs no call (the roster fence
  keeps the member out of every later plan); the hook is for removals relayed
  from other nodes, whose relay must carry joins and invites as well.

Cross-node relay (``node/relay.py``): with :attr:`Hub.relay` set, what the
hub publishes after a commit is also NOTIFYed to the other nodes on the
database, which push it to their own sessions — ``message`` (by seq range,
re-read with the one SQL predicate there), ``membership`` (a ``left`` mutes
the member's sessions there, a join or invite unmutes them), ``readState``
and ``reaction``. A new event kind uses the generic hook
:meth:`Hub.relay_event` right after pushing it locally: the encoded event,
small (the relay's payload stays under PostgreSQL's 8,000 bytes; a bigger one
becomes ``invalidate`` with reason ``relay_oversize`` there) and the members
shown it (``audience``), or, when that list may be long, ``readers_of``: a
message id whose current readers get it (private agents then get nothing:
the hook cannot tell which activity they may see). ``wakes`` and
``daemons=False`` mirror ``reaction``'s rule that daemon sessions get the
event only as a wake. The other node pushes the same bytes and honours
:meth:`Hub.stop_scope_events`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Protocol

import structlog

from actors.model import Member
from actors.planner import MessagePlan, MutationPlan
from actors.ports import CommittedMutation, CommittedSend, ReactionActivity, ThreadActivity
from actors.reactions import ReactionSummary
from node.views import (
    committed_message_view,
    privileged_readers,
    rfc3339,
    stored_message_view,
    without_recipients,
)
from protocol.codec import encode
from protocol.errors import CloseCode
from protocol.frames import (
    Deliver,
    MembershipEvent,
    MemberUpdatedEvent,
    MessageDeletedEvent,
    MessageEvent,
    MessageUpdatedEvent,
    MessageView,
    PersonEntry,
    ReactionEvent,
    ThreadSummary,
    ThreadUpdatedEvent,
)
from protocol.workflows import wake_names
from protocol.wsframes import frame

log = structlog.get_logger(__name__)
REVOKED_REMEMBERED = 10_000


class EventRelay(Protocol):
    """The cross-node side of the Publisher (``node/relay.py``). Never blocks."""

    def messages_committed(self, scope_id: str, seqs: Sequence[int]) -> bool: ...

    def membership(
        self,
        scope_id: str,
        member_id: str,
        op: str,
        visibility: str,
        audience: Collection[str] | None,
    ) -> None: ...

    def read_state(self, scope_id: str, member_id: str, last_read_seq: int) -> None: ...

    def event(
        self,
        scope_id: str,
        payload: bytes,
        *,
        audience: Collection[str] | None,
        readers_of: str | None = None,
        wakes: Collection[str] = (),
        daemons: bool = True,
        seq: int = 1,
    ) -> None: ...


class Holding(Protocol):
    """An outbound path that can keep its writes for one write later."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


class LiveSession(Protocol):
    member_id: str
    is_daemon: bool

    def release_held(self) -> None: ...

    def deliver_events(self, scope_id: str, events: list[tuple[int, bytes]]) -> None: ...

    def push(self, payload: bytes) -> None: ...

    def push_frame(self, framed: bytes) -> None: ...

    def push_wake(self, delivery_id: str, framed: bytes) -> None: ...

    def close(self, code: int, reason: str) -> None: ...

    def profile_changed(self, member: Member) -> None: ...

    def mute_scope(self, scope_id: str, muted: bool) -> None: ...

    def is_muted(self, scope_id: str) -> bool: ...


def delivery_id(message_id: str, agent_id: str) -> str:
    return f"dlv_{message_id.removeprefix('msg_')}.{agent_id.removeprefix('mem_')}"


def wake_frame(
    message_id: str, agent_id: str, scope_id: str, seq: int, reason: str, view: MessageView
) -> tuple[str, bytes]:
    """A framed ``deliver`` of one message to one agent, with its delivery id."""
    wake_id = delivery_id(message_id, agent_id)
    plan_id, request_id = wake_names(view.metadata)
    event = Deliver(
        delivery_id=wake_id,
        agent_id=agent_id,
        target_key=scope_id,
        target_seq=seq,
        reason=reason,
        message=view,
        plan_id=plan_id,
        request_id=request_id,
    )
    return wake_id, frame(encode(event))


def wake_dedupe_key(message_id: str, agent_id: str) -> str:
    return f"wake:{message_id}:{agent_id}"


def _workspace_of(session: LiveSession) -> str | None:
    member = getattr(session, "member", None)
    return getattr(member, "workspace_id", None)


class Hub:
    def __init__(
        self,
        on_delivered: Callable[[Sequence[str]], None],
        on_delivery: Callable[[float], None] | None = None,
    ) -> None:
        """``on_delivered(outbox keys)``: realtime rows pushed here;
        ``on_delivery(seconds)``: a message's age when its events were queued."""
        self._on_delivery = on_delivery
        self._sessions: dict[str, set[LiveSession]] = defaultdict(set)
        # Members with a live session here by workspace (None: not known), so
        # the relay asks about the members of one workspace, not the node's.
        self._workspace_members: dict[str | None, set[str]] = defaultdict(set)
        self._on_delivered = on_delivered
        self.events_published = 0
        self._by_credential: dict[int, set[LiveSession]] = {}
        self._credential_of: dict[LiveSession, int] = {}
        # Credentials revoked while this node ran; a hello that authenticated
        # just before the revocation committed is refused when it registers.
        # Bounded: only revocations of the last while matter for that race.
        self._revoked: dict[int, None] = {}
        self.relay: EventRelay | None = None
        self._holding: list[Holding] | None = None

    def add(self, session: LiveSession, credential_id: int | None = None) -> bool:
        """Register an authenticated session; False (not added) if its credential was revoked."""
        if credential_id is not None:
            if credential_id in self._revoked:
                return False
            self._by_credential.setdefault(credential_id, set()).add(session)
            self._credential_of[session] = credential_id
        self._sessions[session.member_id].add(session)
        self._workspace_members[_workspace_of(session)].add(session.member_id)
        return True

    def discard(self, session: LiveSession) -> None:
        sessions = self._sessions.get(session.member_id)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self._sessions[session.member_id]
                workspace = _workspace_of(session)
                members = self._workspace_members.get(workspace)
                if members is not None:
                    members.discard(session.member_id)
                    if not members:
                        del self._workspace_members[workspace]
        credential_id = self._credential_of.pop(session, None)
        if credential_id is not None:
            same = self._by_credential.get(credential_id)
            if same is not None:
                same.discard(session)
                if not same:
                    del self._by_credential[credential_id]

    def credential_ids(self) -> list[int]:
        """Credentials of the live sessions (to re-check after missed notifications)."""
        return list(self._by_credential)

    def close_credential_sessions(self, credential_id: int) -> int:
        """Close (4401) every live session of a revoked credential; how many were closed."""
        self._revoked[credential_id] = None
        if len(self._revoked) > REVOKED_REMEMBERED:
            del self._revoked[next(iter(self._revoked))]
        sessions = self._by_credential.pop(credential_id, set())
        for session in sessions:
            self._credential_of.pop(session, None)
            session.close(CloseCode.UNAUTHENTICATED, "token revoked")
        if sessions:
            log.info("token_sessions_closed", count=len(sessions))
        return len(sessions)

    def stop_scope_events(self, scope_id: str, member_id: str) -> None:
        """The member's sessions here stop receiving the scope's events (see module doc)."""
        for session in self._sessions.get(member_id, ()):
            session.mute_scope(scope_id, True)

    def allow_scope_events(self, scope_id: str, member_id: str) -> None:
        """Undo :meth:`stop_scope_events` (the member joined or was invited again)."""
        for session in self._sessions.get(member_id, ()):
            session.mute_scope(scope_id, False)

    def sessions_of(self, member_id: str) -> set[LiveSession]:
        return self._sessions.get(member_id, set())

    def member_ids(self, workspace_id: str | None = None) -> list[str]:
        """Members with a live session on this node (the relay's candidates);
        with ``workspace_id``, only that workspace's (and any of unknown one)."""
        if workspace_id is None:
            return list(self._sessions)
        members = self._workspace_members
        return [*members.get(workspace_id, ()), *members.get(None, ())]

    def relay_event(
        self,
        scope_id: str,
        payload: bytes,
        *,
        audience: Collection[str] | None,
        readers_of: str | None = None,
        wakes: Collection[str] = (),
        daemons: bool = True,
    ) -> None:
        """Hand an event already pushed here to the other nodes (see module doc)."""
        if self.relay is not None:
            self.relay.event(
                scope_id,
                payload,
                audience=audience,
                readers_of=readers_of,
                wakes=wakes,
                daemons=daemons,
            )

    def relay_read_state(self, scope_id: str, member_id: str, last_read_seq: int) -> None:
        """The member's sessions on other nodes get ``readState`` too."""
        if self.relay is not None:
            self.relay.read_state(scope_id, member_id, last_read_seq)

    def __len__(self) -> int:
        return sum(len(s) for s in self._sessions.values())

    # ------------------------------------------------------------ Publisher

    @contextmanager
    def batch(self) -> Iterator[None]:
        """A commit's replies and events: a sender's session gets its reply and
        its own events as one write (one wake-up of the client); every other
        session's writes leave as they are queued."""
        if self._holding is not None:
            yield
            return
        self._holding = []
        try:
            yield
        finally:
            held, self._holding = self._holding, None
            for outbound in held:
                outbound.release()

    def hold_reply(self, outbound: Holding) -> None:
        """Inside :meth:`batch`: keep ``outbound``'s writes until the batch ends."""
        if self._holding is not None:
            outbound.hold()
            self._holding.append(outbound)

    def publish_messages(
        self, scope_id: str, sends: Sequence[tuple[MessagePlan, CommittedSend]]
    ) -> None:
        """Queue each committed message on its readers' sessions, framed once.

        A batch (group commit) goes to a session as one write.
        """
        # Other nodes are told first: their NOTIFY leaves before this node
        # encodes anything. With another node writing the scope too, the
        # relay may have its earlier seqs still to push here: then it pushes
        # these after them.
        push_here = self.relay is None or self.relay.messages_committed(
            scope_id, [commit.seq for _, commit in sends]
        )
        delivered: list[str] = []
        batches: dict[LiveSession, list[tuple[int, bytes]]] = {}
        wakes: list[tuple[LiveSession, str, bytes]] = []
        for plan, commit in sends:
            view = committed_message_view(plan, commit)
            framed = frame(encode(MessageEvent(scope_id=scope_id, message=view)))
            privileged = privileged_readers(plan.author.id, plan.intent.metadata)
            if privileged is None and plan.intent.recipients:
                privileged = frozenset({plan.author.id, *plan.intent.recipients})
            if privileged is None:
                for member_id in plan.readers:
                    for session in self._sessions.get(member_id, ()):
                        batches.setdefault(session, []).append((commit.seq, framed))
            else:
                # ``metadata.recipients`` is for the author and the recipients
                # only (``authorisedBy`` for the author and that manager): such
                # a message is encoded twice, once without them.
                others_view = without_recipients(view)
                others = frame(encode(MessageEvent(scope_id=scope_id, message=others_view)))
                for member_id in plan.readers:
                    framed_for = framed if member_id in privileged else others
                    for session in self._sessions.get(member_id, ()):
                        batches.setdefault(session, []).append((commit.seq, framed_for))
            delivered.append(f"rt:{commit.message_id}")
            for agent_id, reason in plan.wakes:
                shown = view if privileged is None or agent_id in privileged else others_view
                wake_id, wake = wake_frame(
                    commit.message_id, agent_id, scope_id, commit.seq, reason, shown
                )
                wakes.extend(
                    (session, wake_id, wake)
                    for session in self._sessions.get(agent_id, ())
                    if session.is_daemon and not session.is_muted(scope_id)
                )
        if push_here:
            for session, events in batches.items():
                session.deliver_events(scope_id, events)
                self.events_published += len(events)
            self.observe_delivery(plan.intent.created_at for plan, _ in sends)
            # A held message's wakes follow it: the relay pushes both, in order.
            for session, wake_id, wake in wakes:
                session.push_wake(wake_id, wake)
        self._on_delivered(delivered)

    def observe_delivery(self, created: Iterable[datetime]) -> None:
        if self._on_delivery is not None:
            now = time.time()
            for at in created:
                self._on_delivery(max(0.0, now - at.timestamp()))

    def publish_thread(self, activity: ThreadActivity) -> None:
        """``threadUpdated`` to the thread's readers (the parent's public readers
        and its members), so a client updates the root's "N replies"."""
        scope_id = activity.parent_scope_id
        payload = encode(
            ThreadUpdatedEvent(
                scope_id=scope_id,
                root_message_id=activity.root_message_id,
                thread=ThreadSummary(
                    scope_id=activity.thread_scope_id,
                    reply_count=activity.reply_count,
                    last_reply_at=rfc3339(activity.last_reply_at),
                    participants=list(activity.participants),
                ),
            )
        )
        for reader in activity.audience:
            for session in self._sessions.get(reader, ()):
                if not session.is_muted(scope_id):
                    session.push(payload)

    def publish_reaction(self, activity: ReactionActivity) -> None:
        """``reaction`` straight to the sessions of the readers shown it.

        Delivery policy *direct*: no outbox row, nothing to replay; a session
        that misses it reads the summary in history or resume
        (docs/design.md#reactions). An agent's daemon session gets it only as a
        wake (its own message under ``auto-wake``); its other sessions read it
        like anyone's.
        """
        scope_id = activity.scope_id
        payload = encode(
            ReactionEvent(
                scope_id=scope_id,
                message_id=activity.message_id,
                member_id=activity.member_id,
                emoji=activity.emoji,
                op=activity.op,  # type: ignore[arg-type]
            )
        )
        framed = frame(payload)  # once for every session
        # The reactor's sessions first: the one that asked holds its reply
        # (hold_reply), and the reply and this event leave as one write
        # before the other readers' writes.
        reactor = activity.member_id
        first = (reactor,) if reactor in activity.audience else ()
        for reader in (*first, *(r for r in activity.audience if r != reactor)):
            woken = reader in activity.wakes
            for session in self._sessions.get(reader, ()):
                if (woken or not session.is_daemon) and not session.is_muted(scope_id):
                    session.push_frame(framed)
                if reader == reactor:
                    session.release_held()
        self.events_published += 1
        self.relay_event(
            scope_id,
            payload,
            audience=activity.audience,
            readers_of=activity.message_id,
            wakes=activity.wakes,
            daemons=False,
        )

    def publish_mutation(self, plan: MutationPlan, commit: CommittedMutation) -> None:
        """``messageUpdated``/``messageDeleted`` to the message's current readers, and
        a ``deliver`` to each agent the edit woke; then the projection's outbox row
        is marked delivered (docs/design.md#edits-and-deletes).

        A session muted for the scope gets nothing. Wakes go to daemon sessions,
        as for sends; a wake row stays pending until the daemon acknowledges it.
        """
        message = plan.message
        scope_id = message.scope_id
        if plan.kind == "delete":
            payload = encode(
                MessageDeletedEvent(scope_id=scope_id, message_id=message.id, seq=message.seq)
            )
            payloads = dict.fromkeys(plan.readers, payload)
        else:
            # ``metadata.recipients`` is for the author and the recipients only,
            # and each reader is shown the reactions it may see: one encoding
            # per distinct (recipients shown, reactions shown).
            privileged = privileged_readers(message.author.id, message.metadata) or {
                message.author.id
            }
            encoded: dict[tuple[bool, tuple[ReactionSummary, ...]], bytes] = {}
            payloads = {}
            for reader in plan.readers:
                key = (reader in privileged, commit.reactions_shown.get(reader, ()))
                if key not in encoded:
                    view = stored_message_view(message, message.author.id if key[0] else None)
                    view.reactions = [summary.view() for summary in key[1]]
                    encoded[key] = encode(MessageUpdatedEvent(scope_id=scope_id, message=view))
                payloads[reader] = encoded[key]
        for reader, payload in payloads.items():
            for session in self._sessions.get(reader, ()):
                if not session.is_muted(scope_id):
                    session.push(payload)
                    self.events_published += 1
        audiences: dict[bytes, list[str]] = {}
        for reader, payload in payloads.items():
            audiences.setdefault(payload, []).append(reader)
        for payload, shown in audiences.items():
            whole = len(audiences) == 1  # else readers_of would reach both groups
            self.relay_event(
                scope_id, payload, audience=shown, readers_of=message.id if whole else None
            )
        for agent_id, reason in plan.wakes:
            if agent_id not in commit.woken:
                continue  # woken for this message before: one wake per message
            view = stored_message_view(message, agent_id)
            wake_id, wake = wake_frame(message.id, agent_id, scope_id, message.seq, reason, view)
            for session in self._sessions.get(agent_id, ()):
                if session.is_daemon and not session.is_muted(scope_id):
                    session.push_wake(wake_id, wake)
        self._on_delivered([plan.projection_key])

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
        if op in ("joined", "invited"):
            self.allow_scope_events(scope_id, member_id)
        for reader in audience:
            for session in self._sessions.get(reader, ()):
                session.push(payload)
        if self.relay is not None:
            # Private memberships are shown to two members at most: carried.
            # A public one goes to whoever reads the scope on the other node.
            shown = audience if visibility == "private" else None
            self.relay.membership(scope_id, member_id, op, visibility, shown)

    def publish_profile(self, member: Member, avatar_color: str | None = None) -> None:
        """``memberUpdated`` to the sessions here of the members who may see
        ``member`` (the workspace's; a private agent's only to it and its owner),
        and the member's own sessions send from now on under the new name.

        Sessions on other nodes are not told: they read the new name with the
        next history page or listing (docs/design.md#profiles).
        """
        for session in self._sessions.get(member.id, ()):
            session.profile_changed(member)
        payload = encode(
            MemberUpdatedEvent(
                member=PersonEntry(
                    id=member.id,
                    handle=member.handle,
                    display_name=member.display_name,
                    type=member.type.value,
                    owner_member_id=member.owner_member_id if member.is_private_agent else None,
                    avatar_color=avatar_color,
                )
            )
        )
        if member.is_private_agent:
            audience = [member.id, *filter(None, [member.owner_member_id])]
        else:
            audience = list(self._workspace_members.get(member.workspace_id, ()))
        for reader in audience:
            for session in self._sessions.get(reader, ()):
                session.push(payload)
                self.events_published += 1
