"""Deferred package inits and unread modules (rag_app.shells.lazy_packages): a one-shot `brain` process imports the
LlamaIndex modules its command uses, not the whole package, leaves the modules it never reads unrun, and answers
exactly as a process that imported everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rag_app.shells.lazy_packages import UNREAD_MODULES
from tests.conftest import REPO, write_files
from tests.doubles.openai_server import OpenAIDouble

FIXTURE_PACKAGE = {
    "pkg/__init__.py": """
        import logging
        from typing import Optional
        from pkg.heavy import Thing
        from .light import small as tiny
        Alias = Thing
        counter: Optional[int] = 0
        logging.getLogger("pkg").addHandler(logging.NullHandler())
        __all__ = ["Thing", "tiny", "Alias"]
    """,
    "pkg/heavy.py": "import sys\nsys.modules['__main__'].LOADED.append('heavy')\nclass Thing: ...\n",
    "pkg/light.py": "small = 'small'\n",
    "pkg/sub/__init__.py": "from pkg.sub.leaf import LEAF\n",
    "pkg/sub/leaf.py": "LEAF = 'leaf'\n",
}


def run_python(code: str, cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": f"{cwd}{os.pathsep}{REPO}"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_deferred_package_runs_its_own_statements_and_imports_a_re_export_when_it_is_first_read(tmp_path):
    write_files(tmp_path, {name: textwrap.dedent(text) for name, text in FIXTURE_PACKAGE.items()})
    out = run_python("""
        import logging, sys
        LOADED = []
        from rag_app.shells.lazy_packages import defer_package_inits, deferred_names
        defer_package_inits("pkg")
        import pkg.light
        print("after import:", LOADED, pkg.counter, pkg.__all__, len(logging.getLogger("pkg").handlers))
        print("waiting:", sorted(deferred_names(pkg)))
        print("no dunder import:", hasattr(pkg, "__wrapped__"), LOADED)
        from pkg import tiny
        print("tiny:", tiny, LOADED)
        print("alias:", pkg.Alias is pkg.Thing, pkg.Thing.__module__, LOADED)
        print("submodule:", pkg.sub.LEAF, sorted(deferred_names(pkg.sub)))
        print("missing:", hasattr(pkg, "nothing_here"))
        from pkg import *
        print("star:", Thing is Alias, tiny)
    """, tmp_path)
    assert out.splitlines() == [
        "after import: [] 0 ['Thing', 'tiny', 'Alias'] 1",
        "waiting: ['Alias', 'Thing', 'tiny']",
        "no dunder import: False []",
        "tiny: small []",
        "alias: True pkg.heavy ['heavy']",
        "submodule: leaf []",
        "missing: False",
        "star: True small",
    ]


def test_an_unread_module_whose_body_fails_raises_on_the_first_read_and_is_imported_afresh_next_time(tmp_path):
    write_files(tmp_path, {"broken.py": "import sys\nLOADED = sys.modules['__main__'].LOADED\nLOADED.append('run')\n"
                                        "if len(LOADED) == 1:\n    raise RuntimeError('first run fails')\nVALUE = 7\n"})
    out = run_python("""
        import sys
        LOADED = []
        from rag_app.shells.lazy_packages import defer_module_bodies
        defer_module_bodies(["broken"])
        import broken
        try:
            broken.VALUE
        except RuntimeError as exc:
            print("first read:", exc, "broken" in sys.modules)
        import broken
        print("again:", broken.VALUE, LOADED)
    """, tmp_path)
    assert out.splitlines() == ["first read: first run fails False", "again: 7 ['run', 'run']"]


def test_importing_a_submodule_of_an_unread_package_runs_the_package_first_and_each_module_once(tmp_path):
    """The import system reads the package's `__path__` to import the submodule; the package's body, run then,
    imports that submodule itself: there is still one module of that name, run once."""
    write_files(tmp_path, {
        "rpkg/__init__.py": "import sys\nsys.modules['__main__'].LOADED.append('rpkg')\nfrom rpkg import adapters\n",
        "rpkg/adapters.py": "import sys\nsys.modules['__main__'].LOADED.append('adapters')\nclass Adapter: ...\n",
        "rpkg/other.py": "import sys\nsys.modules['__main__'].LOADED.append('other')\n",
    })
    out = run_python("""
        import sys
        LOADED = []
        from rag_app.shells.lazy_packages import defer_module_bodies
        defer_module_bodies(["rpkg"])
        import rpkg
        from rpkg.adapters import Adapter
        import rpkg.other
        print(LOADED, rpkg.adapters is sys.modules["rpkg.adapters"], Adapter is rpkg.adapters.Adapter)
        print(sys.modules["rpkg.adapters"].__spec__.origin.endswith("adapters.py"))
    """, tmp_path)
    assert out.splitlines() == ["['rpkg', 'adapters', 'other'] True True", "True"]


def test_a_deferred_package_s_own_statements_and_functions_import_a_re_export_when_they_read_it(tmp_path):
    """Chroma's `__init__` builds its default settings from a name it imports and calls re-exported classes in its
    functions: each is imported when that statement or call reads it, not before."""
    write_files(tmp_path, {
        "pkg/__init__.py": "from pkg.config import Settings\nfrom pkg.client import Client\n"
                           "from pkg.extra import Extra\n_settings = Settings()\n"
                           "def make():\n    return Client(_settings)\n",
        "pkg/config.py": "import sys\nsys.modules['__main__'].LOADED.append('config')\nclass Settings: ...\n",
        "pkg/client.py": "import sys\nsys.modules['__main__'].LOADED.append('client')\n"
                         "class Client:\n    def __init__(self, settings):\n        self.settings = settings\n",
        "pkg/extra.py": "import sys\nsys.modules['__main__'].LOADED.append('extra')\nclass Extra: ...\n",
    })
    out = run_python("""
        LOADED = []
        from rag_app.shells.lazy_packages import defer_package_inits, deferred_names
        defer_package_inits("pkg")
        import pkg
        print("imported:", LOADED, sorted(deferred_names(pkg)))
        client = pkg.make()
        print("called:", LOADED, type(client.settings).__name__, sorted(deferred_names(pkg)))
        print("builtins:", len([1, 2]), isinstance(client, object))
        try:
            pkg.make.__globals__["__builtins__"]["nothing_here"]
        except KeyError:
            print("unknown: KeyError")
    """, tmp_path)
    assert out.splitlines() == [
        "imported: ['config'] ['Client', 'Extra']",
        "called: ['config', 'client'] Settings ['Extra']",
        "builtins: 2 True",
        "unknown: KeyError",
    ]


def test_two_threads_reading_deferred_names_while_one_imports_a_module_that_reads_another_do_not_deadlock(tmp_path):
    """One thread imports a module whose body reads a deferred name of its package while another thread reads a
    deferred name that needs that same module: Python's import locks order this; a lock of the resolver's own, held
    around the import, made each thread wait for the other forever."""
    write_files(tmp_path, {
        "pkg/__init__.py": "from pkg.heavy import Thing\nfrom pkg.light import small\n",
        "pkg/heavy.py": "import time\ntime.sleep(0.5)\nfrom pkg import small\nclass Thing: ...\n",
        "pkg/light.py": "small = 'small'\n",
    })
    out = run_python("""
        import threading, time
        from rag_app.shells.lazy_packages import defer_package_inits
        defer_package_inits("pkg")
        import pkg
        importing = threading.Thread(target=lambda: __import__("pkg.heavy"), daemon=True)
        importing.start()
        time.sleep(0.2)
        print(pkg.Thing.__name__, pkg.small)
        importing.join()
    """, tmp_path, timeout=20)
    assert out.splitlines() == ["Thing small"]


def test_a_module_left_unread_runs_its_body_on_the_first_read_of_an_attribute_and_not_on_a_second_import(tmp_path):
    write_files(tmp_path, {
        "unread.py": "import sys\nsys.modules['__main__'].LOADED.append('unread')\nVALUE = 42\n",
        "consumer.py": "import unread\nimport unread as again\nKEPT = again\n",
        "spkg/__init__.py": "import sys\nsys.modules['__main__'].LOADED.append('spkg')\n",
        "spkg/sub.py": "import sys\nsys.modules['__main__'].LOADED.append('spkg.sub')\nLEAF = 'leaf'\n",
    })
    out = run_python("""
        import sys
        LOADED = []
        from rag_app.shells.lazy_packages import defer_module_bodies, is_unread
        defer_module_bodies(["unread", "spkg"])
        import consumer
        import unread
        print("imported twice:", LOADED, is_unread(unread), consumer.KEPT is unread, unread.__name__, LOADED)
        print("read:", unread.VALUE, LOADED, is_unread(unread))
        from spkg.sub import LEAF
        print("submodule:", LEAF, LOADED)
        import spkg
        print("from import:", is_unread(spkg))
    """, tmp_path)
    assert out.splitlines() == [
        "imported twice: [] True True unread []",
        "read: 42 ['unread'] False",
        "submodule: leaf ['unread', 'spkg', 'spkg.sub']",  # a package runs before its submodule, as always
        "from import: False",
    ]


def test_every_llama_index_core_package_init_defers_cleanly():
    """Each of LlamaIndex's package inits runs deferred without error and keeps only the statements of its own (an
    upgrade whose init needs an imported name at import time fails here, not in a user's search)."""
    out = run_python("""
        import pkgutil, importlib, json
        from rag_app.shells.lazy_packages import defer_package_inits, deferred_names
        defer_package_inits()
        import llama_index.core as core
        packages = [m.name for m in pkgutil.walk_packages(core.__path__, "llama_index.core.") if m.ispkg]
        waiting = {}
        for name in ["llama_index.core", *packages]:
            try:
                waiting[name] = len(deferred_names(importlib.import_module(name)))
            except Exception as exc:
                waiting[name] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(waiting))
    """, REPO)
    waiting = json.loads(out)
    assert len(waiting) > 50
    assert {name: error for name, error in waiting.items() if isinstance(error, str)} == {}
    assert waiting["llama_index.core"] > 30  # VectorStoreIndex, Settings, ...: none imported by the package itself


