"""The authorization matrix: every op × every kind of actor × every kind of scope.

One node, real WebSockets, real PostgreSQL. :data:`MATRIX` says, for each
scope kind, what each actor kind gets for each op: ``ok`` (a ``reply``) or the
``error`` code. ``test_authorization_matrix`` builds the worlds and asks every
cell; ``test_doc_is_current`` checks that ``docs/authorization.md`` is the
rendering of the same data. Regenerate the doc with::

    python -m tests.test_authorization_matrix > docs/authorization.md

Read-only cells of a scope kind share one world; a cell whose op changes the
roster (join, leave, invite, remove) gets a fresh world of its own, so no
answer depends on the order in which cells run.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from actors.ids import new_id
from actors.model import MemberType
from node.client import Client
from storage import directory, invites, scopes
from storage.pg import connect
from tests.nodes import Person, World, running_node
from tests.test_authorization_cards import card_lines
from tests.test_authorization_rewind import rewind_lines
from tests.test_authorization_schedules import schedule_lines
from tests.test_authorization_services import service_lines
from tests.test_authorization_tasks import task_lines
from tests.test_authorization_workflows import workflow_lines

DOC = Path(__file__).resolve().parent.parent / "docs" / "authorization.md"
REGEN_ENV = "SCOPENODE_REGEN_DOCS"
TIMEOUT = 120
PARALLEL = 12  # worlds built and cells asked at once

OK = "ok"
FORBIDDEN = "forbidden"
NOT_FOUND = "not_found"
NA = None  # the combination cannot exist
# Listings (channels, people, a root's thread summary) answer with a reply
# either way: the cell is whether the reply names what the row asks about.
LISTED = "listed"
UNLISTED = "not listed"

PUBLIC_CHANNEL = "public channel"
PRIVATE_CHANNEL = "private channel"
DM = "DM"
THREAD = "thread of a private channel"
SCOPE_KINDS = (PUBLIC_CHANNEL, PRIVATE_CHANNEL, DM, THREAD)

ACTORS: dict[str, tuple[str, str]] = {
    # key: (column heading, who it is)
    "member": (
        "public member",
        "a current public member, a human (in a thread: one who has posted there)",
    ),
    "owner": ("channel owner", "the channel's owner (its creator)"),
    "former": ("former member", "joined, then left"),
    "outsider": ("outsider", "a human of the workspace who is not a member"),
    "foreign": ("other workspace", "a member of another workspace"),
    "own_agent": (
        "owner's private agent",
        "a private agent of the channel's owner, added by it as a private member"
        " (in a thread: admitted there by its owner's mention)",
    ),
    "other_agent": ("other's private agent", "a private agent of another owner, not a member"),
    "third": ("DM third party", "a human of the workspace who is not one of the DM's two members"),
    "leaver": (
        "thread poster who left the parent",
        "a public member of the parent who posted in the thread, then left the parent",
    ),
}
COLUMNS: dict[str, tuple[str, ...]] = {
    PUBLIC_CHANNEL: (
        "member",
        "owner",
        "former",
        "outsider",
        "foreign",
        "own_agent",
        "other_agent",
    ),
    PRIVATE_CHANNEL: (
        "member",
        "owner",
        "former",
        "outsider",
        "foreign",
        "own_agent",
        "other_agent",
    ),
    DM: ("member", "third", "foreign", "other_agent"),
    THREAD: ("member", "outsider", "foreign", "own_agent", "other_agent", "leaver"),
}
LEFT_OUT: tuple[tuple[str, str], ...] = (
    (
        "channel owner in a DM or a thread",
        "a DM has two equal members and no owner; a thread"
        " has none either (its parent's owner reads and posts there as a public member of the"
        " parent, which is the *public member* column)",
    ),
    ("former member of a DM", "a DM's membership is fixed: nobody leaves or joins it"),
    (
        "former member of a thread",
        "thread membership follows the parent; the former members"
        " that matter are the *thread poster who left the parent* column",
    ),
    ("outsider in a DM", "that is the *DM third party* column"),
    (
        "private agent of the owner in a DM",
        "a DM between two humans cannot get a private"
        " member (invite is forbidden there); the DM of an owner with its own private agent is"
        " that agent's private DM",
    ),
    ("DM third party in a channel or a thread", "that is the *outsider* column"),
    (
        "thread poster who left the parent, in a channel or a DM",
        "that is the *former member* column of the parent channel",
    ),
    (
        "*invite owner's agent*, *remove owner's agent* and *remove owner* in a DM",
        "a DM has no owner",
    ),
    ("*remove owner* in a thread", "a thread has no owner"),
    ("*invite own agent* by a private agent", "private agents own no agents"),
    (
        "the profile rows (*update own profile* …) outside the public channel",
        "a profile belongs to the workspace, not to a scope: the public channel's"
        " columns already hold every kind of actor",
    ),
)

OPS: dict[str, tuple[str, str]] = {
    # key: (op on the wire, the request each cell sends); the key is the row heading
    "send": ("send", "`send` a text message to `scope:<id>`"),
    "history": ("history", "`history` of `scope:<id>`"),
    "search": ("search", "`search` with `scopeId`"),
    "markRead": ("markRead", "`markRead` seq 1"),
    "react": ("react", "`react` to a message of the scope that its members may read"),
    "edit": (
        "edit",
        "`edit` a message the *public member* has just sent (in a DM: the first member)",
    ),
    "delete": (
        "delete",
        "`delete` a message the *public member* has just sent (in a DM: the first member)",
    ),
    "members": ("members", "`members` of the scope"),
    "join": ("join", "`join`"),
    "leave": ("leave", "`leave`"),
    "invite": ("invite", "`invite` a human of the workspace who is not a member"),
    "invite own agent": (
        "invite",
        "`invite` with `visibility: private` the caller's own private agent",
    ),
    "invite owner's agent": (
        "invite",
        "`invite` with `visibility: private` another private agent of the channel's owner",
    ),
    "remove member": ("remove", "`remove` a current public member (in a DM: the other member)"),
    "remove owner's agent": ("remove", "`remove` the *owner's private agent*"),
    "remove owner": ("remove", "`remove` the channel owner"),
    "grant": ("grant", "`grant` to a current public member (in a DM: the other member)"),
    "revokeGrant": ("revokeGrant", "`revokeGrant` a grant made by the *public member*"),
    "setNotification": ("setNotification", "`setNotification` to `quiet`"),
    "channels": ("channels", "`channels`: is the scope listed?"),
    "people": (
        "people",
        "`people`: is the *owner's private agent* listed (in a DM: the first member's"
        " private agent)?",
    ),
    "thread summary": (
        "history",
        "`history` of the thread's parent: does the root carry `thread`?",
    ),
    "typing": ("typing", "`typing` with `scopeId`"),
    "setPresence": ("setPresence", "`setPresence` to `active` (names no scope)"),
    "presence": (
        "presence",
        "`presence`: is the *owner's private agent*, connected, listed?",
    ),
    "update own profile": ("updateProfile", "`updateProfile` of the caller's own display name"),
    "update other's profile": (
        "updateProfile",
        "`updateProfile` with `memberId` of another human of the workspace",
    ),
    "update owner's agent profile": (
        "updateProfile",
        "`updateProfile` with `memberId` of the *owner's private agent*",
    ),
}
MUTATING = frozenset(
    {
        "join",
        "leave",
        "invite",
        "invite own agent",
        "invite owner's agent",
        "remove member",
        "remove owner's agent",
        "remove owner",
    }
)

# Cells that send first run with the sends (see below).
SENDING = frozenset({"send", "edit", "delete"})
F, NF = FORBIDDEN, NOT_FOUND
L, U = LISTED, UNLISTED
# fmt: off
MATRIX: dict[str, dict[str, tuple[str | None, ...]]] = {
    PUBLIC_CHANNEL: {
        #                  member owner former outsider foreign own_agent other_agent
        "send":            (OK,   OK,   F,     F,       NF,     OK,       F),
        "history":         (OK,   OK,   F,     F,       NF,     OK,       F),
        "search":          (OK,   OK,   F,     F,       NF,     OK,       F),
        "markRead":        (OK,   OK,   F,     F,       NF,     OK,       F),
        "react":           (OK,   OK,   F,     F,       NF,     OK,       F),
        "edit":            (OK,   F,    F,     F,       NF,     F,        F),
        "delete":          (OK,   OK,   F,     F,       NF,     F,        F),
        "members":         (OK,   OK,   F,     F,       NF,     OK,       F),
        "join":            (OK,   OK,   OK,    OK,      NF,     F,        F),
        "leave":           (OK,   OK,   OK,    OK,      NF,     OK,       OK),
        "invite":          (OK,   OK,   F,     F,       NF,     F,        F),
        "invite own agent":      (OK, OK, F,  F,  NF, NA, NA),
        "invite owner's agent":  (F,  OK, F,  F,  NF, F,  F),
        "remove member":         (F,  OK, F,  F,  NF, F,  F),
        "remove owner's agent":  (F,  OK, F,  F,  NF, F,  F),
        "remove owner":          (F,  F,  F,  F,  NF, F,  F),
        "grant":           (OK,   OK,   F,     F,       NF,     F,        F),
        "revokeGrant":     (OK,   NF,   NF,    NF,      NF,     NF,       NF),
        "setNotification": (OK,   OK,   F,     F,       NF,     OK,       F),
        "channels":        (L,    L,    L,     L,       U,      L,        L),
        "people":          (U,    L,    U,     U,       U,      L,        U),
        "thread summary":  (NA,   NA,   NA,    NA,      NA,     NA,       NA),
        "typing":          (OK,   OK,   NF,    NF,      NF,     OK,       NF),
        "setPresence":     (OK,   OK,   OK,    OK,      OK,     OK,       OK),
        "presence":        (U,    L,    U,     U,       U,      L,        U),
        "update own profile":           (OK, OK, OK, OK, OK, OK, OK),
        "update other's profile":       (F,  F,  F,  F,  NF, F,  F),
        "update owner's agent profile": (NF, OK, NF, NF, NF, OK, NF),
    },
    # Whoever never belonged to a private channel is answered as if it did not
    # exist: the outsider and the other owner's private agent get not_found.
    PRIVATE_CHANNEL: {
        #                  member owner former outsider foreign own_agent other_agent
        "send":            (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "history":         (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "search":          (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "markRead":        (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "react":           (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "edit":            (OK,   F,    F,     NF,      NF,     F,        NF),
        "delete":          (OK,   OK,   F,     NF,      NF,     F,        NF),
        "members":         (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "join":            (F,    F,    F,     NF,      NF,     F,        NF),
        "leave":           (OK,   OK,   OK,    NF,      NF,     OK,       NF),
        "invite":          (OK,   OK,   F,     NF,      NF,     F,        NF),
        "invite own agent":      (OK, OK, F,  NF, NF, NA, NA),
        "invite owner's agent":  (F,  OK, F,  NF, NF, F,  NF),
        "remove member":         (F,  OK, F,  NF, NF, F,  NF),
        "remove owner's agent":  (F,  OK, F,  NF, NF, F,  NF),
        "remove owner":          (F,  F,  F,  NF, NF, F,  NF),
        "grant":           (OK,   OK,   F,     NF,      NF,     F,        NF),
        "revokeGrant":     (OK,   NF,   NF,    NF,      NF,     NF,       NF),
        "setNotification": (OK,   OK,   F,     NF,      NF,     OK,       NF),
        "channels":        (L,    L,    U,     U,       U,      L,        U),
        "people":          (U,    L,    U,     U,       U,      L,        U),
        "thread summary":  (NA,   NA,   NA,    NA,      NA,     NA,       NA),
        "typing":          (OK,   OK,   NF,    NF,      NF,     OK,       NF),
        "setPresence":     (OK,   OK,   OK,    OK,      OK,     OK,       OK),
        "presence":        (U,    L,    U,     U,       U,      L,        U),
        "update own profile":           (NA, NA, NA, NA, NA, NA, NA),
        "update other's profile":       (NA, NA, NA, NA, NA, NA, NA),
        "update owner's agent profile": (NA, NA, NA, NA, NA, NA, NA),
    },
    DM: {
        #                  member third foreign other_agent
        "send":            (OK,   NF,   NF,     NF),
        "history":         (OK,   NF,   NF,     NF),
        "search":          (OK,   NF,   NF,     NF),
        "markRead":        (OK,   NF,   NF,     NF),
        "react":           (OK,   NF,   NF,     NF),
        "edit":            (OK,   NF,   NF,     NF),
        "delete":          (OK,   NF,   NF,     NF),
        "members":         (OK,   NF,   NF,     NF),
        "join":            (F,    NF,   NF,     NF),
        "leave":           (F,    NF,   NF,     NF),
        "invite":          (F,    NF,   NF,     NF),
        "invite own agent":     (F,  NF, NF, NA),
        "invite owner's agent": (NA, NA, NA, NA),
        "remove member":        (F,  NF, NF, NF),
        "remove owner's agent": (NA, NA, NA, NA),
        "remove owner":         (NA, NA, NA, NA),
        "grant":           (OK,   NF,   NF,     NF),
        "revokeGrant":     (OK,   NF,   NF,     NF),
        "setNotification": (OK,   NF,   NF,     NF),
        "channels":        (NA,   NA,   NA,     NA),
        "people":          (L,    U,    U,      U),
        "thread summary":  (NA,   NA,   NA,     NA),
        "typing":          (OK,   NF,   NF,     NF),
        "setPresence":     (OK,   OK,   OK,     OK),
        "presence":        (NA,   NA,   NA,     NA),
        "update own profile":           (NA, NA, NA, NA),
        "update other's profile":       (NA, NA, NA, NA),
        "update owner's agent profile": (NA, NA, NA, NA),
    },
    # The thread of a private channel: it exists for whoever ever belonged to
    # the parent or the thread (the thread poster who left the parent).
    THREAD: {
        #                  member outsider foreign own_agent other_agent leaver
        "send":            (OK,   NF,      NF,     OK,       NF,         F),
        "history":         (OK,   NF,      NF,     OK,       NF,         F),
        "search":          (OK,   NF,      NF,     OK,       NF,         F),
        "markRead":        (OK,   NF,      NF,     OK,       NF,         F),
        "react":           (OK,   NF,      NF,     OK,       NF,         F),
        "edit":            (OK,   NF,      NF,     F,        NF,         F),
        "delete":          (OK,   NF,      NF,     F,        NF,         F),
        "members":         (OK,   NF,      NF,     OK,       NF,         F),
        "join":            (F,    NF,      NF,     F,        NF,         F),
        "leave":           (OK,   NF,      NF,     OK,       NF,         OK),
        "invite":          (F,    NF,      NF,     F,        NF,         F),
        "invite own agent":     (F,  NF, NF, NA, NA, F),
        "invite owner's agent": (F,  NF, NF, F,  NF, F),
        "remove member":        (F,  NF, NF, F,  NF, F),
        "remove owner's agent": (F,  NF, NF, F,  NF, F),
        "remove owner":         (NA, NA, NA, NA, NA, NA),
        "grant":           (OK,   NF,      NF,     F,        NF,         F),
        "revokeGrant":     (OK,   NF,      NF,     NF,       NF,         NF),
        "setNotification": (OK,   NF,      NF,     OK,       NF,         F),
        "channels":        (NA,   NA,      NA,     NA,       NA,         NA),
        "people":          (U,    U,       U,      L,        U,          U),
        "thread summary":  (L,    NF,      NF,     U,        NF,         F),
        "typing":          (OK,   NF,      NF,     OK,       NF,         NF),
        "setPresence":     (OK,   OK,      OK,     OK,       OK,         OK),
        "presence":        (U,    U,       U,      L,        U,          U),
        "update own profile":           (NA, NA, NA, NA, NA, NA),
        "update other's profile":       (NA, NA, NA, NA, NA, NA),
        "update owner's agent profile": (NA, NA, NA, NA, NA, NA),
    },
}
# fmt: on


def expected_cells() -> dict[tuple[str, str, str], str]:
    """(scope kind, op key, actor) → expected answer, for every combination that exists."""
    cells: dict[tuple[str, str, str], str] = {}
    for kind in SCOPE_KINDS:
        rows = MATRIX[kind]
        assert list(rows) == list(OPS), f"{kind}: rows must be exactly {list(OPS)} in order"
        for op, answers in rows.items():
            assert len(answers) == len(COLUMNS[kind]), (kind, op)
            for actor, answer in zip(COLUMNS[kind], answers, strict=True):
                if answer is not None:
                    cells[(kind, op, actor)] = answer
    return cells


# ---------------------------------------------------------------- private scopes read as missing
#
# Each probe is one request naming a private scope, or a message of one, in
# one of the ways a request can. Asked by someone who never belonged to the
# scope, it must get the very frame the same request naming nothing gets.
# ``{…}`` are filled with the private scope's names, or with names of nothing.

_TARGETS: dict[str, str] = {
    # the target → how the doc names it
    "#{slug}": "`#slug`",
    "#{slug}:{root}": "`#slug:<root>`",
    "scope:{channel}": "`scope:<channel>`",
    "scope:{thread}": "`scope:<thread>`",
    "scope:{dm}": "`scope:<DM>`",
    "task:{channel}": "`task:<channel>`",
    "dm:{agent}": "`dm:<another owner's private agent>`",
}
_SCOPE_IDS: dict[str, str] = {"channel": "channel", "thread": "thread", "dm": "DM"}
_MESSAGE_IDS: dict[str, str] = {"in_channel": "channel", "in_thread": "thread", "in_dm": "DM"}
_BY_SCOPE_ID: dict[str, dict[str, Any]] = {
    "members": {},
    "join": {},
    "leave": {},
    "invite": {"memberId": "{member}"},
    "remove": {"memberId": "{member}"},
    "setNotification": {"state": "quiet"},
    "markRead": {"seq": 1},
    "grant": {"granteeMemberId": "{member}"},
    "search": {"query": "hi"},
    "typing": {},
}
_BY_MESSAGE_ID: dict[str, dict[str, Any]] = {
    "edit": {"content": "changed"},
    "delete": {},
    "react": {"emoji": ":+1:"},
}


def _probes() -> list[tuple[str, str, dict[str, Any]]]:
    """(op, what names the scope, request fields) for every op that names a
    scope, in every form."""
    by_target = [
        (op, shown, {"type": op, "target": target})
        for op in ("send", "history")
        for target, shown in _TARGETS.items()
    ]
    by_scope_id = [
        (op, f"`scopeId` of the {shown}", {"type": op, "scopeId": f"{{{name}}}", **fields})
        for op, fields in _BY_SCOPE_ID.items()
        for name, shown in _SCOPE_IDS.items()
    ]
    by_message_id = [
        (op, f"a message of the {shown}", {"type": op, "messageId": f"{{{name}}}", **fields})
        for op, fields in _BY_MESSAGE_ID.items()
        for name, shown in _MESSAGE_IDS.items()
    ]
    forwards = [
        (
            "send with forward",
            f"a message of the {shown}",
            {
                "type": "send",
                "target": "#{slug}",
                "forward": {"mode": "single", "sources": [{"messageId": f"{{{name}}}"}]},
            },
        )
        for name, shown in _MESSAGE_IDS.items()
    ]
    # Search terms never fail: a channel the caller may not know has no hits for it.
    in_channel = ("search in:", "`in:#slug`", {"type": "search", "query": "hi in:#{slug}"})
    return [*by_target, *by_scope_id, *by_message_id, *forwards, in_channel]


PROBES = _probes()


# ---------------------------------------------------------------- the document

_INTRO = """\
# Authorization

