"""Sync: list each source completely, plan against the manifest, then chunk and embed only what changed.

Writes come in the order that makes notes searchable soonest (see `_Applier`): chunk rows and BM25 tokens first,
then each dense model's vectors, every batch one SQLite commit. A crash between steps leaves work the manifest does
not record as done, so the next sync redoes exactly that; a failing source changes nothing at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rag_app.config import FAST_EMBEDDING, ConfigError, Settings, SourceSpec
from rag_app.index.keyword import TOKENIZER_VERSION, chunk_index_text, tokenize
from rag_app.index.keyword_store import keyword_progress, refresh_keyword_index
from rag_app.index.manifest import Manifest, ManifestEntry, Plan, make_plan
from rag_app.index.store import StoreError
from rag_app.index.topics import TOPIC_MODEL, fill_topics
from rag_app.ingest.chunking import chunker_id
from readers.listing import MemosLister, SourceLister, VaultLister
from readers.records import NoteRecord, SourceListing, decode_list, encode_list

log = logging.getLogger("cflow_brain.sync")
WRITE_BATCH_NOTES = 500  # notes chunked and committed at once (no model: fast)
FILL_BATCH_SECONDS = 2.0  # a fill batch is sized to take about this long, so a stop request is honoured soon
FIRST_FILL_BATCH, MIN_FILL_BATCH, MAX_FILL_BATCH = 4, 2, 512  # the first slice runs before the rate is known
MASS_DELETE_SHARE, MASS_DELETE_MIN = 0.5, 3  # a listing that would delete this share and this many notes is held
FILL_ERROR = "fill_error:"  # meta key prefix: the last fill failure per model, cleared once its fill completes
RETAIN_SECONDS = 7 * 86_400  # deleted chunks' vectors are kept this long, by content, for notes that come back
MAX_NOTE_CHUNKS = 1000  # chunks indexed of one note (~600 kB of text): one note cannot stall a channel or the index


class SyncBusyError(Exception):
    """Another process holds the sync lock."""


class Progress(Protocol):
    def start(self, total: int, description: str, unit: str = "chunk") -> None: ...
    def advance(self, count: int) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def start(self, total: int, description: str, unit: str = "chunk") -> None:
        pass

    def advance(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class SourceReport:
    name: str
    kind: str
    added: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped: int = 0
    deletes_held: int = 0  # notes this sync would have deleted but did not: see `_mass_delete`
    failed: bool = False
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    remembered: bool = True  # False: its first sync failed, so later syncs do not try it again
    store_failed: bool = False  # the failure was a store's (the docstore, Chroma), not this source's


@dataclass
class SyncReport:
    """`embedded_chunks`: chunks (re)written, searchable by BM25 at once; `vectors`: chunk vectors added per model."""

    sources: list[SourceReport] = field(default_factory=list)
    embedded_chunks: int = 0
    deleted_chunks: int = 0
    vectors: dict[str, int] = field(default_factory=dict)
    reused_vectors: int = 0  # of those, copied from identical text elsewhere in the home instead of embedded
    model_loaded: bool = False
    interrupted: bool = False
    fill_error: str | None = None
    store_error: str | None = None  # the first store failure a source met (each such source failed, kept its notes)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(s.failed for s in self.sources) or self.fill_error is not None or self.store_error is not None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


class SyncLock:
    """An exclusive flock on `<home>/sync.lock`; waits up to `wait` seconds, then refuses with who holds it."""

    def __init__(self, home: Path, wait: float):
        self.path = home / "sync.lock"
        self.wait = wait
        self._fd: int | None = None

    def __enter__(self) -> SyncLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise SyncBusyError(
                        f"another sync is running on {self.path.parent} (pid {holder}); "
                        f"waited {self.wait:g} s — try again when it finishes"
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):  # who holds the lock is only told to a waiting sync (a full disk: not)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def source_lister(spec: SourceSpec, token: str | None = None, known: Mapping[str, str] | None = None,
                  signatures: Mapping[str, str] | None = None) -> SourceLister:
    """The listing half of this source's reader (`VaultReader`, `MemosReader`). `token`: see `memos_token`; `known`:
    what the index holds of this source (see `_known`), so only new and changed notes come as records; `signatures`
    (memos): what each known memo's record was made from, so an unchanged memo is not even parsed.

    A sync lists with it (no LlamaIndex import: that alone takes 1.2-1.4 s, and a sync that finds nothing changed must
    finish within a second); when something changed, the Documents it chunks come from the reader's
    `lazy_load_data(listing=...)` over that same pass (see `_Applier.write_chunks`)."""
    if spec.kind == "vault":
        return VaultLister(spec.path, name=spec.name, known=known)
    return MemosLister(spec.url, token, include_archived=spec.include_archived,
                       include_comments=spec.include_comments, source=spec.name, known=known, signatures=signatures,
                       **spec.memos_limits())


TOKEN_ORIGIN = "memos_token_origin"


def memos_token(spec: SourceSpec, manifest: Manifest) -> tuple[str | None, str | None]:
    """The token this Memos source may be sent, and a warning when a token exists that is not its own.

    A token belongs to one server. `token_env` in a source's config names its own variable. The generic
    CFLOW_API_TOKEN / MEMOS_TOKEN belongs to the origin of the first Memos source synced with it: that binding,
    never the token, is kept in the manifest, and no other origin is sent the token."""
    from readers.memos_client import TOKEN_ENV_VARS, token_from_env

    if spec.token_env:
        token = os.environ.get(spec.token_env, "").strip()
        if not token:
            raise ConfigError(f"source {spec.name}: its token_env names ${spec.token_env}, which is not set")
        return token, None
    generic = token_from_env()
    bound = manifest.get_meta(TOKEN_ORIGIN)
    if not generic or bound in (None, url_origin(spec.url)):
        return generic, None
    return None, (f"{TOKEN_ENV_VARS[0]} belongs to {bound}, so it is not sent to {url_origin(spec.url)}; give this "
                  'source its own token: token_env = "VARIABLE" in its [[sources]] entry of config.toml')


def url_origin(url: str) -> str:
    """scheme://host:port, the unit a token belongs to."""
    parts = urlsplit(url.strip())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}"


