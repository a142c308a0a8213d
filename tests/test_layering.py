"""Dependencies point one way: protocol <- actors <- storage <- node (STYLE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "protocol": set(),
    "actors": {"protocol"},
    "storage": {"protocol", "actors"},
    "node": {"protocol", "actors", "storage", "bench"},
}
SQL_WORDS = ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM")


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package: str) -> None:
    ours = set(ALLOWED) | {"bench"}
    for path in (ROOT / package).rglob("*.py"):
        wrong = (imports_of(path) & ours) - ALLOWED[package] - {package}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


def test_protocol_does_no_io() -> None:
    for path in (ROOT / "protocol").rglob("*.py"):
        assert not imports_of(path) & {"trio", "socket", "psycopg", "wsproto", "asyncio"}, path


def test_sql_lives_only_in_storage() -> None:
    for package in ("protocol", "actors", "node"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            assert not any(word in text for word in SQL_WORDS), f"SQL in {path}"


# The Applier: sends in applier.py, its mutation path (edits, deletes) in mutations.py.
APPLIER_MODULES = {"applier.py", "mutations.py"}


def test_only_the_applier_writes_messages() -> None:
    product = ("protocol", "actors", "storage", "node")
    for path in (p for package in product for p in (ROOT / package).rglob("*.py")):
        text = path.read_text()
        if "INSERT INTO scope_messages " in text or "UPDATE scope_messages " in text:
            assert path.parent.name == "storage", path
            assert path.name in APPLIER_MODULES, path
    assert "INSERT INTO scope_messages " not in (ROOT / "storage" / "mutations.py").read_text()


def test_one_mention_parser() -> None:
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or path.name == "mentions.py" or "tests" in path.parts:
            continue
        assert "def parse_mentions" not in path.read_text(), path
