"""A vault sync decides "unchanged" from each file's bytes before parsing, and still re-embeds whatever must be.

Through `Brain.sync` into a real home (fast model); `VaultScanner.parse` is watched to see which files were parsed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rag_app.engine import Brain
from rag_app.index.manifest import Manifest
from readers.vault_scanner import VaultScanner

NOTES = {
    "a.md": "---\ntitle: Alpha\ntags: [garden]\ncreated: 2024-03-01\n---\n# Alpha\n\nTomatoes need sun. See [[b]].",
    "b.md": "---\ntitle: Beta\naliases: [B]\n---\nBeta is about compost.",
    "sub/c.md": "# Gamma\n\nWatering schedules in summer.",
}


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The relative paths of the files parsed since the test started (cleared by the test when it needs to)."""
    seen: list[str] = []
    original = VaultScanner.parse

    def watched(self: VaultScanner, rel: str, *args: object) -> object:
        seen.append(rel)
        return original(self, rel, *args)

    monkeypatch.setattr(VaultScanner, "parse", watched)
    return seen


def sync(home: Path, vault: Path):
    report = Brain(home).sync(vaults=(str(vault),))
    assert not report.failed, report.sources[0].error
    return report, report.sources[0]


def sql(home: Path, statement: str, *args: object) -> None:
    db = sqlite3.connect(home / "index.sqlite")
    with db:
        db.execute(statement, args)
    db.close()


def test_a_no_change_sync_parses_no_file_and_an_edit_parses_only_that_file(home, make_vault, parsed):
    vault = make_vault(NOTES)
    sync(home, vault)
    assert sorted(parsed) == ["a.md", "b.md", "sub/c.md"]
    parsed.clear()
    report, source = sync(home, vault)
    assert (parsed, source.unchanged, source.updated, source.deleted, report.model_loaded) == ([], 3, 0, 0, False)
    (vault / "b.md").write_text(NOTES["b.md"] + "\n\nAdded a line about worms.", encoding="utf-8")
    (vault / "sub" / "c.md").unlink()
    report, source = sync(home, vault)
    assert parsed == ["b.md"]
    assert (source.unchanged, source.updated, source.deleted) == (1, 1, 1)
    hits = Brain(home).search("worms", 5, mode="bm25").results
    assert [r["path"] for r in hits] == ["b.md"]


def test_a_chunker_change_re_chunks_files_whose_bytes_did_not_change(home, make_vault, parsed):
    """Signatures are trusted only for notes chunked with the current chunker: a new one parses and re-chunks all."""
    vault = make_vault(NOTES)
    sync(home, vault)
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[chunking]\nmax_chars = 200\n', encoding="utf-8")
    parsed.clear()
    report, source = sync(home, vault)
    assert sorted(parsed) == ["a.md", "b.md", "sub/c.md"]
    assert (source.updated, source.unchanged, report.vectors) == (3, 0, {"use-m3": report.chunks_written})
    assert report.chunks_written >= 3
    parsed.clear()
    report, source = sync(home, vault)
    assert (parsed, source.unchanged, report.chunks_written, report.vectors) == ([], 3, 0, {})


def test_a_model_change_embeds_every_unchanged_file_with_the_new_model(home, make_vault, parsed):
    """Vectors come from the stored chunk texts, so the files need no parsing, but every note gets the new model."""
    vault = make_vault(NOTES)
    first, _ = sync(home, vault)
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\nsecond_model = ""\n', encoding="utf-8")
    parsed.clear()
    report, source = sync(home, vault)
    assert (parsed, source.unchanged, report.model_loaded) == ([], 3, True)
    assert report.vectors == {"e5-small": first.chunks_written}
    hits = Brain(home).search("compost", 3, mode="vector").results
    assert hits and hits[0]["path"] == "b.md"


def test_a_signature_is_trusted_only_while_the_index_entry_is_the_one_it_was_stored_with(home, make_vault, parsed):
    """A note whose stored hash moved on is parsed and offered: the docstore holds it unchanged, so nothing is chunked
    and the index's record is put right; one whose kept text is missing is parsed to restore it (without
    re-embedding)."""
    vault = make_vault(NOTES)
    sync(home, vault)
    sql(home, "UPDATE notes SET hash = 'not what the file gives' WHERE note_id = ?", "vault:notes/a.md")
    sql(home, "DELETE FROM note_docs WHERE note_id = ?", "vault:notes/b.md")
    parsed.clear()
    report, source = sync(home, vault)
    assert sorted(parsed) == ["a.md", "b.md"]
    assert (source.updated, source.unchanged, report.chunks_written) == (0, 3, 0)
    manifest = Manifest(home / "index.sqlite")
    try:
        assert manifest.note_doc("vault:notes/b.md")[0] == "Beta is about compost."
        assert manifest.entries()["vault:notes/a.md"].hash != "not what the file gives"
    finally:
        manifest.close()
    parsed.clear()
    assert (sync(home, vault)[1].unchanged, parsed) == (3, [])


def test_an_older_home_without_signatures_is_migrated_in_place(home, make_vault, parsed):
    """The first sync after the upgrade parses every file once, re-embeds nothing, and the next one parses none."""
    vault = make_vault(NOTES)
    sync(home, vault)
    sql(home, "DROP TABLE file_signatures")
    parsed.clear()
    report, source = sync(home, vault)
    assert (len(parsed), source.unchanged, report.model_loaded) == (3, 3, False)
    parsed.clear()
    assert (sync(home, vault)[1].unchanged, parsed) == (3, [])


def test_a_renamed_file_with_the_same_bytes_is_a_new_note(home, make_vault, parsed):
    """Signatures are per note id (its path): the same bytes under a new name are parsed and indexed there."""
    vault = make_vault(NOTES)
    sync(home, vault)
    (vault / "sub" / "c.md").rename(vault / "c-moved.md")
    parsed.clear()
    _, source = sync(home, vault)
    assert (parsed, source.added, source.deleted, source.unchanged) == (["c-moved.md"], 1, 1, 2)
