"""The SQL readable predicate and its in-memory twin agree.

Hypothesis generates random scopes: humans, public agents, private agents with
owners, membership intervals built by joins and leaves (public for humans and
public agents, private with the owner for private agents), grants from an owner
to a grantee in the scope, its parent (threads) or an unrelated scope, with
optional expiry and revoke, and messages by anyone at increasing seqs and
non-decreasing wall-clock times (ties on purpose: grant bounds are half-open).
Thread worlds also give each member a membership of the parent channel (none,
current or closed) that later steps end and start again: current public
members of the parent read the thread (``parent_member``), and a
human or public agent reads it only while it is one. Leaving or being removed
from the parent ends the member's thread membership at that point (what
``storage.scopes.leave`` does); a "legacy" parent leave does not, so worlds
also hold current thread memberships under left parents, which must read
nothing. ``remove`` ends an interval exactly as ``leave`` does.

Each world is written straight into the test database (its own workspace and
scope ids). Then, for every (viewer, message) pair, the reason and grant id of
``storage.visibility.READABLE_JOIN`` must equal what ``actors.visibility.readable``
answers on the context the scope actor would load (the loader's own queries),
and the production history query must return exactly the readable rows.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from actors.model import Member, Membership, MemberType, PrivateGrant
from actors.visibility import Readable, VisibilityContext, readable, readers
from storage import messages, snapshots
from storage.directory import member_from_row
from storage.visibility import READABLE_JOIN, Viewer

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)

ALL_ROWS = f"""
SELECT m.id, v.reason, v.grant_id
FROM scope_messages m
{READABLE_JOIN}
WHERE m.scope_id = %(scope_id)s
ORDER BY m.seq
"""

# ------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Spec:
    """A generated world before it is simulated: who exists and what happens."""

    kinds: tuple[tuple[str, int | None], ...]  # (human|public_agent|private_agent, owner index)
    thread: bool
    initial_joins: tuple[bool, ...]
    steps: tuple[tuple[Any, ...], ...]
    parent_joins: tuple[int, ...] = ()  # per member: 0 none, 1 current, 2 closed


@dataclass
class Simulated:
    """Rows to write, produced by replaying a Spec."""

    workspace_id: str
    scope_id: str
    parent_id: str | None
    sibling_id: str
    members: list[Member]
    memberships: list[tuple[str, str, str | None, int, int | None]] = field(default_factory=list)
    grants: list[list[Any]] = field(default_factory=list)
    messages: list[tuple[str, int, str, datetime]] = field(default_factory=list)
    parent_memberships: list[tuple[str, str, str | None, int, int | None]] = field(
        default_factory=list
    )


# How a parent membership ends: through the node (its thread memberships end
# with it) or as a row left from before that rule ("legacy": they stay open).
CLOSINGS = ("leave", "remove", "legacy")


def _uid() -> str:
    return uuid.uuid4().hex


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    humans = draw(st.integers(1, 3))
    public_agents = draw(st.integers(0, 2))
    owners = draw(st.lists(st.integers(0, humans - 1), min_size=1, max_size=3))
    kinds: list[tuple[str, int | None]] = [("human", None)] * humans
    kinds += [("public_agent", draw(st.sampled_from([None, *range(humans)])))] * public_agents
    kinds += [("private_agent", owner) for owner in owners]
    n = len(kinds)
    initial_joins = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    member = st.integers(0, n - 1)
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(0, 30))):
        tick = draw(st.integers(0, 1))
        kind = draw(
            st.sampled_from(
                [
                    *("msg", "msg", "msg", "join", "leave", "remove"),
                    *("grant", "regrant", "revoke", "parent_leave", "parent_join"),
                ]
            )
        )
        if kind in ("msg", "join", "leave", "remove", "parent_join"):
            steps.append((kind, tick, draw(member)))
        elif kind == "parent_leave":
            steps.append((kind, tick, draw(member), draw(st.sampled_from(CLOSINGS))))
        elif kind == "grant":
            steps.append(
                (
                    kind,
                    tick,
                    draw(st.integers(0, humans - 1)),
                    draw(member),
                    draw(st.sampled_from(["scope", "scope", "parent", "sibling"])),
                    draw(st.none() | st.integers(1, 3)),
                )
            )
        elif kind == "regrant":  # the last grant's owner and grantee again: overlapping grants
            steps.append((kind, tick, draw(st.none() | st.integers(1, 3))))
        else:
            steps.append((kind, tick, draw(st.integers(0, 5))))
    parent_joins = tuple(draw(st.lists(st.sampled_from([0, 1, 1, 2]), min_size=n, max_size=n)))
    return Spec(tuple(kinds), draw(st.booleans()), initial_joins, tuple(steps), parent_joins)


def simulate(spec: Spec) -> Simulated:
    workspace_id = f"ws_{_uid()}"
    members: list[Member] = []
    for index, (kind, owner) in enumerate(spec.kinds):
        members.append(
            Member(
                id=f"mem_{_uid()}",
                workspace_id=workspace_id,
                type=MemberType.HUMAN if kind == "human" else MemberType.AGENT,
                handle=f"{kind[:2]}{index}",
                display_name=f"{kind} {index}",
                owner_member_id=members[owner].id if owner is not None else None,
                is_private=kind == "private_agent",
            )
        )
    world = Simulated(
        workspace_id=workspace_id,
        scope_id=f"scp_{_uid()}",
        parent_id=f"scp_{_uid()}" if spec.thread else None,
        sibling_id=f"scp_{_uid()}",
        members=members,
    )
    clock = EPOCH
    latest = 0
    current: dict[int, int] = {}  # member index -> position in world.memberships

    def join(index: int) -> None:
        if index in current:
            return
        member = members[index]
        owner = member.owner_member_id if member.is_private_agent else None
        current[index] = len(world.memberships)
        world.memberships.append(
            (member.id, "private" if owner else "public", owner, latest + 1, None)
        )

    def leave(index: int) -> None:
        if index not in current:
            return
        position = current.pop(index)
        member_id, visibility, owner_id, start, _ = world.memberships[position]
        world.memberships[position] = (member_id, visibility, owner_id, start, latest + 1)

    # The parent's own seqs do not matter here (only which memberships are
    # current), so parent intervals use a counter of parent roster steps.
    parent_seq = 2
    parent_current: dict[int, int] = {}  # member index -> position in parent_memberships

    def parent_row(index: int, start: int, end: int | None) -> None:
        member = members[index]
        owner = member.owner_member_id if member.is_private_agent else None
        if end is None:
            parent_current[index] = len(world.parent_memberships)
        world.parent_memberships.append(
            (member.id, "private" if owner else "public", owner, start, end)
        )

    for index, joined in enumerate(spec.initial_joins):
        if joined:
            join(index)
    if world.parent_id is not None:
        for index, status in enumerate(spec.parent_joins):
            if status:
                parent_row(index, 1, 2 if status == 2 else None)
    for step in spec.steps:
        kind, tick = step[0], step[1]
        clock += timedelta(seconds=tick)
        if kind == "msg":
            latest += 1
            world.messages.append((f"msg_{_uid()}", latest, members[step[2]].id, clock))
        elif kind == "join":
            join(step[2])
        elif kind in ("leave", "remove"):
            leave(step[2])
        elif kind == "parent_leave" and world.parent_id is not None:
            index, closing = step[2], step[3]
            if index in parent_current:
                parent_seq += 1
                position = parent_current.pop(index)
                member_id, visibility, owner_id, start, _ = world.parent_memberships[position]
                world.parent_memberships[position] = (
                    member_id,
                    visibility,
                    owner_id,
                    start,
                    parent_seq,
                )
            if closing != "legacy":
                leave(index)
        elif kind == "parent_join" and world.parent_id is not None:
            if step[2] not in parent_current:
                parent_seq += 1
                parent_row(step[2], parent_seq, None)
        elif kind in ("grant", "regrant"):
            if kind == "grant":
                _, _, owner_index, grantee_index, where, expiry = step
                if owner_index == grantee_index:
                    continue
                owner_id, grantee_id = members[owner_index].id, members[grantee_index].id
                scope_id = {
                    "scope": world.scope_id,
                    "parent": world.parent_id or world.sibling_id,
                    "sibling": world.sibling_id,
                }[where]
            elif world.grants:
                _, _, scope_id, owner_id, grantee_id, *_ = world.grants[-1]
                expiry = step[2]
            else:
                continue
            expires = clock + timedelta(seconds=expiry) if expiry is not None else None
            world.grants.append(
                [
                    *(f"grt_{_uid()}", workspace_id, scope_id, owner_id, grantee_id, owner_id),
                    *(clock, expires, None),
                ]
            )
        elif kind == "revoke":
            open_grants = [g for g in world.grants if g[8] is None]
            if open_grants:
                open_grants[step[2] % len(open_grants)][8] = clock
    return world


# ------------------------------------------------------------------ writing a world


def write(conn: psycopg.Connection[Any], world: Simulated) -> None:
    ws = world.workspace_id
    first = world.members[0]
    global_seq = itertools.count(1)

    def message(message_id: str, scope_id: str, seq: int, author: Member, at: datetime) -> Any:
        # The author is its own notify principal and idempotency subject.
        row = [message_id, ws, scope_id, seq, next(global_seq), author.id, author.type.value]
        return (*row, author.id, author.id, at)

    with conn.transaction(), conn.cursor() as cur:
        cur.execute("INSERT INTO workspaces (id, name) VALUES (%s, %s)", (ws, "eq"))
        cur.executemany(
            "INSERT INTO members (id, workspace_id, type, handle, display_name,"
            " owner_member_id, is_private) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (m.id, ws, m.type.value, m.handle, m.display_name, m.owner_member_id, m.is_private)
                for m in world.members
            ],
        )
        insert_scope = (
            "INSERT INTO scopes (id, workspace_id, type, parent_scope_id, root_message_id,"
            " latest_seq) VALUES (%s, %s, %s, %s, %s, %s)"
        )
        insert_message = (
            "INSERT INTO scope_messages (id, workspace_id, scope_id, seq, workspace_global_seq,"
            " author_member_id, author_type, notify_principal_member_id,"
            " idempotency_subject_member_id, message_type, content, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'text', 'x', %s)"
        )
        if world.parent_id is None:
            cur.execute(insert_scope, (world.sibling_id, ws, "channel", None, None, 0))
            cur.execute(insert_scope, (world.scope_id, ws, "channel", None, None, 0))
        else:
            # The parent channel holds two roots: one for this thread, one for a sibling.
            cur.execute(insert_scope, (world.parent_id, ws, "channel", None, None, 2))
            roots = [f"msg_{_uid()}", f"msg_{_uid()}"]
            cur.executemany(
                insert_message,
                [
                    message(root, world.parent_id, seq, first, EPOCH)
                    for seq, root in enumerate(roots, 1)
                ],
            )
            cur.execute(insert_scope, (world.scope_id, ws, "thread", world.parent_id, roots[0], 0))
            cur.execute(
                insert_scope, (world.sibling_id, ws, "thread", world.parent_id, roots[1], 0)
            )
        authors = {m.id: m for m in world.members}
        cur.executemany(
            insert_message,
            [
                message(message_id, world.scope_id, seq, authors[author], created_at)
                for message_id, seq, author, created_at in world.messages
            ],
        )
        cur.execute(
            "UPDATE scopes SET latest_seq = %s WHERE id = %s",
            (len(world.messages), world.scope_id),
        )
        cur.executemany(
            "INSERT INTO scope_memberships (scope_id, member_id, visibility, owner_member_id,"
            " effective_from_seq, effective_to_seq) VALUES (%s, %s, %s, %s, %s, %s)",
            [(world.scope_id, *row) for row in world.memberships],
        )
        cur.executemany(
            "INSERT INTO scope_memberships (scope_id, member_id, visibility, owner_member_id,"
            " effective_from_seq, effective_to_seq) VALUES (%s, %s, %s, %s, %s, %s)",
            [(world.parent_id, *row) for row in world.parent_memberships],
        )
        cur.executemany(
            "INSERT INTO scope_private_grants (id, workspace_id, scope_id, owner_member_id,"
            " grantee_member_id, granted_by_member_id, created_at, expires_at, revoked_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [tuple(g) for g in world.grants],
        )


def load_twin_context(conn: psycopg.Connection[Any], world: Simulated) -> VisibilityContext:
    """The context a scope actor builds, read with the loader's own queries."""
    intervals: dict[str, tuple[Membership, ...]] = {}
    members: dict[str, Member] = {}
    for r in conn.execute(snapshots.SELECT_MEMBERSHIPS, (world.scope_id,)).fetchall():
        members[r[0]] = member_from_row(r[6:13])
        membership = Membership(r[0], r[1], r[2], r[3], r[4], r[5])
        intervals[r[0]] = (*intervals.get(r[0], ()), membership)
    grant_scopes = [world.scope_id, *([world.parent_id] if world.parent_id else [])]
    rows = conn.execute(snapshots.SELECT_GRANTS, (grant_scopes,)).fetchall()
    # Newest first on purpose: the twin must not depend on the order it is given.
    grants = tuple(PrivateGrant(*r) for r in reversed(rows))
    by_id = {m.id: m for m in world.members}
    for _, _, author_id, _ in world.messages:
        members.setdefault(author_id, by_id[author_id])  # the actor's recent tail adds authors
    parent_readers: set[str] = set()
    if world.parent_id is not None:
        # The thread actor's parent roster: current public members, no private agents.
        for r in conn.execute(snapshots.SELECT_PARENT_ROSTER, (world.parent_id,)).fetchall():
            parent_member = member_from_row(r[6:13])
            members.setdefault(parent_member.id, parent_member)
            if r[1] == "public" and not parent_member.is_private_agent:
                parent_readers.add(r[0])
    return VisibilityContext(
        intervals, members, grants, frozenset(parent_readers), thread=world.parent_id is not None
    )