class StopRequested:
    """A sync asked to stop (Ctrl-C, SIGTERM, a watcher shutting down): it ends after the batch in hand, with every
    finished batch committed, and the next sync resumes there."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


@contextmanager
def stop_on_signals(stop: StopRequested) -> Iterator[None]:
    """In the main thread, the first SIGINT/SIGTERM asks the sync to stop; a second SIGINT aborts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request(signum: int, frame: Any) -> None:
        if stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("stop requested (signal %d): finishing the batch in hand", signum)
        stop.set()

    previous = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_ENCODERS: dict[tuple[str, str], Any] = {}  # used by one sync at a time (the sync lock); searches load their own


def fill_order(models: list[str]) -> list[str]:
    """Dense models in the order their vectors are filled: the fast USE-m3 first, so meaning-search arrives soonest."""
    return sorted(models, key=lambda m: m != FAST_EMBEDDING)


class _Applier:
    """Writes what changed in the order that makes notes searchable soonest.

    1. `write_chunks`: chunk the added and changed notes and store chunk texts and BM25 tokens (no model needed);
       their old vectors go. BM25 search covers them as soon as the keyword index is refreshed, seconds later.
    2. `fill`: each dense model embeds the chunks of notes that lack its vectors, the fastest model first, in batches
       of about two seconds, each committed. An interrupted sync resumes with the notes still lacking, and nothing
       finished is embedded twice.

    `keep_hashes`: the records are stored note texts being rebuilt (doctor), so each note keeps its source hash.
    """

    def __init__(self, settings: Settings, manifest: Manifest, report: SyncReport, progress: Progress,
                 stop: StopRequested, keep_hashes: bool = False):
        self.settings = settings
        self.manifest = manifest
        self.report = report
        self.progress = progress
        self.stop = stop
        self.keep_hashes = keep_hashes
        self.chunker_id = chunker_id(settings.chunk_max_chars, settings.chunk_overlap)
        self._client: Any = None
        self._chunker: Any = None
        self._docstore: Any = None
        self._indexes: dict[str, Any] = {}
        self.written: set[str] = set()  # notes whose chunks this applier committed
        self.deleted: set[str] = set()  # notes it removed from the manifest

    @property
    def client(self) -> Any:
        if self._client is None:
            from rag_app.index.store import open_chroma

            self._client = open_chroma(self.settings, writing=True)  # under the sync lock: reread if written since
        return self._client

    @property
    def docstore(self) -> Any:
        """The ingestion docstore, opened when a sync first has a note to chunk or delete (never by a sync that finds
        nothing changed: that one does not even import LlamaIndex). An older home's notes are copied in once."""
        if self._docstore is None:
            from rag_app.index.docstore import docstore_name, is_new_docstore, open_docstore

            docstore = open_docstore(self.settings)
            try:
                _seed_docstore(self.manifest, docstore, docstore_name(self.settings), is_new_docstore(docstore))
            except BaseException:
                from rag_app.index.docstore import close_docstore

                close_docstore(docstore)
                raise
            self._docstore = docstore
        return self._docstore

    def stored_hashes(self, note_ids: list[str]) -> dict[str, str]:
        """The docstore's hash of each of these notes it holds (key lookups); nothing to look up, nothing opened."""
        if not note_ids:
            return {}
        if self._docstore is None and self.manifest.get_meta(DOCSTORE_SEEDED) == "1":
            from rag_app.index.docstore_health import home_file_hashes

            found = home_file_hashes(self.settings, note_ids)  # no LlamaIndex for a sync that may change nothing
            if found is not None:
                return found
        from rag_app.index.docstore import document_hashes

        return document_hashes(self.docstore, note_ids)

    def close(self) -> None:
        """Release the docstore, if this sync opened it."""
        if self._docstore is not None:
            from rag_app.index.docstore import close_docstore

            close_docstore(self._docstore)
            self._docstore = None

    def _index(self, model: str) -> Any:
        """The collection of one model, opened once per sync."""
        if model not in self._indexes:
            from rag_app.index.store import VectorIndex

            self._indexes[model] = VectorIndex(self.settings, model, client=self.client)
        return self._indexes[model]

    def _forget(self, note_ids: list[str], models: set[str], retain: bool = True) -> None:
        """Remove these notes' vectors from the collections of `models`; with `retain`, keep them by content first
        (`RETAIN_SECONDS`), so a note that comes back is not embedded again."""
        hashes = self.manifest.embed_hashes_of(note_ids) if retain else {}
        for model in sorted(models):
            index = self._index(model)
            if hashes:
                with self.manifest.transaction():
                    self.manifest.retain_vectors(model, index.vectors_by(hashes))
            index.forget(note_ids)

    def apply(self, source: str, plan: Plan, documents: Callable[[], Iterable[Any]]) -> list[str]:
        """Write the plan; returns warnings about notes (see `write_chunks`). `documents`: the listing's Documents,
        from the source's reader, asked for only when the plan has notes to chunk."""
        warnings = self.write_chunks(source, plan.to_embed, documents()) if plan.to_embed else []
        if plan.deleted:
            self.delete(plan.deleted)
        return warnings

    def write_chunks(self, source: str, records: list[NoteRecord], documents: Iterable[Any] | None = None) -> list[str]:
        """Chunk notes through an IngestionPipeline (chunker only) and commit chunk rows and tokens per batch. A note
        keeps its first `MAX_NOTE_CHUNKS` chunks, with a warning (returned).

        `documents`: the records' Documents as the source's reader yields them (`ListingReader.lazy_load_data`; any
        others are passed over); None makes them from the records (`brain doctor` rebuilding from stored texts)."""
        from rag_app.index.docstore import forget_documents
        from rag_app.ingest.pipeline import embed_hash

        if self._chunker is None:
            from rag_app.ingest.pipeline import chunking_pipeline

            self._chunker = chunking_pipeline(self.settings.chunk_max_chars, self.settings.chunk_overlap,
                                              docstore=self.docstore)
        self.progress.start(len(records), f"bm25 {source}", unit="note")
        warnings: list[str] = []
        wanted = {r.id: r for r in records}
        planned = _planned(documents if documents is not None else (r.to_document() for r in records), wanted)
        while not self.stop and (documents_batch := list(islice(planned, WRITE_BATCH_NOTES))):
            batch = [wanted.pop(d.id_) for d in documents_batch]
            ids = [r.id for r in batch]
            old = self.manifest.entries_for(ids)
            stale = {m for e in old.values() for m in e.models}
            if stale:
                self._forget([i for i in ids if i in old], stale)
            stored = self.stored_hashes(ids)
            # Planned for chunking though the docstore holds this very version: the chunker changed, a rebuild was
            # asked for, or a sync died between the docstore's write and the manifest's commit. Forgotten, so the
            # docstore lets them through.
            forget_documents(self.docstore, [r.id for r in batch if stored.get(r.id) == r.content_hash])
            nodes = self._chunker.run(documents=documents_batch)
            by_note: dict[str, list[Any]] = {note_id: [] for note_id in ids}
            for node in nodes:
                by_note[node.ref_doc_id].append(node)
            rows = []
            with self.manifest.transaction():
                self.manifest.delete_chunks_of(ids)
                for record in batch:
                    chunk_nodes = by_note[record.id]
                    if len(chunk_nodes) > MAX_NOTE_CHUNKS:
                        warnings.append(f"{record.id}: too long to index whole: the first {MAX_NOTE_CHUNKS} of "
                                        f"{len(chunk_nodes)} chunks are indexed, the rest is not searchable")
                        chunk_nodes = chunk_nodes[:MAX_NOTE_CHUNKS]
                    rows += [(n.id_, record.id, source, n.text, meta, tokenize(chunk_index_text(n.text, meta)),
                              embed_hash(n)) for n in chunk_nodes for meta in (_chunk_metadata(n.metadata),)]
                    kept = old[record.id].hash if self.keep_hashes and record.id in old else None
                    self.manifest.put_note(record, source, "", self.chunker_id, [n.id_ for n in chunk_nodes],
                                           content_hash=kept)
                self.manifest.put_chunks(rows)
            self.written.update(ids)
            self.report.embedded_chunks += len(rows)
            self.report.deleted_chunks += sum(len(e.chunk_ids) for e in old.values())
            self.progress.advance(len(batch))
        self.progress.close()
        if wanted and not self.stop:
            raise RuntimeError(f"the reader yielded no Document for {len(wanted)} listed notes, "
                               f"e.g. {next(iter(wanted))}")
        return warnings

    def delete(self, note_ids: list[str], retain: bool = True) -> None:
        entries = self.manifest.entries_for(note_ids)
        models = {m for e in entries.values() for m in e.models}
        if models:
            self._forget(note_ids, models, retain)
        with self.manifest.transaction():
            self.manifest.delete_notes(note_ids)
        self.deleted.update(note_ids)
        if note_ids:
            from rag_app.index.docstore import forget_documents

            forget_documents(self.docstore, note_ids)
        self.report.deleted_chunks += sum(len(e.chunk_ids) for e in entries.values())

    def fill(self) -> None:
        """Give every note the vectors of every configured model it lacks, the fastest model first; the notes' topics
        (rag_app.index.topics) right after the fast model's chunks."""
        for model in fill_order(self.settings.models):
            if self.stop:
                return
            self._fill(model)
            if model == TOPIC_MODEL and not self.stop:
                fill_topics(self.manifest, lambda texts: self._encoder(TOPIC_MODEL).get_text_embedding_batch(texts),
                            stop=lambda: bool(self.stop))

    def _encoder(self, model: str) -> Any:
        """A model's embedding, loaded once per process: a watcher's next sync starts embedding at once."""
        key = (model, repr(self.settings.remote_embedding))
        if key not in _ENCODERS:
            from rag_app.index.embeddings import load_embedding

            _ENCODERS[key] = load_embedding(model, self.settings)
        self.report.model_loaded = True
        return _ENCODERS[key]

    def _fill(self, model: str) -> None:
        lacking = self.manifest.notes_lacking(model)
        if not lacking:
            return
        from rag_app.ingest.pipeline import embedding_pipeline

        sizes = self.manifest.chunk_counts(lacking)
        total = sum(sizes.values())
        index = self._index(model)
        embed = self._encoder(model)
        pipeline = embedding_pipeline(embed)
        self.progress.start(total, model)
        queue = deque(lacking)
        try:
            self._fill_queue(model, queue, sizes, index, pipeline)
        except Exception as exc:  # recorded for `brain doctor`, which names a channel that cannot complete and why
            with self.manifest.transaction():
                self.manifest.set_meta(f"{FILL_ERROR}{model}", _one_line(exc))
            raise
        if not queue:
            self.manifest.delete_meta(f"{FILL_ERROR}{model}")
        self.progress.close()

    def _fill_queue(self, model: str, queue: deque[str], sizes: dict[str, int], index: Any, pipeline: Any) -> None:
        """Embed the queued notes in batches of about `FILL_BATCH_SECONDS`, each committed, until done or stopped.

        A batch is bounded in chunks, not notes: a long note is embedded in slices, the stop request honoured between
        them; a note stopped part-way keeps the vectors it got by content (`_keep_partial`), so no slice is lost."""
        from rag_app.ingest.pipeline import nodes_from_rows

        batch_chunks, done, started = FIRST_FILL_BATCH, 0, time.monotonic()
        while queue and not self.stop:
            batch: list[str] = []
            chunks = 0
            while queue and (not batch or chunks + sizes[queue[0]] <= batch_chunks):
                chunks += sizes[queue[0]]
                batch.append(queue.popleft())
            index.forget(batch)  # vectors a crashed run added but never recorded
            nodes = nodes_from_rows(self.manifest.chunks_for_notes(batch))
            added = self._add_reused(nodes, model, index)
            fresh = [n for n in nodes if n.embedding is None]
            start = 0
            while start < len(fresh) and not self.stop:
                part, part_started = fresh[start : start + batch_chunks], time.monotonic()
                start += len(part)
                try:
                    pipeline.run(nodes=part)
                except Exception as exc:
                    self._keep_partial(model, batch, nodes, getattr(exc, "partial", {}), index, added)
                    raise
                self.progress.advance(len(part))
                rate = len(part) / max(time.monotonic() - part_started, 1e-3)
                batch_chunks = max(MIN_FILL_BATCH, min(MAX_FILL_BATCH, int(rate * FILL_BATCH_SECONDS)))
            if any(n.embedding is None for n in nodes):
                if not self.stop:
                    raise RuntimeError(f"{model} returned no vector for some chunks of {batch[0]}")
                self._keep_partial(model, batch, nodes, {}, index, added)  # stopped inside a long note
                return
            if new := [n for n in nodes if n.id_ not in added]:
                index.vector_store().add(new)
            done += len(nodes)
            with self.manifest.transaction():
                self.manifest.add_model(batch, model)
                self.manifest.set_meta(f"fill_rate:{model}", f"{done / max(time.monotonic() - started, 1e-3):.3f}")
            self.report.vectors[model] = self.report.vectors.get(model, 0) + len(nodes)

    def _add_reused(self, nodes: list[Any], model: str, index: Any) -> set[str]:
        """Write the vectors `_reuse_vectors` found; the ids of the nodes now in the store."""
        reused = self._reuse_vectors(nodes, model, index)
        if reused:
            index.vector_store().add(reused)
            self.report.reused_vectors += len(reused)
            self.progress.advance(len(reused))
        return {n.id_ for n in reused}

    def _keep_partial(self, model: str, batch: list[str], nodes: list[Any], partial: dict[str, list[float]],
                      index: Any, added: set[str]) -> None:
        """A batch ended part-way (an embedding server died, or a stop inside a long note): commit the notes whose
        chunks all got vectors, and keep the other vectors by content (as for deleted notes), so the next sync embeds
        none of them again. A half-embedded note leaves no vectors in the index: it is filled whole or not at all."""
        import numpy as np
        from llama_index.core.schema import MetadataMode

        from rag_app.ingest.pipeline import embed_hash

        filled = 0
        for node in nodes:
            if node.embedding is None:
                node.embedding = partial.get(node.get_content(metadata_mode=MetadataMode.EMBED))
                filled += node.embedding is not None
        if filled:
            self.progress.advance(filled)  # the slices before reported theirs
        lacking = {n.ref_doc_id for n in nodes if n.embedding is None}
        kept = {embed_hash(n): np.asarray(n.embedding, dtype=np.float32).tobytes() for n in nodes
                if n.ref_doc_id in lacking and n.embedding is not None}
        if kept:
            with self.manifest.transaction():
                self.manifest.retain_vectors(model, kept)
        if lacking:
            index.forget(sorted(lacking))
        whole = [note for note in batch if note not in lacking]
        if not whole:
            return
        new = [n for n in nodes if n.ref_doc_id not in lacking and n.id_ not in added]
        if new:
            index.vector_store().add(new)
        with self.manifest.transaction():
            self.manifest.add_model(whole, model)
        count = sum(1 for n in nodes if n.ref_doc_id not in lacking)
        self.report.vectors[model] = self.report.vectors.get(model, 0) + count

    def _reuse_vectors(self, nodes: list[Any], model: str, index: Any) -> list[Any]:
        """Nodes whose very text is already embedded elsewhere in the home, or was in a note deleted lately (kept
        vectors, `RETAIN_SECONDS`), get that vector instead of a new one."""
        import numpy as np

        from rag_app.ingest.pipeline import embed_hash

        reused = []
        copies = self.manifest.embedded_copies([n.id_ for n in nodes], model)
        if copies:
            got = index.collection.get(ids=sorted(set(copies.values())), include=["embeddings"])
            vectors = dict(zip(got["ids"], got["embeddings"], strict=True))
            for node in nodes:
                vector = vectors.get(copies.get(node.id_, ""))
                if vector is not None:
                    node.embedding = [float(x) for x in vector]
                    reused.append(node)
        rest = {embed_hash(n): n for n in nodes if n.embedding is None}
        for digest, blob in self.manifest.retained_vectors(list(rest), model).items():
            rest[digest].embedding = np.frombuffer(blob, dtype=np.float32).tolist()
            reused.append(rest[digest])
        return reused

    def finish(self) -> None:
        """Once every note has every configured model's vectors, drop the other models' collections (a model switch
        keeps the old vectors until the new ones are complete)."""
        configured = set(self.settings.models)
        extra = self.manifest.models_in_use() - configured
        if self.stop or any(self.manifest.notes_lacking(m, limit=1) for m in configured):
            return
        if extra:
            with self.manifest.transaction():
                self.manifest.keep_only_models(configured)
        if extra or self._client is not None:
            from rag_app.index.store import drop_unused_collections

            for name in drop_unused_collections(self.settings, self.client, configured):
                log.info("dropped collection %s (no note uses its model any more)", name)


