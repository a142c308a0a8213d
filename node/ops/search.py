"""``search``: readable messages matching a query (docs/design.md#search)."""

from __future__ import annotations

import time
from typing import Any

from actors.search_query import QueryError, Refinements, highlights, parse, stem_words, with_stems
from node.ops import reading
from node.ops.context import Context, member_of
from node.views import stored_message_view
from protocol.errors import ErrorCode, OperationError
from protocol.frames import Search
from storage import search as index
from storage import search_index, search_terms
from storage.search_sql import Filters
from storage.visibility import Viewer


async def search(ctx: Context, request: Search) -> dict[str, Any]:
    member = member_of(ctx)
    if request.scope_id is not None:
        # The same answers as `history` for a scope the caller may not read
        # (not_found in another workspace, forbidden elsewhere): never an oracle.
        await reading.scope_viewer(ctx, request.scope_id)
    refinements = Refinements(
        request.from_member, request.in_scope, request.before, request.after, request.on
    )
    try:
        parsed = parse(request.query, refinements)
    except QueryError as exc:
        raise OperationError(ErrorCode.VALIDATION_FAILED, str(exc), path=exc.path) from None
    filters = Filters(member.workspace_id, request.scope_id, request.author_id)
    # The per-scope rights are evaluated per row by the statement itself.
    viewer = Viewer(member, public_reader=False, grant_scopes=()).params()
    started = time.perf_counter()
    async with ctx.services.pool.connection() as conn:
        if words := stem_words(parsed):
            language = ctx.services.settings.search_language
            parsed = with_stems(parsed, await search_terms.stems(conn, language, words))
        try:
            results = await index.search(
                conn,
                request.query,
                parsed,
                filters,
                viewer,
                sort=request.sort,
                limit=request.limit,
                cursor=request.cursor,
            )
        except index.BadCursor as exc:
            raise OperationError(ErrorCode.VALIDATION_FAILED, str(exc), path="$.cursor") from None
        # The statement finds nothing in a workspace being built: only an empty
        # page pays the readiness lookup.
        if not results.hits and not await search_index.is_ready(conn, member.workspace_id):
            raise OperationError(
                ErrorCode.SEARCH_UNAVAILABLE, "the search index of this workspace is being built"
            )
    hits = []
    for hit in results.hits:
        message = hit.readable.message
        hits.append(
            {
                "scopeId": message.scope_id,
                # Encoded with the reply as it is: no dict of it first.
                "message": stored_message_view(message, member.id),
                "highlights": [list(span) for span in highlights(message.content, parsed)],
            }
        )
    ctx.services.metrics.search.observe(time.perf_counter() - started)
    return {
        "hits": hits,
        "nextCursor": results.next_cursor,
        "hasMore": results.next_cursor is not None,
        # What the node understood: a client can say what an empty page searched.
        "searched": parsed.described(),
    }
