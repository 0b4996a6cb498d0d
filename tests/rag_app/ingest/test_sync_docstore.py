"""A sync's chunking runs through an IngestionPipeline whose docstore (SQLite in the home) holds every indexed note.

Through `Brain.sync` into a real home (fast model).
"""

from __future__ import annotations

from pathlib import Path

from rag_app.config import load_settings
from rag_app.engine import Brain
from rag_app.index.docstore import DOCSTORE_FILE, open_docstore
from rag_app.index.manifest import Manifest
from tests.conftest import free_port

NOTES = {
    "a.md": "---\ntitle: Alpha\n---\n# Alpha\n\nTomatoes need sun.",
    "b.md": "# Beta\n\nCompost needs worms.",
    "c.md": "# Gamma\n\nWatering schedules in summer.",
}


def sync(home: Path, vault: Path):
    report = Brain(home).sync(vaults=(str(vault),))
    assert not report.failed, report.sources[0].error
    return report, report.sources[0]


def stored(home: Path) -> dict[str, str]:
    """note id → hash, as the docstore holds them, against the manifest's notes."""
    manifest = Manifest(home / "index.sqlite")
    ids = sorted(manifest.entries())
    manifest.close()
    docstore = open_docstore(load_settings(home))
    return {note_id: digest for note_id in ids if (digest := docstore.get_document_hash(note_id))}


def manifest_hashes(home: Path) -> dict[str, str]:
    manifest = Manifest(home / "index.sqlite")
    try:
        return {note_id: entry.hash for note_id, entry in manifest.entries().items()}
    finally:
        manifest.close()


def test_the_docstore_holds_every_indexed_note_and_forgets_deleted_ones(home, make_vault):
    vault = make_vault(NOTES)
    sync(home, vault)
    assert (home / DOCSTORE_FILE).is_file()
    assert stored(home) == manifest_hashes(home) and len(stored(home)) == 3
    docstore = open_docstore(load_settings(home))
    assert docstore.get_document(next(iter(stored(home))), raise_error=False) is None  # hashes, no second text
    (vault / "c.md").unlink()
    (vault / "b.md").write_text("# Beta\n\nCompost needs worms and time.", encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.updated, source.deleted) == (1, 1)
    assert stored(home) == manifest_hashes(home) and len(stored(home)) == 2


def test_a_no_change_sync_does_not_open_the_docstore(home, make_vault, monkeypatch):
    """Nothing listed as changed: no key is looked up and LlamaIndex is not needed."""
    import rag_app.index.docstore as docstore_module

    vault = make_vault(NOTES)
    sync(home, vault)
    opened = []
    original = docstore_module.open_docstore
    monkeypatch.setattr(docstore_module, "open_docstore", lambda settings: opened.append(1) or original(settings))
    report, source = sync(home, vault)
    assert (opened, source.unchanged, report.chunks_written) == ([], 3, 0)


def test_a_note_the_docstore_lacks_is_chunked_again(home, make_vault):
    """The docstore has a say: a listed note it does not hold with that hash (a sync that died after the docstore
    lost track, a docstore emptied by hand) is chunked again, its vectors reused rather than embedded."""
    vault = make_vault(NOTES)
    sync(home, vault)
    docstore = open_docstore(load_settings(home))
    docstore.delete_document("vault:notes/b.md", raise_error=False)
    (vault / "b.md").write_text(NOTES["b.md"].replace("\n", "\r\n"), encoding="utf-8")  # new bytes, same note
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged) == (1, 2)
    assert report.vectors == {"use-m3": report.reused_vectors} and report.reused_vectors >= 1
    assert stored(home) == manifest_hashes(home)


def test_a_note_the_docstore_already_has_is_not_chunked_again(home, make_vault):
    """New bytes, same note (line endings): the docstore holds that hash, so nothing is chunked or embedded."""
    vault = make_vault(NOTES)
    sync(home, vault)
    (vault / "a.md").write_text(NOTES["a.md"].replace("\n", "\r\n"), encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged, report.chunks_written, report.vectors) == (0, 3, 0, {})


def test_a_home_from_before_the_docstore_is_migrated_once_without_re_embedding(home, make_vault):
    """A home indexed before this docstore existed (no docstore file, no seed mark): the first sync that has something
    to write copies every note in from its kept text; only the edited note is chunked, none is embedded again."""
    vault = make_vault(NOTES)
    sync(home, vault)
    (home / DOCSTORE_FILE).unlink()
    for suffix in ("-wal", "-shm"):
        (home / (DOCSTORE_FILE + suffix)).unlink(missing_ok=True)
    manifest = Manifest(home / "index.sqlite")
    manifest.delete_meta("docstore_seeded")
    manifest.close()
    report, source = sync(home, vault)
    assert not (home / DOCSTORE_FILE).exists()  # nothing changed: the migration waits, the sync stays fast
    (vault / "b.md").write_text("# Beta\n\nCompost needs worms, edited.", encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged) == (1, 2)
    assert stored(home) == manifest_hashes(home) and len(stored(home)) == 3
    assert report.vectors == {"use-m3": report.chunks_written}  # the edited note's chunks only


