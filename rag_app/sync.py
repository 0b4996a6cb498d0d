"""Sync: list each source completely, plan against the manifest, then embed only what changed.

Order of writes per batch: forget the notes' old chunks in Chroma → pipeline (chunk, embed, add) → one SQLite
commit of manifest rows and chunk texts. A crash between steps leaves notes the manifest does not know as done,
so the next sync redoes exactly those; a failing source changes nothing at all.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rag_app.chunking import chunk_markdown, chunker_id
from rag_app.config import ConfigError, Settings, SourceSpec
from rag_app.keyword import TOKENIZER_VERSION, chunk_index_text, tokenize
from rag_app.manifest import Manifest, Plan, make_plan
from readers.records import NoteRecord, SourceListing, decode_list, encode_list

log = logging.getLogger("cflow_brain.sync")
BATCH_CHUNKS = 64


class SyncBusyError(Exception):
    """Another process holds the sync lock."""


class Progress(Protocol):
    def start(self, total: int, description: str) -> None: ...
    def advance(self, count: int) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def start(self, total: int, description: str) -> None:
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
    failed: bool = False
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class SyncReport:
    sources: list[SourceReport] = field(default_factory=list)
    embedded_chunks: int = 0
    deleted_chunks: int = 0
    model_loaded: bool = False
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(s.failed for s in self.sources)

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
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def read_source(spec: SourceSpec, token: str | None = None, known: Mapping[str, str] | None = None) -> SourceListing:
    """A complete listing of one source, or an exception: never a partial listing. `token`: see `memos_token`;
    `known`: vault files that need no parsing if their bytes still match (see `_known_files`)."""
    if spec.kind == "vault":
        from readers.vault_scanner import VaultScanner

        return VaultScanner(spec.path, name=spec.name).scan(known)
    from readers.memos_client import MemosClient, fetch_memos

    knobs = {"timeout": spec.timeout, "max_retries": spec.max_retries, "page_size": spec.page_size}
    with MemosClient(spec.url, token, **{k: v for k, v in knobs.items() if v is not None}) as client:
        return fetch_memos(
            spec.url,
            None,
            source=spec.name,
            include_archived=spec.include_archived,
            include_comments=spec.include_comments,
            client=client,
        )


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


class _Applier:
    """Holds the heavy parts (model, Chroma, pipeline), created on first need only.

    `keep_hashes`: the records are stored note texts being re-embedded (doctor), so the manifest keeps each note's
    source hash and the next sync sees no change.
    """

    def __init__(self, settings: Settings, manifest: Manifest, report: SyncReport, progress: Progress,
                 keep_hashes: bool = False):
        self.settings = settings
        self.manifest = manifest
        self.report = report
        self.progress = progress
        self.keep_hashes = keep_hashes
        self.model = settings.model_id
        self.second = settings.models[1] if len(settings.models) > 1 else None
        self.chunker_id = chunker_id(settings.chunk_max_chars, settings.chunk_overlap)
        self._index: Any = None
        self._second_index: Any = None
        self._second_embed: Any = None
        self._pipeline: Any = None

    @property
    def index(self) -> Any:
        if self._index is None:
            from rag_app.store import VectorIndex

            self._index = VectorIndex(self.settings, self.settings.embedding_model)
        return self._index

    def _second_channel(self) -> tuple[Any, Any]:
        """The second dense model's collection and encoder (USE-m3 by default: a cheap second opinion)."""
        if self._second_index is None:
            from rag_app.embeddings import load_embedding
            from rag_app.store import VectorIndex

            self._second_index = VectorIndex(self.settings, str(self.second), client=self.index.client)
            self._second_embed = load_embedding(str(self.second), self.settings)
            self.report.model_loaded = True
        return self._second_index, self._second_embed

    def _add_second(self, nodes: list[Any]) -> None:
        """Embed the same chunk texts with the second model into its own collection."""
        if not self.second or not nodes:
            return
        index, embed = self._second_channel()
        from llama_index.core.schema import MetadataMode

        vectors = embed.get_text_embedding_batch([n.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes])
        copies = []
        for node, vector in zip(nodes, vectors, strict=True):
            copy = node.model_copy()
            copy.embedding = vector
            copies.append(copy)
        index.vector_store().add(copies)

    def add_second_only(self, records: list[NoteRecord]) -> None:
        """Notes embedded before the second model was configured: add its vectors, keep the main ones."""
        from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

        from rag_app.pipeline import EMBED_KEYS

        ids = [r.id for r in records]
        for start in range(0, len(ids), 200):
            batch = ids[start : start + 200]
            index, _ = self._second_channel()
            index.forget(batch)
            nodes = []
            for chunk_id, note_id, text, meta in self.manifest.chunks_for_notes(batch):
                hidden = [k for k in meta if k not in EMBED_KEYS]
                node = TextNode(id_=chunk_id, text=text, metadata=meta, excluded_embed_metadata_keys=hidden,
                                excluded_llm_metadata_keys=hidden, metadata_template="{value}",
                                metadata_separator="\n", text_template="{metadata_str}\n\n{content}")
                node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=note_id)
                nodes.append(node)
            self._add_second(nodes)
            with self.manifest.transaction():
                self.manifest.set_model(batch, self.model)
            self.report.embedded_chunks += len(nodes)

    def _get_pipeline(self) -> Any:
        if self._pipeline is None:
            from rag_app.embeddings import load_embedding
            from rag_app.pipeline import MarkdownChunker, build_pipeline

            embed_model = load_embedding(self.settings.embedding_model, self.settings)
            embed_model.set_progress_hook(self.progress.advance)
            self.report.model_loaded = True
            chunker = MarkdownChunker(max_chars=self.settings.chunk_max_chars, overlap=self.settings.chunk_overlap)
            self._pipeline = build_pipeline(chunker, embed_model, self.index.vector_store(), self.index.docstore())
        return self._pipeline

    def apply(self, source: str, plan: Plan) -> None:
        if plan.second_only:
            self.add_second_only(plan.second_only)
        if plan.to_embed:
            self._embed(source, plan.to_embed)
        if plan.deleted:
            self._delete(plan.deleted)

    def _embed(self, source: str, records: list[NoteRecord]) -> None:
        sizes = [len(chunk_markdown(r.text, self.settings.chunk_max_chars, self.settings.chunk_overlap)) or 1
                 for r in records]
        pipeline = self._get_pipeline()
        self.progress.start(sum(sizes), f"embedding {source}")
        batch: list[NoteRecord] = []
        batch_chunks = 0
        for record, size in zip(records, sizes, strict=True):
            batch.append(record)
            batch_chunks += size
            if batch_chunks >= BATCH_CHUNKS:
                self._embed_batch(source, pipeline, batch)
                batch, batch_chunks = [], 0
        if batch:
            self._embed_batch(source, pipeline, batch)
        self.index.persist()
        self.progress.close()

    def _embed_batch(self, source: str, pipeline: Any, batch: list[NoteRecord]) -> None:
        ids = [r.id for r in batch]
        old = self.manifest.entries_for(ids)
        self.index.forget(ids)
        if self.second:
            self._second_channel()[0].forget(ids)
        nodes = pipeline.run(documents=[r.to_document() for r in batch], store_doc_text=False)
        self._add_second(nodes)
        by_note: dict[str, list[Any]] = {note_id: [] for note_id in ids}
        for node in nodes:
            by_note[node.ref_doc_id].append(node)
        with self.manifest.transaction():
            self.manifest.delete_chunks_of(ids)
            rows = []
            for record in batch:
                chunk_nodes = by_note[record.id]
                rows += [
                    (n.id_, record.id, source, n.text, meta, tokenize(chunk_index_text(n.text, meta)))
                    for n in chunk_nodes
                    for meta in (_chunk_metadata(n.metadata),)
                ]
                kept = old[record.id].hash if self.keep_hashes and record.id in old else None
                self.manifest.put_note(record, source, self.model, self.chunker_id, [n.id_ for n in chunk_nodes],
                                       content_hash=kept)
            self.manifest.put_chunks(rows)
        self.index.mark_written()
        self.report.embedded_chunks += len(nodes)
        self.report.deleted_chunks += sum(len(e.chunk_ids) for e in old.values())

    def _delete(self, note_ids: list[str]) -> None:
        entries = self.manifest.entries_for(note_ids)
        self.index.forget(note_ids)
        if self.second:
            self._second_channel()[0].forget(note_ids)
        with self.manifest.transaction():
            self.manifest.delete_notes(note_ids)
        self.index.persist()
        self.report.deleted_chunks += sum(len(e.chunk_ids) for e in entries.values())

    def finish(self) -> None:
        """Drop collections of models no note uses any more (after a completed model switch)."""
        if self._index is None:
            return
        from rag_app.store import drop_unused_collections

        in_use = self.manifest.models_in_use() | set(self.settings.models)
        dropped = drop_unused_collections(self.settings, self.index.client, in_use)
        for name in dropped:
            log.info("dropped collection %s (no note uses its model any more)", name)


