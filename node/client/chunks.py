"""Long messages: how the node stores them as rows, and how to read them back.

A ``send`` whose content is longer than the node's row limit (16,000
characters by default) is one *logical* send that the node splits into rows.
Row ``i`` is stored with ``clientMessageId`` ``<clientMessageId>#<i>`` and
``metadata.chunk = {index, count, clientMessageId}``; the ``#<digits>`` suffix
is reserved, so a client never sends it (the node answers
``validation_failed``). The library therefore never splits: it sends the whole
content once with one ``clientMessageId`` and lets the node chunk, which keeps
a retry idempotent (accepted rows replay as ``already_sent`` and the rest goes
on from where it was held).

A reader meets the rows one by one: each is its own ``message`` event, a
mention wakes an agent on the row that holds it, and history pages may cut a
logical message anywhere. :func:`chunk_info` tells a row from a plain message;
:func:`join_chunks` puts the rows of a page back together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CHUNK_SEPARATOR", "ChunkInfo", "chunk_client_message_id", "chunk_info", "join_chunks"]

# The node's separator (``actors/scope_state.py``); tests/test_daemon_client.py
# checks the two agree.
CHUNK_SEPARATOR = "#"


def chunk_client_message_id(client_message_id: str, index: int) -> str:
    """The ``clientMessageId`` under which the node stores row ``index`` of a long send."""
    return f"{client_message_id}{CHUNK_SEPARATOR}{index}"


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """``metadata.chunk`` of one stored row."""

    index: int
    count: int
    client_message_id: str


def chunk_info(message: Mapping[str, Any]) -> ChunkInfo | None:
    """The chunk metadata of ``message``, or None for a message that is not a row."""
    metadata = message.get("metadata")
    chunk = metadata.get("chunk") if isinstance(metadata, Mapping) else None
    if not isinstance(chunk, Mapping):
        return None
    index, count, logical = chunk.get("index"), chunk.get("count"), chunk.get("clientMessageId")
    if not (isinstance(index, int) and isinstance(count, int) and isinstance(logical, str)):
        return None
    return ChunkInfo(index, count, logical)


def join_chunks(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages in order with the rows of each logical send merged into one.

    A merged message is row 0 (its id, seq, author, recipients) with the whole
    ``content`` and ``metadata.chunk.complete`` telling whether every row was
    among ``messages``; other messages pass through unchanged. Rows of one
    send are merged even when other messages lie between them (a row can be
    held and land after someone else's message); the merged message takes the
    place of its first row.
    """
    out: list[dict[str, Any]] = []
    rows: dict[tuple[str, str], dict[int, str]] = {}
    firsts: dict[tuple[str, str], int] = {}
    for message in messages:
        info = chunk_info(message)
        if info is None:
            out.append(dict(message))
            continue
        author = message.get("author")
        author_id = author.get("memberId", "") if isinstance(author, Mapping) else ""
        key = (str(author_id), info.client_message_id)
        parts = rows.setdefault(key, {})
        parts[info.index] = str(message.get("content", ""))
        if key not in firsts:
            firsts[key] = len(out)
            out.append(dict(message))
        elif info.index == 0:
            out[firsts[key]] = dict(message)
    for key, position in firsts.items():
        parts = rows[key]
        merged = out[position]
        info = chunk_info(merged)
        assert info is not None
        metadata = dict(merged.get("metadata") or {})
        complete = len(parts) == info.count and all(i in parts for i in range(info.count))
        metadata["chunk"] = {**metadata["chunk"], "complete": complete}
        merged["metadata"] = metadata
        merged["content"] = "".join(parts[i] for i in sorted(parts))
        out[position] = merged
    return out
