"""The one API every shell (CLI, agent tools, MCP server, chat page, notebooks) calls."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rag_app.answers.asking import Asker
from rag_app.answers.llm import LLMLink, llm_config, missing_message
from rag_app.answers.sessions import SessionError, SessionNotFound, SessionStore
from rag_app.answers.sessions import validate_name as validate_session_name
from rag_app.config import (
    ConfigError,
    Settings,
    SourceSpec,
    load_settings,
    memos_source,
    resolve_home,
    vault_source,
)
from rag_app.index.docstore_health import DocstoreError, docstore_shown
from rag_app.index.docstore_reads import stored_count
from rag_app.index.manifest import Manifest
from rag_app.index.private import make_home, open_home
from rag_app.index.store import DiskFull, StoreError, disk_full, store_shown
from rag_app.ingest.capture import (
    MAX_CAPTURE_BYTES,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    CaptureError,
    new_note,
    write_memo,
    write_vault_note,
)
from rag_app.ingest.chunking import CHUNKER_VERSION, chunker_id
from rag_app.ingest.doctor import run_doctor
from rag_app.ingest.fresh import SourceError, read_note
from rag_app.ingest.lock import StopRequested, SyncBusyError, stop_on_signals
from rag_app.ingest.memos_token import memos_token
from rag_app.ingest.progress import Progress, channel_progress, time_left
from rag_app.ingest.report import SourceReport, SyncReport
from rag_app.ingest.sync import remove_source, sync_sources
from rag_app.ingest.watch import (
    BackgroundWatch,
    HomeGone,
    WatchBusy,
    Watcher,
    claim_watch,
    release_watch,
    watch_in_background,
)
from rag_app.search.graph import LinkGraph
from rag_app.search.query import MAX_QUERIES, SearchCancelled, SearchError, SearchFilters, cancelled_when
from rag_app.search.suggest import example_questions
from readers.records import decode_list

if TYPE_CHECKING:
    from llama_index.core.chat_engine import CondensePlusContextChatEngine
    from llama_index.core.query_engine import RetrieverQueryEngine

    from rag_app.answers.answer import AnswerResponse
    from rag_app.search.retrieve import NoteFusionRetriever, SearchIndex, SearchResponse

__all__ = ["MAX_CAPTURE_BYTES", "MAX_QUERIES", "MAX_TAGS", "MAX_TITLE_CHARS", "BackgroundWatch", "Brain",
           "CaptureError", "ConfigError", "DiskFull", "HomeGone", "NoteNotFound", "Progress", "SearchCancelled",
           "SearchError",
           "SessionError", "SessionNotFound", "SourceError", "SourceReport", "StopRequested", "StoreError",
           "SyncBusyError", "SyncReport", "WatchBusy", "claim_watch", "release_watch", "stop_on_signals", "time_left"]


log = logging.getLogger("cflow_brain.engine")
REFRESH_WAIT_SECONDS = 5.0  # a stale check waits this long for listing and keyword index, never for embedding


class _RefreshOff(threading.local):
    active = False  # per thread: see Brain.refresh_off


_refresh_off = _RefreshOff()


class Brain:
    """A home directory's index: sources, sync, status (and, on top of these, search and answers)."""

    def __init__(self, home: str | os.PathLike[str] | None = None, store_url: str | None = None):
        """Refuses (ConfigError) a home that is not this user's alone, before its config.toml is read; an older
        home others could read is made private, and `notices` says so (a shell shows it)."""
        home_path = resolve_home(home)
        notice = open_home(home_path)
        self.notices: list[str] = [notice] if notice else []
        self.settings: Settings = load_settings(home_path, store_url=store_url)
        self._search_index: SearchIndex | None = None
        self._search_models: tuple[str, ...] = ()
        self._progress: tuple[str, tuple[str, ...]] | None = None
        self.auto_refresh = False  # long-running shells turn this on (see refresh_if_stale)
        self._refresh_guard = threading.Lock()
        self._refreshing: threading.Thread | None = None
        self._last_refresh = 0.0
        self._llm = LLMLink(self.settings.llm)
        self._graph: tuple[str, LinkGraph, dict[str, dict[str, Any]]] | None = None
        self._lock = threading.RLock()
        self._asker = Asker(self.settings, self._llm, self.search, self.searcher, self._lock,
                            lambda: self.status()["notes"], lambda: self._sessions)

    @property
    def home(self) -> Path:
        return self.settings.home

    def create_home(self) -> bool:
        """Make the home (private: 0700) if it does not exist; whether it was made."""
        return make_home(self.settings.home)

    @property
    def obsidian_links(self) -> bool:
        """[serve] obsidian: whether the page links vault notes into Obsidian."""
        return bool(self.settings.serve["obsidian"])

    @property
    def agents_see_private(self) -> bool:
        """[mcp] allow_private: whether agents (MCP, tools) may see PRIVATE memos."""
        return bool(self.settings.mcp["allow_private"])

    def known_sources(self) -> list[SourceSpec]:
        """Sources from the config file, then those remembered from earlier `--vault` / `--memos` runs."""
        specs = {s.name: s for s in self.settings.sources}
        if self.settings.manifest_path.exists():
            manifest = Manifest(self.settings.manifest_path)
            try:
                for name, row in manifest.sources().items():
                    if name not in specs:
                        specs[name] = SourceSpec.from_dict({**row["spec"], "name": name})
            finally:
                manifest.close()
        return list(specs.values())

    def resolve_sources(
        self, vaults: tuple[str, ...] = (), memos: tuple[str, ...] = (), names: tuple[str, ...] = ()
    ) -> list[SourceSpec]:
        """The sources one sync run touches: those named by flags, else every known source."""
        known = {s.name: s for s in self.known_sources()}
        chosen: list[SourceSpec] = []
        for path in vaults:
            if not Path(path).expanduser().is_dir():
                raise ConfigError(f"--vault {path}: not a directory")
            chosen.append(_reuse_name(vault_source(path), known))
        for url in memos:
            chosen.append(_reuse_name(memos_source(url), known))
        for name in names:
            if name not in known:
                raise ConfigError(f"unknown source {name!r}; known: {sorted(known) or 'none'}")
            chosen.append(known[name])
        if not (vaults or memos or names):
            chosen = list(known.values())
        if not chosen:
            raise ConfigError(
                "no sources: pass --vault DIR or --memos URL, or add [[sources]] to "
                f"{self.settings.home / 'config.toml'}"
            )
        names_seen = [s.name for s in chosen]
        if len(names_seen) != len(set(names_seen)):
            raise ConfigError(f"two sources in this run share a name: {names_seen}")
        return chosen

    def sync(
        self,
        vaults: tuple[str, ...] = (),
        memos: tuple[str, ...] = (),
        names: tuple[str, ...] = (),
        progress: Progress | None = None,
        on_source: Callable[[SourceReport], None] | None = None,
        stop: StopRequested | None = None,
        on_searchable: Callable[[], None] | None = None,
        allow_deletes: tuple[str, ...] = (),
    ) -> SyncReport:
        """`allow_deletes`: sources of this run whose listing may delete most of their notes (see sync._mass_delete)."""
        with self._full_disk_named():
            specs = self.resolve_sources(vaults, memos, names)
            outside = sorted(set(allow_deletes) - {s.name for s in specs})
            if outside:
                raise ConfigError(f"--allow-deletes {outside[0]}: not a source of this sync; "
                                  f"its sources: {', '.join(s.name for s in specs)}")
            return sync_sources(self.settings, specs, progress, on_source, stop, on_searchable,
                                frozenset(allow_deletes))

    @contextmanager
    def _full_disk_named(self) -> Iterator[None]:
        """A full disk as DiskFull (one line: which store, nothing lost), not the chain of errors it set off."""
        try:
            yield
        except (StoreError, ConfigError):
            raise
        except Exception as exc:
            full = disk_full(exc, str(self.home))
            if full is None:
                raise
            raise full from None

    def watch(self, specs: list[SourceSpec], interval: float,
              on_sync: Callable[[str, SyncReport], None] | None = None, stop: StopRequested | None = None) -> None:
        """Keep these sources fresh until SIGINT/SIGTERM or `stop` (see rag_app.ingest.watch)."""
        Watcher(self.settings, specs, interval, on_sync, stop).run()

    def watch_in_background(self, specs: list[SourceSpec], interval: float) -> BackgroundWatch:
        """The same watcher on a daemon thread, for the page and the MCP server; stop it through the returned handle
        when the server ends."""
        def logged(trigger: str, report: SyncReport) -> None:
            log.info("watch (%s): %s", trigger, {s.name: (s.added, s.updated, s.deleted) for s in report.sources})

        return watch_in_background(self.settings, specs, interval, logged)

    def status(self, docstore: bool = False) -> dict[str, Any]:
        """Counts from the manifest (no Chroma, no model): cheap enough for a status bar. `docstore`: also which
        docstore the home writes to, how many notes it holds and whether that is the index's count (one query, but
        a PostgreSQL one may wait for its server: `brain status` asks, a status bar does not)."""
        sources: list[dict[str, Any]] = []
        notes = chunks = 0
        channels: dict[str, Any] = {}
        if self.settings.manifest_path.exists():
            manifest = Manifest(self.settings.manifest_path)
            try:
                channels = channel_progress(self.settings, manifest)
                counts = manifest.counts()
                for name, row in manifest.sources().items():
                    n_notes, n_chunks = counts.get(name, (0, 0))
                    notes += n_notes
                    chunks += n_chunks
                    sources.append({
                        "name": name,
                        "kind": row["kind"],
                        "notes": n_notes,
                        "chunks": n_chunks,
                        "last_sync": _iso(row["last_sync"]),
                        "last_result": _summary(row["last_result"]),
                    })
            finally:
                manifest.close()
        return {
            "notes": notes,
            "chunks": chunks,
            "sources": sources,
            "channels": channels,
            "embedding_model": self.settings.embedding_model,
            "dense_models": self.settings.models,
            "chunker_version": chunker_id(self.settings.chunk_max_chars, self.settings.chunk_overlap)
            if sources else CHUNKER_VERSION,
            "home": str(self.settings.home),
            "store": store_shown(self.settings.store_url) or "embedded",
        } | ({"docstore": self._docstore_status(notes)} if docstore else {})

    def _docstore_status(self, notes: int) -> dict[str, Any]:
        """{"name", "notes", "agrees", "error"}: name without credentials; error one line naming what to do."""
        try:
            held = stored_count(self.settings)
        except DocstoreError as exc:
            return {"name": docstore_shown(self.settings), "notes": None, "agrees": None, "error": str(exc)}
        return {"name": docstore_shown(self.settings), "notes": held, "agrees": held == notes, "error": None}

    def searcher(self) -> SearchIndex:
        """The open search index of this home (kept for the life of this Brain: warm searches skip start-up).

        While a sync fills in vectors, a dense model that has not reached every note is left out of fusion (it would
        push the notes it has not reached down): BM25 alone until USE-m3 is complete, then the fast mode (BM25
        leading, USE-m3 gated) until the default model is complete too (see `_searchable_settings`)."""
        models = self._complete_models()
        if self._search_index is None or self._search_models != models:
            if self._search_index is not None:
                self._search_index.close()
            self._search_index = _retrieve().SearchIndex(self._searchable_settings(models), dense=bool(models))
            self._search_models = models
        return self._search_index

    def _complete_models(self) -> tuple[str, ...]:
        """The dense models to search with, main first: those whose vectors cover every note (re-read when the
        manifest's progress moved). Until the configured main model is complete, a previous main model that still
        covers every note (a model switch keeps its collection until the new one is complete) takes its place."""
        if not self.settings.manifest_path.exists():
            return tuple(self.settings.models)
        manifest = self._search_index.manifest if self._search_index is not None else Manifest(
            self.settings.manifest_path)
        try:
            stamp = manifest.progress_stamp()
            if self._progress is None or self._progress[0] != stamp:
                total, per_model = manifest.channel_counts()
                complete = [m for m in self.settings.models if per_model.get(m, 0) >= total]
                previous = sorted(m for m, n in per_model.items() if n >= total and m not in self.settings.models)
                if previous and self.settings.embedding_model not in complete:
                    complete = [previous[0], *complete]  # the old main model, beside a complete second channel
                self._progress = (stamp, tuple(complete[:2]))
            return self._progress[1]
        finally:
            if self._search_index is None:
                manifest.close()

    def _searchable_settings(self, models: tuple[str, ...]) -> Settings:
        """The settings a search runs with: all configured models once complete; during a fill, the complete ones
        only (USE-m3 alone means the fast mode's weights, tuned for it). With none, hybrid search is BM25 alone."""
        if not models or list(models) == self.settings.models:
            return self.settings
        return replace(self.settings, embedding_model=models[0], second_model=models[1] if models[1:] else "")

    def llm(self) -> Any | None:
        """The LLM of [llm] (or LLM_BASE_URL and LLM_MODEL), loaded on first use; None when there is none."""
        return self._llm.llm()

    def variants_llm(self) -> Any | None:
        """The LLM that writes a question's search variants, with a short timeout and no retries."""
        return self._llm.variants_llm()

    def search(
        self,
        query: str,
        k: int = 8,
        *,
        sources: tuple[str, ...] = (),
        tags: tuple[str, ...] = (),
        path_prefix: str = "",
        since: str | dt.date | None = None,
        until: str | dt.date | None = None,
        mode: str = "hybrid",
        variants: list[str] | None = None,
        expand: bool = True,
        audience: str = "user",
    ) -> SearchResponse:
        """Hybrid search over every note; see rag_app.search.retrieve for what each result holds."""
        retriever = self._retriever(k, mode, sources, tags, path_prefix, since, until, variants, expand, audience)
        freshness = self.refresh_if_stale() if self.auto_refresh and not _refresh_off.active else None
        response = retriever.search(query)
        filling = [m for m in self.settings.models if m not in self._search_models]
        if filling:
            response.coverage["filling_vectors"] = filling  # searched without them: BM25 covers every note
        previous = [m for m in self._search_models if m not in self.settings.models]
        if previous and response.coverage["mode"] != "bm25":
            response.coverage["searched_with"] = previous  # the models being replaced, complete until the new ones are
        if freshness:
            response.coverage["freshness"] = freshness
        return response

    def as_retriever(
        self,
        k: int = 8,
        *,
        mode: str = "hybrid",
        sources: tuple[str, ...] = (),
        tags: tuple[str, ...] = (),
        path_prefix: str = "",
        since: str | dt.date | None = None,
        until: str | dt.date | None = None,
        expand: bool = True,
        audience: str = "user",
    ) -> NoteFusionRetriever:
        """The same search as a LlamaIndex retriever (a QueryFusionRetriever): one NodeWithScore per note, node id =
        note id, metadata = the search result (title, path or url, relevance, strength, matched passages).
        `retrieve`/`aretrieve` give exactly what `search` gives for the same arguments."""
        return self._retriever(k, mode, sources, tags, path_prefix, since, until, None, expand, audience)

    def as_query_engine(self, k: int = 6, **search: Any) -> RetrieverQueryEngine:
        """A LlamaIndex RetrieverQueryEngine over `as_retriever(k, **search)`. With an LLM ([llm] or LLM_BASE_URL and
        LLM_MODEL) it answers from the notes that may answer, cited as [n] (`source_nodes[n - 1]`); without one, or
        with half a configuration, it answers with the notes' best passages as `ask` does (answers/llama_engines.py)."""
        return _llama_engines().query_engine(self.as_retriever(k, **search), self.llm(), self._asker.answering_lines)

    def as_chat_engine(self, session: str | None = None, k: int = 6, **search: Any) -> CondensePlusContextChatEngine:
        """A LlamaIndex CondensePlusContextChatEngine over `as_retriever(k, **search)` whose memory is the brain
        session `session` (a new one by default): its turns are stored there, as `brain ask --session` stores them,
        and an existing session's turns are its history. It needs an LLM: without one, ConfigError says what to set
        (a conversation without an LLM is `ask(question, session=...)`)."""
        llm = self.llm()
        if llm is None:
            missing = llm_config(self.settings.llm).missing
            raise ConfigError(
                (missing_message(missing) if missing else "no LLM configured: a chat engine needs one; set base_url "
                 f"and model under [llm] in {self.settings.home / 'config.toml'} (or LLM_BASE_URL and LLM_MODEL)")
                + "; without an LLM, Brain.ask(question, session=...) holds a conversation with passages")
        name = validate_session_name(session) if session is not None else self.new_session_name()
        return _llama_engines().chat_engine(self.as_retriever(k, **search), llm, self._sessions, name,
                                            self.settings.llm["budget_chars"] // 4)

    def _retriever(self, k: int, mode: str, sources: tuple[str, ...], tags: tuple[str, ...], path_prefix: str,
                   since: str | dt.date | None, until: str | dt.date | None, variants: list[str] | None,
                   expand: bool, audience: str) -> NoteFusionRetriever:
        if sources:
            known = {s.name for s in self.known_sources()} | {"vault", "memos"}
            unknown = [name for name in sources if name not in known]
            if unknown:
                raise SearchError(f"unknown source {unknown[0]!r}; known: {', '.join(sorted(known))}")
        hide_private = audience == "agent" and not self.agents_see_private
        filters = SearchFilters(tuple(sources), tuple(tags), path_prefix, _date(since, "since"), _date(until, "until"),
                                exclude_private=hide_private)
        wanted = expand and not variants and self.llm_state()["configured"]
        llm = self.variants_llm() if wanted and not self.llm_state(probe=True)["error"] else None
        return _retrieve().NoteFusionRetriever(self.searcher, k, mode=mode, filters=filters, llm=llm,
                                               variants=variants, lock=self._lock)

    @staticmethod
    def load_libraries() -> None:
        """Import LlamaIndex on the calling thread, before a long-running shell starts its threads: its package imports
        form cycles, and two threads importing it for the first time at once see each other's half-initialised modules
        ("ImportError: ... partially initialized module"), which failed a capture's sync while the warm-up searched."""
        import llama_index.core  # noqa: F401

    def warm_up(self) -> None:
        """Open the search index and load every channel (BM25 and jieba, each dense model) before anyone asks, so that
        a long-running shell's first search is as quick as the next (the warm engine does this when it starts)."""
        if not self.status()["notes"]:
            return  # nothing to search yet: the first sync opens what it needs
        for mode in ("bm25", "vector", "vector2")[: 1 + len(self._complete_models())]:
            self.search("warm up 预热", 1, mode=mode, expand=False)

    @contextmanager
    def refresh_off(self) -> Iterator[None]:
        """On this thread, for the block: no stale check before a search, whatever auto_refresh says (a warm engine
        runs a CLI command so, as the CLI in its own process would run it)."""
        was = _refresh_off.active
        _refresh_off.active = True
        try:
            yield
        finally:
            _refresh_off.active = was

    @staticmethod
    def cancelled_when(gone: Callable[[], bool]) -> AbstractContextManager[None]:
        """On this thread, for the block: a search stops (SearchCancelled) at its next step, between its queries and
        channels, once `gone()` is true: a warm engine's client that went away no longer holds the next one up."""
        return cancelled_when(gone)

    def refresh_if_stale(self) -> dict[str, Any] | None:
        """For long-running shells (page, MCP) without a watcher: when a source's last sync is older than
        `[sync] stale_seconds`, sync every known source in the background. The call waits only for the listing and
        the keyword index (changed notes are then found by their words); embedding goes on in the background."""
        with self._refresh_guard:
            if self._refreshing is not None and self._refreshing.is_alive():
                return {"syncing": True}
            now = time.time()
            if now - self._last_refresh < self.settings.stale_seconds:
                return None
            ages = [now - (s["last_sync"] or 0) for s in self._source_rows()]
            if not ages or max(ages) < self.settings.stale_seconds:
                return None
            self._last_refresh = now
            searchable = threading.Event()
            changes: list[SourceReport] = []
            self._refreshing = threading.Thread(target=self._background_sync, args=(searchable, changes),
                                                name="brain-refresh", daemon=True)
            self._refreshing.start()
        searchable.wait(REFRESH_WAIT_SECONDS)
        changed = sum(r.added + r.updated + r.deleted for r in changes)
        return {"checked": True, "stale_seconds": round(max(ages)), "changed_notes": changed,
                "embedding_in_background": self._refreshing.is_alive()}

    def _background_sync(self, searchable: threading.Event, changes: list[SourceReport]) -> None:
        try:
            self.sync(on_source=changes.append, on_searchable=searchable.set)
        except Exception:  # busy or unreadable: the next stale check tries again; the search goes on meanwhile
            log.warning("background refresh failed", exc_info=True)
        finally:
            searchable.set()

    def _source_rows(self) -> list[dict[str, Any]]:
        if not self.settings.manifest_path.exists():
            return []
        manifest = Manifest(self.settings.manifest_path)
        try:
            return list(manifest.sources().values())
        finally:
            manifest.close()

    def ask(
        self,
        question: str,
        k: int = 6,
        *,
        session: str | None = None,
        sources: tuple[str, ...] = (),
        tags: tuple[str, ...] = (),
        since: str | dt.date | None = None,
        until: str | dt.date | None = None,
        on_token: Callable[[str], None] | None = None,
        budget: int | None = None,
        audience: str = "user",
        turn_id: str | None = None,
    ) -> AnswerResponse:
        """Search, then answer only from the notes found, citing them as [n] (sessions and turn ids: `Asker.ask`)."""
        return self._asker.ask(question, k, session=session, sources=sources, tags=tags, since=since, until=until,
                               on_token=on_token, budget=budget, audience=audience, turn_id=turn_id)

    @property
    def _sessions(self) -> SessionStore:
        return SessionStore(self.settings.home / "sessions.sqlite")

    def sessions(self) -> list[dict[str, Any]]:
        """Every conversation: {"name", "turns", "last_question", "updated"} (ISO time), most recent first."""
        return self._sessions.list()

    def session(self, name: str, last: int | None = None, before: int | None = None) -> dict[str, Any]:
        """{"name", "total", "first", "turns": [{"question", "answer", "citations", "coverage", "mode", "asked"}]}:
        every turn, or the `last` ones before turn number `before` (a long conversation is read a page at a time);
        `first` numbers the first turn returned. SessionNotFound for a name never used."""
        return self._sessions.get(name, last, before)

    def rename_session(self, old: str, new: str) -> None:
        self._sessions.rename(old, new)

    def delete_session(self, name: str) -> None:
        self._sessions.delete(name)

    def new_session_name(self) -> str:
        """A readable unused name such as "2026-12-01 14:03" (the session exists once a question is asked in it)."""
        return self._sessions.new_name()

    def start_session(self, question: str) -> str:
        """A new conversation, stored at once and named after its first question (numbered when taken): the page
        creates it when that question arrives, so no other chat can end up in it."""
        return self._sessions.create(question)

    def example_questions(self, count: int = 4) -> list[str]:
        """Questions an empty chat can offer, from this home's own notes (recent titles, frequent tags); [] when
        nothing is indexed. Reads the manifest only: no model, no Chroma."""
        if not self.settings.manifest_path.exists():
            return []
        manifest = Manifest(self.settings.manifest_path)
        try:
            return example_questions(manifest.note_metadata(), count)
        finally:
            manifest.close()

    def llm_state(self, probe: bool = False) -> dict[str, Any]:
        """{"configured", "missing", "model", "base_url", "error"}: "missing" names what a half-done configuration
        lacks; "error" why the LLM cannot be used now (its last call failed, or with `probe`, its address refuses a
        connection), else None."""
        return self._llm.llm_state(probe)

    def llm_failure(self) -> str | None:
        """Why the LLM failed within the last LLM_RETRY_SECONDS (its calls are skipped meanwhile), else None."""
        return self._llm.llm_failure()

    def graph(self) -> LinkGraph:
        """The link graph of everything indexed (rebuilt when the index changed)."""
        return self._graph_and_metadata()[0]

    def _graph_and_metadata(self) -> tuple[LinkGraph, dict[str, dict[str, Any]]]:
        """The link graph and every note's metadata, read once per index generation (both feed every note view)."""
        with self._lock:
            index = self.searcher()
            if self._graph is None or self._graph[0] != index.stamp:
                resolver = index.link_resolver()  # every note's metadata, read once for searches and the graph
                text_of = index.manifest.note_doc  # read only for a note whose link did not resolve
                graph = LinkGraph.build(resolver.notes, lambda note: (text_of(note) or ("",))[0], resolver)
                self._graph = (index.stamp, graph, resolver.notes)
            return self._graph[1], self._graph[2]

    def get_note(self, note_id: str, max_chars: int = 20_000, audience: str = "user",
                 fresh: bool = False) -> dict[str, Any]:
        """A note's full text (capped) with its metadata, links and backlinks. Takes note ids only, never paths.

        `fresh` reads the note again from its source (see rag_app.ingest.fresh) and says whether the indexed copy is
        `stale`; links and backlinks stay those of the index."""
        note_id = validate_note_id(note_id)
        with self._lock:
            manifest = self.searcher().manifest
            found = manifest.note_doc(note_id)
            entry = manifest.entries_for([note_id]).get(note_id)
        if found is None or not self._visible(found[1], audience):
            raise NoteNotFound(f"no note with id {note_id!r}")
        text, meta = found
        freshness: dict[str, Any] = {}
        if fresh:
            text, meta, freshness = self._read_fresh(note_id, meta, entry.hash if entry else "", audience)
        graph = self.graph()
        hidden = graph.private if audience == "agent" and not self.agents_see_private else set()
        note = _citation_fields(note_id, meta)
        note.update(
            text=text[:max_chars],
            truncated=len(text) > max_chars,
            chars=len(text),
            tags=decode_list(meta.get("tags")),
            aliases=decode_list(meta.get("aliases")),
            created=meta.get("created"),
            updated=meta.get("updated") or meta.get("mtime"),
            links=[n for n in graph.outgoing.get(note_id, []) if n not in hidden],
            backlinks=[n for n in graph.backlinks.get(note_id, []) if n not in hidden],
            broken_links=graph.broken.get(note_id, []),
            **freshness,
        )
        return note

    def _read_fresh(self, note_id: str, meta: dict[str, Any], indexed_hash: str,
                    audience: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(text, metadata, freshness fields) of the note as its source holds it now."""
        name = str(meta.get("source") or "")
        spec = next((s for s in self.known_sources() if s.name == name), None)
        if spec is None:
            raise SourceError(f"the source {name!r} of this note is no longer known; it cannot be read again")
        record = read_note(spec, note_id, meta, self._memos_token(spec) if spec.kind == "memos" else None)
        read_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        if record is None:
            return "", meta, {"fresh": True, "stale": True, "deleted_at_source": True, "read_at": read_at}
        current = {**record.volatile, **record.metadata}
        if not self._visible(current, audience):  # made PRIVATE since the last sync
            raise NoteNotFound(f"no note with id {note_id!r}")
        return record.text, current, {"fresh": True, "stale": record.content_hash != indexed_hash,
                                      "deleted_at_source": False, "read_at": read_at}

    def _memos_token(self, spec: SourceSpec) -> str | None:
        """The token this Memos source may be sent (rag_app.ingest.memos_token: one origin per token)."""
        manifest = Manifest(self.settings.manifest_path)
        try:
            return memos_token(spec, manifest)[0]
        finally:
            manifest.close()

    @property
    def capture_enabled(self) -> bool:
        """Whether `[capture] enabled = true`: only then do agents get the capture tool."""
        return bool(self.settings.capture.get("enabled"))

    def capture(self, text: str, title: str | None = None, tags: list[str] | None = None,
                wait_seconds: float = 30.0) -> dict[str, Any]:
        """Save a new note into the `[capture]` source (a vault folder, or a PRIVATE memo) and index it at once.

        The source alone is synced; the call returns when the note is searchable by its words (seconds), while its
        vectors are filled in the background. The reply gives the note id."""
        if not self.capture_enabled:
            raise ConfigError("capture is off: set [capture] enabled = true and source = \"<source name>\" in "
                              f"{self.settings.home / 'config.toml'}")
        note = new_note(text, title, tags)
        name = str(self.settings.capture.get("source") or "")
        spec = next((s for s in self.known_sources() if s.name == name), None)
        if spec is None:
            raise ConfigError(f"[capture] source {name!r} is not a known source; known: "
                              f"{sorted(s.name for s in self.known_sources()) or 'none'}")
        if spec.kind == "vault":
            saved = write_vault_note(spec, str(self.settings.capture.get("folder") or "Inbox"), note)
        else:
            saved = write_memo(spec, self._memos_token(spec), note)
        reply: dict[str, Any] = {"note_id": saved.note_id, "title": note.title, "source": saved.source,
                                 "kind": saved.kind, "tags": list(note.tags)}
        reply.update({"path": saved.path} if saved.kind == "vault" else {"url": saved.url,
                                                                         "visibility": saved.visibility})
        reply.update(self._index_capture(spec.name, wait_seconds))
        return reply

    def _index_capture(self, source: str, wait_seconds: float) -> dict[str, Any]:
        """Sync one source on a thread; wait until its notes are searchable by keyword, not for the vectors."""
        searchable = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                report = self.sync(names=(source,), on_searchable=searchable.set)
                failed = next((s.error for s in report.sources if s.failed), None)
                if failed:
                    outcome["index_error"] = failed
            except Exception as exc:  # busy or failing: the note is saved; the next sync indexes it
                outcome["index_error"] = " ".join(str(exc).split())[:300]
            finally:
                searchable.set()

        thread = threading.Thread(target=run, name="brain-capture-sync", daemon=True)
        thread.start()
        searchable.wait(wait_seconds)
        if "index_error" in outcome:
            return {"indexed": False, "index_error": outcome["index_error"]}
        return {"indexed": searchable.is_set(), "embedding_in_background": thread.is_alive()}

    def related(self, note_id: str, k: int = 8, audience: str = "user") -> dict[str, Any]:
        """Notes linked to or from this one, then its nearest notes by meaning."""
        note = self.get_note(note_id, max_chars=0, audience=audience)
        _, metadata = self._graph_and_metadata()
        with self._lock:
            index = self.searcher()
            linked = [n for n in dict.fromkeys(note["links"] + note["backlinks"]) if n in metadata
                      and self._visible(metadata[n], audience)]
            nearest = [n for n in index.nearest_notes(note_id, k * 2) if n not in linked and n in metadata
                       and self._visible(metadata[n], audience)][:k]  # a note synced a moment ago: not yet here
        return {
            "note_id": note_id,
            "title": note["title"],
            "links": [_citation_fields(n, metadata[n]) | {"relation": "links to" if n in note["links"]
                      else "linked from"} for n in linked],
            "similar": [_citation_fields(n, metadata[n]) | {"relation": "similar"} for n in nearest],
            "broken_links": note["broken_links"],
        }

    def _visible(self, meta: dict[str, Any], audience: str) -> bool:
        """Agents (MCP, tools) do not see PRIVATE memos unless the config allows it ([mcp] allow_private)."""
        if audience != "agent" or meta.get("kind") != "memos":
            return True
        return meta.get("visibility") != "PRIVATE" or self.agents_see_private

    def close(self) -> None:
        if self._search_index is not None:
            self._search_index.close()
            self._search_index = None

    def doctor(self, repair: bool = False, compact: bool = False) -> dict[str, Any]:
        """Do Chroma, the manifest and BM25 agree? `repair` fixes them, `compact` rebuilds Chroma (ingest/doctor.py)."""
        try:
            with self._full_disk_named():
                sessions = self._check_sessions(repair)
                result = run_doctor(self.settings, repair=repair, compact=compact)
        finally:
            self.close()  # repaired or compacted stores are reopened by the next search
        return result | {"ok": result["ok"] and sessions["ok"], "sessions": sessions}

    def _check_sessions(self, repair: bool) -> dict[str, Any]:
        """The conversations file for `doctor`: {"ok", "problem", "set_aside"}; with `repair`, a damaged one is moved
        aside (kept, not deleted) and the next conversation starts a new file."""
        store = self._sessions
        problem = store.check()
        moved = str(store.set_aside()) if problem and repair else None
        if moved:
            log.warning("doctor set the damaged %s aside as %s", store.path, moved)
        return {"ok": problem is None or moved is not None, "problem": problem, "set_aside": moved}

    def remove_source(self, name: str) -> dict[str, Any]:
        """Drop a source and every note it contributed: the only way notes leave the index besides deletion."""
        removed = remove_source(self.settings, name)
        self.close()
        in_config = any(s.name == name for s in self.settings.sources)
        return {"removed": name, "notes": removed, "still_in_config": in_config}


# Imported on first use, here only: both import LlamaIndex (1.2-1.4 s), which `brain status`, a sync with nothing to do,
# a note's view, the conversations and a warm engine's client never need. The first search (or query engine) pays it.


def _retrieve() -> ModuleType:
    """rag_app.search.retrieve: SearchIndex and NoteFusionRetriever."""
    from rag_app.search import retrieve

    return retrieve


def _llama_engines() -> ModuleType:
    """rag_app.answers.llama_engines: the search as LlamaIndex query and chat engines."""
    from rag_app.answers import llama_engines

    return llama_engines


class NoteNotFound(LookupError):
    """No note with that id (or not visible to this caller)."""


_NOTE_ID = re.compile(r"^(vault|memos):[^\x00-\x1f]{1,1000}$")


def validate_note_id(note_id: object) -> str:
    """Note ids are `vault:<vault>/<path>` or `memos:<source>/<uid>`: never file paths, never traversal."""
    if not isinstance(note_id, str) or not _NOTE_ID.match(note_id):
        raise SearchError("a note id looks like 'vault:<vault>/<path>.md' or 'memos:<source>/<uid>'")
    rest = note_id.split(":", 1)[1]
    if any(part in ("..", ".") for part in rest.split("/")) or rest.startswith("/") or "\\" in rest:
        raise SearchError("a note id cannot contain '..', '.', a leading '/' or backslashes")
    return note_id


def _citation_fields(note_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    out = {"note_id": note_id, "title": meta.get("title"), "source": meta.get("source"), "kind": meta.get("kind")}
    if meta.get("kind") == "memos":
        out.update(memo_id=meta.get("memo_id"), url=meta.get("url"))
    else:
        out["path"] = meta.get("path")
    return out


def _date(value: str | dt.date | None, name: str) -> dt.date | None:
    if value is None or value == "" or isinstance(value, dt.date):
        return value or None
    try:
        return dt.date.fromisoformat(str(value)[:10])
    except ValueError:
        raise SearchError(f"{name} must be a date like 2024-03-15, got {value!r}") from None


def _reuse_name(spec: SourceSpec, known: dict[str, SourceSpec]) -> SourceSpec:
    """A flag naming a known source's folder/URL reuses its name (and settings), so ids stay stable."""
    for other in known.values():
        if other.kind == spec.kind and (other.path or other.url) == (spec.path or spec.url):
            return other
    return spec


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _summary(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if not result:
        return None
    keys = ("added", "updated", "deleted", "unchanged", "skipped", "failed", "error")
    return {k: result.get(k) for k in keys} | {"warnings": len(result.get("warnings") or [])}
