"""The message domain's guardrails as checker functions (docs/guardrails.md).

Each checker reads a source tree rooted at ``root`` (the repository, or a
scratch copy of part of it with one planted violation) and returns what it
finds wrong, one line per finding; an empty list is a pass. The
``tests/test_guardrail_*.py`` modules run each one on a planted copy (it must
report) and on the real tree (it must not). They read text only: no database,
no imports of the code under check, so each runs in well under a second.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("protocol", "actors", "storage", "node", "bench", "examples")


def python_files(root: Path, packages: tuple[str, ...] = PRODUCT) -> list[Path]:
    return sorted(
        path
        for package in packages
        for path in (root / package).rglob("*.py")
        if "node_modules" not in path.parts
    )


def rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


# ------------------------------------------------------------------ the schema


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    definition: str


def schema_text(root: Path) -> str:
    """Every migration of ``storage/``, in file order (each adds to the last)."""
    files = sorted((root / "storage").glob("schema_v*.sql"), key=_version)
    return "\n".join(path.read_text() for path in files)


def _version(path: Path) -> int:
    found = re.match(r"schema_v(\d+)", path.name)
    return int(found.group(1)) if found else 0


_CREATE = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+) \((.*?)\n\);", re.S)
_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+)\s+((?:.|\n)*?);")
_COLUMN = re.compile(r"^\s*(\w+) (\w[^,]*)", re.M)
_NOT_COLUMNS = {"CHECK", "PRIMARY", "UNIQUE", "EXCLUDE", "FOREIGN", "CONSTRAINT", "ADD"}


def tables(root: Path) -> dict[str, list[Column]]:
    """Table → its columns (CREATE TABLE bodies and ``ADD COLUMN`` of later migrations)."""
    text = _without_comments(schema_text(root))
    found: dict[str, list[Column]] = {}
    for name, body in _CREATE.findall(text):
        found[name] = [
            Column(column, definition)
            for column, definition in _COLUMN.findall(body)
            if column not in _NOT_COLUMNS
        ]
    for name, body in _ADD_COLUMN.findall(text):
        for column, definition in re.findall(r"ADD COLUMN (?:IF NOT EXISTS )?(\w+) ([^,]*)", body):
            found.setdefault(name, []).append(Column(column, definition))
    return found


def _without_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def check_values(root: Path, table: str, column: str) -> set[str] | None:
    """The values ``CHECK (column IN (...))`` allows in ``table``, if it has one."""
    body = _table_body(root, table)
    found = re.search(rf"\b{column} text NOT NULL[^\n]*CHECK \({column} IN \(([^)]*)\)\)", body)
    if found is None:
        return None
    return set(re.findall(r"'([^']*)'", found.group(1)))


def _table_body(root: Path, table: str) -> str:
    for name, body in _CREATE.findall(_without_comments(schema_text(root))):
        if name == table:
            return str(body)
    return ""


# ------------------------------------------------------- SQL in Python sources


def string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (f-strings by their literal parts), with its line."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def statements_writing(root: Path, verb_table: str) -> list[tuple[str, int, str]]:
    """(file, line, statement text) of every literal holding ``verb_table``
    (``INSERT INTO scope_messages`` …), whitespace-normalised for the match."""
    pattern = re.compile(r"\b" + r"\s+".join(verb_table.split()) + r"\b", re.I)
    return [
        (rel(root, path), line, text)
        for path in python_files(root)
        # Only a module whose text has the statement is parsed (fast on the whole tree).
        if pattern.search(path.read_text())
        for line, text in string_constants(path)
        if pattern.search(text)
    ]


# ------------------------------------------- rule 1: no dense per-recipient rows

# Columns naming the member who did something (one row per act, never per reader).
ACTOR_COLUMNS = {
    "author_member_id",
    "actor_member_id",
    "created_by_member_id",
    "revoked_by_member_id",
    "edited_by_member_id",
    "deleted_by_member_id",
    "uploaded_by_member_id",
    "notify_principal_member_id",
    "idempotency_subject_member_id",
    "rewound_by_member_id",
    "requester_member_id",  # who asked a workflow request: one row per request
}
# Message-keyed tables with a member column that is not its actor: each is one
# row per decision the plan or the member made, never one per reader.
MEMBER_KEYED_ALLOWED = {
    ("scope_fanout_outbox", "target_member_id"): "an agent wake row: one per agent the "
    "plan woke (a decision), the realtime row carries no member",
    ("scope_message_reactions", "member_id"): "the reactor's own reaction",
    ("scope_message_sources", "context_member_id"): "explicit context built for one "
    "named member, one row per cited message",
}
# Non-message activity kinds: nothing a message's own routing explains.
ACTIVITY_TYPES = {"reaction_add", "task_activity", "share_activity", "attachment_activity"}
# Statements of the Applier (sends and their mutation path, card changes
# included) and where they may insert.
APPLIER_FILES = ("storage/applier.py", "storage/mutations.py", "storage/cards.py")
APPLIER_TABLES = {
    # A card message's own sidecar (docs/cards.md): one row per card, none per reader.
    "scope_share_cards",
    "service_notification_cards",
    # A human's action on an app card: one row per card revision (the decision).
    "service_card_actions",
    "scopes",
    "scope_messages",
    "scope_message_search_docs",
    "scope_message_revisions",
    "scope_message_sources",
    "scope_memberships",
    "scope_notification_settings",
    "scope_fanout_outbox",
    "attachments",
}
# What a statement creates (clean-ups of a delete may touch more: they add no rows).
_INSERT = re.compile(r"\bINSERT\s+INTO\s+([a-z_]+)\b")


def dense_row_findings(root: Path) -> list[str]:
    findings = []
    for table, columns in tables(root).items():
        if table == "scope_messages" or not any(
            "REFERENCES scope_messages" in c.definition for c in columns
        ):
            continue
        findings += [
            f"schema: {table}.{column.name} keys a message row by member"
            for column in columns
            if "REFERENCES members" in column.definition
            and column.name not in ACTOR_COLUMNS
            and (table, column.name) not in MEMBER_KEYED_ALLOWED
        ]
    kinds = check_values(root, "scope_activity_events", "activity_type") or set()
    findings += [
        f"schema: scope_activity_events.activity_type allows {kind!r}"
        for kind in sorted(kinds - ACTIVITY_TYPES)
    ]
    for where in APPLIER_FILES:
        path = root / where
        if not path.exists():
            continue
        findings += [
            f"{where}:{line}: a message write also inserts into {table}"
            for line, text in string_constants(path)
            for table in _INSERT.findall(text)
            if table not in APPLIER_TABLES
        ]
    return findings


# ------------------------------------- rule 2: every message write is the Applier's

MESSAGE_WRITERS = {
    "INSERT INTO scope_messages": {"storage/applier.py"},
    # Edits and deletes; an app card's update replaces its fallback content.
    "UPDATE scope_messages": {"storage/mutations.py", "storage/cards.py"},
    "DELETE FROM scope_messages": set(),
    "INSERT INTO scope_fanout_outbox": {
        "storage/applier.py",
        "storage/mutations.py",
        # A task assignment's wake: an activity's row, no message behind it.
        "storage/tasks.py",
    },
}


def applier_findings(root: Path) -> list[str]:
    findings = []
    for verb_table, allowed in MESSAGE_WRITERS.items():
        for where, line, _ in statements_writing(root, verb_table):
            if where not in allowed:
                findings.append(f"{where}:{line}: {verb_table} outside the Applier")
    return findings


# ------------------------------------------------- rule 3: one mention parser

MENTION_PARSER = "actors/mentions.py"
# Patterns with an ``@handle`` shape that are not mention parsers, and why.
MENTION_SHAPED_ALLOWED = {
    "actors/search_query.py": "search operators from:@h and in:@h: query syntax, "
    "matched only after the operator's prefix",
    "node/web/markdown.js": "the renderer finds where a token sits to draw it; routing, "
    "wakes and admission use the server's parser alone",
}
# A regex that reads a handle after an ``@``: ``@(`` / ``@[`` opening a capture or
# a class, or a handle spliced in (``@{…}`` in an f-string, ``@${…}`` in JS).
_HANDLE_AFTER_AT = re.compile(r"@(?:\(\[|\[|\(\?|\{|\$\{)")
_JS_REGEX = re.compile(r"(?<![\w)\]])/((?:\\.|\[(?:\\.|[^\]\\])*\]|[^/\\\n\[])+)/[dgimsuy]*")


def _python_patterns(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("re", "regex")
            and node.args
        ):
            continue
        out.append((node.lineno, ast.unparse(node.args[0])))
    return out


def mention_findings(root: Path) -> list[str]:
    findings = []
    for path in python_files(root):
        where = rel(root, path)
        if where == MENTION_PARSER:
            continue
        text = path.read_text()
        if "def parse_mentions" in text or "def live_handles" in text:
            findings.append(f"{where}: a second mention parser")
        if where in MENTION_SHAPED_ALLOWED:
            continue
        for line, pattern in _python_patterns(path):
            if _HANDLE_AFTER_AT.search(pattern):
                findings.append(f"{where}:{line}: a mention regex {pattern}")
    for path in sorted((root / "node" / "web").rglob("*.js")):
        where = rel(root, path)
        if where in MENTION_SHAPED_ALLOWED:
            continue
        findings += [
            f"{where}:{number}: a mention regex {found.group(0)}"
            for number, line in enumerate(path.read_text().splitlines(), 1)
            for found in _JS_REGEX.finditer(line)
            if _HANDLE_AFTER_AT.search(found.group(1))
        ]
    return findings


# ----------------------- rule 4: named delivery policies, one no-outbox allowlist

ALLOWLIST = "docs/direct-no-outbox.md"
# Event producers whose first delivery is an outbox row's (the row names the
# policy: tests/test_delivery_policies.py), and the paths that only replay or
# relay an event produced elsewhere. Everything else that builds an event must
# be a direct/no-outbox exception on the allowlist.
OUTBOX_BACKED = {
    "node/hub.py:publish_messages": "inline_ordinary / inline_targeted (the send's rows)",
    "node/hub.py:wake_frame": "inline_ordinary (the send's agent_wake rows)",
    "node/hub.py:publish_mutation": "worker_first_mutation (edits and deletes)",
    "node/views.py:task_wake": "worker_first_targeted (a task assignment's wake)",
    "node/ops/delivery.py:redeliver": "replays pending agent_wake rows",
    "node/outbox_worker.py:_replay": "replays inline_ordinary rows",
    "node/outbox_worker.py:_replay_frozen": "replays inline_targeted rows",
    "node/outbox_worker.py:_project": "worker_first_mutation rows",
    "node/ops/reading.py:resume": "replays committed history to the session that asks",
    "node/relay_delivery.py:_push_range": "relays another node's committed messages",
    "node/relay_delivery.py:membership": "relays another node's membership event",
    "node/relay.py:_handle": "relays another node's read state",
}


def event_producers(root: Path) -> set[str]:
    """``file:function`` of every function in ``node/`` that builds an event frame."""
    found = set()
    for path in python_files(root, ("node",)):
        tree = ast.parse(path.read_text(), str(path))
        for top in ast.walk(tree):
            if not isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(top):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and (node.func.id.endswith("Event") or node.func.id == "Deliver")
                ):
                    found.add(f"{rel(root, path)}:{top.name}")
                    break
    return found


def allowlist(root: Path) -> dict[str, str]:
    """``file:function`` → why, from the allowlist's table rows."""
    out: dict[str, str] = {}
    path = root / ALLOWLIST
    if not path.exists():
        return out
    row = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|([^|]*)\|")
    for line in path.read_text().splitlines():
        found = row.match(line)
        if found:
            out[f"{found.group(1)}:{found.group(2)}"] = found.group(3).strip()
    return out


