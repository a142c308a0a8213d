"""Dependencies point one way: protocol <- actors <- storage <- node <- bench,
and no module imports itself through others."""

from __future__ import annotations

import ast
import functools
import itertools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.cli import registered_commands

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "protocol": set(),
    "actors": {"protocol"},
    "storage": {"protocol", "actors"},
    "node": {"protocol", "actors", "storage"},
    "bench": {"protocol", "actors", "storage", "node"},
}
PACKAGES = tuple(ALLOWED)
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
    ours = set(ALLOWED)
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


# The Applier: sends in applier.py, its mutation path (edits, deletes) in mutations.py,
# and card changes (a card's fallback content) in cards.py.
APPLIER_MODULES = {"applier.py", "mutations.py", "cards.py"}


def test_only_the_applier_writes_messages() -> None:
    product = ("protocol", "actors", "storage", "node")
    for path in (p for package in product for p in (ROOT / package).rglob("*.py")):
        text = path.read_text()
        if "INSERT INTO scope_messages " in text or "UPDATE scope_messages " in text:
            assert path.parent.name == "storage", path
            assert path.name in APPLIER_MODULES, path
    for mutation_path in ("mutations.py", "cards.py"):
        assert "INSERT INTO scope_messages " not in (ROOT / "storage" / mutation_path).read_text()


def test_one_mention_parser() -> None:
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or path.name == "mentions.py" or "tests" in path.parts:
            continue
        assert "def parse_mentions" not in path.read_text(), path


# The import graph of our packages, read from the source: every import
# statement counts, at module level or inside a function, since either runs.
Graph = dict[str, set[str]]


def modules_of(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of our packages under ``root``."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every dotted name ``module`` imports (``from a import b`` is ``a.b`` when that is
    a module of ours, else ``a``), relative imports made absolute."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(_parsed(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base


@functools.cache
def _parsed(source: str) -> ast.Module:
    # The planted-violation tests build the graph of a copy twice: only the
    # file they change is parsed again.
    return ast.parse(source)


def import_graph(root: Path) -> Graph:
    """Module -> the modules of ours it imports (each name cut to its longest known prefix)."""
    known = modules_of(root)
    graph: Graph = {}
    for module, path in known.items():
        graph[module] = set()
        for name in imported_names(module, path, known):
            parts = name.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and ".".join(parts) != module:
                graph[module].add(".".join(parts))
    return graph


def import_circles(graph: Graph) -> list[list[str]]:
    """One circle ``[a, b, …, a]`` per strongly connected group of two or more modules
    (Tarjan), so every circle in the graph shows up in at least one report."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while not group or module not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_circle_in(graph, group) for group in groups]


def _circle_in(graph: Graph, group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself, inside the group."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        reached = []
        for module in frontier:
            for target in sorted(graph[module] & group - came_from.keys()):
                came_from[target] = module
                reached.append(target)
        frontier = reached
    circle = [start]
    while len(circle) == 1 or circle[-1] != start:
        circle.append(came_from[circle[-1]])
    return circle[::-1]


# A string that names a module of bench (``bench``, ``bench.cli``, ``bench.cli:main``),
# as one would hand it to importlib or an entry-point loader.
BENCH_MODULE = re.compile(r"bench(\.\w*)*(:[\w.]*)?")


def bench_references(package_dir: Path) -> list[str]:
    """Every import of bench, and every string naming a bench module, under ``package_dir``."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if BENCH_MODULE.fullmatch(node.value) else []
            else:
                continue
            found += [
                f"{path.name}:{node.lineno}: {name}"
                for name in names
                if name == "bench" or name.startswith(("bench.", "bench:"))
            ]
    return found


def scratch_copy(tmp_path: Path) -> Path:
    """The Python files of our packages, copied under ``tmp_path`` to plant violations in."""
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
    return tmp_path


def test_no_import_circle_over_all_packages() -> None:
    graph = import_graph(ROOT)
    # The graph is read for real: the CLIs share the port probe of node/listen.py.
    assert "node.listen" in graph["node.cli"] & graph["node.cluster_cli"]
    circles = [" -> ".join(circle) for circle in import_circles(graph)]
    assert not circles, "import circles:\n" + "\n".join(circles)


