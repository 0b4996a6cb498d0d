"""`brain doctor`: do Chroma, the manifest (notes and chunks tables) and the saved BM25 index hold the same chunks?

A crash between a sync's steps (kill -9, a full disk, a Chroma error) can leave vectors the manifest does not know
or manifest chunks without vectors. A sync repairs the notes it touches; `repair` fixes the rest without reading any
source and without re-embedding notes whose vectors are intact. `compact` rebuilds each collection, because many
delete/re-add cycles grow Chroma's HNSW files (chroma-core/chroma#2594) and a deleted collection leaves its folder.
"""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_app.config import Settings
from rag_app.index.docstore_health import DOCSTORE_FILE, DocstoreError, docstore_shown
from rag_app.index.docstore_reads import all_stored_hashes
from rag_app.index.keyword_store import keyword_stamp, refresh_keyword_index, saved_keyword_ids
from rag_app.index.manifest import Manifest
from rag_app.index.store import (
    COLLECTION_PREFIX,
    collection_ids,
    collection_name,
    exact_enough,
    open_chroma,
    store_shown,
)
from rag_app.ingest.apply import FILL_ERROR
from rag_app.ingest.lock import SyncLock
from rag_app.ingest.migrations import rebuild_docstore
from rag_app.ingest.sync import fill_vectors, reembed_stored
from readers.records import NoteRecord

log = logging.getLogger("cflow_brain.doctor")
EXAMPLES = 20
COPY_BATCH = 500
OLD_SUFFIX, NEW_SUFFIX = ".compact-old", ".compact-new"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass
class Findings:
    """What disagrees, with every id (the report shows counts and a few examples)."""

    counts: dict[str, int]
    problems: dict[str, list[str]]
    orphans: dict[str, list[str]] = field(default_factory=dict)  # collection name → vector ids no note owns
    reembed: list[str] = field(default_factory=list)  # notes whose vectors or chunk rows are missing, or stale model

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    def summary(self) -> dict[str, dict[str, Any]]:
        return {kind: {"count": len(ids), "examples": ids[:EXAMPLES]} for kind, ids in self.problems.items()}


def run_doctor(settings: Settings, repair: bool = False, compact: bool = False) -> dict[str, Any]:
    """Check (and optionally repair, then compact) under the sync lock, so no sync writes meanwhile."""
    with SyncLock(settings.home, settings.lock_wait_seconds):
        manifest = Manifest(settings.manifest_path)
        try:
            client = open_chroma(settings)
            findings = inspect(settings, manifest, client)
            result: dict[str, Any] = {"store": store_shown(settings.store_url) or "embedded",
                                      "model": settings.model_id, "docstore": docstore_shown(settings)}
            if repair and not findings.ok:
                # the docstore first: re-embedding a note writes through it
                result["repair"] = {"found": findings.summary()} | repair_docstore(settings, manifest, findings)
                if any(ids for kind, ids in findings.problems.items() if kind not in DOCSTORE_PROBLEMS):
                    result["repair"] |= repair_index(settings, manifest, client, findings)
                findings = inspect(settings, manifest, client)
            if compact:
                result["compact"] = compact_store(settings, client)
                findings = inspect(settings, manifest, client)  # the copy lost nothing, or this says so
        finally:
            manifest.close()
    return result | {"ok": findings.ok, "counts": findings.counts, "problems": findings.summary()}


