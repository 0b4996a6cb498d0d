"""Every step that brings a home made by an earlier version up to date, in one place, each run once and recorded.

A home of any earlier version opens: each step checks its own mark in the manifest's meta table and is repeatable
after a crash. In the order they were introduced:

1. `chunks.tokens`, `chunks.embed_hash` columns (`Manifest._missing_columns`, at open: SQLite only).
2. `namespace_memo_ids`: memo ids namespaced by source (`memos:<uid>` → `memos:<source>/<uid>`), mark `memo_ids`.
3. `backfill_docs`: note texts kept in the manifest for notes indexed before they were (from the next listing).
4. `widen_search_beam`: Chroma collections get the search beam (`hnsw_ef_search`).
5. `seed_docstore`: a docstore made after its notes were indexed gets their hashes (`docstore_seeded[:name]`).
6. `seed_docstore`: a docstore of an earlier version sheds the note texts it kept (`docstore_lean:<name>`).
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

from rag_app.config import Settings
from rag_app.index.manifest import Manifest
from readers.records import NoteRecord, decode_list, encode_list

log = logging.getLogger("cflow_brain.sync")
SEED_BATCH = 500  # hashes written at once


DOCSTORE_SEEDED = "docstore_seeded"

DOCSTORE_LEAN = "docstore_lean"  # the docstore holds hashes only: no note texts of an earlier version


def seed_docstore(manifest: Manifest, docstore: Any, name: str, new_file: bool) -> int:
    """Once per docstore a home writes to (its file, or each PostgreSQL database it is pointed at; again when the
    file was deleted or emptied): notes indexed before get their hash in it, the hash they were indexed with, so
    nothing is chunked or embedded again for them; a docstore of an earlier version sheds the note texts it kept
    (the manifest owns them). Repeating it after a crash writes the same hashes. Returns how many it copied."""
    mark = DOCSTORE_SEEDED if name == "home" else f"{DOCSTORE_SEEDED}:{name}"
    lean = f"{DOCSTORE_LEAN}:{name}"
    copied = 0
    if manifest.get_meta(mark) != "1" or new_file:
        entries = manifest.entries()
        missing = [note_id for note_id in entries if docstore.get_document_hash(note_id) is None]
        for start in range(0, len(missing), SEED_BATCH):
            docstore.set_document_hashes({note_id: entries[note_id].hash
                                          for note_id in missing[start : start + SEED_BATCH]})
        copied = len(missing)
        manifest.set_meta(mark, "1")
    if manifest.get_meta(lean) != "1":
        from rag_app.index.docstore import drop_stored_texts

        dropped = drop_stored_texts(docstore)
        if dropped:
            log.info("the docstore %s gave up %d note texts the manifest holds", name, dropped)
        manifest.set_meta(lean, "1")
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
        return seed_docstore(manifest, docstore, docstore_name(settings), new_file=True)
    finally:
        close_docstore(docstore)


def widen_search_beam(settings: Settings, manifest: Manifest) -> None:
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


def namespace_memo_ids(settings: Settings, manifest: Manifest) -> None:
    """Once per home: ids of homes made before memo ids were namespaced by source (`memos:<uid>`, which let two
    servers' memos 1, 2, … overwrite each other) become `memos:<source>/<uid>`, vectors moved, nothing re-embedded.

    Chroma and the docstore first, then one manifest transaction with the flag: after a crash the next sync repeats
    it harmlessly."""
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
        for source, renames in by_source.items():
            remap = partial(_remap_memo_ids, source=source)
            _rename_in_docstore(settings, renames, manifest.renamed_hashes(renames, remap))
    with manifest.transaction():
        for source, renames in by_source.items():
            manifest.rename_notes(renames, lambda meta, source=source: _remap_memo_ids(meta, source))
        manifest.set_meta("memo_ids", MEMO_ID_SCHEME)
    if entries:
        log.info("note ids of %d memos namespaced by source (no re-embedding)", len(entries))


def _rename_in_docstore(settings: Settings, renames: dict[str, str], hashes: dict[str, str]) -> None:
    """The docstore's hashes move to the new ids with their notes (it decides what changed by id), each the hash the
    manifest gives the note under its new id. Repeated after a crash, it writes the same."""
    from rag_app.index.docstore import close_docstore, forget_documents, open_docstore

    docstore = open_docstore(settings)
    try:
        docstore.set_document_hashes(hashes)
        forget_documents(docstore, [old for old, new in renames.items() if old != new])
    finally:
        close_docstore(docstore)


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


def backfill_docs(manifest: Manifest, source: str, records: list[NoteRecord]) -> None:
    """Indexes made before note texts were kept get them from this listing, without re-embedding (whatever the
    docstore decides about the note)."""
    missing = manifest.notes_without_docs(source)
    if missing:
        with manifest.transaction():
            for record in records:
                if record.id in missing:
                    manifest.put_doc(record, source)