Who may do what, per kind of scope. Every cell below is asked by
`tests/test_authorization_matrix.py` against a running node (real WebSockets,
real PostgreSQL), and this page is rendered from that test's own table: if the
page and the test disagree, the test fails. Regenerate it with

```sh
python -m tests.test_authorization_matrix > docs/authorization.md
```

**ok** is a `reply`; anything else is the `error` code the node answers,
except in the listing rows (`channels`, `people`, `thread summary`), which
answer with a reply either way: **listed** or *not listed* says whether the
reply names what the row asks about.
The rules in short:

- A scope answers `not_found` to a member of another workspace, whatever it
  asks: scopes, messages and grants of other workspaces do not exist for it.
- A private scope (a private channel, a DM, a thread of a private channel)
  does not exist for a member that never belonged to it (or, for a thread, to
  its parent), nor for a private agent that no explicit context opened it to:
  every op and every way of naming it (`#slug`, `#slug:<root>`, `scope:<id>`,
  `task:<id>`, a `scopeId`, the id of one of its messages) answers exactly as
  for a scope that does not exist: the same `not_found` code, message and
  `details`, from the same one database statement. The one exception is
  `createChannel`, whose `validation_failed` says a slug is taken, private
  channel or not: a workspace cannot hold two channels of one slug. Public
  channels, and their threads, exist for every member of the workspace: an
  outsider gets `forbidden` there. `dm:<id>` of another owner's private agent
  answers as an unknown member (`not_found`).
