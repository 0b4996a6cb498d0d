"""`brain sync` gets its Documents from the readers: `VaultReader` / `MemosReader` `lazy_load_data` over the one
listing the sync made (no second pass, no second read of a Memos
server), and nothing LlamaIndex when nothing changed.

Through `Brain.sync` into a real home (fast model), a real vault folder and the Memos double over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_app.config import load_settings
from rag_app.engine import Brain
from rag_app.index.docstore import open_docstore
from rag_app.index.manifest import Manifest
from readers.memos_reader import MemosReader
from readers.vault_reader import VaultReader
from tests.doubles.memos_server import MemosDouble, seed_memos

TOKEN = "memos_pat_test"
NOTES = {
    "a.md": "---\ntitle: Alpha\ntags: [garden]\n---\n# Alpha\n\nTomatoes need sun. [[b]]",
    "sub/b.md": "# Beta\n\nCompost needs worms. #soil",
    "c.md": "Watering schedules in summer.",
}


@pytest.fixture
def memos(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemosDouble]:
    monkeypatch.setenv("CFLOW_API_TOKEN", TOKEN)
    with MemosDouble(mode="head") as double:
        double.keys = seed_memos(double, 12)
        yield double


def indexed_documents(home: Path) -> dict[str, tuple[str, dict[str, Any], str]]:
    """note id → (text, metadata, hash) of every indexed note: the text and metadata as the manifest keeps them (their
    one owner), the hash as the sync's docstore holds it (what its upserts decide by)."""
    manifest = Manifest(home / "index.sqlite")
    try:
        kept = {note_id: manifest.note_doc(note_id) for note_id in sorted(manifest.entries())}
    finally:
        manifest.close()
    docstore = open_docstore(load_settings(home))
    return {note_id: (text, metadata, docstore.get_document_hash(note_id))
            for note_id, (text, metadata) in kept.items()}


def reader_documents(documents: list[Any]) -> dict[str, tuple[str, dict[str, Any], str]]:
    return {doc.id_: (doc.text, doc.metadata, doc.hash) for doc in documents}


def test_a_vault_sync_stores_exactly_the_documents_the_vault_reader_yields(home: Path, make_vault) -> None:
    """Ids, text and metadata (file times included) equal `VaultReader(path).load_data()`, after a first sync and
    after an edit."""
    vault = make_vault(NOTES, name="garden")
    Brain(home).sync(vaults=(str(vault),))
    assert indexed_documents(home) == reader_documents(VaultReader(vault).load_data())
    (vault / "c.md").write_text("Watering schedules in winter.", encoding="utf-8")
    assert Brain(home).sync(vaults=(str(vault),)).sources[0].updated == 1
    assert indexed_documents(home) == reader_documents(VaultReader(vault).load_data())


def test_a_memos_sync_stores_exactly_the_documents_the_memos_reader_yields(home: Path, memos: MemosDouble) -> None:
    source = Brain(home).sync(memos=(memos.url,)).sources[0]
    assert source.added > 5
    documents = MemosReader(memos.url, token=TOKEN, source=source.name).load_data()
    assert indexed_documents(home) == reader_documents(documents)


def test_the_documents_a_sync_chunks_come_through_the_readers_lazy_load_data(
        home: Path, make_vault, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader whose `lazy_load_data` marks its Documents: every note the sync indexed carries the mark, and the
    reader was handed the sync's own listing (it does not list again)."""
    calls: list[Any] = []
    yielded: list[Any] = []
    original = VaultReader.lazy_load_data

    def marking(reader: VaultReader, *args: Any, **kwargs: Any) -> Iterator[Any]:
        calls.append(kwargs.get("listing"))
        for document in original(reader, *args, **kwargs):
            document.metadata["read_by"] = type(reader).__name__
            yielded.append(document)
            yield document

    monkeypatch.setattr(VaultReader, "lazy_load_data", marking)
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    assert len(calls) == 1 and calls[0] is not None and len(calls[0].records) == 3
    assert {d.id_ for d in yielded} == {"vault:notes/a.md", "vault:notes/sub/b.md", "vault:notes/c.md"}
    assert {d.metadata["read_by"] for d in yielded} == {"VaultReader"}
    # the docstore decided on the marked Documents themselves: their hash covers the mark
    assert {note_id: digest for note_id, (_, _, digest) in indexed_documents(home).items()} == {
        d.id_: d.hash for d in yielded}


def test_a_changed_memo_is_read_from_the_server_once(home: Path, memos: MemosDouble) -> None:
    """The sync's listing is the reader's: a sync with a change makes as many requests as one without."""
    Brain(home).sync(memos=(memos.url,))
    before = len(memos.requests)
    assert Brain(home).sync(memos=(memos.url,)).sources[0].unchanged > 5
    one_pass = len(memos.requests) - before
    memos.edit_memo(memos.keys[0], "edited once #garden")
    before = len(memos.requests)
    assert Brain(home).sync(memos=(memos.url,)).sources[0].updated == 1
    assert len(memos.requests) - before == one_pass


def test_a_sync_that_finds_nothing_changed_builds_no_reader(home: Path, make_vault, monkeypatch) -> None:
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a no-change sync asked the reader for Documents")

    monkeypatch.setattr(VaultReader, "from_lister", classmethod(refuse))
    source = Brain(home).sync(vaults=(str(vault),)).sources[0]
    assert (source.failed, source.unchanged) == (False, 3)


def test_a_no_change_memos_sync_parses_no_memo(home: Path, memos: MemosDouble, monkeypatch) -> None:
    """The second sync compares each memo's answer with its stored signature: nothing is parsed; after an edit, only
    the edited memo is, and the sync after that parses nothing again."""
    from readers import memos_client

    Brain(home).sync(memos=(memos.url,))
    parsed: list[str] = []
    original = memos_client.memo_to_record
    monkeypatch.setattr(memos_client, "memo_to_record",
                        lambda memo, *a, **kw: parsed.append(str(memo.get("name"))) or original(memo, *a, **kw))
    source = Brain(home).sync(memos=(memos.url,)).sources[0]
    assert (parsed, source.updated, source.unchanged > 5) == ([], 0, True)
    memos.edit_memo(memos.keys[0], "edited once #garden")
    assert Brain(home).sync(memos=(memos.url,)).sources[0].updated == 1
    assert parsed == [f"memos/{memos.keys[0]}"]
    assert Brain(home).sync(memos=(memos.url,)).sources[0].unchanged == source.unchanged
    assert parsed == [f"memos/{memos.keys[0]}"]