def _widen_search_beam(settings: Settings, manifest: Manifest) -> None:
    """Once per home: collections made before ef_search was set get it (a no-change sync otherwise never opens
    Chroma). Recorded in the manifest, so later syncs do not import chromadb for it."""
    from rag_app.store import SEARCH_EF, collection_name, exact_enough, open_chroma  # chromadb itself stays unloaded

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
        from rag_app.store import collection_name, open_chroma, rename_chunks

        client = open_chroma(settings)
        for model in {m for e in entries.values() for m in e.model.split("+")}:
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


def keyword_stamp(manifest: Manifest) -> str:
    return f"{manifest.generation()}/{TOKENIZER_VERSION}"


def refresh_keyword_index(settings: Settings, manifest: Manifest, force: bool = False) -> bool:
    """Rebuild and save the BM25 index when chunks changed since it was saved, or when `force`d. True if rebuilt.
    The caller holds the SyncLock (it may rewrite cached tokens)."""
    from rag_app.keyword import KeywordIndex

    stamp = keyword_stamp(manifest)
    directory = settings.home / "bm25"
    current_tokens = manifest.get_meta("tokenizer_version") == TOKENIZER_VERSION
    if not force and current_tokens and (directory / "ids.json").exists() and _saved_stamp(directory) == stamp:
        return False
    index = KeywordIndex.build(load_keyword_rows(manifest, persist=True))
    index.save(directory, stamp)
    return True