- Reading (`history`, `members`, `search`, `react`) and writing (`send`,
  `markRead`, `setNotification`) need current membership: a public one for
  humans and public agents, any membership interval for a private agent, which
  then reads only the rows it may see. Whoever else the scope exists for (a
  former member; in a public channel an outsider or another owner's private
  agent) gets `forbidden`.
- Channels: a current public member invites humans and public agents; a
  private agent is added (`visibility: private`) only by its owner, where the
  owner is a current public member; private agents never invite, join or
  remove. Only public channels can be joined. `join` and `leave` are
  idempotent. The channel's owner removes members and nobody removes the
  owner; an owner removes its own private agent.
- `edit` is the author's alone; `delete` is the author's and, in a channel
  and its threads, the channel owner's. Both need the caller to read the
  message and to be a current member (a former member recalls nothing).
- DMs have a fixed membership: no `join`, `leave`, `invite` or `remove`.
- Threads are read and written through the parent: humans and public agents
  while they are current public members of the parent, private agents only by
  admission. No `join`, `invite` or `remove`. Leaving the parent ends the
  member's thread memberships under it.
- `grant` is for human current public members; `revokeGrant` only for the
  grant's owner, and anyone else gets `not_found` (a grant's existence is not
  revealed).
- `channels` lists the workspace's public channels and the private ones the
  caller is a current member of. `people` lists humans and public agents to
  everyone, a private agent only to its owner (and to itself). A root carries
  its `thread` summary for readers of the parent, never for private agents.
