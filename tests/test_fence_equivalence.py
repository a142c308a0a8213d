"""Fan-out equals the SQL predicate while the roster moves under the actor.

Hypothesis drives one channel through random steps: sends through actor A
(this node), sends through actor B (a second ScopeActor on the same database:
another node), and grants, revokes, joins, leaves and notification changes
written straight through the storage functions, as another node would, without
telling either actor. After every committed send, the readers the committing
actor handed to its publisher must equal the readers the SQL readable
predicate finds for that message at that moment. Without the roster fence and
the one clock, a warm actor fans out on the roster and grants it cached.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.model import Member, MemberType, NotificationState
from actors.scope_actor import ScopeActor
from actors.scope_state import SendCommand
from node.database import autocommit
from protocol.errors import OperationError
from protocol.frames import SendResult
from storage import access, directory, grants, messages, scopes
from storage.pg import TrioConnection
from storage.pool import Pool, open_pool
from storage.store import PgScopeStore
from tests.publishers import RecordingPublisher

# (kind, owner index): ann creates the channel; pub is ann's public agent;
# p is ann's private agent, q is bob's.
CAST: tuple[tuple[str, MemberType, int | None, bool], ...] = (
    ("ann", MemberType.HUMAN, None, False),
    ("bob", MemberType.HUMAN, None, False),
    ("cat", MemberType.HUMAN, None, False),
    ("pub", MemberType.AGENT, 0, False),
    ("p", MemberType.AGENT, 0, True),
    ("q", MemberType.AGENT, 1, True),
)
MEMBERS = st.integers(0, len(CAST) - 1)
SEND = st.tuples(st.just("send"), st.sampled_from((0, 1)), MEMBERS, st.booleans())
STEP = st.one_of(
    # Sends weigh as much as every roster move together.
    SEND,
    SEND,
    SEND,
    SEND,
    SEND,
    st.tuples(st.just("grant"), st.sampled_from((0, 1)), MEMBERS),
    st.tuples(st.just("revoke"), st.integers(0, 7)),
    st.tuples(st.just("revoke"), st.integers(0, 7)),
    st.tuples(st.just("join"), MEMBERS),
    st.tuples(st.just("leave"), MEMBERS),
    st.tuples(st.just("notify"), MEMBERS, st.sampled_from(list(NotificationState))),
)
_names = itertools.count()


async def sql_readers(
    conn: TrioConnection, scope_id: str, message_id: str, cast: list[Member]
) -> frozenset[str]:
    info = await scopes.get_scope(conn, scope_id)
    assert info is not None
    out = set()
    for member in cast:
        viewer = await access.viewer_for(conn, info, member)
        if viewer is not None and await messages.readable_message(
            conn, scope_id, message_id, viewer
        ):
            out.add(member.id)
    return frozenset(out)


async def send(actor: ScopeActor, author: Member, content: str) -> SendResult | OperationError:
    answered = trio.Event()
    results: list[SendResult | OperationError] = []

    def reply(result: SendResult | OperationError) -> None:
        results.append(result)
        answered.set()

    actor.submit_nowait(SendCommand(author, content, f"k{next(_names)}", reply=reply))
    with trio.fail_after(10):
        await answered.wait()
    return results[0]


async def run_world(pool: Pool, steps: Sequence[tuple[Any, ...]], tally: dict[str, int]) -> None:
    async with pool.connection() as conn:
        ws = await directory.create_workspace(conn, f"fence{next(_names)}")
        cast: list[Member] = []
        for handle, type_, owner, private in CAST:
            cast.append(
                await directory.create_member(
                    conn,
                    workspace_id=ws,
                    type_=type_,
                    handle=handle,
                    owner_member_id=cast[owner].id if owner is not None else None,
                    private=private,
                )
            )
        scope_id = await scopes.create_channel(
            conn, creator=cast[0], slug="c", name="c", visibility="public", description=""
        )
    current = {cast[0].id}
    live_grants: list[str] = []

    async def join(member: Member) -> None:
        if member.id in current:
            return
        private = member.is_private_agent
        await scopes.join(
            conn,
            scope_id,
            member,
            visibility="private" if private else "public",
            owner_member_id=member.owner_member_id if private else None,
            state=NotificationState.ACTIVE,
        )
        current.add(member.id)

    publishers = (RecordingPublisher(), RecordingPublisher())
    store = PgScopeStore(pool)
    async with trio.open_nursery() as nursery, pool.connection() as conn:
        for member in (cast[1], cast[4], cast[5]):
            await join(member)
        actors = [ScopeActor(scope_id, store, publisher) for publisher in publishers]
        for actor in actors:
            await nursery.start(actor.run)
        for step in steps:
            kind = step[0]
            if kind == "send":
                _, which, author_index, mention = step
                content = "@p @q hello" if mention else "hello"
                result = await send(actors[which], cast[author_index], content)
                if isinstance(result, OperationError):
                    tally["refused"] += 1
                    continue
                assert result.state == "sent", result
                assert result.message_id is not None
                fanned = publishers[which].readers[result.message_id]
                expected = await sql_readers(conn, scope_id, result.message_id, cast)
                assert fanned == expected, (step, fanned ^ expected)
                tally["sent"] += 1
                tally["private_readers"] += len(expected & {cast[4].id, cast[5].id})
            elif kind == "grant":
                _, owner_index, grantee_index = step
                if owner_index == grantee_index:
                    continue
                live_grants.append(
                    await grants.create(
                        conn,
                        workspace_id=ws,
                        scope_id=scope_id,
                        owner_id=cast[owner_index].id,
                        grantee_id=cast[grantee_index].id,
                        expires_at=None,
                    )
                )
                tally["grants"] += 1
            elif kind == "revoke":
                if live_grants:
                    grant_id = live_grants.pop(step[1] % len(live_grants))
                    owner_id = await _grant_owner(conn, grant_id)
                    assert await grants.revoke(conn, grant_id, owner_id=owner_id) == scope_id
                    tally["revokes"] += 1
            elif kind == "join":
                await join(cast[step[1]])
            elif kind == "leave":
                member = cast[step[1]]
                if member.id in current:
                    await scopes.leave(conn, scope_id, member.id)
                    current.discard(member.id)
                    tally["leaves"] += 1
            elif kind == "notify":
                _, index, state = step
                if cast[index].id in current:
                    await scopes.set_notification(conn, scope_id, cast[index].id, state)
        nursery.cancel_scope.cancel()


async def _grant_owner(conn: TrioConnection, grant_id: str) -> str:
    cur = await conn.execute(
        "SELECT owner_member_id FROM scope_private_grants WHERE id = %s", (grant_id,)
    )
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def test_fan_out_equals_the_predicate_while_another_node_moves_the_roster(
    database_url: str,
) -> None:
    tally = dict.fromkeys(("sent", "refused", "grants", "revokes", "leaves", "private_readers"), 0)
    # One pool for every world (each in a workspace of its own): a pool per
    # world started four database sessions for each.
    async with open_pool(database_url, size=4, configure=autocommit) as pool:

        @settings(
            max_examples=60,
            deadline=None,
            # A fixed sequence of worlds: the coverage checks below never flake.
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(st.lists(STEP, min_size=4, max_size=14))
        def agree(steps: list[tuple[Any, ...]]) -> None:
            trio.from_thread.run(run_world, pool, steps, tally)

        await trio.to_thread.run_sync(agree)
    # The generator must reach the interesting cases, not only refusals.
    assert tally["sent"] >= 40, tally
    assert min(tally["grants"], tally["revokes"], tally["leaves"]) > 0, tally
    assert tally["private_readers"] > 0, tally
