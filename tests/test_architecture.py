"""The layering rules of README's Layout: readers know nothing of the engine or the stores; shells (the CLI, the page,
app.py, the agent tools) talk to the engine's API only, not the modules behind it; the store knows nothing of Memos."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

ENGINE_INTERNALS = {"chunking", "store", "keyword", "keyword_store", "manifest", "pipeline", "sync", "embeddings",
                    "retrieve", "watch", "llama_engines"}
SHELLS = ["rag_app/cli.py", "rag_app/page.py", "app.py",
          *(str(p.relative_to(REPO)) for p in (REPO / "tools").glob("*.py"))]


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, however it is spelt: `from rag_app import sync` is rag_app.sync (a name imported
    from a package may be a module), a relative import is resolved against the file's package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(filter(None, [path.parent.name if node.level else "", node.module]))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def internal_imports(path: Path) -> set[str]:
    """The engine's internal modules a file imports."""
    return {m for m in imports_of(path) if m.split(".")[0] == "rag_app" and m.split(".")[-1] in ENGINE_INTERNALS}


def test_readers_never_import_the_engine_or_chroma():
    for path in (REPO / "readers").glob("*.py"):
        bad = {m for m in imports_of(path) if m.startswith(("rag_app", "chromadb", "tools"))}
        assert not bad, f"{path.name} imports {bad}"


def test_shells_only_use_the_engine_api():
    for rel in SHELLS:
        internal = internal_imports(REPO / rel)
        assert not internal, f"{rel} reaches past the engine: {internal}"


def test_every_shell_the_rule_names_exists():
    """A shell renamed or moved would otherwise leave the rule checking nothing."""
    assert [rel for rel in SHELLS if not (REPO / rel).is_file()] == []
    assert len(SHELLS) > 3  # the tools were found


@pytest.mark.parametrize("line", ["import rag_app.sync", "import rag_app.sync as s",
                                  "from rag_app.sync import sync_sources", "from rag_app import sync",
                                  "from rag_app import engine, store as s", "from . import watch",
                                  "from .keyword import tokenize",
                                  "def f():\n    from rag_app import manifest\n"])
def test_the_shell_rule_catches_every_spelling_of_an_internal_import(tmp_path: Path, line: str):
    shell = tmp_path / "rag_app" / "shell.py"
    shell.parent.mkdir()
    shell.write_text(line + "\n", encoding="utf-8")
    assert internal_imports(shell), line


def test_the_shell_rule_lets_the_engine_and_config_through(tmp_path: Path):
    shell = tmp_path / "rag_app" / "shell.py"
    shell.parent.mkdir()
    shell.write_text("from rag_app import engine\nfrom rag_app.engine import Brain\nfrom . import config\n"
                     "import rag_app.answer\nfrom tools import brief\n", encoding="utf-8")
    assert internal_imports(shell) == set()


def test_store_knows_nothing_of_memos():
    assert not any("memos" in m for m in imports_of(REPO / "rag_app" / "store.py"))