- `react` is allowed to whoever may read the message (a private agent: the
  messages it may see); a reaction is not a message and changes no seq.
- `search` with `scopeId` checks first that the caller may read the scope,
  as `history` does; hits are only messages `history` would show it.
- `typing` needs the caller to read the scope now; anyone else (a former
  member, an outsider of a public channel too) gets `not_found`, as for a
  scope that does not exist. `setPresence` names no scope: every session may.
  `presence` lists a private agent only to its owner (and itself), as `people`
  does, and only while it has a session open (docs/presence.md).
- `updateProfile` renames the caller, or an agent by its owner; another
  member's profile is `forbidden`, another owner's private agent and a member
  of another workspace are `not_found`.
"""


_PROBES_INTRO = """\
A private channel with a thread, a DM, and a private agent of the channel's
owner; asking are the *outsider* and the *other's private agent*, neither of
which ever belonged to them. Each request below is sent twice: once naming
the private scope (or one of its messages, or the private agent) and once
naming one that does not exist. The two answers must be the same frame,
`code`, `message` (with the slug named in its place) and `details` alike,
and, but for `search` terms, a `not_found` `error`."""


def _cell(answer: str | None) -> str:
    if answer is None:
        return "—"
    if answer == OK:
        return "**ok**"
    if answer == LISTED:
        return "**listed**"
    if answer == UNLISTED:
        return "*not listed*"
    return f"`{answer}`"


def render() -> str:
    """``docs/authorization.md``, from :data:`MATRIX` and its legends."""
    lines = [_INTRO, "## Who the columns are", "", "| column | who |", "| --- | --- |"]
    lines += [f"| {heading} | {who} |" for heading, who in ACTORS.values()]
    lines += ["", "## What each row asks", "", "| row | request |", "| --- | --- |"]
    lines += [f"| {key} | {request} |" for key, (_, request) in OPS.items()]
    for kind in SCOPE_KINDS:
        columns = COLUMNS[kind]
        lines += ["", f"## {kind[0].upper()}{kind[1:]}", ""]
        lines.append("| op | " + " | ".join(ACTORS[c][0] for c in columns) + " |")
        lines.append("| --- |" + " :-: |" * len(columns))
        for op, answers in MATRIX[kind].items():
            if all(answer is None for answer in answers):
                continue
            lines.append(f"| {op} | " + " | ".join(_cell(a) for a in answers) + " |")
    lines += ["", "## Private scopes read as missing ones", "", _PROBES_INTRO, ""]
    lines += ["| op | names the private scope by |", "| --- | --- |"]
    forms_of: dict[str, list[str]] = {}
    for op, form, _ in PROBES:
        forms_of.setdefault(op, []).append(form)
    lines += [f"| {op} | {', '.join(forms)} |" for op, forms in forms_of.items()]
    lines += ["", "## Combinations that cannot exist", ""]
    lines += [f"- {what}: {why}." for what, why in LEFT_OUT]
    lines.append(
        "- A row that is not listed under a scope kind (or a cell shown as —) has no"
        " such target there."
    )
    lines += _admin_lines()
    lines += service_lines()
    lines += task_lines(_cell)
    lines += workflow_lines(_cell)
    lines += rewind_lines(_cell)
    lines += schedule_lines()
    lines += card_lines()
    return "\n".join(lines) + "\n"


def test_doc_is_current() -> None:
    expected_cells()  # the table is well formed
    rendered = render()
    if os.environ.get(REGEN_ENV):
        DOC.write_text(rendered)
    assert DOC.exists(), "docs/authorization.md is missing"
    assert DOC.read_text() == rendered, (
        "docs/authorization.md is stale: regenerate it with "
        f"`python -m tests.test_authorization_matrix > docs/authorization.md` (or {REGEN_ENV}=1)"
    )


# ---------------------------------------------------------------- the worlds


@dataclass
class Scene:
    """One scope with every actor kind in place, and the ids the cells need."""

    kind: str
    scope_id: str
    message_id: str  # readable by every member, the owner's private agent included
    actors: dict[str, Client]
    targets: dict[str, str]  # row → the member it names (invite, remove …, grant)
    granter: Client  # the "member" actor, whose grant revokeGrant cells revoke
    own_agents: dict[str, str]  # actor → its own private agent (not a member)
    root: tuple[str, str] | None = None  # threads: (parent scope id, root message id)


@dataclass
class Cast:
    world: World
    people: dict[str, Person]
    clients: dict[str, Client]
    hold: trio.Nursery  # keeps the sessions opened while building worlds
    # Set when every cell is answered: the sessions then close as a client
    # closes them (a cancelled client waits out its close handshake instead).
    done: trio.Event = field(default_factory=trio.Event)
    slugs: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    handles: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


async def ask(client: Client, cast: Cast, op: str, **fields: Any) -> dict[str, Any]:
    """Send a request with a fresh string id (auto ids are ints) and return the answer."""
    return await client.request_frame({"type": op, "id": f"m{next(cast.ids)}", **fields})


async def ok(client: Client, cast: Cast, op: str, **fields: Any) -> dict[str, Any]:
    answer = await ask(client, cast, op, **fields)
    assert answer["type"] == "reply", (op, fields, answer)
    result: dict[str, Any] = answer["result"]
    return result


async def channel_scene(cast: Cast, kind: str) -> Scene:
    c, p = cast.clients, cast.people
    owner = c["owner"]
    slug = f"m{next(cast.slugs)}"
    visibility = "public" if kind == PUBLIC_CHANNEL else "private"  # threads: private parent
    created = await ok(owner, cast, "createChannel", slug=slug, name=slug, visibility=visibility)
    scope = created["scopeId"]
    invited = ["member", "target", "former"] + (["leaver"] if kind == THREAD else [])

    async def invite(who: str, visibility: str = "public") -> None:
        await ok(owner, cast, "invite", scopeId=scope, memberId=p[who].id, visibility=visibility)

    async with trio.open_nursery() as nursery:
        for who in invited:
            nursery.start_soon(invite, who)
        nursery.start_soon(invite, "own_agent", "private")
    await ok(c["former"], cast, "leave", scopeId=scope)
    first = await ok(
        owner,
        cast,
        "send",
        target=f"scope:{scope}",
        content="first",
        clientMessageId=f"first-{slug}",
    )
    actors = {name: c[name] for name in COLUMNS[PUBLIC_CHANNEL]}
    targets = {
        "remove member": p["target"].id,
        "remove owner's agent": p["own_agent"].id,
        "remove owner": p["owner"].id,
        "invite": p["invitee"].id,
        "invite owner's agent": p["second_agent"].id,
        "grant": p["target"].id,
        "people": p["own_agent"].id,
        "update other's profile": p["target"].id,
        "update owner's agent profile": p["own_agent"].id,
    }
    own_agents = {actor: p[agent].id for actor, agent in _OWN_AGENTS.items()}
    scene = Scene(kind, scope, first["messageId"], actors, targets, c["member"], own_agents)
    if kind == THREAD:
        scene = await thread_scene(cast, scene, slug)
    return scene


async def thread_scene(cast: Cast, parent: Scene, slug: str) -> Scene:
    """A thread under a private channel: the owner admits its private agent by a mention,
    the member, the target and the leaver post; then the leaver leaves the parent."""
    c = cast.clients
    opened = await ok(
        c["owner"],
        cast,
        "send",
        target=f"#{slug}:{parent.message_id}",
        content="@p welcome",
        clientMessageId=f"root-{slug}",
    )
    thread = opened["targetKey"]

    async def post(who: str) -> None:
        await ok(
            c[who],
            cast,
            "send",
            target=f"scope:{thread}",
            content=f"from {who}",
            clientMessageId=f"{who}-{slug}",
        )

    async with trio.open_nursery() as nursery:
        for who in ("member", "target", "leaver"):
            nursery.start_soon(post, who)
    await ok(c["leaver"], cast, "leave", scopeId=parent.scope_id)
    actors = {name: c[name] for name in COLUMNS[THREAD]}
    return Scene(
        THREAD,
        thread,
        opened["messageId"],
        actors,
        parent.targets,
        c["member"],
        parent.own_agents,
        (parent.scope_id, parent.message_id),
    )


async def dm_scene(cast: Cast) -> Scene:
    """A DM between two fresh humans (a pair has one DM), the first with a private agent."""
    n = next(cast.handles)
    first = await cast.world.member(f"dma{n}")
    second = await cast.world.member(f"dmb{n}")
    agent = await cast.world.member(f"dmp{n}", MemberType.AGENT, owner=first, private=True)
    client = await cast.hold.start(session, cast.world, first, cast.done)
    sent = await ok(
        client, cast, "send", target=f"dm:{second.id}", content="hello", clientMessageId=f"dm-{n}"
    )
    c = cast.clients
    actors = {
        "member": client,
        "third": c["outsider"],
        "foreign": c["foreign"],
        "other_agent": c["other_agent"],
    }
    targets = {
        "remove member": second.id,
        "invite": cast.people["invitee"].id,
        "grant": second.id,
        "people": agent.id,
    }
    own_agents = {
        "member": agent.id,
        "third": cast.people["outsider_agent"].id,
        "foreign": cast.people["foreign_agent"].id,
    }
    return Scene(DM, sent["targetKey"], sent["messageId"], actors, targets, client, own_agents)


async def session(
    world: World,
    person: Person,
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open a session for ``person`` and keep it open until ``done``."""
    kind = "daemon" if person.member.type is MemberType.AGENT else "browser"
    async with world.client(person, kind=kind, max_pending_events=math.inf) as client:
        task_status.started(client)
        await done.wait()


