"""Package `__init__`s that import a name only when it is asked for, for one-shot `brain` processes.

Importing any `llama_index.core.<module>` first runs `llama_index/core/__init__.py`, which imports every index, chat
engine, agent, memory (SQLAlchemy) and prompt of LlamaIndex: ~650 modules and ~0.7 s of CPU, of which a search uses
none (it needs the retriever, node and embedding base classes: ~0.45 s). `defer_package_inits(root)` makes the
packages under `root` import what their `__init__` re-exports (`from .base import CallbackManager`) only when that
name is first read, from outside or by the `__init__`'s own statements and functions; those statements (a logger's
handler, module globals) run as they always do. Importing `llama_index.core.retrievers.fusion_retriever` then loads
what that module needs and nothing else, and code that reads `llama_index.core.VectorStoreIndex` still gets it,
imported then. `chromadb`'s `__init__` likewise imports OpenTelemetry's gRPC exporter (through `TokenTransportHeader`,
read only by its `CloudClient`) and the async HTTP client: ~220 modules, ~0.15 s of CPU that a local search skips.

`defer_module_bodies(names)` goes further for modules such a process imports and never reads: `requests`, `PIL.Image`,
`filetype` and `platformdirs` (imported by LlamaIndex's schema and utils for fetching, sniffing and caching images and
files), `scipy.sparse` (bm25s, for a matrix format a saved index does not use), the `rich` and `pygments` modules of
httpx's command-line tool. Such a module is bound at once and runs its body when one of its attributes is first read:
a search then never runs them (~0.15 s of CPU), and code that does read them gets them, loaded then.

`skip_override_checks()` skips the checks Chroma's classes run on themselves as they are created (~0.13 s).

Only for a process that runs one command and ends (rag_app.shells.cli_entry.main): its imports happen on one thread.
Long-running shells import LlamaIndex whole, on their main thread, before starting threads (Brain.load_libraries).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

LLAMA_INDEX = "llama_index.core"
# Imported on a one-shot command's path, read by none of its commands (tests/rag_app/shells/test_lazy_packages.py
# checks that a cold search and ask leave them unrun): why each is imported is in the module's docstring.
UNREAD_MODULES = ("requests", "PIL.Image", "filetype", "platformdirs", "scipy.sparse", "rich.console", "rich.markup",
                  "rich.progress", "rich.syntax", "rich.table", "pygments.lexers", "pygments.util")


def defer_package_inits(root: str = LLAMA_INDEX) -> None:
    """From now on, packages under `root` (and `root` itself) imported for the first time resolve their re-exports on
    first use. Call it before anything imports `root`; calling it again changes nothing."""
    if not any(isinstance(f, _DeferringFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferringFinder(root))


def deferred_names(module: ModuleType) -> dict[str, tuple[str, str | None]]:
    """What a deferred package re-exports and has not imported yet: name → (module, attribute or None for the module
    itself). Empty for a package imported the usual way."""
    exports: dict[str, tuple[str, str | None]] = getattr(module, "__deferred_exports__", {})
    return {name: target for name, target in exports.items() if name not in module.__dict__}


class _DeferringFinder:
    """A meta path finder: packages under `root` as the path finder finds them, their `__init__` handed to a
    _DeferringLoader. (Not an importlib.abc subclass: importing importlib.abc costs more than this module.)"""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name: str, path: Any,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.root and not name.startswith(self.root + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.submodule_search_locations is None:
            return None  # a plain module: imported as usual
        if not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None  # no source to read its imports from
        spec.loader = _DeferringLoader(spec.loader, self.root)
        return spec


class _DeferringLoader:
    """Runs a package `__init__` without its imports of modules under `root`; those names resolve on first use."""

    def __init__(self, real: importlib.machinery.SourceFileLoader, root: str):
        self.real, self.root = real, root

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        source = self.real.get_source(name)
        if source is None:
            self.real.exec_module(module)
            return
        body, exports = split_init(ast.parse(source), name, self.root)
        module.__dict__["__deferred_exports__"] = exports
        module.__dict__["__getattr__"] = _resolver(module, exports)
        module.__dict__["__builtins__"] = _DeferredNames(module, exports)
        exec(compile(ast.Module(body=body, type_ignores=[]), self.real.get_filename(name), "exec"), module.__dict__)

    def __getattr__(self, attr: str) -> Any:  # get_data, get_resource_reader, is_package...: the real loader's
        return getattr(self.real, attr)


class _DeferredNames(dict):  # type: ignore[type-arg]
    """The builtins of a deferred package's own code. Python looks a global name up here when the package's namespace
    lacks it, so a statement or function of the `__init__` that reads a name it re-exports (`__settings = Settings()`,
    a function calling `ClientCreator(...)`) imports that name then, as an outside read does."""

    def __init__(self, module: ModuleType, exports: dict[str, tuple[str, str | None]]):
        super().__init__(builtins.__dict__)
        self.module, self.exports = module, exports

    def __missing__(self, name: str) -> Any:
        if name in self.exports:
            return getattr(self.module, name)
        return builtins.__dict__[name]  # a builtin added since (KeyError, hence NameError, if none)


def split_init(tree: ast.Module, package: str, root: str) -> tuple[list[ast.stmt], dict[str, tuple[str, str | None]]]:
    """An `__init__`'s statements to run now, and the names it imports from modules under `root` (resolved later):
    `from X import a as b` → b: (X, a); `import X as b` → b: (X, None); `c = b` of such a name → c: the same.
    Annotations of module globals are dropped (they name classes that are not imported yet); everything else runs."""
    exports: dict[str, tuple[str, str | None]] = {}
    body: list[ast.stmt] = []

    def under_root(module: str) -> bool:
        return module == root or module.startswith(root + ".")

    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and not any(a.name == "*" for a in node.names):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            if under_root(source):
                exports.update({a.asname or a.name: (source, a.name) for a in node.names})
                continue
        elif isinstance(node, ast.Import) and all(a.asname and under_root(a.name) for a in node.names):
            exports.update({a.asname: (a.name, None) for a in node.names if a.asname})
            continue
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Name) and node.value.id in exports):
            exports[node.targets[0].id] = exports[node.value.id]
            continue
        elif isinstance(node, ast.AnnAssign):
            if node.value is None:
                continue
            node = ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)
        body.append(node)
    return [ast.fix_missing_locations(n) for n in body], exports


def _resolver(module: ModuleType, exports: dict[str, tuple[str, str | None]]) -> Any:
    """The package's module `__getattr__`: a re-exported name is imported now (and kept); so is a submodule read as
    an attribute (the whole `__init__` would have imported it); anything else is missing, as it would be. No lock of
    its own: Python's import locks already make threads that import the same module wait for one import, and a lock
    held around an import deadlocks with a thread whose import reads another deferred name."""

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}")
        if attr in module.__dict__:
            return module.__dict__[attr]
        if attr in exports:
            source, name = exports[attr]
            value: Any = importlib.import_module(source)
            if name is not None:
                try:
                    value = getattr(value, name)
                except AttributeError:  # `from package import submodule`
                    value = importlib.import_module(f"{source}.{name}")
        else:
            try:
                value = importlib.import_module(f"{module.__name__}.{attr}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{module.__name__}.{attr}":
                    raise
                raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None
        setattr(module, attr, value)
        return value

    return __getattr__


def skip_override_checks() -> None:
    """Chroma decorates ~120 methods with `overrides.override`, which checks each one against its base class while
    the class is created: it disassembles the defining module's code to find the bases and compares the signatures'
    type hints (importing what they name), ~0.13 s of CPU in a cold search, to raise only for a mistake in Chroma
    itself. From now on the decorator marks the method as an override (what `EnforceOverrides` classes check) and
    returns it, as it does after a passing check; a method without a docstring no longer copies its base's."""
    import overrides

    def override(method: Any = None, **_options: Any) -> Any:
        if method is None:  # @override(check_signature=...)
            return override
        method.__override__ = True
        return method

    overrides.override = overrides.overrides = override


