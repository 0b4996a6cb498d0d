"""The layering rules of docs/ARCHITECTURE: readers know nothing of stores; shells only talk to the engine."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

ENGINE_INTERNALS = {"chunking", "store", "keyword", "keyword_store", "manifest", "pipeline", "sync", "embeddings",
                    "retrieve", "watch"}
SHELLS = ["rag_app/cli.py", "rag_app/page.py", "app.py",
          *(str(p.relative_to(REPO)) for p in (REPO / "tools").glob("*.py"))]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_readers_never_import_the_engine_or_chroma():
    for path in (REPO / "readers").glob("*.py"):
        bad = {m for m in imports_of(path) if m.startswith(("rag_app", "chromadb", "tools"))}
        assert not bad, f"{path.name} imports {bad}"


def test_shells_only_use_the_engine_api():
    for rel in SHELLS:
        path = REPO / rel
        if not path.exists():
            continue
        modules = imports_of(path)
        internal = {m for m in modules if m.split(".")[0] == "rag_app" and m.split(".")[-1] in ENGINE_INTERNALS}
        assert not internal, f"{rel} reaches past the engine: {internal}"


def test_store_knows_nothing_of_memos():
    assert not any("memos" in m for m in imports_of(REPO / "rag_app" / "store.py"))