async def scene(cast: Cast, kind: str) -> Scene:
    return await dm_scene(cast) if kind == DM else await channel_scene(cast, kind)


# ---------------------------------------------------------------- the cells


async def answer(cast: Cast, s: Scene, op_key: str, actor: str) -> str:
    """Ask one cell; ``ok`` for a reply, else the error code."""
    client = s.actors[actor]
    op = OPS[op_key][0]
    fields: dict[str, Any]
    if op_key == "send":
        fields = {
            "target": f"scope:{s.scope_id}",
            "content": f"{actor} says hi",
            "clientMessageId": f"cell-{next(cast.ids)}",
        }
    elif op_key == "history":
        fields = {"target": f"scope:{s.scope_id}"}
    elif op_key == "search":
        fields = {"query": "hi", "scopeId": s.scope_id}
    elif op_key == "markRead":
        fields = {"scopeId": s.scope_id, "seq": 1}
    elif op_key in ("edit", "delete"):
        # Each cell its own message, so no cell sees another's edit or tombstone.
        mine = await ok(
            s.granter,
            cast,
            "send",
            target=f"scope:{s.scope_id}",
            content="to be changed",
            clientMessageId=f"mut-{next(cast.ids)}",
        )
        fields = {"messageId": mine["messageId"]}
        if op_key == "edit":
            fields["content"] = f"changed by {actor}"
    elif op_key == "react":
        fields = {"messageId": s.message_id, "emoji": ":+1:"}
    elif op_key in ("members", "join", "leave"):
        fields = {"scopeId": s.scope_id}
    elif op_key == "invite":
        fields = {"scopeId": s.scope_id, "memberId": s.targets["invite"]}
    elif op_key in ("invite own agent", "invite owner's agent"):
        agent = s.own_agents[actor] if op_key == "invite own agent" else s.targets[op_key]
        fields = {
            "scopeId": s.scope_id,
            "memberId": agent,
            "visibility": "private",
        }
    elif op_key.startswith("remove "):
        fields = {"scopeId": s.scope_id, "memberId": s.targets[op_key]}
    elif op_key == "grant":
        fields = {"scopeId": s.scope_id, "granteeMemberId": s.targets["grant"]}
    elif op_key == "revokeGrant":
        made = await ok(
            s.granter, cast, "grant", scopeId=s.scope_id, granteeMemberId=s.targets["grant"]
        )
        fields = {"grantId": made["grantId"]}
    elif op_key == "setNotification":
        fields = {"scopeId": s.scope_id, "state": "quiet"}
    elif op_key in ("channels", "people", "presence"):
        fields = {}
    elif op_key == "typing":
        fields = {"scopeId": s.scope_id}
    elif op_key == "setPresence":
        fields = {"state": "active"}
    elif op_key == "thread summary":
        assert s.root is not None
        fields = {"target": f"scope:{s.root[0]}"}
    elif op_key == "update own profile":
        fields = {"displayName": f"{actor} renamed"}
    elif op_key in ("update other's profile", "update owner's agent profile"):
        fields = {"displayName": f"renamed by {actor}", "memberId": s.targets[op_key]}
    else:  # pragma: no cover - the table and this function name the same ops
        raise AssertionError(op_key)
    reply = await ask(client, cast, op, **fields)
    if reply["type"] == "reply":
        return _listed(s, op_key, reply["result"])
    assert reply["type"] == "error", reply
    return str(reply["code"])


