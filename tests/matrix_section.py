"""What the authorization matrix's feature sections share (tasks, services,
workflows, schedules, rewind, cards): the section's lines in
``docs/authorization.md``, a cast that asks as each actor, and every cell
asked at once and checked together."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio

from actors.model import MemberType
from node.client import Client
from tests.nodes import Person, World

Matrix = Mapping[str, Sequence[str]]


def section_lines(
    title: str,
    intro: str,
    actors: Mapping[str, tuple[str, str]],
    ops: Mapping[str, str],
    matrix: Matrix,
    cell: Callable[[str], str],
) -> list[str]:
    """A section: who each column is, what each row asks, and the answers."""
    lines = ["", f"## {title}", "", intro, ""]
    lines += ["| column | who |", "| --- | --- |"]
    lines += [f"| {heading} | {who} |" for heading, who in actors.values()]
    lines += ["", "| row | request |", "| --- | --- |"]
    lines += [f"| {op} | {request} |" for op, request in ops.items()]
    lines += ["", "| op | " + " | ".join(heading for heading, _ in actors.values()) + " |"]
    lines.append("| --- |" + " :-: |" * len(actors))
    for op, answers in matrix.items():
        lines.append(f"| {op} | " + " | ".join(cell(a) for a in answers) + " |")
    return lines


@dataclass
class Cast:
    """The section's people, each with an open session."""

    people: dict[str, Person]
    clients: dict[str, Client]
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def ask(self, actor: str, op: str, **fields: Any) -> dict[str, Any]:
        frame = {"type": op, "id": f"m{next(self.ids)}", **fields}
        return await self.clients[actor].request_frame(frame)

    async def ok(self, actor: str, op: str, **fields: Any) -> dict[str, Any]:
        answer = await self.ask(actor, op, **fields)
        assert answer["type"] == "reply", (op, fields, answer)
        result: dict[str, Any] = answer["result"]
        return result


async def open_sessions(
    hold: AsyncExitStack, people: dict[str, Person], world: World, elsewhere: World
) -> dict[str, Client]:
    """A session for each person (a browser's for humans, a daemon's for
    agents and services); ``foreign`` signs in to the other workspace."""
    clients = {}
    for name, person in people.items():
        home = elsewhere if name == "foreign" else world
        kind = "browser" if person.member.type is MemberType.HUMAN else "daemon"
        clients[name] = await hold.enter_async_context(home.client(person, kind=kind))
    return clients


async def ask_every_cell(
    matrix: Matrix, columns: Sequence[str], answer: Callable[[str, str], Awaitable[str]]
) -> dict[tuple[str, str], str]:
    """Every (op, actor) answer, asked at once; a broken cell is reported, not raised."""
    got: dict[tuple[str, str], str] = {}

    async def run(op: str, actor: str) -> None:
        try:
            got[(op, actor)] = await answer(op, actor)
        except Exception as exc:  # one broken cell must not hide the others
            got[(op, actor)] = f"crashed: {exc!r}"

    async with trio.open_nursery() as nursery:
        for op in matrix:
            for actor in columns:
                nursery.start_soon(run, op, actor)
    return got


def assert_cells(matrix: Matrix, columns: Sequence[str], got: dict[tuple[str, str], str]) -> None:
    expected = {
        (op, actor): want
        for op, answers in matrix.items()
        for actor, want in zip(columns, answers, strict=True)
    }
    wrong = {cell: (want, got[cell]) for cell, want in expected.items() if got[cell] != want}
    assert not wrong, "\n".join(
        f"  {op} / {actor}: expected {want}, got {have}"
        for (op, actor), (want, have) in sorted(wrong.items())
    )