def inspect(settings: Settings, manifest: Manifest, client: Any) -> Findings:
    """Compare the four id sets: each model's collection, the notes table, the chunks table, bm25/ids.json.

    A note's manifest model is every dense model its vectors are stored for ("e5-small+use-m3"): each collection
    must hold all its chunks.
    """
    entries = manifest.entries()
    owner = {chunk_id: note_id for note_id, e in entries.items() for chunk_id in e.chunk_ids}
    expected: dict[str, set[str]] = {}
    for entry in entries.values():
        for model in entry.models:
            expected.setdefault(collection_name(model), set()).update(entry.chunk_ids)
    present = {collection.name: collection_ids(collection) for collection in _collections(client)}
    orphans = {name: sorted(ids - expected.get(name, set())) for name, ids in present.items()}
    missing = sorted(c for name, ids in expected.items() for c in ids - present.get(name, set()))
    rows = manifest.stored_chunk_ids()
    saved_stamp, bm25_ids = saved_keyword_ids(settings)
    stamp = keyword_stamp(manifest)
    docstore, docstore_notes = docstore_problems(settings, manifest)
    problems = {
        "orphan_vectors": sorted(c for ids in orphans.values() for c in ids),
        "missing_vectors": missing,
        "orphan_chunks": sorted(rows - owner.keys()),
        "missing_chunks": sorted(owner.keys() - rows),
        "bm25_missing": sorted(owner.keys() - bm25_ids),
        "bm25_stale": sorted(bm25_ids - owner.keys()),
        "bm25_stamp": [] if saved_stamp == stamp else [f"saved {saved_stamp or 'none'}, current {stamp}"],
        "interrupted_compaction": sorted(c.name for c in client.list_collections()
                                         if c.name.endswith((OLD_SUFFIX, NEW_SUFFIX))),
        "incomplete_channels": incomplete_channels(settings, manifest),
    } | docstore
    reembed = {owner[c] for c in problems["missing_vectors"] + problems["missing_chunks"]}
    counts = {
        "notes": len(entries),
        "manifest_chunks": len(owner),
        "chunk_rows": len(rows),
        "vectors": sum(len(ids) for ids in present.values()),
        "bm25_ids": len(bm25_ids),
        "notes_without_vectors": {m: len(manifest.notes_lacking(m)) for m in settings.models},  # the next sync fills
        "docstore_notes": docstore_notes,
    }
    return Findings(counts, problems, {n: ids for n, ids in orphans.items() if ids},
                    sorted(reembed))


def incomplete_channels(settings: Settings, manifest: Manifest) -> list[str]:
    """Dense channels whose last fill failed, with the notes still lacking and the reason: search leaves such a
    channel out (BM25 covers those notes) until it is complete, so a failure that repeats must be named."""
    out = []
    for model in settings.models:
        error = manifest.get_meta(FILL_ERROR + model)
        lacking = len(manifest.notes_lacking(model)) if error else 0
        if lacking:
            out.append(f"{model}: {lacking} notes lack vectors; the last sync could not embed them: {error}")
    return out


DOCSTORE_PROBLEMS = ("docstore_unusable", "docstore_missing", "docstore_stale", "docstore_extra")


def docstore_problems(settings: Settings, manifest: Manifest) -> tuple[dict[str, list[str]], int]:
    """Does the ingestion docstore open (the home's file passing SQLite's quick_check) and hold every note the manifest
    holds, under the same hash, and no other? A docstore that lacks notes lets the next sync chunk them again only
    when their files change, so new and edited notes would be its only content. Notes whose text the manifest never
    kept (older homes) are left out: a sync re-reads them anyway. Also returns how many notes it holds."""
    try:
        held = all_stored_hashes(settings, check=True)
    except DocstoreError as exc:
        return {"docstore_unusable": [str(exc)], "docstore_missing": [], "docstore_stale": [], "docstore_extra": []}, 0
    entries = manifest.entries()
    without_text = set().union(*(manifest.notes_without_docs(source) for source in manifest.sources()))
    expected = {note_id: entry.hash for note_id, entry in entries.items() if note_id not in without_text}
    return {
        "docstore_unusable": [],
        "docstore_missing": sorted(expected.keys() - held.keys()),
        "docstore_stale": sorted(n for n, digest in expected.items() if n in held and held[n] != digest),
        "docstore_extra": sorted(held.keys() - entries.keys()),
    }, len(held)