def test_a_docstore_that_cannot_be_read_fails_its_source_and_keeps_every_note(home, make_vault):
    """A database down (here a PostgreSQL URL nobody answers) is that source's failure: nothing is deleted or
    re-chunked, and the run goes on with the next source."""
    vault = make_vault(NOTES)
    other = make_vault({"d.md": "# Delta\n\nMulch keeps soil moist."}, name="garden")
    Brain(home).sync(vaults=(str(vault),))
    before = manifest_hashes(home)
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n\n[store]\ndocstore_url = '
                                      f'"postgresql://brain@127.0.0.1:{free_port()}/notes"\n', encoding="utf-8")
    (vault / "b.md").write_text("# Beta\n\nCompost needs worms and time.", encoding="utf-8")
    report = Brain(home).sync(vaults=(str(vault), str(other)))
    assert [s.name for s in report.sources] == ["notes", "garden"]
    assert report.sources[0].failed and "127.0.0.1" in report.sources[0].error
    assert {k: v for k, v in manifest_hashes(home).items() if k in before} == before


def test_a_docstore_file_deleted_by_hand_is_filled_again_at_the_next_sync_with_a_change(home, make_vault):
    """The home's mark says its docstore was filled; the file it was filled into is gone: filled again, not left
    holding only the notes that change from now on."""
    vault = make_vault(NOTES)
    sync(home, vault)
    for suffix in ("", "-wal", "-shm"):
        (home / (DOCSTORE_FILE + suffix)).unlink(missing_ok=True)
    (vault / "b.md").write_text("# Beta\n\nCompost needs worms, edited.", encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged) == (1, 2)
    assert stored(home) == manifest_hashes(home) and len(stored(home)) == 3


def test_a_read_only_docstore_is_named_in_the_sources_failure(home: Path, make_vault):
    """Issue 30 (Low): "attempt to write a readonly database" once named no file. Run with file modes in force."""
    from tests.conftest import as_an_ordinary_user

    vault = make_vault({"a.md": "# A\n\nalpha"})
    sync(home, vault)
    (vault / "b.md").write_text("# B\n\nbeta", encoding="utf-8")
    (home / DOCSTORE_FILE).chmod(0o400)
    with as_an_ordinary_user():
        [source] = Brain(home).sync(vaults=(str(vault),)).sources
    assert source.failed and source.error == (f"the docstore {home / DOCSTORE_FILE} failed (attempt to write a "
                                              "readonly database): it cannot be written: check its owner and "
                                              "permissions")


def test_the_docstore_not_the_manifest_decides_what_changed(home, make_vault):
    """The index's own record of a note's hash is not asked: with it scrambled, a file rewritten with the same note
    is still skipped (the docstore holds that hash), and an edited one is still chunked (the docstore does not)."""
    import sqlite3

    vault = make_vault(NOTES)
    sync(home, vault)
    db = sqlite3.connect(home / "index.sqlite")
    db.execute("UPDATE notes SET hash = 'scrambled'")
    db.commit()
    db.close()
    (vault / "a.md").write_text(NOTES["a.md"].replace("\n", "\r\n"), encoding="utf-8")  # new bytes, same note
    (vault / "b.md").write_text("# Beta\n\nCompost needs worms and patience.", encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.added, source.updated, source.unchanged) == (0, 1, 2)
    assert report.vectors == {"use-m3": report.chunks_written} and report.chunks_written >= 1


def test_without_the_docstores_upserts_a_rewritten_note_would_be_chunked_again(home, make_vault, monkeypatch):
    """The specification's other side: let every Document through the pipeline (no docstore decision) and the same
    rewrite is chunked again, so the tests above would fail if sync decided without the docstore."""
    from llama_index.core.ingestion import IngestionPipeline

    vault = make_vault(NOTES)
    sync(home, vault)
    monkeypatch.setattr(IngestionPipeline, "_handle_upserts", lambda self, nodes: list(nodes))
    (vault / "a.md").write_text(NOTES["a.md"].replace("\n", "\r\n"), encoding="utf-8")
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged) == (1, 2)


def test_a_sync_that_dies_between_the_docstore_and_the_index_converges_at_the_next(home, make_vault, monkeypatch):
    """The pipeline writes the docstore before the index commits the note's chunks. A crash in between leaves the
    docstore holding the edit; the journal makes the next sync offer it again, so the edit is searchable."""
    vault = make_vault(NOTES)
    sync(home, vault)
    (vault / "b.md").write_text("# Beta\n\nCompost needs earthworms.", encoding="utf-8")

    def crash(self, rows):
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as patch:
        patch.setattr(Manifest, "put_chunks", crash)
        try:
            Brain(home).sync(vaults=(str(vault),))
        except KeyboardInterrupt:
            pass
    assert stored(home)["vault:notes/b.md"] != manifest_hashes(home)["vault:notes/b.md"]  # the docstore ran ahead
    report, source = sync(home, vault)
    assert (source.updated, source.unchanged) == (1, 2)
    assert stored(home) == manifest_hashes(home)
    assert Brain(home).search("earthworms", k=3).results[0]["note_id"] == "vault:notes/b.md"