# ------------------------------------------------------------------ the property


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def check_world(conn: psycopg.Connection[Any], world: Simulated, seen: Counter[str | None]) -> None:
    write(conn, world)
    ctx = load_twin_context(conn, world)
    grant_scopes = (world.scope_id, *((world.parent_id,) if world.parent_id else ()))
    for viewer in world.members:
        public = not viewer.is_private_agent and any(m.is_current for m in ctx.intervals(viewer.id))
        in_thread = world.parent_id is not None
        viewer_params = Viewer(viewer, public, grant_scopes, in_thread).params()
        params = {"scope_id": world.scope_id, **viewer_params}
        sql = {row[0]: (row[1], row[2]) for row in conn.execute(ALL_ROWS, params).fetchall()}
        assert len(sql) == len(world.messages)
        if in_thread and public and viewer.id not in ctx.parent_readers:
            # A thread membership under a left parent reads nothing.
            seen["thread_member_without_parent"] += 1
            assert set(sql.values()) <= {(None, None)}
        readable_ids = set()
        for message_id, seq, author_id, created_at in world.messages:
            twin = readable(ctx, viewer, author_id, seq, created_at)
            expected = (twin.reason, twin.grant_id) if twin else (None, None)
            assert sql[message_id] == expected, (
                f"viewer {viewer.handle} message seq {seq} by "
                f"{next(m.handle for m in world.members if m.id == author_id)}: "
                f"SQL {sql[message_id]} twin {expected}"
            )
            seen[expected[0]] += 1
            if twin is not None:
                readable_ids.add(message_id)
            assert (viewer.id in readers(ctx, [viewer.id], author_id, seq, created_at)) == (
                twin is not None
            )
        # The production history query returns exactly the readable rows, same reasons.
        history = conn.execute(
            messages.HISTORY_ASC,
            {
                **params,
                "after": 0,
                "before": 2**62,
                "budget": messages.CANDIDATE_BUDGET,
                "limit": 1000,
            },
        ).fetchall()
        assert [r[0] for r in history] == [m[0] for m in world.messages if m[0] in readable_ids]
        assert all((r[15], r[16]) == sql[r[0]] for r in history)