def reembed_stored(
    settings: Settings, manifest: Manifest, records: dict[str, list[NoteRecord]], progress: Progress | None = None
) -> SyncReport:
    """Embed notes again from their stored text (source → records), in the same batches a sync uses.

    For `brain doctor --repair`: no source is read. The caller holds the SyncLock and rebuilds BM25 afterwards.
    """
    report = SyncReport()
    applier = _Applier(settings, manifest, report, progress or NoProgress(), keep_hashes=True)
    for source, batch in records.items():
        applier._embed(source, batch)
    applier.finish()
    return report


def _saved_stamp(directory: Path) -> str | None:
    try:
        return json.loads((directory / "ids.json").read_text(encoding="utf-8")).get("stamp")
    except (OSError, ValueError):
        return None


def load_keyword_rows(manifest: Manifest, persist: bool = False) -> list[tuple[str, list[str]]]:
    """Cached tokens of every chunk.

    Only a writer holding the sync lock (`persist`) re-tokenizes chunks cached by an older tokenizer and saves the
    tokens: a search process must never write them, or a sync editing a note meanwhile could get the old text's
    tokens saved over the new. A reader uses the cached tokens as they are and tokenizes chunks that have none in
    memory only.
    """
    stale = persist and manifest.get_meta("tokenizer_version") != TOKENIZER_VERSION
    rows, fresh = [], []
    for chunk_id, tokens, text, metadata in manifest.chunk_tokens():
        if tokens is None or stale:
            tokens = " ".join(tokenize(chunk_index_text(text, json.loads(metadata))))
            fresh.append((chunk_id, tokens))
        rows.append((chunk_id, tokens.split()))
    if persist and (fresh or stale):
        with manifest.transaction():
            manifest.set_tokens(fresh)
            manifest.set_meta("tokenizer_version", TOKENIZER_VERSION)
    return rows


def _chunk_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if not k.startswith("_")}