DOCSTORE_SEEDED = "docstore_seeded"


def _planned(documents: Iterable[Any], wanted: Mapping[str, NoteRecord]) -> Iterator[Any]:
    """The Documents of the notes to chunk, each once, in the reader's order."""
    seen: set[str] = set()
    for document in documents:
        if document.id_ in wanted and document.id_ not in seen:
            seen.add(document.id_)
            yield document


def _seed_docstore(manifest: Manifest, docstore: Any, name: str, new_file: bool) -> int:
    """Once per docstore a home writes to (its file, or each PostgreSQL database it is pointed at; again when the
    file was deleted or emptied): notes indexed before go into it from their kept text, under the hash they were
    indexed with, so nothing is chunked or embedded again for it. Repeating it after a crash rewrites the same
    Documents. Returns how many it copied."""
    mark = DOCSTORE_SEEDED if name == "home" else f"{DOCSTORE_SEEDED}:{name}"
    if manifest.get_meta(mark) == "1" and not new_file:
        return 0
    from readers.note_document import NoteDocument

    entries = manifest.entries()
    missing = [note_id for note_id in entries if not docstore.document_exists(note_id)]
    copied = 0
    for start in range(0, len(missing), WRITE_BATCH_NOTES):
        documents, hashes = [], {}
        for note_id in missing[start : start + WRITE_BATCH_NOTES]:
            kept = manifest.note_doc(note_id)
            if kept is None:  # no text kept: the next listing chunks it again, as before
                continue
            text, metadata = kept
            documents.append(NoteDocument(id_=note_id, text=text, metadata=metadata))
            hashes[note_id] = entries[note_id].hash
        docstore.add_documents(documents)
        docstore.set_document_hashes(hashes)
        copied += len(documents)
    manifest.set_meta(mark, "1")
    return copied