def _listed(s: Scene, op_key: str, result: dict[str, Any]) -> str:
    """A listing row's answer: does the reply name what the row asks about?"""
    if op_key == "channels":
        found = any(c["id"] == s.scope_id for c in result["channels"])
    elif op_key == "people":
        found = any(m["id"] == s.targets["people"] for m in result["people"])
    elif op_key == "presence":
        found = any(m["memberId"] == s.targets["people"] for m in result["members"])
    elif op_key == "thread summary":
        assert s.root is not None
        found = any(m["id"] == s.root[1] and "thread" in m for m in result["messages"])
    else:
        return OK
    return LISTED if found else UNLISTED


_PEOPLE: tuple[tuple[str, MemberType, str | None], ...] = (
    # name, type, owner (name) — a private agent when it has an owner
    ("owner", MemberType.HUMAN, None),
    ("member", MemberType.HUMAN, None),
    ("target", MemberType.HUMAN, None),
    ("former", MemberType.HUMAN, None),
    ("outsider", MemberType.HUMAN, None),
    ("invitee", MemberType.HUMAN, None),
    ("leaver", MemberType.HUMAN, None),
    ("own_agent", MemberType.AGENT, "owner"),
    ("second_agent", MemberType.AGENT, "owner"),
    ("other_agent", MemberType.AGENT, "member"),
    ("member_agent", MemberType.AGENT, "member"),
    ("former_agent", MemberType.AGENT, "former"),
    ("outsider_agent", MemberType.AGENT, "outsider"),
    ("leaver_agent", MemberType.AGENT, "leaver"),
)
_HANDLES = {"own_agent": "p", "second_agent": "p2", "other_agent": "q"}
_OWN_AGENTS = {  # actor → the person that is its own private agent
    "member": "member_agent",
    "owner": "second_agent",
    "former": "former_agent",
    "outsider": "outsider_agent",
    "foreign": "foreign_agent",
    "leaver": "leaver_agent",
}
_ACTING = ("owner", "member", "target", "former", "outsider", "leaver", "own_agent", "other_agent")


async def test_authorization_matrix(database_url: str, tmp_path: Path) -> None:
    expected = expected_cells()
    got: dict[tuple[str, str, str], str] = {}
    with trio.fail_after(TIMEOUT):
        async with running_node(database_url, tmp_path) as node, trio.open_nursery() as hold:
            world = await World.create(node, "matrix")
            elsewhere = await World.create(node, "elsewhere")
            people: dict[str, Person] = {}
            for name, type_, owner in _PEOPLE:
                people[name] = await world.member(
                    _HANDLES.get(name, name),
                    type_,
                    owner=people[owner] if owner else None,
                    private=owner is not None,
                )
            people["foreign"] = await elsewhere.member("foreign")
            people["foreign_agent"] = await elsewhere.member(
                "foreign_agent", MemberType.AGENT, owner=people["foreign"], private=True
            )
            done = trio.Event()
            clients = {
                name: await hold.start(session, world, people[name], done) for name in _ACTING
            }
            clients["foreign"] = await hold.start(session, elsewhere, people["foreign"], done)
            cast = Cast(world, people, clients, hold, done)

            shared: dict[str, Scene] = {}

            async def build_shared(kind: str) -> None:
                shared[kind] = await scene(cast, kind)

            async with trio.open_nursery() as nursery:
                for kind in SCOPE_KINDS:
                    nursery.start_soon(build_shared, kind)

            limiter = trio.CapacityLimiter(PARALLEL)

            async def run(cell: tuple[str, str, str]) -> None:
                kind, op, actor = cell
                async with limiter:
                    try:
                        s = await scene(cast, kind) if op in MUTATING else shared[kind]
                        got[cell] = await answer(cast, s, op, actor)
                    except Exception as exc:  # one broken cell must not hide the others
                        got[cell] = f"crashed: {exc!r}"

            # Sends last: a send that misses a fence makes the actor reload, which
            # would hide a stale roster from the cells that run after it.
            for sends in (False, True):
                async with trio.open_nursery() as nursery:
                    for cell in expected:
                        if (cell[1] in SENDING) is sends:
                            nursery.start_soon(run, cell)
            done.set()

    wrong = {cell: (want, got[cell]) for cell, want in expected.items() if got[cell] != want}
    assert not wrong, f"{len(wrong)} of {len(expected)} cells differ:\n" + "\n".join(
        f"  {kind} / {op} / {actor}: expected {want}, got {have}"
        for (kind, op, actor), (want, have) in sorted(wrong.items())
    )