def sync_sources(
    settings: Settings,
    specs: list[SourceSpec],
    progress: Progress | None = None,
    on_source: Callable[[SourceReport], None] | None = None,
) -> SyncReport:
    """Sync the given sources (and only those) into the index under `settings.home`."""
    started = time.monotonic()
    report = SyncReport()
    progress = progress or NoProgress()
    with SyncLock(settings.home, settings.lock_wait_seconds):
        manifest = Manifest(settings.manifest_path)
        try:
            if not manifest.counts() and manifest.get_meta("tokenizer_version") is None:
                manifest.set_meta("tokenizer_version", TOKENIZER_VERSION)  # a new home: its tokens are all current
            _namespace_memo_ids(settings, manifest)
            applier = _Applier(settings, manifest, report, progress)
            for spec in specs:
                source_report = _sync_one(spec, manifest, applier)
                report.sources.append(source_report)
                if on_source:
                    on_source(source_report)
            applier.finish()
            refresh_keyword_index(settings, manifest)
            _widen_search_beam(settings, manifest)
        finally:
            manifest.close()
    report.seconds = time.monotonic() - started
    return report


def _sync_one(spec: SourceSpec, manifest: Manifest, applier: _Applier) -> SourceReport:
    result = SourceReport(name=spec.name, kind=spec.kind)
    manifest.put_source(spec.name, spec.kind, spec.to_dict())
    try:
        token, token_warning = memos_token(spec, manifest) if spec.kind == "memos" else (None, None)
        listing = read_source(spec, token, known=_known_files(spec, manifest, applier))
    except Exception as exc:  # any failure of the source: keep everything it had
        result.failed = True
        result.error = _one_line(exc, spec.token_env)
        log.warning("source %s failed, nothing changed: %s", spec.name, result.error)
        manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    if token and not spec.token_env and manifest.get_meta(TOKEN_ORIGIN) is None:
        manifest.set_meta(TOKEN_ORIGIN, url_origin(spec.url))
    result.warnings = ([token_warning] if token_warning else []) + listing.warnings
    result.skipped = listing.skipped
    for warning in listing.warnings:
        log.warning("%s: %s", spec.name, warning)
    plan = make_plan(manifest.entries(spec.name), listing.records, listing.kept_ids, applier.model, applier.chunker_id,
                     unchanged_ids=listing.unchanged_ids)
    _backfill_docs(manifest, spec.name, listing.records, plan)
    result.added, result.updated = len(plan.added), len(plan.changed)
    result.deleted, result.unchanged = len(plan.deleted), plan.unchanged + len(plan.second_only)
    try:
        applier.apply(spec.name, plan)
    except Exception as exc:  # a store/model failure part-way: finished batches are committed, the rest retried
        result.failed = True
        result.error = _one_line(exc, spec.token_env)
        log.error("source %s: applying changes failed: %s", spec.name, result.error)
        manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    _remember_files(spec, manifest, listing)
    manifest.record_result(spec.name, asdict(result), succeeded=True)
    log.info("synced %s: +%d ~%d -%d =%d", spec.name, result.added, result.updated, result.deleted, result.unchanged)
    return result


def _known_files(spec: SourceSpec, manifest: Manifest, applier: _Applier) -> dict[str, str]:
    """Vault files whose bytes, if they still match, need no parsing (see `Manifest.trusted_signatures`)."""
    if spec.kind != "vault":
        return {}
    return manifest.trusted_signatures(spec.name, applier.model, applier.chunker_id)


def _remember_files(spec: SourceSpec, manifest: Manifest, listing: SourceListing) -> None:
    """Store the signatures of the files parsed this time with their records' hashes, for the next sync to compare."""
    if spec.kind != "vault":
        return
    parsed = {r.id: (listing.signatures[r.id], r.content_hash) for r in listing.records if r.id in listing.signatures}
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
    from readers.memos_client import redact_secrets

    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_secrets(text, _secrets_in_environment(token_env))[:500]


SECRET_ENV_VARS = ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "EMBEDDING_API_KEY", "OPENAI_API_KEY", "LLM_API_KEY")


def _secrets_in_environment(token_env: str = "") -> list[str]:
    names = {*SECRET_ENV_VARS, token_env} | {n for n in os.environ if n.endswith(("_TOKEN", "_API_KEY", "_SECRET"))}
    return [os.environ[n] for n in names if len(os.environ.get(n, "").strip()) >= 8]