def rebuild_docstore(settings: Settings, manifest: Manifest, forget: list[str]) -> int:
    """`brain doctor --repair`: give the docstore every note the manifest holds, from the kept texts (no source read,
    nothing embedded), after dropping `forget` (notes it holds under another hash, or that the index no longer has).
    Forced, whatever the seed mark says: the mark only says the docstore was filled once. The caller holds the
    SyncLock. Returns how many notes it copied in."""
    from rag_app.index.docstore import close_docstore, docstore_name, forget_documents, open_docstore

    docstore = open_docstore(settings)
    try:
        forget_documents(docstore, forget)
        return _seed_docstore(manifest, docstore, docstore_name(settings), new_file=True)
    finally:
        close_docstore(docstore)


def _widen_search_beam(settings: Settings, manifest: Manifest) -> None:
    """Once per home: collections made before ef_search was set get it (a no-change sync otherwise never opens
    Chroma). Recorded in the manifest, so later syncs do not import chromadb for it."""
    from rag_app.index.store import (  # chromadb itself stays unloaded
        SEARCH_EF,
        collection_name,
        exact_enough,
        open_chroma,
    )

    if manifest.get_meta("hnsw_ef_search") == str(SEARCH_EF) or not manifest.counts():
        return

    client = open_chroma(settings)
    for model in settings.models:
        try:
            collection = client.get_collection(collection_name(model))
        except Exception:  # not created yet (nothing embedded with this model)
            continue
        exact_enough(collection)
    manifest.set_meta("hnsw_ef_search", str(SEARCH_EF))