# An owner grants its private agent another human's messages, who then posts.
GRANTED = Spec(
    kinds=(("human", None), ("human", None), ("private_agent", 0)),
    thread=False,
    initial_joins=(True, True, True),
    steps=(("grant", 1, 0, 1, "scope", None), ("msg", 1, 1), ("msg", 1, 1)),
)
# Two private agents of one owner: each reads the other's private messages.
SAME_OWNER = Spec(
    kinds=(("human", None), ("private_agent", 0), ("private_agent", 0)),
    thread=False,
    initial_joins=(True, True, True),
    steps=(("msg", 1, 1), ("msg", 1, 2)),
)


def test_sql_predicate_and_twin_agree(conn: psycopg.Connection[Any]) -> None:
    seen: Counter[str | None] = Counter()
    worlds: list[int] = []

    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    # Random worlds reach a grant or two private agents of one owner only now
    # and then (about one run in thirty missed "grant"): these two worlds
    # reach both on every run, the generated ones explore around them.
    @example(GRANTED)
    @example(SAME_OWNER)
    @given(specs())
    def agree(spec: Spec) -> None:
        check_world(conn, simulate(spec), seen)
        worlds.append(1)

    agree()
    assert sum(worlds) >= 200
    # The generator must actually reach every branch of the predicate.
    assert set(seen) >= {
        None,
        "member",
        "parent_member",
        "own",
        "owner",
        "grant",
        "same_owner_private",
    }, seen
    assert seen["thread_member_without_parent"] > 0, seen