def policy_findings(root: Path) -> list[str]:
    from tests.test_delivery_policies import _scan

    findings = []
    for path in python_files(root, ("protocol", "actors", "storage", "node", "bench")):
        text = path.read_text()
        if any(m in text for m in ("OutboxEvent(", "scope_fanout_outbox", '"fanout_type"')):
            findings += _scan(path, rel(root, path))[1]
    listed = allowlist(root)
    for entry, why in sorted(listed.items()):
        if not why:
            findings.append(f"{ALLOWLIST}: {entry} has no line of why")
    findings += stale_allowlist_entries(root)
    for producer in sorted(event_producers(root)):
        if producer not in OUTBOX_BACKED and producer not in listed:
            findings.append(f"{producer}: an event with no outbox row and not on {ALLOWLIST}")
    return findings


# ------------------------------------------ rule 5: authors are human/agent/service

AUTHOR_TYPES = {"human", "agent", "service"}


def author_findings(root: Path) -> list[str]:
    findings = []
    for table, column in (("scope_messages", "author_type"), ("members", "type")):
        allowed = check_values(root, table, column)
        if allowed != AUTHOR_TYPES:
            findings.append(f"schema: {table}.{column} allows {sorted(allowed or [])}")
    model = root / "actors" / "model.py"
    tree = ast.parse(model.read_text(), str(model))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "MemberType":
            values = {
                n.value.value
                for n in node.body
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            }
            if values != AUTHOR_TYPES:
                findings.append(f"actors/model.py: MemberType is {sorted(values)}")
    # An author column set from a literal other than the three.
    literal = re.compile(r"author_type\s*(?:=|,)\s*'(\w+)'")
    findings += [
        f"{rel(root, path)}:{line}: author_type {kind!r}"
        for path in python_files(root)
        if "author_type" in path.read_text()
        for line, text in string_constants(path)
        for kind in literal.findall(text)
        if kind not in AUTHOR_TYPES
    ]
    return findings