# Same length, so the names cannot differ in anything but their letters.
HIDDEN_SLUG = "hidden-a"
MISSING_SLUG = "absent-a"


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, dict):
        return {key: _fill(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, names) for item in value]
    return value


def _compared(answer: dict[str, Any], slug: str) -> dict[str, Any]:
    """The frame as the two answers must share it: without the request id, the slug
    named in its place."""
    shown = {key: value for key, value in answer.items() if key != "id"}
    if "message" in shown:
        shown["message"] = shown["message"].replace(slug, "<slug>")
    if isinstance(searched := shown.get("result", {}).get("searched"), dict):
        # The search echoes the query as it understood it, slug included.
        searched["in"] = [name.replace(slug, "<slug>") for name in searched["in"]]
    return shown


async def _hidden_names(owner: Client, bob: Person, agent: Person) -> dict[str, str]:
    """A private channel with a thread, a DM and the owner's private agent."""

    async def sent(target: str, content: str) -> dict[str, Any]:
        return await owner.request(
            "send", target=target, content=content, clientMessageId=f"hide-{content}"
        )

    channel = await owner.request(
        "createChannel", slug=HIDDEN_SLUG, name="Hidden", visibility="private"
    )
    await owner.request(
        "invite", scopeId=channel["scopeId"], memberId=agent.id, visibility="private"
    )
    root = await sent(f"#{HIDDEN_SLUG}", "root")
    in_thread = await sent(f"#{HIDDEN_SLUG}:{root['messageId']}", "reply")
    in_dm = await sent(f"dm:{bob.id}", "between-us")
    return {
        "slug": HIDDEN_SLUG,
        "root": root["messageId"],
        "channel": channel["scopeId"],
        "thread": in_thread["targetKey"],
        "dm": in_dm["targetKey"],
        "agent": agent.id,
        "in_channel": root["messageId"],
        "in_thread": in_thread["messageId"],
        "in_dm": in_dm["messageId"],
        "member": bob.id,
    }


def _missing_names(bob: Person) -> dict[str, str]:
    """Well-formed names of nothing (the same kinds of ids, never issued)."""
    return {
        "slug": MISSING_SLUG,
        "root": new_id("msg"),
        "channel": new_id("scp"),
        "thread": new_id("scp"),
        "dm": new_id("scp"),
        "agent": new_id("mem"),
        "in_channel": new_id("msg"),
        "in_thread": new_id("msg"),
        "in_dm": new_id("msg"),
        "member": bob.id,
    }


async def test_private_scopes_answer_as_missing_ones(database_url: str, tmp_path: Path) -> None:
    differ: list[str] = []
    with trio.fail_after(TIMEOUT):
        async with running_node(database_url, tmp_path) as node:
            world = await World.create(node, "hidden")
            owner = await world.member("owner")
            bob = await world.member("bob")
            eve = await world.member("eve")
            agent = await world.member("pa", MemberType.AGENT, owner=owner, private=True)
            eves_agent = await world.member("ea", MemberType.AGENT, owner=eve, private=True)
            async with (
                world.client(owner) as o,
                world.client(eve) as e,
                world.client(eves_agent, kind="daemon") as ea,
            ):
                hidden = await _hidden_names(o, bob, agent)
                missing = _missing_names(bob)
                ids = itertools.count(1)
                for who, client in (("outsider", e), ("other's private agent", ea)):
                    for op, form, fields in PROBES:
                        answers = []
                        for names in (hidden, missing):
                            request = _fill(fields, names)
                            request["id"] = f"p{next(ids)}"
                            if request["type"] == "send":
                                request |= {"content": "hi", "clientMessageId": request["id"]}
                            answers.append(await client.request_frame(request))
                        seen, absent = (
                            _compared(answers[0], HIDDEN_SLUG),
                            _compared(answers[1], MISSING_SLUG),
                        )
                        expected_error = op != "search in:"
                        if seen != absent or (expected_error and seen.get("code") != NOT_FOUND):
                            differ.append(f"  {who} / {op} / {form}: {seen} vs {absent}")
    assert not differ, f"{len(differ)} of {2 * len(PROBES)} probes tell them apart:\n" + "\n".join(
        differ
    )


# ---------------------------------------------------------------- workspace admin ops
#
# Workspace-wide ops, asked of no scope: one table, its own actors. A cell
# that changes something gets its own target (a fresh member or invite), so
# no answer depends on the order in which cells run.

ADMIN_ACTORS: dict[str, tuple[str, str]] = {
    "admin": ("admin", "a workspace admin (a human)"),
    "member": ("member", "a human of the workspace who is not an admin"),
    "agent": ("agent", "a public agent of the workspace"),
    "private_agent": ("admin's private agent", "a private agent owned by the admin"),
    "outsider": ("other workspace", "a member of another workspace, not an admin there"),
    "foreign_admin": ("other workspace's admin", "an admin of another workspace"),
}
ADMIN_OPS: dict[str, str] = {
    # op (the row heading) → the request each cell sends
    "adminMembers": "`adminMembers`: is a member of the workspace listed?",
    "adminCreateMember": "`adminCreateMember` a human with a fresh handle",
    "adminDeactivateMember": "`adminDeactivateMember` a fresh member of the workspace",
    "adminSetAdmin": "`adminSetAdmin` to promote a fresh human of the workspace",
    "adminIssueToken": "`adminIssueToken` for a fresh member of the workspace",
    "adminRevokeTokens": "`adminRevokeTokens` of a fresh member of the workspace",
    "adminCreateInvite": "`adminCreateInvite` for one use",
    "adminInvites": "`adminInvites`: is an invite of the workspace listed?",
    "adminRevokeInvite": "`adminRevokeInvite` a fresh invite of the workspace",
    "adminChannels": "`adminChannels`: is the workspace's `#general` listed?",
    "adminCreateChannel": "`adminCreateChannel` with a fresh slug",
}
# fmt: off
ADMIN_MATRIX: dict[str, tuple[str, ...]] = {
    #                        admin member agent private_agent outsider foreign_admin
    "adminMembers":          (L,   F,     F,    F,            F,       U),
    "adminCreateMember":     (OK,  F,     F,    F,            F,       OK),
    "adminDeactivateMember": (OK,  F,     F,    F,            F,       NF),
    "adminSetAdmin":         (OK,  F,     F,    F,            F,       NF),
    "adminIssueToken":       (OK,  F,     F,    F,            F,       NF),
    "adminRevokeTokens":     (OK,  F,     F,    F,            F,       NF),
    "adminCreateInvite":     (OK,  F,     F,    F,            F,       OK),
    "adminInvites":          (L,   F,     F,    F,            F,       U),
    "adminRevokeInvite":     (OK,  F,     F,    F,            F,       NF),
    "adminChannels":         (L,   F,     F,    F,            F,       U),
    "adminCreateChannel":    (OK,  F,     F,    F,            F,       OK),
}
# fmt: on

