"""Request handlers other than ``send``: each returns the reply's ``result``."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from actors.model import Member, MemberType, NotificationState, ScopeInfo, ScopeType
from actors.scope_actor import RosterCommand
from node.hub import delivery_id, wake_dedupe_key
from node.views import stored_message_view
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import (
    Ack,
    CreateChannel,
    Deliver,
    Grant,
    History,
    Invite,
    Join,
    Leave,
    MarkRead,
    Members,
    MessageEvent,
    React,
    ReadStateEvent,
    Resumed,
    ResumeState,
    RevokeGrant,
    Scopes,
    Search,
    SetNotification,
    to_builtins,
)
from storage import directory, grants, messages, outbox, read_state, scopes
from storage.errors import UniqueViolation
from storage.pg import TrioConnection
from storage.visibility import Viewer

if TYPE_CHECKING:
    from node.session import Session

RESUME_LIMIT = 200


def _member(session: Session) -> Member:
    assert session.member is not None
    return session.member


async def handle(session: Session, request: Any) -> Any:
    match request:
        case History():
            return await history(session, request)
        case Scopes():
            return await list_scopes(session)
        case Members():
            return await list_members(session, request)
        case CreateChannel():
            return await create_channel(session, request)
        case Join() | Leave():
            return await roster(session, request)
        case Invite():
            return await invite(session, request)
        case SetNotification():
            return await set_notification(session, request)
        case MarkRead():
            return await mark_read(session, request)
        case Ack():
            return await ack(session, request)
        case Grant():
            return await grant(session, request)
        case RevokeGrant():
            return await revoke_grant(session, request)
        case Search():
            raise OperationError(
                ErrorCode.SEARCH_UNAVAILABLE, "search is not ready on this deployment"
            )
        case React():
            raise OperationError(ErrorCode.VALIDATION_FAILED, "reactions are not enabled yet")
    raise OperationError(ErrorCode.BAD_FRAME, "unsupported operation")


async def viewer_for(session: Session, scope_id: str) -> tuple[Viewer, int]:
    """The viewer's read rights in a scope and the scope's latest seq; forbidden if none."""
    viewer, info = await scope_viewer(session, scope_id)
    return viewer, info.latest_seq


async def scope_viewer(session: Session, scope_id: str) -> tuple[Viewer, ScopeInfo]:
    """The viewer's read rights in a scope (SQL predicate parameters) and the scope."""
    member = _member(session)
    async with session.services.pool.connection() as conn:
        info = await scopes.get_scope(conn, scope_id)
        if info is None or info.workspace_id != member.workspace_id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such scope")
        viewer = await scopes.viewer_for(conn, info, member)
    if viewer is None:
        raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
    return viewer, info


async def thread_root(session: Session, info: ScopeInfo) -> dict[str, Any] | None:
    """A thread's root message as context, only if the viewer can read it in the parent."""
    if info.parent_scope_id is None or info.root_message_id is None:
        return None
    member = _member(session)
    async with session.services.pool.connection() as conn:
        parent = await scopes.get_scope(conn, info.parent_scope_id)
        viewer = await scopes.viewer_for(conn, parent, member) if parent is not None else None
        if viewer is None:
            return None
        root = await messages.readable_message(
            conn, info.parent_scope_id, info.root_message_id, viewer
        )
    return to_builtins(stored_message_view(root.message)) if root is not None else None


async def history(session: Session, request: History) -> dict[str, Any]:
    member = _member(session)
    scope_id = await session.services.resolver.resolve(member, request.target)
    viewer, info = await scope_viewer(session, scope_id)
    latest = info.latest_seq
    if request.before_seq is not None and request.after_seq is not None:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "give beforeSeq or afterSeq, not both", path="$.afterSeq"
        )
    ascending = request.after_seq is not None
    async with session.services.pool.connection() as conn:
        page = await messages.page(
            conn,
            scope_id,
            viewer,
            after=request.after_seq or 0,
            before=request.before_seq,
            limit=request.limit,
            ascending=ascending,
            budget=session.settings.history_candidate_budget,
        )
    if ascending:
        covers = page.examined_high if page.has_more and page.examined_high else latest
    elif request.before_seq is not None:
        covers = min(request.before_seq - 1, latest)
    else:
        covers = latest
    result = {
        "scopeId": scope_id,
        "targetKey": scope_id,
        "latestSeq": latest,
        "messages": [to_builtins(stored_message_view(r.message)) for r in page.messages],
        "coversThroughSeq": max(covers, 0),
        "hasMore": page.has_more,
        "candidateBudgetExhausted": page.candidate_budget_exhausted,
    }
    if page.has_more and not ascending and page.examined_low is not None:
        # The continuation of a backward page, even an empty one (additive field).
        result["continueBeforeSeq"] = page.examined_low
    if info.type is ScopeType.THREAD:
        # Context only: the root lives in the parent and never moves the thread's seqs.
        result["root"] = await thread_root(session, info)
    return result


