"""Reading: history pages, resume, the scope list, read state, thread root context."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import trio

from actors.model import MemberType, ScopeInfo, ScopeType
from node.ops.context import Context, member_of, push_to_others
from node.resolver import SCOPE_ID, TARGET
from node.views import rfc3339, stored_message_view
from protocol.codec import encode
from protocol.errors import ErrorCode, OperationError
from protocol.frames import (
    History,
    MarkRead,
    MessageEvent,
    ReadStateEvent,
    Resumed,
    ResumeState,
    ThreadSummary,
    to_builtins,
)
from storage import access, cards, messages, reactions, read_state, scopes, services, sources
from storage import rewind as rewind_store
from storage.pg import TrioConnection
from storage.visibility import Viewer

RESUME_LIMIT = 200


async def viewer_for(ctx: Context, scope_id: str) -> tuple[Viewer, int]:
    """The viewer's read rights in a scope and the scope's latest seq; forbidden if none."""
    viewer, info = await scope_viewer(ctx, scope_id)
    return viewer, info.latest_seq


async def scope_viewer(
    ctx: Context, scope_id: str, path: str = SCOPE_ID
) -> tuple[Viewer, ScopeInfo]:
    """The viewer's read rights in a scope (SQL predicate parameters) and the scope.

    ``not_found`` when the scope does not exist for the member (a private scope
    it never belonged to reads as a missing one), ``forbidden`` when it does
    but the member may not read it.
    """
    member = member_of(ctx)
    info = await ctx.services.resolver.scope(member, scope_id, path)
    async with ctx.services.pool.connection() as conn:
        viewer = await access.viewer_for(conn, info, member)
        if viewer is None:
            # Explicit context opens single messages of this scope to a private agent.
            viewer = await sources.context_viewer(conn, info, member)
    if viewer is None:
        raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
    return viewer, info


async def thread_root(ctx: Context, info: ScopeInfo) -> dict[str, Any] | None:
    """A thread's root message as context, only if the viewer can read it in the parent."""
    if info.parent_scope_id is None or info.root_message_id is None:
        return None
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        parent = await scopes.get_scope(conn, info.parent_scope_id)
        viewer = await access.viewer_for(conn, parent, member) if parent is not None else None
        if viewer is None:
            return None
        root = await messages.readable_message(
            conn, info.parent_scope_id, info.root_message_id, viewer
        )
        if root is None:
            return None
        cited = await sources.sources_for(conn, [root.message.id], member)
        shown_reactions = await reactions.summaries(conn, [root.message.id], member)
        card = (await cards.cards_for(conn, [root.message], member)).get(root.message.id)
    view = stored_message_view(root.message, member.id)
    if card is not None:
        view.card = card
    view.sources += cited.get(root.message.id, [])
    view.reactions = [s.view() for s in shown_reactions.get(root.message.id, [])]
    shown: dict[str, Any] = to_builtins(view)
    return shown


async def history(ctx: Context, request: History) -> dict[str, Any]:
    member = member_of(ctx)
    scope_id = await ctx.services.resolver.resolve(member, request.target)
    viewer, info = await scope_viewer(ctx, scope_id, TARGET)
    latest = info.latest_seq
    if request.before_seq is not None and request.after_seq is not None:
        raise OperationError(
            ErrorCode.VALIDATION_FAILED, "give beforeSeq or afterSeq, not both", path="$.afterSeq"
        )
    if request.around_seq is not None:
        if request.before_seq is not None or request.after_seq is not None:
            raise OperationError(
                ErrorCode.VALIDATION_FAILED,
                "aroundSeq excludes beforeSeq and afterSeq",
                path="$.aroundSeq",
            )
        return await _history_around(ctx, request, scope_id, viewer, info)
    ascending = request.after_seq is not None
    async with ctx.services.pool.connection() as conn:
        page = await messages.page(
            conn,
            scope_id,
            viewer,
            after=request.after_seq or 0,
            before=request.before_seq,
            limit=request.limit,
            ascending=ascending,
            budget=ctx.settings.history_candidate_budget,
        )
        cited = await sources.sources_for(conn, [r.message.id for r in page.messages], member)
        shown_cards = await cards.cards_for(conn, [r.message for r in page.messages], member)
    if ascending:
        covers = page.examined_high if page.has_more and page.examined_high else latest
    elif request.before_seq is not None:
        covers = min(request.before_seq - 1, latest)
    else:
        covers = latest
    shown = [to_builtins(stored_message_view(r.message, member.id)) for r in page.messages]
    for message in shown:
        message["sources"] += cited.get(message["id"], [])
        _with_card(message, shown_cards)
    await _with_reactions(ctx, shown)
    await _with_rewound(ctx, scope_id, shown)
    if info.type is ScopeType.CHANNEL and shown and not member.is_private_agent:
        await _with_threads(ctx, scope_id, shown)
    result = {
        "scopeId": scope_id,
        "targetKey": scope_id,
        "latestSeq": latest,
        "messages": shown,
        "coversThroughSeq": max(covers, 0),
        "hasMore": page.has_more,
        "candidateBudgetExhausted": page.candidate_budget_exhausted,
    }
    if page.has_more and not ascending and page.examined_low is not None:
        # The continuation of a backward page, even an empty one (additive field).
        result["continueBeforeSeq"] = page.examined_low
    if info.type is ScopeType.THREAD:
        # Context only: the root lives in the parent and never moves the thread's seqs.
        result["root"] = await thread_root(ctx, info)
    return result


