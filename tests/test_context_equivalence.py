"""Explicit context: the SQL predicate and its twin still agree (docs/design.md#sources).

The worlds of ``tests/test_visibility_equivalence.py`` (members, intervals,
grants, threads and their parents), plus explicit-context sends: a carrier
message in another scope whose ``recipient_context`` rows open chosen
messages of the scope to chosen members. For every (viewer, message) pair
the SQL reason and grant must equal the twin's given the context rows, a
private agent must read a message by ``context`` exactly when it reads it by
nothing else and a row names it, and nobody else gains anything.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.visibility import readable
from storage.sources import SELECT_CONTEXT
from storage.visibility import Viewer
from tests.test_visibility_equivalence import (
    ALL_ROWS,
    Simulated,
    load_twin_context,
    simulate,
    specs,
    write,
)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def write_context(
    conn: psycopg.Connection[Any], world: Simulated, picks: list[tuple[int, int]]
) -> set[tuple[str, str]]:
    """One explicit-context carrier in the sibling scope; a recipient_context row
    per picked (member, message) pair. Returns the (member id, message id) pairs."""
    pairs = {
        (world.members[m % len(world.members)].id, world.messages[k % len(world.messages)][0])
        for m, k in picks
    }
    if not pairs:
        return set()
    carrier = f"msg_{uuid.uuid4().hex}"
    author = world.members[0]
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "INSERT INTO scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
            " author_member_id, author_type, notify_principal_member_id,"
            " idempotency_subject_member_id, message_type, content)"
            " VALUES (%s, %s, %s, 100, 100000, %s, %s, %s, %s, 'text', 'see these')",
            (
                carrier,
                world.workspace_id,
                world.sibling_id,
                *(author.id, author.type.value, author.id, author.id),
            ),
        )
        seqs = {message_id: seq for message_id, seq, _, _ in world.messages}
        cur.executemany(
            "INSERT INTO scope_message_sources (target_scope_id, message_id, ordinal,"
            " source_scope_id, source_seq, source_message_id, source_kind, source_dedupe_key,"
            " context_member_id) VALUES (%s, %s, %s, %s, %s, %s, 'recipient_context', %s, %s)",
            [
                (
                    *(world.sibling_id, carrier, ordinal, world.scope_id),
                    *(seqs[message_id], message_id, f"rc:{member_id}:{message_id}", member_id),
                )
                for ordinal, (member_id, message_id) in enumerate(sorted(pairs))
            ],
        )
    return pairs


def check(
    conn: psycopg.Connection[Any],
    world: Simulated,
    picks: list[tuple[int, int]],
    seen: Counter[str],
) -> None:
    write(conn, world)
    pairs = write_context(conn, world, picks)
    base = load_twin_context(conn, world)
    context: dict[str, set[str]] = {}
    for member_id, message_id in conn.execute(SELECT_CONTEXT, (world.scope_id,)).fetchall():
        context.setdefault(member_id, set()).add(message_id)
    assert {(m, i) for m, ids in context.items() for i in ids} == pairs
    ctx = replace(base, context={m: frozenset(ids) for m, ids in context.items()})
    grant_scopes = (world.scope_id, *((world.parent_id,) if world.parent_id else ()))
    for viewer in world.members:
        public = not viewer.is_private_agent and any(m.is_current for m in ctx.intervals(viewer.id))
        params = {
            "scope_id": world.scope_id,
            **Viewer(viewer, public, grant_scopes, world.parent_id is not None).params(),
        }
        sql = {row[0]: (row[1], row[2]) for row in conn.execute(ALL_ROWS, params).fetchall()}
        for message_id, seq, author_id, created_at in world.messages:
            twin = readable(ctx, viewer, author_id, seq, created_at, message_id)
            expected = (twin.reason, twin.grant_id) if twin else (None, None)
            assert sql[message_id] == expected, (viewer.handle, seq, sql[message_id], expected)
            without = readable(base, viewer, author_id, seq, created_at, message_id)
            opened = viewer.is_private_agent and (viewer.id, message_id) in pairs
            # Context adds exactly the rows that name the viewer, and only to private agents.
            if without is None and opened:
                assert expected == ("context", None)
                seen["opened"] += 1
            else:
                assert twin == without
                seen["context_row_ignored" if (viewer.id, message_id) in pairs else "other"] += 1


def test_context_rows_agree_with_the_twin(conn: psycopg.Connection[Any]) -> None:
    seen: Counter[str] = Counter()

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        specs(),
        st.lists(st.tuples(st.integers(0, 20), st.integers(0, 40)), max_size=8),
    )
    def agree(spec: Any, picks: list[tuple[int, int]]) -> None:
        world = simulate(spec)
        check(conn, world, picks if world.messages else [], seen)

    agree()
    # Both ways are reached: rows that open a message, and rows that change
    # nothing (a human named, or a message the agent already reads).
    assert seen["opened"] > 0, seen
    assert seen["context_row_ignored"] > 0, seen