MEMO_ID_SCHEME = "memos:<source>/<uid>"
_ID_KEYS = frozenset({"note_id", "document_id", "doc_id", "ref_doc_id", "parent", "id_", "node_id"})


def _namespace_memo_ids(settings: Settings, manifest: Manifest) -> None:
    """Once per home: ids of homes made before memo ids were namespaced by source (`memos:<uid>`, which let two
    servers' memos 1, 2, … overwrite each other) become `memos:<source>/<uid>`, vectors moved, nothing re-embedded.

    Chroma first, then one manifest transaction with the flag: after a crash the next sync repeats it harmlessly."""
    if manifest.get_meta("memo_ids") == MEMO_ID_SCHEME:
        return
    entries = {n: e for n, e in manifest.entries().items() if n.startswith("memos:")}
    by_source: dict[str, dict[str, str]] = {}
    for old, entry in entries.items():
        by_source.setdefault(entry.source, {})[old] = _old_memo_id_renamed(old, entry.source)
    if entries:
        from rag_app.index.store import collection_name, open_chroma, rename_chunks

        client = open_chroma(settings)
        for model in {m for e in entries.values() for m in e.models}:
            try:
                collection = client.get_collection(collection_name(model))
            except Exception:  # no collection of this model (nothing was embedded with it)
                continue
            for source, renames in by_source.items():
                chunks = {c: new + c[len(old):] for old, new in renames.items() for c in entries[old].chunk_ids}
                rename_chunks(collection, chunks, lambda meta, source=source: _remap_memo_ids(meta, source))
    with manifest.transaction():
        for source, renames in by_source.items():
            manifest.rename_notes(renames, lambda meta, source=source: _remap_memo_ids(meta, source))
        manifest.set_meta("memo_ids", MEMO_ID_SCHEME)
    if entries:
        log.info("note ids of %d memos namespaced by source (no re-embedding)", len(entries))