def test_grant_bounds_are_half_open(conn: psycopg.Connection[Any]) -> None:
    """A message at a grant's created_at is covered, one at revoke/expiry is not."""
    spec = Spec(
        kinds=(("human", None), ("human", None), ("private_agent", 0)),
        thread=False,
        initial_joins=(True, True, True),
        steps=(
            ("grant", 1, 0, 1, "scope", 2),  # t=1: O grants H until t=3
            ("msg", 0, 1),  # t=1 covered (created_at == grant start)
            ("msg", 1, 1),  # t=2 covered
            ("msg", 1, 1),  # t=3 expired
            ("grant", 1, 0, 1, "scope", None),  # t=4: a second grant
            ("msg", 0, 1),  # t=4 covered by the second grant
            ("revoke", 1, 0),  # t=5: revokes the first unrevoked grant (the expired one)
            ("revoke", 0, 0),  # t=5: revokes the second
            ("msg", 0, 1),  # t=5 not covered (created_at == revoked_at)
        ),
    )
    world = simulate(spec)
    seen: Counter[str | None] = Counter()
    check_world(conn, world, seen)
    ctx = load_twin_context(conn, world)
    agent = world.members[2]
    reasons = [readable(ctx, agent, author, seq, at) for _, seq, author, at in world.messages]
    first, second = (g[0] for g in world.grants)
    assert [(r.reason, r.grant_id) if r else None for r in reasons] == [
        ("grant", first),
        ("grant", first),
        None,
        ("grant", second),
        None,
    ]