PLANTED_CIRCLES = {
    # node.cli imports node.listen; the probe takes something back inside a function.
    "function-level": ("node/listen.py", "\n\ndef _planted() -> None:\n    import node.cli\n"),
    # node.cluster_cli imports node.listen too; a relative import closes the loop.
    "relative": ("node/listen.py", "\nfrom . import cluster_cli\n"),
    # Across packages: the bench workload imports node.cluster_cli.
    "across packages": ("node/cluster_cli.py", "\nfrom bench.workloads import cluster\n"),
}


@pytest.mark.parametrize("planted", sorted(PLANTED_CIRCLES))
def test_a_planted_import_circle_is_found(tmp_path: Path, planted: str) -> None:
    root = scratch_copy(tmp_path)
    assert import_circles(import_graph(root)) == []
    file, line = PLANTED_CIRCLES[planted]
    with (root / file).open("a") as f:
        f.write(line)
    graph = import_graph(root)
    circles = import_circles(graph)
    planted_in = file.removesuffix(".py").replace("/", ".")
    assert any(planted_in in circle for circle in circles), circles
    for circle in circles:
        assert circle[0] == circle[-1], circle
        assert all(b in graph[a] for a, b in itertools.pairwise(circle)), circle


def test_node_does_not_import_bench() -> None:
    """``scopenode bench`` is registered by bench (pyproject ``scopenode.commands``);
    the node's code neither imports it nor names it to importlib."""
    assert bench_references(ROOT / "node") == []


PLANTED_BENCH_REFERENCES = {
    "import": "import bench.cli\n",
    "from-import": "from bench import cli\n",
    "importlib": "import importlib\n\ncli = importlib.import_module('bench.cli')\n",
    "__import__": "def _planted() -> object:\n    return __import__('bench')\n",
    "entry-point string": "TARGET = 'bench.cli:main'\n",
}


@pytest.mark.parametrize("planted", sorted(PLANTED_BENCH_REFERENCES))
def test_a_planted_bench_reference_in_node_is_found(tmp_path: Path, planted: str) -> None:
    root = scratch_copy(tmp_path)
    assert bench_references(root / "node") == []
    with (root / "node" / "cli.py").open("a") as f:
        f.write("\n" + PLANTED_BENCH_REFERENCES[planted])
    found = bench_references(root / "node")
    assert len(found) == 1, found
    assert found[0].startswith("cli.py:"), found


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["bench", "--help"], "usage: scopenode bench "),
        (["cluster", "up", "--help"], "usage: scopenode cluster up "),
    ],
)
def test_scopenode_reaches_the_registered_commands(argv: list[str], usage: str) -> None:
    """bench and cluster reach ``scopenode`` through the ``scopenode.commands`` entry
    points of the installed project (``pip install -e .``), not through an import."""
    assert set(registered_commands()) >= {"bench", "cluster"}
    done = subprocess.run(
        [sys.executable, "-m", "node", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage), done.stdout


# A module past these sizes holds more than one job: split it by job.
PYTHON_MODULE_MAX_LINES = 700
WEB_MODULE_MAX_LINES = 600
WEB_ROOT_MAX_LINES = 400  # node/web/app.js only composes the modules


def _lines(path: Path) -> int:
    return path.read_text().count("\n")


def test_no_module_outgrows_one_job() -> None:
    product = ("protocol", "actors", "storage", "node")
    python = [p for pkg in product for p in (ROOT / pkg).rglob("*.py")]
    web = list((ROOT / "node" / "web").rglob("*.js"))
    too_big = [
        f"{p.relative_to(ROOT)}: {_lines(p)} lines"
        for p, limit in [
            *((p, PYTHON_MODULE_MAX_LINES) for p in python),
            *((p, WEB_MODULE_MAX_LINES) for p in web),
        ]
        if _lines(p) > limit
    ]
    assert not too_big, too_big
    assert _lines(ROOT / "node" / "web" / "app.js") <= WEB_ROOT_MAX_LINES