# ------------------------- rule 6: no eager inherited rows for child scopes

ROSTER_TABLES = ("scope_memberships", "scope_notification_settings")
# What an insert may not read: another scope's roster or the parent link.
_INHERITS = re.compile(
    r"\b(?:FROM|JOIN)\s+(?:scope_memberships|scope_notification_settings)\b|parent_scope_id",
    re.I,
)


def _insert_body(text: str, start: int) -> str:
    """The INSERT starting at ``start``: up to the end of its CTE or of the literal."""
    end = text.find("\n)", start)
    return text[start:] if end == -1 else text[start:end]


def inherited_row_findings(root: Path) -> list[str]:
    findings = []
    for table in ROSTER_TABLES:
        pattern = re.compile(rf"INSERT\s+INTO\s+{table}\b", re.I)
        findings += [
            f"{rel(root, path)}:{line}: {table} rows copied from another scope"
            for path in python_files(root, ("storage",))
            if pattern.search(path.read_text())
            for line, text in string_constants(path)
            for match in pattern.finditer(text)
            if _INHERITS.search(_insert_body(text, match.start()))
        ]
    return findings


# ---------------------------------------- rule 7: no parallel message tables

# A projection of scope_messages keyed by its message id, never written alone.
MESSAGE_SHAPED_ALLOWED = {"scope_message_search_docs": "the search projection of a message"}


