"""SQL is composed from one definition per rule, never edited into variants.

docs/design.md#statements: the readable predicate is one builder, each write
of a send or a reaction one fragment, and no statement is derived from
another by string replacement (the way a copy silently stops being the rule).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from storage import applier, reactions, relay, search_sql, send_baseline
from storage.visibility import READABLE_JOIN, ViewerTerms, readable_join

ROOT = Path(__file__).resolve().parent.parent

# ``.replace`` calls in storage/ and bench/ that touch no statement: module or
# dataclass functions, and text that is never SQL we run.
NOT_SQL_RECEIVERS = {"os", "dataclasses"}
NOT_SQL = {
    # Catalog output (an index definition) normalised for the drift
    # comparison of `scopenode db verify`; no statement is built from it.
    ("storage/schema.py", "str(definition)"),
    # Locale names listed by `locale -a`.
    ("storage/embedded.py", "line.strip().lower()"),
    # A bench option's flag from its attribute name.
    ("bench/options.py", "name"),
}

_WRITE = re.compile(r"\b(?:INSERT INTO|UPDATE|DELETE FROM)\s+(\w+)")


def _sources() -> list[Path]:
    return sorted(
        path
        for folder in ("storage", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if "node_modules" not in path.parts
    )


def test_no_string_replacement_on_statements() -> None:
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "replace"
            ):
                continue
            receiver = ast.unparse(node.func.value)
            where = str(path.relative_to(ROOT))
            if receiver in NOT_SQL_RECEIVERS or (where, receiver) in NOT_SQL:
                continue
            found.append(f"{where}:{node.lineno}: {receiver}.replace(...)")
    assert found == [], "compose SQL from fragments instead of editing its text"


def _writes(statement: str) -> set[str]:
    return set(_WRITE.findall(statement))


def test_the_send_forms_make_the_same_writes() -> None:
    single = _writes(applier.SEND_MESSAGE)
    assert single >= {"scopes", "scope_messages", "scope_fanout_outbox", "attachments"}
    assert _writes(applier.SEND_GROUP) == single
    assert _writes(send_baseline.RAW_SEND_BASELINE_SQL) == single


def test_the_reaction_forms_make_the_same_writes() -> None:
    add, remove = _writes(reactions.REACT_ADD), _writes(reactions.REACT_REMOVE)
    assert add == {"scope_message_reactions", "scope_activity_events"}
    assert remove == add
    assert _writes(reactions.REACT_GROUP) == add | remove


def test_every_predicate_is_the_builders_text() -> None:
    """Where a statement decides readability, the builder's text is there
    whole, with the inputs that statement names."""
    per_row = ViewerTerms(
        viewer_public="sv.viewer_public", in_thread="sv.in_thread", grant_scopes="sv.grant_scopes"
    )
    per_reactor = ViewerTerms(
        viewer_id="q.member_id",
        viewer_public="q.viewer_public",
        viewer_private="q.viewer_private",
        owner_id="q.owner_id",
    )
    assert readable_join(per_row) in search_sql.READABLE_PER_ROW
    assert readable_join(ViewerTerms.columns_of("c")) in relay.READERS_IN_RANGE
    assert readable_join(ViewerTerms.columns_of("c")) in relay.READERS_OF_MESSAGE
    assert READABLE_JOIN in reactions.REACT_ADD
    assert READABLE_JOIN in reactions.REACT_REMOVE
    assert readable_join(per_reactor) in reactions.REACT_GROUP
    # No statement is left with a viewer input it does not bind.
    for statement in (relay.READERS_IN_RANGE, search_sql.READABLE_PER_ROW, reactions.REACT_GROUP):
        assert "%(viewer_public)s" not in statement
