"""The layering of docs/architecture.md, checked on every import however it is spelt.

readers/ know nothing of the engine or the stores. Inside rag_app/ each layer imports only the layers beneath it:
config.py < index/ < ingest/ and search/ (side by side: neither imports the other) < answers/ < engine.py < shells/.
The shells (rag_app/shells/, app.py, tools/) talk to the engine's API and the answers' types, never to the index,
ingest or search modules behind it; the index knows nothing of Memos.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

LAYERS = ("index", "ingest", "search", "answers", "shells")
MAY_IMPORT = {
    "config": set(),
    "index": {"config"},
    "ingest": {"config", "index"},
    "search": {"config", "index"},
    "answers": {"config", "index", "search"},
    "engine": {"config", "index", "ingest", "search", "answers"},
    "shells": {"config", "engine", "answers"},
}
ROOT_MODULES = {"__init__", "config", "engine"}
SHELLS = [*sorted((REPO / "rag_app" / "shells").glob("*.py")), REPO / "app.py", *sorted((REPO / "tools").glob("*.py"))]


def package_of(path: Path) -> list[str]:
    """The dotted package a file sits in, from the last `rag_app`, `readers` or `tools` folder of its path."""
    parts = list(path.parent.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in {"rag_app", "readers", "tools"}:
            return parts[i:]
    return []


def imports_of(path: Path, runtime: bool = False) -> set[str]:
    """Every module a file imports, however it is spelt: `from rag_app.ingest import sync` is rag_app.ingest.sync (a
    name imported from a package may be a module), a relative import is resolved against the file's package.
    `runtime`: without what an `if TYPE_CHECKING:` block imports (it never runs: it names types for annotations)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if runtime:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            package = package_of(path)[: len(package_of(path)) - node.level + 1] if node.level else []
            base = ".".join([*package, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def layer_of_module(module: str) -> str | None:
    """rag_app.ingest.sync → ingest, rag_app.engine.Brain → engine; None outside rag_app's layers."""
    parts = module.split(".")
    if parts[0] != "rag_app" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS or parts[1] in {"config", "engine"} else None


def layer_of_file(path: Path) -> str:
    rel = path.relative_to(REPO)
    if rel.parts[0] != "rag_app":
        return "shells"  # app.py, tools/
    return rel.parts[1] if len(rel.parts) > 2 else rel.stem


def layers_imported(path: Path) -> set[str]:
    return {layer for m in imports_of(path) if (layer := layer_of_module(m))}


def test_readers_never_import_the_engine_or_chroma():
    for path in (REPO / "readers").glob("*.py"):
        bad = {m for m in imports_of(path) if m.startswith(("rag_app", "chromadb", "tools"))}
        assert not bad, f"{path.name} imports {bad}"


def test_every_module_sits_in_a_layer():
    """A new module picks its layer: only the package marker, config and the engine live at rag_app's top."""
    assert {p.stem for p in (REPO / "rag_app").glob("*.py")} == ROOT_MODULES
    folders = {p.name for p in (REPO / "rag_app").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)


@pytest.mark.parametrize("layer", [*LAYERS, "config", "engine"])
def test_each_layer_imports_only_the_layers_beneath_it(layer: str):
    files = (sorted((REPO / "rag_app" / layer).glob("*.py")) if layer in LAYERS
             else [REPO / "rag_app" / f"{layer}.py"])
    assert files
    for path in files:
        above = layers_imported(path) - MAY_IMPORT[layer] - {layer}
        assert not above, f"{path.relative_to(REPO)} imports from {above}"


def test_shells_only_use_the_engine_api():
    for path in SHELLS:
        assert layer_of_file(path) == "shells"
        behind = layers_imported(path) - MAY_IMPORT["shells"] - {"shells"}
        assert not behind, f"{path.relative_to(REPO)} reaches past the engine: {behind}"


def test_every_shell_the_rule_names_exists():
    """A shell renamed or moved would otherwise leave the rule checking nothing."""
    names = {p.name for p in SHELLS}
    assert {"cli.py", "page.py", "warm_engine.py", "app.py", "mcp_server.py", "function_tools.py"} <= names


@pytest.mark.parametrize("line", ["import rag_app.ingest.sync", "import rag_app.ingest.sync as s",
                                  "from rag_app.ingest.sync import sync_sources", "from rag_app.ingest import sync",
                                  "from rag_app import engine, index", "from ..ingest import watch",
                                  "from ..search.keyword import tokenize", "from rag_app.search import retrieve as r",
                                  "def f():\n    from rag_app.index import manifest\n"])
def test_the_shell_rule_catches_every_spelling_of_an_internal_import(tmp_path: Path, line: str):
    shell = tmp_path / "rag_app" / "shells" / "shell.py"
    shell.parent.mkdir(parents=True)
    shell.write_text(line + "\n", encoding="utf-8")
    assert layers_imported(shell) - MAY_IMPORT["shells"] - {"shells"}, line


def test_the_shell_rule_lets_the_engine_config_and_answers_through(tmp_path: Path):
    shell = tmp_path / "rag_app" / "shells" / "shell.py"
    shell.parent.mkdir(parents=True)
    shell.write_text("from rag_app import engine\nfrom rag_app.engine import Brain\nfrom .. import config\n"
                     "import rag_app.answers.answer\nfrom tools import brief\nfrom . import cli\n", encoding="utf-8")
    assert layers_imported(shell) - MAY_IMPORT["shells"] - {"shells"} == set()


def test_the_index_knows_nothing_of_memos():
    for path in (REPO / "rag_app" / "index").glob("*.py"):
        assert not any("memos" in m for m in imports_of(path)), path.name


def listed_in_document(folder: str) -> set[str]:
    """The modules docs/architecture.md's tree lists under `folder/` (the lines indented beneath it)."""
    lines = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == [f"{folder}/"])
    indent = len(lines[head]) - len(lines[head].lstrip())
    names = set()
    for line in lines[head + 1:]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        if len(line) - len(line.lstrip()) == indent + 2 and line.split()[0].endswith(".py"):
            names.add(line.split()[0])
    return names


@pytest.mark.parametrize("folder", ["readers", *LAYERS])
def test_the_architecture_document_lists_each_folder_as_it_is(folder: str):
    """docs/architecture.md, the folders and this test say the same thing."""
    path = REPO / "readers" if folder == "readers" else REPO / "rag_app" / folder
    assert listed_in_document(folder) == {p.name for p in path.glob("*.py") if p.stem != "__init__"}


def module_name(path: Path, root: Path) -> str:
    """rag_app/shells/cli.py → rag_app.shells.cli, readers/__init__.py → readers, app.py → app."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module → the first-party modules it imports, at the top or inside a function (rag_app, readers, tools, app)."""
    files = [*sorted(root.glob("rag_app/**/*.py")), *sorted(root.glob("readers/*.py")),
             *sorted(root.glob("tools/*.py")), *sorted(root.glob("app.py"))]
    modules = {module_name(path, root): path for path in files}
    return {name: (imports_of(path, runtime=True) & modules.keys()) - {name} for name, path in modules.items()}


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Every group of modules that import each other round a circle (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(frozenset(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


def circle_path(graph: dict[str, set[str]], group: frozenset[str]) -> str:
    """A shortest way from the group's first module back to itself, through the group ("a → b → a")."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for imported in sorted(graph[module] & group):
            if imported == start:
                return " → ".join([*paths[module], start])
            if imported not in paths:
                paths[imported] = [*paths[module], imported]
                queue.append(imported)
    raise AssertionError(f"no circle through {group}")


# Circles not yet taken apart, each with who takes it apart; one that is gone must leave this list too.
def test_no_module_imports_itself_round_a_circle():
    """A circle of imports, even one held by an import inside a function (which only hides it), means two modules
    that are one: the layers above and this rule say which way each dependency goes."""
    graph = import_graph(REPO)
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(circle_path(graph, group) for group in circles)


@pytest.mark.parametrize(("a", "b", "circle"), [
    ("from readers import b\n", "from readers.a import X\n", True),
    ("import readers.b\n", "def f():\n    from readers import a\n", True),
    ("from . import b\n", "class C:\n    def f(self):\n        from .a import X\n", True),
    ("from readers import b\n", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from readers.a import X\n",
     False),
    ("from readers import b\n", "import json\n", False),
])
def test_the_circle_rule_sees_imports_inside_functions(tmp_path: Path, a: str, b: str, circle: bool):
    (tmp_path / "readers").mkdir()
    (tmp_path / "readers" / "a.py").write_text(a, encoding="utf-8")
    (tmp_path / "readers" / "b.py").write_text(b, encoding="utf-8")
    graph = import_graph(tmp_path)
    assert [circle_path(graph, group) for group in import_circles(graph)] == (
        ["readers.a → readers.b → readers.a"] if circle else [])
