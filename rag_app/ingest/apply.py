"""Applying a sync's plan: chunk through the IngestionPipeline (its docstore decides), then fill every dense model's
vectors, in the order that makes notes searchable soonest."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

from rag_app.config import Settings
from rag_app.index.keyword import chunk_index_text, tokenize
from rag_app.index.manifest import Manifest
from rag_app.index.topics import TOPIC_MODEL, fill_topics
from rag_app.ingest.chunking import chunker_id
from rag_app.ingest.lock import StopRequested
from rag_app.ingest.migrations import DOCSTORE_SEEDED, seed_docstore
from rag_app.ingest.plan import Plan
from rag_app.ingest.progress import Progress, fill_order
from rag_app.ingest.report import SyncReport
from readers.records import NoteRecord
from readers.redaction import one_line

log = logging.getLogger("cflow_brain.sync")
WRITE_BATCH_NOTES = 500  # notes chunked and committed at once (no model: fast)
FILL_BATCH_SECONDS = 2.0  # a fill batch is sized to take about this long, so a stop request is honoured soon
FIRST_FILL_BATCH, MIN_FILL_BATCH, MAX_FILL_BATCH = 4, 2, 512  # the first slice runs before the rate is known
FILL_ERROR = "fill_error:"  # meta key prefix: the last fill failure per model, cleared once its fill completes
RETAIN_SECONDS = 7 * 86_400  # deleted chunks' vectors are kept this long, by content, for notes that come back
MAX_NOTE_CHUNKS = 1000  # chunks indexed of one note (~600 kB of text): one note cannot stall a channel or the index


_ENCODERS: dict[tuple[str, str], Any] = {}  # used by one sync at a time (the sync lock); searches load their own


class Applier:
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
        self.kept: set[str] = set()  # offered notes the docstore held unchanged: nothing written
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
                seed_docstore(self.manifest, docstore, docstore_name(self.settings), is_new_docstore(docstore))
                _forget_pending(self.manifest, docstore)
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
        from the source's reader, asked for only when the plan offers notes."""
        warnings = self.write_chunks(source, plan.offered, documents(), plan.forced) if plan.offered else []
        if plan.deleted:
            self.delete(plan.deleted)
        return warnings

    def write_chunks(self, source: str, records: list[NoteRecord], documents: Iterable[Any] | None = None,
                     forced: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Offer notes to the chunking IngestionPipeline, whose docstore decides: a note it holds under the same hash
        is skipped (`self.kept`), a new or changed one is chunked and its rows and tokens committed per batch
        (`self.written`). `forced` notes are chunked whatever the docstore holds (the index has no current chunks of
        them). A note keeps its first `MAX_NOTE_CHUNKS` chunks, with a warning (returned).

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
            batch = {d.id_: wanted.pop(d.id_) for d in documents_batch}
            self.manifest.mark_pending(list(batch))
            forget_documents(self.docstore, [i for i in batch if i in forced])
            nodes = self._chunker.run(documents=documents_batch, store_doc_text=False)
            by_note: dict[str, list[Any]] = {}
            for node in nodes:
                by_note.setdefault(node.ref_doc_id, []).append(node)
            chunked = [record for note_id, record in batch.items() if note_id in by_note]
            ids = [record.id for record in chunked]
            old = self.manifest.entries_for(ids)
            stale = {m for e in old.values() for m in e.models}
            if stale:
                self._forget(list(old), stale)
            rows = []
            with self.manifest.transaction():
                self.manifest.delete_chunks_of(ids)
                for record in chunked:
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
                self.manifest.clear_pending(list(batch))
            self.written.update(ids)
            kept = [record for note_id, record in batch.items() if note_id not in by_note]
            self.kept.update(record.id for record in kept)
            self.manifest.confirm_versions({r.id: r.content_hash for r in kept})
            self.report.chunks_written += len(rows)
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
                self.manifest.set_meta(f"{FILL_ERROR}{model}", one_line(exc))
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
                index.add(new)
            done += len(nodes)
            with self.manifest.transaction():
                self.manifest.add_model(batch, model)
                self.manifest.set_meta(f"fill_rate:{model}", f"{done / max(time.monotonic() - started, 1e-3):.3f}")
            self.report.vectors[model] = self.report.vectors.get(model, 0) + len(nodes)

    def _add_reused(self, nodes: list[Any], model: str, index: Any) -> set[str]:
        """Write the vectors `_reuse_vectors` found; the ids of the nodes now in the store."""
        reused = self._reuse_vectors(nodes, model, index)
        if reused:
            index.add(reused)
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
            index.add(new)
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


def _planned(documents: Iterable[Any], wanted: Mapping[str, NoteRecord]) -> Iterator[Any]:
    """The Documents of the notes to chunk, each once, in the reader's order."""
    seen: set[str] = set()
    for document in documents:
        if document.id_ in wanted and document.id_ not in seen:
            seen.add(document.id_)
            yield document


def _forget_pending(manifest: Manifest, docstore: Any) -> None:
    """A sync that died between the docstore's write and the index's commit left those notes journaled: the docstore
    forgets them, so it lets them through when they are offered again (their sources list them: nothing was recorded
    as done), and the index converges."""
    pending = manifest.pending_notes()
    if pending:
        from rag_app.index.docstore import forget_documents

        forget_documents(docstore, pending)
        with manifest.transaction():
            manifest.clear_pending(pending)
        log.info("%d notes of an interrupted sync are offered to the docstore again", len(pending))


def _chunk_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if not k.startswith("_")}