def test_thread_uses_parent_grants_never_siblings(conn: psycopg.Connection[Any]) -> None:
    spec = Spec(
        kinds=(("human", None), ("human", None), ("human", None), ("private_agent", 0)),
        thread=True,
        initial_joins=(True, True, True, True),
        steps=(
            ("grant", 1, 0, 1, "parent", None),  # O grants H1 in the parent channel
            ("grant", 0, 0, 2, "sibling", None),  # O grants H2 in a sibling thread
            ("msg", 1, 1),
            ("msg", 0, 2),
        ),
    )
    world = simulate(spec)
    check_world(conn, world, Counter())
    ctx = load_twin_context(conn, world)
    agent = world.members[3]
    (_, s1, a1, t1), (_, s2, a2, t2) = world.messages
    assert readable(ctx, agent, a1, s1, t1) is not None
    assert readable(ctx, agent, a2, s2, t2) is None


def test_thread_membership_needs_the_parent(conn: psycopg.Connection[Any]) -> None:
    """A poster who left the parent reads nothing of the thread, even with a thread
    membership left open; re-joining the parent reads it through the parent."""
    spec = Spec(
        kinds=(("human", None), ("human", None), ("human", None)),
        thread=True,
        initial_joins=(True, True, True),
        steps=(
            ("msg", 1, 0),
            ("msg", 1, 1),
            ("parent_leave", 0, 1, "leave"),  # through the node: thread membership ends
            ("parent_leave", 0, 2, "legacy"),  # a thread membership left open
            ("msg", 1, 0),
            ("parent_join", 0, 1),  # back in the parent: reads through it
        ),
        parent_joins=(1, 1, 1),
    )
    world = simulate(spec)
    check_world(conn, world, Counter())
    ctx = load_twin_context(conn, world)
    rejoined, legacy = world.members[1], world.members[2]
    assert [m.to_seq for m in ctx.intervals(rejoined.id)] == [3]
    assert [m.to_seq for m in ctx.intervals(legacy.id)] == [None]
    for _, seq, author, at in world.messages:
        assert readable(ctx, legacy, author, seq, at) is None
        assert readable(ctx, rejoined, author, seq, at) == Readable("parent_member")