def test_every_chromadb_package_init_defers_cleanly():
    """Each of Chroma's package inits runs deferred wherever it runs imported whole (the server's needs a package this
    project does not install: deferred, that import waits for a read of its name), and the telemetry exporters, which
    only a function of Chroma's `__init__` reads, are not imported."""
    code = """
        import importlib, json, os, pkgutil, sys
        from rag_app.shells.lazy_packages import defer_package_inits, deferred_names
        if os.environ["DEFER"]:
            defer_package_inits("chromadb")
        import chromadb
        print(json.dumps({"otel": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter" in sys.modules}))
        outcome = {}
        for info in pkgutil.walk_packages(chromadb.__path__, "chromadb.", onerror=lambda name: None):
            if info.ispkg:
                try:
                    outcome[info.name] = len(deferred_names(importlib.import_module(info.name)))
                except Exception as exc:
                    outcome[info.name] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(outcome))
    """
    runs = {}
    for defer in ("", "1"):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO,
                              timeout=300, env={**os.environ, "DEFER": defer, "ANONYMIZED_TELEMETRY": "False"})
        assert done.returncode == 0, done.stderr
        runs[defer] = [json.loads(line) for line in done.stdout.splitlines()]
    (whole_start, whole), (deferred_start, deferred) = runs[""], runs["1"]
    assert whole_start == {"otel": True} and deferred_start == {"otel": False}
    assert len(deferred) > 25 and deferred.keys() == whole.keys()
    failed = {name for name, error in deferred.items() if isinstance(error, str)}
    assert failed <= {name for name, error in whole.items() if isinstance(error, str)}  # fewer: a failing import waits
    assert sum(waiting for waiting in deferred.values() if isinstance(waiting, int)) > 100