_ADMIN_INTRO = """\
Workspace-wide ops of the admin page (docs/invites.md). Only a workspace
admin may make them, and the node asks the database at every request, so a
demotion or a deactivation counts from the next one. An admin acts on its own
workspace only: a member or an invite of another workspace is `not_found`,
and a listing names none of them. An admin is a human; an invite makes a
plain human member, never an admin or an agent."""


def _admin_lines() -> list[str]:
    columns = list(ADMIN_ACTORS)
    lines = ["", "## Workspace admin ops", "", _ADMIN_INTRO, ""]
    lines += ["| column | who |", "| --- | --- |"]
    lines += [f"| {heading} | {who} |" for heading, who in ADMIN_ACTORS.values()]
    lines += ["", "| row | request |", "| --- | --- |"]
    lines += [f"| {op} | {request} |" for op, request in ADMIN_OPS.items()]
    lines += ["", "| op | " + " | ".join(ADMIN_ACTORS[c][0] for c in columns) + " |"]
    lines.append("| --- |" + " :-: |" * len(columns))
    for op, answers in ADMIN_MATRIX.items():
        lines.append(f"| {op} | " + " | ".join(_cell(a) for a in answers) + " |")
    return lines


@dataclass
class AdminCast:
    world: World
    general: str  # the workspace's #general
    invite_id: str  # an invite of the workspace
    fresh: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


async def _promoted(world: World, person: Person) -> Person:
    async with await connect(world.node.database_url, autocommit=True) as conn:
        await directory.set_admin(conn, person.id, True)
    return person


async def _admin_fields(cast: AdminCast, op: str) -> dict[str, Any]:
    n = next(cast.fresh)
    if op in ("adminMembers", "adminInvites", "adminChannels"):
        return {}
    if op == "adminCreateMember":
        return {"handle": f"new{n}"}
    if op == "adminCreateInvite":
        return {"maxUses": 1}
    if op == "adminCreateChannel":
        return {"slug": f"room{n}", "name": f"Room {n}"}
    if op == "adminRevokeInvite":
        async with await connect(cast.world.node.database_url, autocommit=True) as conn:
            made = await invites.create_invite(
                conn, cast.world.workspace_id, expires_in_s=3600, max_uses=None
            )
        return {"inviteId": made.id}
    target = await cast.world.member(f"target{n}")
    return {"memberId": target.id, **({"admin": True} if op == "adminSetAdmin" else {})}


def _admin_listed(cast: AdminCast, op: str, result: dict[str, Any]) -> str:
    if op == "adminMembers":
        found = any(m["handle"] == "member" for m in result["members"])
    elif op == "adminInvites":
        found = any(i["id"] == cast.invite_id for i in result["invites"])
    elif op == "adminChannels":
        found = any(c["scopeId"] == cast.general for c in result["channels"])
    else:
        return OK
    return LISTED if found else UNLISTED


async def test_workspace_admin_ops(database_url: str, tmp_path: Path) -> None:
    columns = list(ADMIN_ACTORS)
    got: dict[tuple[str, str], str] = {}
    with trio.fail_after(TIMEOUT):
        async with running_node(database_url, tmp_path) as node, AsyncExitStack() as hold:
            world = await World.create(node, "admin matrix")
            elsewhere = await World.create(node, "elsewhere")
            admin = await _promoted(world, await world.member("admin"))
            people = {
                "admin": admin,
                "member": await world.member("member"),
                "agent": await world.member("bot", MemberType.AGENT),
                "private_agent": await world.member(
                    "pa", MemberType.AGENT, owner=admin, private=True
                ),
                "outsider": await elsewhere.member("outsider"),
                "foreign_admin": await _promoted(elsewhere, await elsewhere.member("boss")),
            }
            clients = {}
            for name, person in people.items():
                home = elsewhere if name in ("outsider", "foreign_admin") else world
                kind = "daemon" if person.member.type is MemberType.AGENT else "browser"
                clients[name] = await hold.enter_async_context(home.client(person, kind=kind))
            async with await connect(node.database_url, autocommit=True) as conn:
                general = await scopes.create_general(conn, admin.member)
                made = await invites.create_invite(
                    conn, world.workspace_id, expires_in_s=3600, max_uses=None
                )
            cast = AdminCast(world, general, made.id)

            async def run(op: str, actor: str) -> None:
                try:
                    fields = await _admin_fields(cast, op)
                    reply = await clients[actor].request_frame(
                        {"type": op, "id": f"a{next(cast.fresh)}", **fields}
                    )
                    if reply["type"] == "reply":
                        got[(op, actor)] = _admin_listed(cast, op, reply["result"])
                    else:
                        got[(op, actor)] = str(reply["code"])
                except Exception as exc:  # one broken cell must not hide the others
                    got[(op, actor)] = f"crashed: {exc!r}"

            async with trio.open_nursery() as nursery:
                for op in ADMIN_MATRIX:
                    for actor in columns:
                        nursery.start_soon(run, op, actor)

    expected = {
        (op, actor): want
        for op, answers in ADMIN_MATRIX.items()
        for actor, want in zip(columns, answers, strict=True)
    }
    wrong = {cell: (want, got[cell]) for cell, want in expected.items() if got[cell] != want}
    assert not wrong, "\n".join(
        f"  {op} / {actor}: expected {want}, got {have}"
        for (op, actor), (want, have) in sorted(wrong.items())
    )


if __name__ == "__main__":
    sys.stdout.write(render())
