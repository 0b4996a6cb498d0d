"""VaultReader: the LlamaIndex face of the scanner, one Document per note."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llama_index.core.schema import Document

from readers.vault_reader import VaultReader
from readers.vault_scanner import VaultScanner
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