def test_with_override_checks_skipped_chroma_still_marks_its_overrides_and_stores_and_queries(tmp_path):
    """Chroma's classes are created without the decorator's checks (a signature that differs from its base's passes),
    their overriding methods still marked as `EnforceOverrides` requires, and a store written and read as always."""
    out = run_python(f"""
        from rag_app.shells.lazy_packages import skip_override_checks
        skip_override_checks()
        import chromadb
        from chromadb.api.rust import RustBindingsAPI
        from overrides import EnforceOverrides, override

        class Base(EnforceOverrides):
            def count(self, collection: str) -> int: ...

        class Loose(Base):
            @override
            def count(self, other: bytes, extra: float) -> str: ...

        client = chromadb.PersistentClient(path={str(tmp_path / "chroma")!r},
                                           settings=chromadb.config.Settings(anonymized_telemetry=False))
        notes = client.get_or_create_collection("notes", metadata={{"hnsw:space": "cosine"}})
        notes.add(ids=["a", "b"], embeddings=[[1.0, 0.0], [0.0, 1.0]])
        print(RustBindingsAPI._count.__override__, notes.count(),
              notes.query(query_embeddings=[[0.9, 0.1]], n_results=1)["ids"])
    """, tmp_path)
    assert out.splitlines() == ["True 2 [['a']]"]