def parallel_table_findings(root: Path) -> list[str]:
    findings = []
    for table, columns in tables(root).items():
        names = {c.name for c in columns}
        if re.match(r"(?:space|spaces|conversation|room)_", table):
            findings.append(f"schema: {table} is a parallel space_* table")
            continue
        if table == "scope_messages" or table in MESSAGE_SHAPED_ALLOWED:
            continue
        shaped = (
            "seq" in names
            and bool(names & {"content", "body", "text"})
            and any(n.startswith("author") for n in names)
        )
        if shaped or (table.endswith("_messages")):
            findings.append(f"schema: {table} holds messages beside scope_messages")
    return findings


def stale_allowlist_entries(root: Path) -> list[str]:
    """Allowlist entries naming a function that no longer exists."""
    findings = []
    for entry in allowlist(root):
        where, _, function = entry.partition(":")
        path = root / where
        if not path.exists() or not re.search(
            rf"^\s*(?:async )?def {re.escape(function)}\(", path.read_text(), re.M
        ):
            findings.append(f"{ALLOWLIST}: {entry} names nothing")
    return findings


# ------------------------------------------------------------ planted copies


def scratch_copy(tmp_path: Path, *parts: str) -> Path:
    """A copy of the named files and folders of the repository under ``tmp_path``."""
    import shutil

    for part in parts:
        source = ROOT / part
        target = tmp_path / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


def plant(root: Path, where: str, line: str, *, after: str | None = None) -> None:
    """Add ``line`` to ``root/where``: after the first line holding ``after``, else at the end."""
    path = root / where
    text = path.read_text()
    if after is None:
        path.write_text(text.rstrip("\n") + "\n" + line + "\n")
        return
    at = text.index(after)
    end = text.index("\n", at) + 1
    path.write_text(text[:end] + line + "\n" + text[end:])
