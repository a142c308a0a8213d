"""Chunked logical sends: the node splits long content into rows.

Content longer than the node's row limit becomes several rows, committed one
per actor turn with the rest queued again behind everything else. Row i is
stored under ``<clientMessageId>#<i>`` and fenced on the previous row's
``acceptedSeq``. The held middle row is made deterministic with the actor's
``before_requeue`` seam: another member's send is queued right before the
logical send's remainder goes back to the queue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.model import MemberType
from actors.scope_sends import ChunkedSend
from actors.scope_state import SendCommand, split_content
from protocol.errors import OperationError
from protocol.frames import SendResult
from tests.nodes import World, make_channel, running_node

ROW_LIMIT = 12


@given(st.text(max_size=200), st.integers(1, 40))
def test_split_is_deterministic_bounded_and_lossless(content: str, limit: int) -> None:
    rows = split_content(content, limit)
    assert "".join(rows) == content
    assert all(len(row) <= limit for row in rows)
    assert all(rows[:-1])  # no empty row except a lone empty content
    assert split_content(content, limit) == rows


def test_split_prefers_whitespace() -> None:
    assert split_content("alpha bravo charlie delta", 12) == ["alpha bravo ", "charlie ", "delta"]
    assert split_content("line one\nline two", 12) == ["line one\n", "line two"]


def chunk_rows(history: dict[str, Any], client_message_id: str) -> list[dict[str, Any]]:
    return [
        m
        for m in history["messages"]
        if m["metadata"].get("chunk", {}).get("clientMessageId") == client_message_id
    ]


async def test_chunked_send_held_middle_row_refresh_and_retry(
    database_url: str, tmp_path: Path
) -> None:
    async with running_node(database_url, tmp_path, row_limit=ROW_LIMIT) as node:
        world = await World.create(node)
        owner = await world.member("owner")
        human = await world.member("h")
        bot = await world.member("bot", MemberType.AGENT)
        async with (
            world.client(owner) as o,
            world.client(human) as h,
            world.client(bot, kind="daemon", capabilities=["freshness"]) as a,
        ):
            scope = await make_channel(o, "c", h, a)
            start = (await o.send("#c", "hello"))["acceptedSeq"]

            # Undisturbed: three contiguous rows, one reply naming them all.
            content = "alpha bravo charlie delta"
            rows = split_content(content, ROW_LIMIT)
            assert len(rows) == 3
            fresh = {"targetKey": scope, "seenUpToSeq": start}
            whole = await a.send("#c", content, clientMessageId="calm", freshness=fresh)
            assert whole["state"] == "sent"
            assert [c["acceptedSeq"] for c in whole["chunks"]] == [start + 1, start + 2, start + 3]
            assert whole["acceptedSeq"] == start + 3
            assert whole["messageId"] == whole["chunks"][-1]["messageId"]
            seen = whole["acceptedSeq"]

            # Another member's send queued just before the remainder goes back:
            # it lands between row 0 and row 1, so row 1 is held.
            actor = node.services.registry.actor_nowait(scope)
            assert actor is not None
            interloper: list[SendResult | OperationError] = []

            def interleave(job: ChunkedSend) -> None:
                actor.before_requeue = None
                actor.submit_nowait(
                    SendCommand(
                        author=human.member,
                        content="interloper",
                        client_message_id="interloper",
                        reply=interloper.append,
                    )
                )

            actor.before_requeue = interleave
            content = "one two three four five six"
            rows = split_content(content, ROW_LIMIT)
            assert len(rows) == 3
            fresh = {"targetKey": scope, "seenUpToSeq": seen}
            partial = await a.send("#c", content, clientMessageId="busy", freshness=fresh)
            assert isinstance(interloper[0], SendResult)
            assert interloper[0].accepted_seq == seen + 2
            assert partial["state"] == "partial_held", partial
            assert partial["clientMessageId"] == "busy"
            assert partial["heldChunk"] == 1
            assert [c["acceptedSeq"] for c in partial["accepted"]] == [seen + 1]
            assert partial["latestSeq"] == partial["needsRefreshUntilSeq"] == seen + 2
            first_row = partial["accepted"][0]["messageId"]

            # Refresh, then retry with the same clientMessageId: row 0 replays as
            # already_sent, the rest continues from max(refreshed, lastAccepted).
            refreshed = await a.history("#c")
            assert refreshed["coversThroughSeq"] == seen + 2
            fresh = {"targetKey": scope, "seenUpToSeq": refreshed["coversThroughSeq"]}
            retried = await a.send("#c", content, clientMessageId="busy", freshness=fresh)
            assert retried["state"] == "sent", retried
            assert retried["chunks"] == [
                {"messageId": first_row, "acceptedSeq": seen + 1, "state": "already_sent"},
                {
                    "messageId": retried["chunks"][1]["messageId"],
                    "acceptedSeq": seen + 3,
                    "state": "sent",
                },
                {"messageId": retried["messageId"], "acceptedSeq": seen + 4, "state": "sent"},
            ]

            # Retrying a finished logical send replays every row.
            replay = await a.send("#c", content, clientMessageId="busy", freshness=fresh)
            assert replay["state"] == "already_sent"
            assert replay["chunks"] == [{**c, "state": "already_sent"} for c in retried["chunks"]]

            # No duplicate rows, rows in order, content intact.
            history = await o.history("#c")
            stored = chunk_rows(history, "busy")
            assert [m["metadata"]["chunk"]["index"] for m in stored] == [0, 1, 2]
            assert all(m["metadata"]["chunk"]["count"] == 3 for m in stored)
            assert [m["seq"] for m in stored] == [seen + 1, seen + 3, seen + 4]
            assert "".join(m["content"] for m in stored) == content
            assert [m["content"] for m in history["messages"] if m["seq"] > seen] == [
                rows[0],
                "interloper",
                rows[1],
                rows[2],
            ]
            assert len(chunk_rows(history, "calm")) == 3