async def _history_around(
    ctx: Context, request: History, scope_id: str, viewer: Viewer, info: ScopeInfo
) -> dict[str, Any]:
    """A page centred on ``aroundSeq`` (opening a search hit): up to half the
    limit at or before it, the rest after it, oldest first. ``continueBeforeSeq``
    pages back as with ``beforeSeq``; ``coversThroughSeq`` pages on with
    ``afterSeq``."""
    member = member_of(ctx)
    around = request.around_seq
    assert around is not None
    budget = ctx.settings.history_candidate_budget
    async with ctx.services.pool.connection() as conn:
        older = await messages.page(
            conn, scope_id, viewer, before=around + 1, limit=request.limit // 2 + 1, budget=budget
        )
        newer = await messages.page(
            conn,
            scope_id,
            viewer,
            after=around,
            limit=max(request.limit - len(older.messages), 1),
            ascending=True,
            budget=budget,
        )
        found = older.messages + newer.messages
        cited = await sources.sources_for(conn, [r.message.id for r in found], member)
        shown_cards = await cards.cards_for(conn, [r.message for r in found], member)
    shown = [to_builtins(stored_message_view(r.message, member.id)) for r in found]
    for message in shown:
        message["sources"] += cited.get(message["id"], [])
        _with_card(message, shown_cards)
    await _with_reactions(ctx, shown)
    await _with_rewound(ctx, scope_id, shown)
    if info.type is ScopeType.CHANNEL and shown and not member.is_private_agent:
        await _with_threads(ctx, scope_id, shown)
    latest = info.latest_seq
    covers = newer.examined_high if newer.has_more and newer.examined_high else latest
    result: dict[str, Any] = {
        "scopeId": scope_id,
        "targetKey": scope_id,
        "latestSeq": latest,
        "messages": shown,
        "coversThroughSeq": max(covers, 0),
        "hasMore": older.has_more or newer.has_more,
        "candidateBudgetExhausted": (
            older.candidate_budget_exhausted or newer.candidate_budget_exhausted
        ),
    }
    if older.has_more and older.examined_low is not None:
        result["continueBeforeSeq"] = older.examined_low
    if info.type is ScopeType.THREAD:
        result["root"] = await thread_root(ctx, info)
    return result


def _with_card(message: dict[str, Any], shown: dict[str, dict[str, Any]]) -> None:
    """A card message's ``card`` as the viewer may see it (docs/cards.md): the
    one computed for it, replacing the live form the stored metadata gives."""
    card = shown.get(message["id"])
    if card is not None:
        message["card"] = card
    else:
        message.pop("card", None)


async def _with_threads(ctx: Context, scope_id: str, shown: list[dict[str, Any]]) -> None:
    """Carry ``thread`` on each root that has replies (docs/design.md#thread-summary).

    Private agents get none: a thread's count and participants would tell them
    of replies they may not read.
    """
    async with ctx.services.pool.connection() as conn:
        stats = await messages.thread_summaries(conn, scope_id, [m["id"] for m in shown])
    for message in shown:
        found = stats.get(message["id"])
        if found is not None:
            message["thread"] = to_builtins(thread_summary(found))


async def _reaction_summaries(ctx: Context, message_ids: list[str]) -> dict[str, list[Any]]:
    """Message id → ``reactions`` as the viewer may see them (docs/design.md#reactions)."""
    if not message_ids:
        return {}
    async with ctx.services.pool.connection() as conn:
        found = await reactions.summaries(conn, message_ids, member_of(ctx))
    return {message_id: [s.view() for s in found[message_id]] for message_id in found}


async def _with_reactions(ctx: Context, shown: list[dict[str, Any]]) -> None:
    summaries = await _reaction_summaries(ctx, [m["id"] for m in shown])
    for message in shown:
        message["reactions"] = summaries.get(message["id"], [])