def _old_memo_id_renamed(value: str, source: str) -> str:
    """`memos:<uid>` or `memos:<uid>:chunk:<n>` of an older home, in the namespaced form; anything else as it is."""
    from readers.memos_client import memo_note_id

    if not value.startswith("memos:"):
        return value
    note, marker, n = value.partition(":chunk:")
    return memo_note_id(source, note.removeprefix("memos:")) + marker + n


def _remap_memo_ids(meta: dict[str, Any], source: str) -> dict[str, Any]:
    """Metadata with the ids it holds (links, parent, LlamaIndex's node and document ids) renamed."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "links" and isinstance(value, str):
            value = encode_list([_old_memo_id_renamed(v, source) for v in decode_list(value)])
        elif key == "_node_content" and isinstance(value, str):
            value = json.dumps(_remap_memo_ids(json.loads(value), source))
        elif key in _ID_KEYS and isinstance(value, str):
            value = _old_memo_id_renamed(value, source)
        elif isinstance(value, dict):
            value = _remap_memo_ids(value, source)
        out[key] = value
    return out


def channel_progress(settings: Settings, manifest: Manifest) -> dict[str, dict[str, Any]]:
    """How far each search channel has come: chunks it covers, complete or not, and (dense models) time left at the
    rate the last fill measured."""
    total, per_model = manifest.channel_counts()
    channels: dict[str, dict[str, Any]] = {"bm25": keyword_progress(settings, manifest, total)}
    for model in fill_order(settings.models):
        done = per_model.get(model, 0)
        rate = float(manifest.get_meta(f"fill_rate:{model}") or 0)
        left = total - done
        channels[model] = {"chunks": done, "complete": left == 0,
                           "seconds_left": 0 if left == 0 else round(left / rate) if rate else None}
    return channels


def time_left(seconds: float | None) -> str:
    """A channel's `seconds_left` as people say it (status line of the CLI and the page)."""
    if seconds is None:
        return "time left unknown"
    if seconds < 90:
        return f"~{max(1, round(seconds))} s left"
    if seconds < 5400:
        return f"~{round(seconds / 60)} min left"
    return f"~{seconds / 3600:.1f} h left"


def reembed_stored(
    settings: Settings, manifest: Manifest, records: dict[str, list[NoteRecord]], progress: Progress | None = None
) -> SyncReport:
    """Chunk and embed notes again from their stored text (source → records), as a sync would.

    For `brain doctor --repair`: no source is read. The caller holds the SyncLock and rebuilds BM25 afterwards.
    """
    report = SyncReport()
    applier = _Applier(settings, manifest, report, progress or NoProgress(), StopRequested(), keep_hashes=True)
    try:
        for source, batch in records.items():
            applier.write_chunks(source, batch)
        applier.fill()
        applier.finish()
    finally:
        applier.close()
    return report


def fill_vectors(settings: Settings, manifest: Manifest, progress: Progress | None = None) -> SyncReport:
    """Give every note the vectors it lacks, reading no source: `brain doctor --repair` of a channel a sync could not
    complete. The caller holds the SyncLock."""
    report = SyncReport()
    applier = _Applier(settings, manifest, report, progress or NoProgress(), StopRequested())
    try:
        applier.fill()
    except Exception as exc:  # still failing: said in the repair report, recorded for the next doctor
        report.fill_error = _one_line(exc)
    applier.finish()
    return report


def _chunk_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if not k.startswith("_")}