async def resume(session: Session, resume_from: dict[str, int]) -> dict[str, int]:
    """Push missed readable messages per scope, then ``resumed``; returns the last seq sent."""
    states: dict[str, ResumeState] = {}
    sent: dict[str, int] = {}
    for scope_id, last_seen in resume_from.items():
        try:
            viewer, latest = await viewer_for(session, scope_id)
        except OperationError:
            continue
        async with session.services.pool.connection() as conn:
            page = await messages.page(
                conn,
                scope_id,
                viewer,
                after=last_seen,
                limit=RESUME_LIMIT,
                ascending=True,
                budget=session.settings.history_candidate_budget,
            )
        for readable in page.messages:
            view = stored_message_view(readable.message)
            payload = encode(MessageEvent(scope_id=scope_id, message=view))
            # Paced by the writer: a burst of up to 200 messages must not close
            # a reading client as a slow consumer. A client that does not read
            # at all is still closed (the queue stays over the cap).
            with trio.move_on_after(session.settings.slow_consumer_grace):
                await session.outbound.wait_for_room(len(payload))
            session.push(payload)
            sent[scope_id] = readable.message.seq
        covers = page.examined_high if page.has_more and page.examined_high else latest
        states[scope_id] = ResumeState(
            latest_seq=latest, has_more=page.has_more, covers_through_seq=covers
        )
    session.push(encode(Resumed(scopes=states)))
    return sent


async def list_scopes(session: Session) -> dict[str, Any]:
    member = _member(session)
    async with session.services.pool.connection() as conn:
        summaries = await scopes.scopes_of_member(conn, member.id)
        if member.is_private_agent:
            # A private agent's unread counts only what it may read.
            counted = []
            for s in summaries:
                viewer = Viewer(member, False, await _grant_scopes(conn, s.id))
                unread = await read_state.readable_unread(conn, s.id, viewer, s.last_read_seq)
                counted.append(replace(s, unread=unread))
            summaries = counted
    return {
        "scopes": [
            {
                "id": s.id,
                "type": s.type,
                "slug": s.slug,
                "name": s.name,
                "latestSeq": s.latest_seq,
                "lastReadSeq": s.last_read_seq,
                "unread": s.unread,
                "notification": s.notification,
            }
            for s in summaries
        ]
    }


async def _grant_scopes(conn: TrioConnection, scope_id: str) -> tuple[str, ...]:
    info = await scopes.get_scope(conn, scope_id)
    parent = info.parent_scope_id if info is not None else None
    return (scope_id, parent) if parent else (scope_id,)


async def list_members(session: Session, request: Members) -> dict[str, Any]:
    member = _member(session)
    await viewer_for(session, request.scope_id)
    async with session.services.pool.connection() as conn:
        listing = await scopes.current_members(conn, request.scope_id)
    shown = []
    for row in listing:
        if row.visibility == "private" and member.id not in (row.member.id, row.owner_member_id):
            continue  # private members only where the viewer may see them
        entry: dict[str, Any] = {
            "id": row.member.id,
            "handle": row.member.handle,
            "displayName": row.member.display_name,
            "type": row.member.type.value,
            "visibility": row.visibility,
        }
        if row.visibility == "private":
            entry["ownerMemberId"] = row.owner_member_id
        shown.append(entry)
    return {"members": shown}


async def create_channel(session: Session, request: CreateChannel) -> dict[str, Any]:
    member = _member(session)
    if member.is_private_agent:
        raise OperationError(ErrorCode.FORBIDDEN, "private agents cannot create channels")
    try:
        async with session.services.pool.connection() as conn:
            scope_id = await scopes.create_channel(
                conn,
                creator=member,
                slug=request.slug,
                name=request.name,
                visibility=request.visibility,
                description=request.description,
            )
    except UniqueViolation:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, f"channel #{request.slug} already exists", path="$.slug"
        ) from None
    return {"scopeId": scope_id}


async def _submit_roster(session: Session, scope_id: str, cmd: RosterCommand) -> Any:
    import trio

    done = trio.Event()
    outcome: list[Any] = []

    def reply(result: Any) -> None:
        outcome.append(result)
        done.set()

    cmd.reply = reply
    await session.services.registry.submit(scope_id, cmd)
    await done.wait()
    if isinstance(outcome[0], OperationError):
        raise outcome[0]
    return outcome[0]


def _noop(_: Any) -> None:
    pass


async def roster(session: Session, request: Join | Leave) -> Any:
    member = _member(session)
    info = await session.services.resolver.scope(member, request.scope_id)
    if isinstance(request, Join):
        if info.type.value != "channel":
            raise OperationError(ErrorCode.FORBIDDEN, "only channels can be joined")
        if info.channel_visibility == "private" or member.is_private_agent:
            raise OperationError(ErrorCode.FORBIDDEN, "this channel needs an invitation")
        cmd = RosterCommand("join", member, member, _noop)
    else:
        cmd = RosterCommand("leave", member, member, _noop)
    return await _submit_roster(session, request.scope_id, cmd)


