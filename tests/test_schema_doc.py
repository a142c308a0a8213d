"""docs/schema.md gives every table and column of the schema a meaning.

The SQL definition (every migration, in order) is parsed (CREATE TABLE blocks,
one column per top-level item, and ALTER TABLE … ADD COLUMN); the doc must
have a ``## `table` `` section per table with a ``| `column` | type | … |``
row per column, and nothing the SQL lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from storage.schema import CREATE_BOOKKEEPING, migrations

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_SQL = "\n".join(migration.sql for migration in migrations())
SCHEMA_DOC = ROOT / "docs" / "schema.md"

_CREATE_TABLE = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+) \((.*?)\n\);", re.S)
_CREATE_SEQUENCE = re.compile(r"CREATE SEQUENCE (\w+)")
_ALTER_TABLE = re.compile(r"ALTER TABLE (\w+)\s+(.*?);", re.S)
_ADD_COLUMN = re.compile(r"ADD COLUMN (?:IF NOT EXISTS )?(\w+) (\S+)")
_TABLE_CONSTRAINTS = {"PRIMARY", "UNIQUE", "CHECK", "EXCLUDE", "CONSTRAINT", "FOREIGN"}
_HEADING = re.compile(r"^## `(\w+)`\s*$")
_ROW = re.compile(r"^\| `(\w+)` \| ([^|]+?) \|")


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def _top_level_items(body: str) -> list[str]:
    """Split a CREATE TABLE body on commas outside parentheses."""
    items, depth, current = [], 0, []
    for char in body:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def parse_tables(sql: str) -> dict[str, dict[str, str]]:
    """Table name -> {column name: type} in definition order."""
    tables: dict[str, dict[str, str]] = {}
    for name, body in _CREATE_TABLE.findall(_strip_comments(sql)):
        columns: dict[str, str] = {}
        for item in _top_level_items(body):
            words = item.split()
            if words[0].upper() in _TABLE_CONSTRAINTS:
                continue
            columns[words[0]] = words[1]
        tables[name] = columns
    for name, body in _ALTER_TABLE.findall(_strip_comments(sql)):
        for column, type_ in _ADD_COLUMN.findall(body):
            tables[name][column] = type_.rstrip(",")
    return tables


def parse_doc(text: str) -> dict[str, dict[str, str]]:
    """Documented table name -> {column name: type} from headings and table rows."""
    tables: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = _HEADING.match(line)
            current = tables.setdefault(heading.group(1), {}) if heading else None
        elif current is not None and (row := _ROW.match(line)):
            current[row.group(1)] = row.group(2).strip()
    return tables


def _schema() -> dict[str, dict[str, str]]:
    bookkeeping = CREATE_BOOKKEEPING.strip() + ";"  # schema_migrations, from storage/schema.py
    return parse_tables(SCHEMA_SQL + "\n" + bookkeeping)


def test_parser_reads_columns_and_skips_table_constraints() -> None:
    sql = """
CREATE TABLE t (
    id text PRIMARY KEY CHECK (id LIKE 'x\\_%'),
    span int8range,  -- a comment, with a comma
    n bigint NOT NULL CHECK (n IN (1, 2)),
    UNIQUE (id, n),
    CHECK (n > 0),
    EXCLUDE USING gist (
        id WITH =,
        span WITH &&
    )
);
"""
    assert parse_tables(sql) == {"t": {"id": "text", "span": "int8range", "n": "bigint"}}
    added = sql + "ALTER TABLE t\n    ADD COLUMN flag boolean NOT NULL,\n    ADD CHECK (flag);\n"
    assert parse_tables(added)["t"]["flag"] == "boolean"


def test_schema_parse_finds_the_seed_tables() -> None:
    tables = _schema()
    assert {"scopes", "scope_messages", "scope_memberships", "schema_migrations"} <= set(tables)
    assert tables["scope_memberships"]["effective_to_seq"] == "bigint"
    assert tables["moderation_audit_log"]["matched_keywords"] == "text[]"


@pytest.mark.parametrize("table", sorted(_schema()))
def test_every_column_is_documented(table: str) -> None:
    documented = parse_doc(SCHEMA_DOC.read_text(encoding="utf-8"))
    assert table in documented, f"docs/schema.md has no '## `{table}`' section"
    wanted = _schema()[table]
    missing = [column for column in wanted if column not in documented[table]]
    assert not missing, f"{table}: columns without a meaning in docs/schema.md: {missing}"
    wrong_type = {
        column: (documented[table][column], type_)
        for column, type_ in wanted.items()
        if documented[table][column] != type_
    }
    assert not wrong_type, f"{table}: documented type differs (doc, sql): {wrong_type}"


def test_doc_describes_nothing_the_schema_lacks() -> None:
    schema = _schema()
    documented = parse_doc(SCHEMA_DOC.read_text(encoding="utf-8"))
    stale_tables = sorted(set(documented) - set(schema))
    assert not stale_tables, f"docs/schema.md documents tables the schema lacks: {stale_tables}"
    stale = {
        table: sorted(set(columns) - set(schema[table]))
        for table, columns in documented.items()
        if set(columns) - set(schema[table])
    }
    assert not stale, f"docs/schema.md documents columns the schema lacks: {stale}"


def test_every_sequence_is_documented() -> None:
    doc = SCHEMA_DOC.read_text(encoding="utf-8")
    for sequence in _CREATE_SEQUENCE.findall(SCHEMA_SQL):
        assert f"## Sequence `{sequence}`" in doc