def sync_sources(
    settings: Settings,
    specs: list[SourceSpec],
    progress: Progress | None = None,
    on_source: Callable[[SourceReport], None] | None = None,
    stop: StopRequested | None = None,
    on_searchable: Callable[[], None] | None = None,
    allow_deletes: frozenset[str] = frozenset(),
) -> SyncReport:
    """Sync the given sources (and only those) into the index under `settings.home`.

    Every source is listed and its changes chunked first, then BM25 is saved (keyword search covers every note), then
    the dense models fill in their vectors (`on_searchable` hears when that starts). `stop` (or, in the main thread,
    Ctrl-C / SIGTERM) ends it early: what is committed stays searchable, and the next sync resumes. A listing that
    would delete most of a source is held (see `_mass_delete`) unless the source is named in `allow_deletes`."""
    started = time.monotonic()
    report = SyncReport()
    progress = progress or NoProgress()
    stop = stop if stop is not None else StopRequested()
    with SyncLock(settings.home, settings.lock_wait_seconds), stop_on_signals(stop):
        manifest = Manifest(settings.manifest_path)
        applier = _Applier(settings, manifest, report, progress, stop)
        try:
            if not manifest.counts() and manifest.get_meta("tokenizer_version") is None:
                manifest.set_meta("tokenizer_version", TOKENIZER_VERSION)  # a new home: its tokens are all current
            _namespace_memo_ids(settings, manifest)
            for spec in specs:
                if stop:
                    break
                source_report = _sync_one(spec, manifest, applier, spec.name in allow_deletes)
                report.sources.append(source_report)
                if on_source:
                    on_source(source_report)
                if source_report.store_failed and report.store_error is None:
                    report.store_error = source_report.error
            refresh_keyword_index(settings, manifest)
            if on_searchable:
                on_searchable()
            try:
                applier.fill()
            except Exception as exc:  # a model or store failure: the chunks are searchable, the rest is retried
                report.fill_error = _one_line(exc)
                log.error("filling vectors failed: %s", report.fill_error)
            applier.finish()
            with manifest.transaction():
                manifest.purge_retained(time.time() - RETAIN_SECONDS, set(settings.models))
            if report.fill_error is None:  # a store that just failed is tried again at the next sync
                _widen_search_beam(settings, manifest)
        finally:
            applier.close()
            manifest.close()
    report.interrupted = bool(stop)
    report.seconds = time.monotonic() - started
    return report


def remove_source(settings: Settings, name: str) -> int:
    """Drop a source, its notes' chunks and vectors, under the lock; returns how many notes went. The generic token's
    binding goes with the last source of its server."""
    with SyncLock(settings.home, settings.lock_wait_seconds):
        manifest = Manifest(settings.manifest_path)
        try:
            if name not in manifest.sources():
                raise ConfigError(f"unknown source {name!r}; known: {sorted(manifest.sources()) or 'none'}")
            note_ids = sorted(manifest.entries(name))
            applier = _Applier(settings, manifest, SyncReport(), NoProgress(), StopRequested())
            try:
                applier.delete(note_ids, retain=False)  # removing a source is explicit: its vectors go at once
            finally:
                applier.close()
            with manifest.transaction():
                manifest.delete_source(name)
                servers = {url_origin(str(row["spec"].get("url"))) for row in manifest.sources().values()
                           if row["kind"] == "memos"}
                if manifest.get_meta(TOKEN_ORIGIN) not in servers:
                    manifest.delete_meta(TOKEN_ORIGIN)
            refresh_keyword_index(settings, manifest)
        finally:
            manifest.close()
    return len(note_ids)


def _sync_one(spec: SourceSpec, manifest: Manifest, applier: _Applier, allow_deletes: bool = False) -> SourceReport:
    result = SourceReport(name=spec.name, kind=spec.kind)
    first_time = spec.name not in manifest.sources()
    manifest.put_source(spec.name, spec.kind, spec.to_dict())
    try:
        token, token_warning = memos_token(spec, manifest) if spec.kind == "memos" else (None, None)
        entries = manifest.entries(spec.name)
        known = _known(spec, manifest, entries, applier.chunker_id)
        signatures = manifest.trusted_signatures(spec.name, applier.chunker_id) if spec.kind == "memos" else None
        lister = source_lister(spec, token, known=known, signatures=signatures)
        listing = lister.list()
    except Exception as exc:  # any failure of the source: keep everything it had
        result.failed = True
        result.error = _one_line(exc, spec.token_env)
        log.warning("source %s failed, nothing changed: %s", spec.name, result.error)
        if first_time:  # a typo or an unreachable server is not remembered: a plain `brain sync` won't retry it
            manifest.delete_source(spec.name)
            result.remembered = False
        else:
            manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    if token and not spec.token_env and manifest.get_meta(TOKEN_ORIGIN) is None:
        manifest.set_meta(TOKEN_ORIGIN, url_origin(spec.url))
    result.warnings = ([token_warning] if token_warning else []) + listing.warnings
    result.skipped = listing.skipped
    for warning in listing.warnings:
        log.warning("%s: %s", spec.name, warning)
    try:
        stored = applier.stored_hashes([r.id for r in listing.records if r.id in entries])
    except StoreError as exc:  # the docstore cannot be read (a database down, a damaged file): nothing changed
        return _store_failed(spec.name, manifest, result, exc)
    plan = make_plan(entries, listing.records, listing.kept_ids, applier.chunker_id,
                     unchanged_ids=listing.unchanged_ids, stored_hashes=stored)
    held = None if allow_deletes else _mass_delete(spec.name, len(entries), plan)
    if held:
        result.failed, result.error, result.deletes_held = True, held, len(plan.deleted)
        log.warning("source %s: %s", spec.name, held)
        manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    _backfill_docs(manifest, spec.name, listing.records, plan)
    result.unchanged = plan.unchanged
    try:
        for warning in applier.apply(spec.name, plan, lambda: lister.reader().lazy_load_data(listing=listing)):
            result.warnings.append(warning)
            log.warning("%s: %s", spec.name, warning)
    except StoreError as exc:  # the docstore or Chroma failed part-way: finished batches are committed
        _count_done(result, plan, applier)
        return _store_failed(spec.name, manifest, result, exc)
    except Exception as exc:  # a model failure part-way: finished batches are committed, the rest retried
        _count_done(result, plan, applier)
        result.failed = True
        result.error = _one_line(exc, spec.token_env)
        log.error("source %s: applying changes failed: %s", spec.name, result.error)
        manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    _count_done(result, plan, applier)
    _remember_signatures(spec, manifest, listing, known)
    manifest.record_result(spec.name, asdict(result), succeeded=True)
    log.info("synced %s: +%d ~%d -%d =%d", spec.name, result.added, result.updated, result.deleted, result.unchanged)
    return result


