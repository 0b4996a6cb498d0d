"""VaultReader: the LlamaIndex face of the scanner, one Document per note."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from llama_index.core.schema import Document

from readers.vault_reader import VaultReader
from readers.vault_scanner import VaultError, VaultScanner
from tests.conftest import SAMPLE_VAULT

MakeVault = Callable[..., Path]


def test_documents_mirror_the_scanned_records(make_vault: MakeVault) -> None:
    """Same ids and text as the records; metadata is the record metadata plus the volatile keys."""
    root = make_vault({"a.md": "---\ntitle: A\ntags: [x]\n---\nalpha", "sub/b.md": "# B\nbeta [[a]]"})
    records = VaultScanner(root, name="work").scan().records
    documents = VaultReader(root, name="work").load_data()
    assert all(isinstance(doc, Document) for doc in documents)
    assert [doc.id_ for doc in documents] == [r.id for r in records] == ["vault:work/a.md", "vault:work/sub/b.md"]
    assert [doc.text for doc in documents] == ["alpha", "# B\nbeta [[a]]"]
    for doc, record in zip(documents, records, strict=True):
        assert doc.metadata == {**record.metadata, **record.volatile}
        assert set(record.volatile) == {"mtime", "mtime_ts"}


def test_warnings_are_exposed_on_the_reader(make_vault: MakeVault) -> None:
    """Per-file problems do not raise: the note is skipped or read, and the reader lists what happened."""
    reader = VaultReader(make_vault({"ok.md": "ok", "blob.md": b"\x00\x01", "big.md": "x" * 50}), max_bytes=20)
    assert reader.warnings == []
    documents = reader.load_data()
    assert [doc.id_ for doc in documents] == ["vault:notes/ok.md"]
    assert reader.warnings == [
        "big.md: 50 bytes is over the 20-byte limit; not read, its indexed copy is kept",
        "blob.md: binary content in a .md file; skipped",
    ]


def test_sample_vault_loads_as_documents() -> None:
    """The bundled vault gives 41 documents without warnings; known notes carry their metadata."""
    reader = VaultReader(SAMPLE_VAULT)
    documents = {doc.id_: doc for doc in reader.load_data()}
    assert (len(documents), reader.warnings) == (41, [])
    assert not any("/.obsidian/" in doc_id for doc_id in documents)
    films = documents["vault:sample_vault/生活/电影清单.md"]
    assert (films.metadata["title"], films.metadata["tags"]) == ("电影清单", '["电影", "清单"]')
    assert documents["vault:sample_vault/tech/vim-notes.md"].metadata["title"] == "vim-notes"


def test_a_reader_handed_what_the_index_knows_yields_only_new_and_changed_notes(make_vault: MakeVault) -> None:
    """Known notes whose bytes match yield nothing; an edited and a new note do; a removed one is listed as gone."""
    root = make_vault({"same.md": "same", "edited.md": "before", "removed.md": "bye"})
    first = VaultReader(root, name="work")
    assert len(first.load_data()) == 3
    (root / "edited.md").write_text("after", encoding="utf-8")
    (root / "new.md").write_text("hello", encoding="utf-8")
    (root / "removed.md").unlink()
    again = VaultReader(root, name="work", known=first.signatures)
    assert [doc.text for doc in again.lazy_load_data()] == ["after", "hello"]
    assert again.unchanged_ids == {"vault:work/same.md"}
    assert again.gone_ids == {"vault:work/removed.md"}


def test_a_known_note_without_a_signature_is_read_again(make_vault: MakeVault) -> None:
    """"" means: the index holds this note but cannot vouch for it (another chunker, no text kept): it is yielded."""
    root = make_vault({"a.md": "alpha"})
    reader = VaultReader(root, name="work", known={"vault:work/a.md": ""})
    assert [doc.id_ for doc in reader.load_data()] == ["vault:work/a.md"]
    assert (reader.unchanged_ids, reader.gone_ids) == (set(), set())


def test_an_unreadable_or_oversized_note_is_kept_not_gone(make_vault: MakeVault) -> None:
    """A known note that exists but is not read this time is in `kept_ids`, so nobody deletes its indexed copy."""
    root = make_vault({"big.md": "x" * 50})
    reader = VaultReader(root, name="work", max_bytes=20, known={"vault:work/big.md": "old signature"})
    assert reader.load_data() == []
    assert (reader.kept_ids, reader.gone_ids) == ({"vault:work/big.md"}, set())


def test_a_folder_that_cannot_be_listed_fails_before_anything_is_yielded(make_vault: MakeVault) -> None:
    """No partial listing: the generator raises on its first step, having yielded no Document."""
    reader = VaultReader(make_vault({"a.md": "alpha"}) / "missing", known={"vault:work/a.md": "sig"})
    documents = reader.lazy_load_data()
    with pytest.raises(VaultError, match="not found"):
        next(documents)
    assert reader.gone_ids == set()


def test_touching_a_file_keeps_the_document_hash_editing_changes_it(make_vault: MakeVault) -> None:
    """The hash (what an IngestionPipeline's docstore compares) leaves the file time out, and equals the record's."""
    root = make_vault({"a.md": "alpha"})
    before = VaultReader(root).load_data()[0]
    os.utime(root / "a.md", (1_000_000_000, 1_000_000_000))
    touched = VaultReader(root).load_data()[0]
    assert touched.metadata["mtime"] != before.metadata["mtime"]
    assert touched.hash == before.hash == VaultScanner(root).scan().records[0].content_hash
    (root / "a.md").write_text("alpha, edited", encoding="utf-8")
    assert VaultReader(root).load_data()[0].hash != before.hash
