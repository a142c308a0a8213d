"""Every producer of an outbox row names its delivery policy (docs/design.md#delivery).

A static scan of the whole codebase (``protocol actors storage node bench``):

- every ``OutboxEvent(...)`` (a row a plan asks the Applier to write) passes
  its policy as a named value: a ``DeliveryPolicy`` member, or a module
  constant bound to one;
- every outbox-row dict (``{"fanout_type": …}``) names its ``policy`` the same
  way (``….value``);
- every SQL ``INSERT INTO scope_fanout_outbox`` either copies the policy the
  plan named (``o.policy``) or binds ``%(policy)s`` in a module that names it
  in a constant.

The table the scan finds must equal :data:`PRODUCERS`, so a new producer fails
here until it is listed with its policy, and one without a policy fails outright.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from actors.model import DeliveryPolicy

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "actors", "storage", "node", "bench")

# (file, function, what it produces) → the policy named there.
PRODUCERS: dict[tuple[str, str, str], str] = {
    ("actors/planner.py", "plan_message", "agent_wake"): "inline_ordinary",
    ("actors/planner.py", "_realtime_row", "realtime"): "inline_ordinary",
    ("actors/planner.py", "_realtime_row", "realtime (task discussion)"): "inline_targeted",
    ("actors/planner.py", "plan_edit", "mutation"): "worker_first_mutation",
    ("actors/planner.py", "plan_edit", "agent_wake"): "inline_ordinary",
    ("actors/planner.py", "plan_delete", "mutation"): "worker_first_mutation",
    ("actors/cards.py", "plan_card", "mutation"): "worker_first_mutation",
    ("bench/relayfloor.py", "*", "realtime"): "inline_ordinary",
    ("storage/send_baseline.py", "baseline_values", "realtime"): "inline_ordinary",
    ("storage/applier.py", "SQL", "the plan's rows"): "o.policy",
    ("storage/mutations.py", "SQL", "the plan's rows"): "o.policy",
    ("storage/tasks.py", "SQL", "agent_wake (task assignment)"): "worker_first_targeted",
}

_INSERT = re.compile(r"INSERT INTO scope_fanout_outbox\s*\(", re.S)


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module constants bound to a DeliveryPolicy member: name → policy value."""
    out: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            value = _member(node.value)
            if value is not None:
                out[node.targets[0].id] = value
    return out


def _member(node: ast.AST) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "DeliveryPolicy"
    ):
        return DeliveryPolicy[node.attr].value
    return None


def _imported(tree: ast.Module) -> dict[str, str]:
    """Policy constants imported from actors.planner (resolved there)."""
    planner = _constants(ast.parse((ROOT / "actors" / "planner.py").read_text()))
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "actors.planner":
            for alias in node.names:
                if alias.name in planner:
                    out[alias.asname or alias.name] = planner[alias.name]
    return out


def _resolve(node: ast.AST | None, names: dict[str, str]) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return _member(node)


def _functions(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node → the top-level function it is in (``*`` at module level)."""
    owner: dict[ast.AST, str] = {}
    for top in tree.body:
        name = top.name if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) else "*"
        for node in ast.walk(top):
            owner[node] = name
    return owner


def _scan(path: Path, rel: str | None = None) -> tuple[dict[tuple[str, str, str], str], list[str]]:
    rel = rel or str(path.relative_to(ROOT))
    source = path.read_text()
    tree = ast.parse(source)
    names = {**_imported(tree), **_constants(tree)}
    owner = _functions(tree)
    found: dict[tuple[str, str, str], str] = {}
    missing: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "OutboxEvent"
        ):
            kw = {k.arg: k.value for k in node.keywords}
            arg = node.args[2] if len(node.args) > 2 else kw.get("delivery_policy")
            fanout = node.args[0] if node.args else kw.get("fanout_type")
            kind = fanout.value if isinstance(fanout, ast.Constant) else "?"
            if "recipients" in kw:
                kind += " (task discussion)"
            policy = _resolve(arg, names)
            where = f"{rel}:{node.lineno}"
            if policy is None:
                missing.append(f"{where}: OutboxEvent without a named policy")
            else:
                found[(rel, owner[node], str(kind))] = policy
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "fanout_type" in keys and "dedupe_key" in keys:
                values = dict(zip(keys, node.values, strict=False))
                fanout = values["fanout_type"]
                kind = fanout.value if isinstance(fanout, ast.Constant) else "?"
                policy = _resolve(values.get("policy"), names)
                if isinstance(fanout, ast.Attribute):
                    continue  # the Applier's rendering of a plan's OutboxEvent
                if policy is None:
                    missing.append(f"{rel}:{node.lineno}: outbox row without a named policy")
                else:
                    found[(rel, owner[node], str(kind))] = policy
    for match in _INSERT.finditer(source):
        statement = source[match.start() : source.find('"""', match.start())]
        line = source.count("\n", 0, match.start()) + 1
        if "o.policy" in statement:
            found[(rel, "SQL", "the plan's rows")] = "o.policy"
        elif "%(policy)s" in statement:
            bound = sorted(set(_constants(tree).values()))
            if len(bound) != 1:
                missing.append(f"{rel}:{line}: %(policy)s without one named policy constant")
                continue
            kinds = re.findall(r"'(agent_wake|realtime|mutation)'", statement)
            kind = kinds[0] if kinds else "?"
            label = f"{kind} (task assignment)" if rel == "storage/tasks.py" else kind
            found[(rel, "SQL", label)] = bound[0]
        else:
            missing.append(f"{rel}:{line}: INSERT INTO scope_fanout_outbox names no policy")
    return found, missing


def producers() -> tuple[dict[tuple[str, str, str], str], list[str]]:
    found: dict[tuple[str, str, str], str] = {}
    missing: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if not any(m in text for m in ("OutboxEvent(", "scope_fanout_outbox", '"fanout_type"')):
                continue
            got, lacking = _scan(path)
            found |= got
            missing += lacking
    return found, missing


def test_every_outbox_producer_names_its_policy() -> None:
    found, missing = producers()
    assert not missing, "\n".join(missing)
    listing = "\n".join(f"  {k} → {v}" for k, v in sorted(found.items()))
    assert found == PRODUCERS, f"producers found:\n{listing}"
    allowed = {p.value for p in DeliveryPolicy} | {"o.policy"}
    assert set(found.values()) <= allowed


def test_a_producer_without_a_policy_fails(tmp_path: Path) -> None:
    """The scan itself catches an unnamed policy (a variable, not a named value)."""
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from actors.planner import OutboxEvent\n\n"
        "def produce(policy):\n"
        "    return OutboxEvent('realtime', 'rt:x', policy)\n"
    )
    _, missing = _scan(bad, "probe.py")
    assert missing
    assert "without a named policy" in missing[0]