def _count_done(result: SourceReport, plan: Plan, applier: _Applier) -> None:
    """What this source's sync really committed (a failure or a stop part-way leaves the rest for the next sync)."""
    result.added = sum(1 for r in plan.added if r.id in applier.written)
    result.updated = sum(1 for r in plan.changed if r.id in applier.written)
    result.deleted = sum(1 for note_id in plan.deleted if note_id in applier.deleted)


def _store_failed(name: str, manifest: Manifest, result: SourceReport, exc: StoreError) -> SourceReport:
    """A store (the docstore, the Chroma server) failed while this source synced: the store is named, with what to do,
    in one line (never SQL or note text). Later sources still sync: one with nothing to write never opens it."""
    result.failed = result.store_failed = True
    result.error = _one_line(exc)
    log.error("source %s: %s", name, result.error)
    manifest.record_result(name, asdict(result), succeeded=False)
    return result


def _mass_delete(name: str, indexed: int, plan: Plan) -> str | None:
    """Why this plan's deletions are held, or None. An unmounted disk, a sync client that empties a folder before
    refilling it, a wrong path in config.toml or a Memos server that suddenly lists nothing all look like a source
    whose notes were deleted: a listing that finds none of the source's notes, or that would delete at least half of
    them and at least `MASS_DELETE_MIN`, deletes nothing until confirmed. A few deletions in a small source pass."""
    deleted = len(plan.deleted)
    listed = indexed - deleted
    if not deleted or (listed and (deleted < MASS_DELETE_MIN or deleted < MASS_DELETE_SHARE * indexed)):
        return None
    return (f"the listing found {listed} of its {indexed} notes, so this sync would delete {deleted} "
            f"({100 * deleted // indexed} %); nothing was changed. If they are really gone: "
            f"brain sync --allow-deletes {name} (or brain source remove {name})")


def _known(spec: SourceSpec, manifest: Manifest, entries: Mapping[str, ManifestEntry], chunker: str) -> dict[str, str]:
    """What the index holds of this source for its reader: note id → vault file signature or memo content hash.

    A note is trusted (its fingerprint given) only when its entry is current: chunked with this chunker, its text kept
    (see `Manifest.trusted_signatures`). Any other note maps to "", so the reader reads and lists it again."""
    if spec.kind == "vault":
        trusted = manifest.trusted_signatures(spec.name, chunker)
    else:
        without_docs = manifest.notes_without_docs(spec.name)
        trusted = {note_id: entry.hash for note_id, entry in entries.items()
                   if entry.chunker == chunker and note_id not in without_docs}
    return {note_id: trusted.get(note_id, "") for note_id in entries}


def _remember_signatures(spec: SourceSpec, manifest: Manifest, listing: SourceListing,
                         known: Mapping[str, str]) -> None:
    """Store the signatures of the notes parsed this time (vault files, memo answers) with their hashes, for the next
    sync to compare."""
    hashes = {r.id: r.content_hash for r in listing.records}
    if spec.kind == "memos":  # parsed and found unchanged (its answer changed, not its record): the hash it had
        hashes.update({i: known[i] for i in listing.signatures if i not in hashes and known.get(i)})
    parsed = {note_id: (signature, hashes[note_id]) for note_id, signature in listing.signatures.items()
              if note_id in hashes}
    with manifest.transaction():
        manifest.put_signatures(spec.name, parsed, listing.unchanged_ids | listing.kept_ids)


def _backfill_docs(manifest: Manifest, source: str, records: list[NoteRecord], plan: Plan) -> None:
    """Indexes made before note texts were kept get them from this listing, without re-embedding."""
    missing = manifest.notes_without_docs(source) - {r.id for r in plan.to_embed}
    if missing:
        with manifest.transaction():
            for record in records:
                if record.id in missing:
                    manifest.put_doc(record, source)


def _one_line(exc: BaseException, token_env: str = "") -> str:
    """An error as one short line for the report, the manifest and the log: never a token or a bearer header, even
    when a server echoed one back (every secret the environment holds for a source or a model is removed)."""
    from readers.redaction import redact_secrets

    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_secrets(text, _secrets_in_environment(token_env))[:500]


SECRET_ENV_VARS = ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "EMBEDDING_API_KEY", "OPENAI_API_KEY", "LLM_API_KEY")


def _secrets_in_environment(token_env: str = "") -> list[str]:
    names = {*SECRET_ENV_VARS, token_env} | {n for n in os.environ if n.endswith(("_TOKEN", "_API_KEY", "_SECRET"))}
    return [os.environ[n] for n in names if len(os.environ.get(n, "").strip()) >= 8]