async def _with_rewound(ctx: Context, scope_id: str, shown: list[dict[str, Any]]) -> None:
    """``rewound: true`` on each message a rewind set aside (docs/rewind.md)."""
    if not shown:
        return
    seqs = [m["seq"] for m in shown]
    async with ctx.services.pool.connection() as conn:
        ranges = await rewind_store.rewound_ranges(conn, scope_id, min(seqs), max(seqs))
    for message in shown:
        if ranges and rewind_store.is_rewound(message["seq"], ranges):
            message["rewound"] = True


def thread_summary(stats: messages.ThreadStats) -> ThreadSummary:
    return ThreadSummary(
        scope_id=stats.scope_id,
        reply_count=stats.reply_count,
        last_reply_at=rfc3339(stats.last_reply_at),
        participants=list(stats.participants),
    )


async def resume(ctx: Context, resume_from: dict[str, int]) -> dict[str, int]:
    """Push missed readable messages per scope, then ``resumed``; returns, per
    scope, the seq the client now holds everything through: the last one this
    replay sent, or the one it resumed from when there was nothing newer (never
    above the scope's latest). A live event at or below it is one the client has."""
    states: dict[str, ResumeState] = {}
    sent: dict[str, int] = {}
    for scope_id, last_seen in resume_from.items():
        try:
            viewer, latest = await viewer_for(ctx, scope_id)
        except OperationError:
            continue
        sent[scope_id] = min(last_seen, latest)
        async with ctx.services.pool.connection() as conn:
            page = await messages.page(
                conn,
                scope_id,
                viewer,
                after=last_seen,
                limit=RESUME_LIMIT,
                ascending=True,
                budget=ctx.settings.history_candidate_budget,
            )
            cited = await sources.sources_for(
                conn, [r.message.id for r in page.messages], viewer.member
            )
            shown_cards = await cards.cards_for(
                conn, [r.message for r in page.messages], viewer.member
            )
        summaries = await _reaction_summaries(ctx, [r.message.id for r in page.messages])
        for readable in page.messages:
            view = stored_message_view(readable.message, viewer.member.id)
            view.sources += cited.get(readable.message.id, [])
            view.reactions = summaries.get(readable.message.id, [])
            if readable.message.id in shown_cards:
                view.card = shown_cards[readable.message.id]
            payload = encode(MessageEvent(scope_id=scope_id, message=view))
            # Paced by the writer: a burst of up to 200 messages must not close
            # a reading client as a slow consumer. A client that does not read
            # at all is still closed (the queue stays over the cap).
            with trio.move_on_after(ctx.settings.slow_consumer_grace):
                await ctx.outbound.wait_for_room(len(payload))
            ctx.push(payload)
            sent[scope_id] = readable.message.seq
        covers = page.examined_high if page.has_more and page.examined_high else latest
        states[scope_id] = ResumeState(
            latest_seq=latest, has_more=page.has_more, covers_through_seq=covers
        )
    ctx.push(encode(Resumed(scopes=states)))
    return sent


async def list_scopes(ctx: Context) -> dict[str, Any]:
    member = member_of(ctx)
    async with ctx.services.pool.connection() as conn:
        summaries = await scopes.scopes_of_member(conn, member.id)
        managed = (
            frozenset(await services.managed_by(conn, member.id))
            if member.type is MemberType.HUMAN
            else frozenset()
        )
        if member.is_private_agent:
            # A private agent's unread counts only what it may read
            # (docs/design.md#private-agents).
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
                **service_fields(s, managed),
            }
            for s in summaries
        ]
    }


def service_fields(summary: scopes.ScopeSummary, managed: frozenset[str]) -> dict[str, Any]:
    """A service account's conversation names its service, and whether the
    viewer may post there as it (docs/services.md)."""
    if summary.service_member_id is None:
        return {}
    return {
        "service": {
            "memberId": summary.service_member_id,
            "handle": summary.service_handle,
            "manager": summary.service_member_id in managed,
        }
    }


async def _grant_scopes(conn: TrioConnection, scope_id: str) -> tuple[str, ...]:
    info = await scopes.get_scope(conn, scope_id)
    parent = info.parent_scope_id if info is not None else None
    return (scope_id, parent) if parent else (scope_id,)


async def mark_read(ctx: Context, request: MarkRead) -> dict[str, Any]:
    member = member_of(ctx)
    # Another workspace's scope, or a private one never joined, does not exist for it.
    await ctx.services.resolver.known(member, request.scope_id)
    async with ctx.services.pool.connection() as conn:
        last_read = await scopes.mark_read(conn, request.scope_id, member.id, request.seq)
    if last_read is None:
        raise OperationError(ErrorCode.FORBIDDEN, "not a member of this scope")
    payload = encode(ReadStateEvent(scope_id=request.scope_id, last_read_seq=last_read))
    push_to_others(ctx, ctx.services.hub.sessions_of(member.id), payload)
    ctx.services.hub.relay_read_state(request.scope_id, member.id, last_read)
    return {"lastReadSeq": last_read}
