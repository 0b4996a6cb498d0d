"""A home made by an earlier version opens and syncs without re-embedding: each step of ingest/migrations.py.

Steps tested elsewhere, where their behaviour lives: the chunk columns (index/test_manifest.py, two openers at once),
memo ids namespaced by source (test_source_isolation.py), the search beam (test_sync.py), a docstore made after its
notes were indexed (test_sync_docstore.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from llama_index.core.storage.docstore.utils import doc_to_json

from rag_app.config import load_settings
from rag_app.engine import Brain
from rag_app.index.docstore import DOCSTORE_FILE, open_docstore
from rag_app.index.manifest import Manifest
from readers.note_document import NoteDocument

NOTES = {"a.md": "# Alpha\n\nTomatoes need sun.", "b.md": "# Beta\n\nCompost needs worms.",
         "c.md": "# Gamma\n\nWatering schedules in summer."}


def sync(home: Path, vault: Path):
    report = Brain(home).sync(vaults=(str(vault),))
    assert not report.failed, report.sources[0].error
    return report, report.sources[0]


def stored_texts(home: Path) -> int:
    db = sqlite3.connect(home / DOCSTORE_FILE)
    try:
        return db.execute("SELECT count(*) FROM kv WHERE collection = 'notes/data'").fetchone()[0]
    finally:
        db.close()


def test_a_docstore_that_kept_note_texts_sheds_them_and_still_decides(home, make_vault):
    """Before issue 31 the docstore held each note's whole Document, a second copy of the manifest's text."""
    vault = make_vault(NOTES)
    sync(home, vault)
    docstore = open_docstore(load_settings(home))
    for name, text in NOTES.items():  # the Documents as LlamaIndex stored them beside the hashes
        docstore._kvstore.put(f"vault:notes/{name}", doc_to_json(NoteDocument(id_=f"vault:notes/{name}", text=text)),
                              collection=docstore._node_collection)
    manifest = Manifest(home / "index.sqlite")
    manifest.delete_meta("docstore_lean:home")
    manifest.close()
    assert stored_texts(home) == 3
    (vault / "b.md").write_text("# Beta\n\nCompost needs worms, edited.", encoding="utf-8")
    (vault / "c.md").write_text(NOTES["c.md"].replace("\n", "\r\n"), encoding="utf-8")  # new bytes, same note
    report, source = sync(home, vault)
    assert stored_texts(home) == 0
    assert (source.updated, source.unchanged) == (1, 2)
    assert report.vectors == {"use-m3": report.chunks_written}  # the edited note's chunks only


def test_a_home_of_the_first_version_opens_and_syncs_without_re_embedding(home, make_vault):
    """Every mark of a later step undone, no docstore, no kept note texts: the next sync with one edit brings the
    home up to date and embeds only the edited note."""
    vault = make_vault(NOTES)
    sync(home, vault)
    for suffix in ("", "-wal", "-shm"):
        (home / (DOCSTORE_FILE + suffix)).unlink(missing_ok=True)
    db = sqlite3.connect(home / "index.sqlite")
    db.execute("DELETE FROM meta WHERE key IN ('hnsw_ef_search', 'docstore_seeded', 'docstore_lean:home')")
    db.execute("DELETE FROM note_docs")
    db.commit()
    db.close()
    (vault / "a.md").write_text("# Alpha\n\nTomatoes need sun and water.", encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged) == (1, 2)
    assert report.vectors == {"use-m3": report.chunks_written}
    manifest = Manifest(home / "index.sqlite")
    try:
        assert manifest.notes_without_docs("notes") == set()
        assert {manifest.get_meta(k) for k in ("hnsw_ef_search", "docstore_seeded", "docstore_lean:home")} \
            == {"400", "1"}
    finally:
        manifest.close()
    assert Brain(home).search("watering schedules").results[0]["note_id"] == "vault:notes/c.md"