def test_a_cold_search_and_ask_import_no_index_chat_engine_or_sqlalchemy_and_answer_as_a_full_import_does(
        home, make_vault, tmp_path):
    """Searching (a query BM25 covers, and one only the vectors answer), asking without an LLM and asking one (the
    OpenAI-like client's modules resolve on first use too); the modules left unread stay unrun."""
    vault = make_vault({
        "films.md": "# 电影清单\n\n今年想看的电影：星际穿越、千与千寻。周末去电影院观影。\n",
        "deploy.md": "# Deploy\n\nHow we deploy the service: build the image, push it, roll out with kubectl.\n",
        "run.md": "# 跑步\n\n跑步配速记录：5 公里 28 分钟。\n",
    })
    synced = subprocess.run([sys.executable, "-m", "rag_app.shells.cli", "--home", str(home), "sync", "--vault",
                             str(vault)], capture_output=True, text=True, timeout=300)
    assert synced.returncode == 0, synced.stderr
    modules = tmp_path / "modules.json"
    llm = OpenAIDouble(["You deploy it by building the image and rolling it out [1]."]).start()
    with_llm = {"LLM_BASE_URL": llm.url, "LLM_MODEL": "qwen2.5", "LLM_API_KEY": "sk-test-0123456789"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "OPENAI_"))}
    try:
        chroma_read = []
        for command, extra in ((["search", "观影", "--json"], {}),
                               (["search", "container orchestration", "--json"], {}),
                               (["ask", "how do we deploy", "--json"], {}),
                               (["ask", "how do we deploy the service", "--json"], with_llm)):
            argv = ["brain", "--home", str(home), "--no-daemon", *command]
            lazy = subprocess.run(
                [sys.executable, "-c", "import json, os, sys\nend = os._exit\n"  # a one-shot command ends by os._exit
                 f"os._exit = lambda code: (open({str(modules)!r}, 'w').write(json.dumps({{n: type(m).__name__ "
                 f"for n, m in sys.modules.items()}})), "
                 f"end(code))\nsys.argv = {argv!r}\nfrom rag_app.shells.cli_entry import main\nmain()"],
                capture_output=True, text=True, timeout=300, cwd=REPO, env=env | extra)
            whole = subprocess.run([sys.executable, "-m", "rag_app.shells.cli", *argv[1:]], capture_output=True,
                                   text=True, timeout=300, cwd=REPO, env=env | extra)
            assert lazy.returncode == whole.returncode == 0, lazy.stderr[-2000:] + whole.stderr
            imported = json.loads(modules.read_text())
            assert "llama_index.core.retrievers.fusion_retriever" in imported
            assert not imported.keys() & {"llama_index.core.indices.base", "llama_index.core.chat_engine", "sqlalchemy"}
            unread = {name for name, kind in imported.items() if kind == "_UnreadModule"}
            assert unread == {name for name in UNREAD_MODULES if name in imported}, "imported and read: update the list"
            assert {"requests", "scipy.sparse"} <= unread and ("httpx" not in imported or "rich.console" in unread)
            chroma_read.append("chromadb.api.rust" in imported)  # a query BM25 does not cover reads the vectors
            assert not imported.keys() & {"urllib3", "scipy.sparse._base", "rich.text", "PIL.ImageMode"}  # theirs
            assert json.loads(lazy.stdout) == json.loads(whole.stdout)
        assert json.loads(lazy.stdout)["mode"] == "llm" and len(llm.requests) == 2
        assert chroma_read[1]
    finally:
        llm.stop()