def repair_docstore(settings: Settings, manifest: Manifest, findings: Findings) -> dict[str, Any]:
    """A damaged home docstore file is set aside (renamed, never deleted: `docstore.sqlite.damaged-<time>`), then the
    docstore gets every note the manifest holds from the kept texts; notes it holds under another hash, or that the
    index no longer has, go first. A database that cannot be reached is not repaired here: its message says why."""
    found = findings.problems
    if not any(found[kind] for kind in DOCSTORE_PROBLEMS):
        return {}
    set_aside: list[str] = []
    if found["docstore_unusable"]:
        try:
            all_stored_hashes(settings, check=True)
        except DocstoreError as exc:
            if not exc.damaged:
                return {"docstore": {"repaired": False, "reason": str(exc)}}
            set_aside = _set_aside(settings.home / DOCSTORE_FILE)
    copied = rebuild_docstore(settings, manifest, found["docstore_stale"] + found["docstore_extra"])
    log.info("doctor rebuilt the docstore: %d notes copied in, set aside: %s", copied, set_aside or "nothing")
    return {"docstore": {"repaired": True, "copied_notes": copied, "set_aside": set_aside}}


def _set_aside(path: Path) -> list[str]:
    """Rename a damaged SQLite file and its -wal/-shm companions out of the way, kept for whoever wants to look."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists() or part.is_symlink():
            target = part.with_name(f"{path.name}.damaged-{stamp}{suffix}")
            part.rename(target)
            moved.append(str(target))
    return moved


def repair_index(settings: Settings, manifest: Manifest, client: Any, findings: Findings) -> dict[str, Any]:
    """Re-embed only the notes that lack vectors or chunk rows (from their stored text), then drop what no note owns.

    Notes without stored text (indexes from before texts were kept) cannot be rebuilt here: they are dropped from the
    manifest, so the next sync of their source adds them again, and listed under `needs_sync`.
    """
    if findings.problems["interrupted_compaction"]:
        _recover_swap(client)
        findings = inspect(settings, manifest, client)  # the vectors are back under their name: nothing to re-embed
    entries = manifest.entries()
    records: dict[str, list[NoteRecord]] = {}
    needs_sync = []
    for note_id in findings.reembed:
        stored = manifest.note_doc(note_id)
        if stored is None:
            needs_sync.append(note_id)
            continue
        text, metadata = stored
        records.setdefault(entries[note_id].source, []).append(NoteRecord(id=note_id, text=text, metadata=metadata))
    embedded = reembed_stored(settings, manifest, records).chunks_written if records else 0
    filled = fill_vectors(settings, manifest) if findings.problems["incomplete_channels"] else None
    with manifest.transaction():
        manifest.delete_notes(needs_sync)
    if needs_sync:  # out of the docstore too: the next sync adds them as new notes
        rebuild_docstore(settings, manifest, forget=needs_sync)
    after = inspect(settings, manifest, client)  # re-embedding moved vectors: orphans are counted afresh
    for name, ids in after.orphans.items():
        collection = client.get_collection(name)
        for start in range(0, len(ids), COPY_BATCH):
            collection.delete(ids=ids[start : start + COPY_BATCH])
    with manifest.transaction():
        manifest.delete_chunks(after.problems["orphan_chunks"])
    refresh_keyword_index(settings, manifest, force=True)
    done = {
        "reembedded_notes": sum(len(batch) for batch in records.values()),
        "chunks_written": embedded,
        "deleted_vectors": len(after.problems["orphan_vectors"]),
        "deleted_chunk_rows": len(after.problems["orphan_chunks"]),
        "bm25_rebuilt": True,
        "needs_sync": needs_sync,
        "filled_vectors": sum(filled.vectors.values()) if filled else 0,
        "fill_error": filled.fill_error if filled else None,
    }
    log.info("doctor repaired: %s", {k: v for k, v in done.items() if k != "needs_sync"})
    return done


def compact_store(settings: Settings, client: Any) -> dict[str, Any]:
    """Copy each collection into a fresh one and swap names; embedded: delete dead segment folders and VACUUM.

    A search process that has the old collection open must reopen it (the engine does, on a missing collection).
    """
    before = _disk_bytes(settings)
    _recover_swap(client)
    rebuilt = [{"collection": c.name, "vectors": _rebuild(client, c)} for c in _collections(client)]
    vacuum = None
    if not settings.store_url:
        _prune_segments(settings.chroma_path)
        vacuum = _vacuum(settings.chroma_path / "chroma.sqlite3")
    after = _disk_bytes(settings)
    log.info("doctor compacted %d collection(s): %s → %s bytes", len(rebuilt), before, after)
    return {"collections": rebuilt, "bytes_before": before, "bytes_after": after, "vacuum": vacuum}


def _rebuild(client: Any, old: Any) -> int:
    """Fill `<name>.compact-new` in batches, then rename old → `.compact-old`, new → name, and drop the old one."""
    name = old.name
    fresh = client.create_collection(name + NEW_SUFFIX, metadata=old.metadata)
    exact_enough(fresh)
    offset = 0
    while True:
        got = old.get(include=["embeddings", "metadatas"], limit=COPY_BATCH, offset=offset)
        if not got["ids"]:
            break
        fresh.add(ids=got["ids"], embeddings=got["embeddings"],  # an older home's rows shed their copy of the text
                  metadatas=[{"document_id": (m or {}).get("document_id", "")} for m in got["metadatas"]])
        offset += len(got["ids"])
    if fresh.count() != old.count():
        client.delete_collection(fresh.name)
        raise RuntimeError(f"compacting {name}: the copy holds {fresh.count()} of {old.count()} vectors; kept the old")
    old.modify(name=name + OLD_SUFFIX)
    fresh.modify(name=name)
    client.delete_collection(name + OLD_SUFFIX)
    return offset


def _recover_swap(client: Any) -> None:
    """Finish or undo a compaction a crash interrupted: a lone `.compact-old` gets its name back."""
    names = {c.name for c in client.list_collections()}
    for name in names:
        if name.endswith(NEW_SUFFIX):
            client.delete_collection(name)
        elif name.endswith(OLD_SUFFIX):
            base = name.removesuffix(OLD_SUFFIX)
            if base in names:
                client.delete_collection(name)
            else:
                client.get_collection(name).modify(name=base)


def _collections(client: Any) -> list[Any]:
    return [c for c in client.list_collections()
            if c.name.startswith(COLLECTION_PREFIX) and not c.name.endswith((OLD_SUFFIX, NEW_SUFFIX))]


def _disk_bytes(settings: Settings) -> int | None:
    """Bytes under the embedded Chroma folder; None for a server (its disk is not ours to see)."""
    if settings.store_url or not settings.chroma_path.exists():
        return None
    return sum(p.stat().st_size for p in settings.chroma_path.rglob("*") if p.is_file())


def _prune_segments(path: Path) -> None:
    """Chroma 1.5 leaves a deleted collection's HNSW folder behind: remove folders no segment row names."""
    try:
        db = sqlite3.connect(f"file:{path / 'chroma.sqlite3'}?mode=ro", uri=True, timeout=10)
        try:
            live = {row[0] for row in db.execute("SELECT id FROM segments")}
        finally:
            db.close()
    except sqlite3.Error as exc:
        log.warning("compact: cannot read Chroma's segment list, dead folders kept: %s", exc)
        return
    for folder in path.iterdir():
        if folder.is_dir() and _UUID.match(folder.name) and folder.name not in live:
            shutil.rmtree(folder, ignore_errors=True)


def _vacuum(path: Path) -> str:
    """SQLite keeps deleted rows' pages until VACUUM (what `chroma vacuum` does after purging its log)."""
    try:
        db = sqlite3.connect(str(path), timeout=10, isolation_level=None)
        try:
            db.execute("VACUUM")
        finally:
            db.close()
    except sqlite3.Error as exc:
        return f"skipped: {exc}"
    return "done"