async def invite(session: Session, request: Invite) -> Any:
    member = _member(session)
    await session.services.resolver.scope(member, request.scope_id)
    async with session.services.pool.connection() as conn:
        invitee = await directory.get_member(conn, request.member_id)
        rights = await scopes.read_rights(conn, request.scope_id, member.id)
    if invitee is None or invitee.workspace_id != member.workspace_id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such member")
    if not rights.current_public and not rights.current_private:
        raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
    visibility = request.visibility or ("private" if invitee.is_private_agent else "public")
    if visibility == "private":
        if not invitee.is_private_agent or invitee.owner_member_id != member.id:
            raise OperationError(
                ErrorCode.FORBIDDEN, "only its owner can add a private agent", path="$.memberId"
            )
    elif invitee.is_private_agent:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "a private agent joins as private", path="$.visibility"
        )
    cmd = RosterCommand("invite", member, invitee, _noop, visibility=visibility)
    return await _submit_roster(session, request.scope_id, cmd)


async def set_notification(session: Session, request: SetNotification) -> Any:
    member = _member(session)
    await session.services.resolver.scope(member, request.scope_id)
    state = NotificationState(request.state)
    if state in (NotificationState.AUTO_WAKE, NotificationState.NO_WAKE) and (
        member.type is not MemberType.AGENT
    ):
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, f"{state.value} applies to agents only", path="$.state"
        )
    cmd = RosterCommand("setNotification", member, member, _noop, state=state)
    return await _submit_roster(session, request.scope_id, cmd)


async def mark_read(session: Session, request: MarkRead) -> dict[str, Any]:
    member = _member(session)
    async with session.services.pool.connection() as conn:
        last_read = await scopes.mark_read(conn, request.scope_id, member.id, request.seq)
    if last_read is None:
        raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
    payload = encode(ReadStateEvent(scope_id=request.scope_id, last_read_seq=last_read))
    for other in session.services.hub.sessions_of(member.id):
        if other is not session:
            other.push(payload)
    return {"lastReadSeq": last_read}


async def ack(session: Session, request: Ack) -> dict[str, Any]:
    member = _member(session)
    message_part, _, agent_part = request.delivery_id.removeprefix("dlv_").partition(".")
    if not agent_part or f"mem_{agent_part}" != member.id:
        raise OperationError(ErrorCode.NOT_FOUND, "no such delivery", path="$.deliveryId")
    async with session.services.pool.connection() as conn:
        found = await outbox.ack_wake(
            conn, wake_dedupe_key(f"msg_{message_part}", member.id), member.id
        )
    if not found:
        raise OperationError(ErrorCode.NOT_FOUND, "no such delivery", path="$.deliveryId")
    return {}


async def redeliver(session: Session) -> None:
    """Push an agent daemon every unacknowledged delivery, oldest first."""
    member = _member(session)
    async with session.services.pool.connection() as conn:
        pending = await outbox.pending_wakes(conn, member.id, session.settings.redeliver_limit)
        allowed = []
        for wake in pending:
            reason = await outbox.wake_suppression(conn, wake.message.id, member.id)
            if reason is None:
                allowed.append(wake)
            else:
                await outbox.suppress(conn, wake.outbox_id, reason)
    for wake in allowed:
        frame = Deliver(
            delivery_id=delivery_id(wake.message.id, member.id),
            agent_id=member.id,
            target_key=wake.message.scope_id,
            target_seq=wake.target_seq,
            reason=wake.reason,
            message=stored_message_view(wake.message),
        )
        payload = encode(frame)
        # Paced like resume: a reading daemon on a slow link is not a slow consumer.
        with trio.move_on_after(session.settings.slow_consumer_grace):
            await session.outbound.wait_for_room(len(payload))
        session.push(payload)


async def grant(session: Session, request: Grant) -> dict[str, Any]:
    member = _member(session)
    await session.services.resolver.scope(member, request.scope_id)
    async with session.services.pool.connection() as conn:
        grantee = await directory.get_member(conn, request.grantee_member_id)
        rights = await scopes.read_rights(conn, request.scope_id, member.id)
        if grantee is None or grantee.workspace_id != member.workspace_id:
            raise OperationError(ErrorCode.NOT_FOUND, "no such member")
        if member.type is not MemberType.HUMAN or not rights.current_public:
            raise OperationError(ErrorCode.FORBIDDEN, "only a human member can grant")
        if grantee.id == member.id:
            raise OperationError(ErrorCode.VALIDATION_FAILED, "cannot grant to yourself")
        grant_id = await grants.create(
            conn,
            workspace_id=member.workspace_id,
            scope_id=request.scope_id,
            owner_id=member.id,
            grantee_id=grantee.id,
            expires_at=request.expires_at,
        )
    session.services.registry.invalidate(request.scope_id)
    return {"grantId": grant_id}


async def revoke_grant(session: Session, request: RevokeGrant) -> dict[str, Any]:
    member = _member(session)
    async with session.services.pool.connection() as conn:
        scope_id = await grants.revoke(conn, request.grant_id, owner_id=member.id)
    if scope_id is None:
        raise OperationError(ErrorCode.NOT_FOUND, "no such grant", path="$.grantId")
    session.services.registry.invalidate(scope_id)
    return {}