def defer_module_bodies(names: Iterable[str] = UNREAD_MODULES) -> None:
    """From now on, these modules imported for the first time are bound at once and run their body when one of their
    attributes is first read (as `importlib.util.LazyLoader` does, except that importing them again does not run
    them: the import system reads only `__spec__` then). Calling it again with the same names changes nothing."""
    wanted = frozenset(names)
    if not any(isinstance(f, _UnreadModuleFinder) and f.names == wanted for f in sys.meta_path):
        sys.meta_path.insert(0, _UnreadModuleFinder(wanted))


def is_unread(module: ModuleType) -> bool:
    """Whether a module of `defer_module_bodies` is still waiting for its first read (its body not run)."""
    return type(module) is _UnreadModule


class _UnreadModuleFinder:
    """A meta path finder: the modules named, as the path finder finds them, their loader wrapped."""

    def __init__(self, names: frozenset[str]):
        self.names = names

    def find_spec(self, name: str, path: Any,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if _RUN_FOR_A_SUBMODULE and _RUN_FOR_A_SUBMODULE.pop() == name.rpartition(".")[0] and name in sys.modules:
            return importlib.util.spec_from_loader(name, _AlreadyRun(sys.modules[name]))
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None  # an extension module runs as it is created: nothing to leave for later
        spec.loader = _UnreadModuleLoader(spec.loader)
        return spec


class _UnreadModuleLoader:
    """Leaves the module's body for its first read (_UnreadModule)."""

    def __init__(self, real: importlib.machinery.SourceFileLoader):
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__class__ = _UnreadModule

    def __getattr__(self, attr: str) -> Any:  # get_data, get_resource_reader, is_package...: the real loader's
        return getattr(self.real, attr)


class _AlreadyRun:
    """The loader of a submodule that its package's body imported while the import system was importing it (it read
    the package's `__path__`, which ran the body): the module as it is, not a second copy."""

    def __init__(self, module: ModuleType):
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set its own


# The package whose body has just run because its `__path__` was read: the import system reads it to import a
# submodule, and looks for that submodule next; if the body imported it, that is the module (_AlreadyRun).
_RUN_FOR_A_SUBMODULE: list[str] = []

# What the import system reads of a module it already has (`import requests` a second time): answered without the body.
_IMPORT_SYSTEM_READS = frozenset({"__spec__", "__name__", "__loader__", "__class__"})


class _UnreadModule(ModuleType):
    """A module whose body runs on the first read of anything but what the import system reads. The body then runs
    as a plain module's (the class is switched first, so a circular import inside it reads it as it would any module
    being imported)."""

    def __getattribute__(self, attr: str) -> Any:
        if attr in _IMPORT_SYSTEM_READS:
            return object.__getattribute__(self, attr)
        spec = object.__getattribute__(self, "__spec__")
        real = spec.loader.real
        object.__setattr__(self, "__class__", ModuleType)
        spec.loader = real
        self.__loader__ = real
        try:
            real.exec_module(self)
        except BaseException:
            sys.modules.pop(spec.name, None)  # as a failed import leaves it: the next import tries again
            raise
        if attr == "__path__":
            _RUN_FOR_A_SUBMODULE[:] = [spec.name]
        return getattr(self, attr)
