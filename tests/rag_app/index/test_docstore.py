"""The ingestion docstore: LlamaIndex's KVDocumentStore over SQLite in the home, or PostgreSQL for a team.

An IngestionPipeline with `docstore_strategy=UPSERTS` over it chunks a document only when its hash is new, keeps
identical text in two notes apart (dedup is by document id), and forgets a note through `delete_ref_doc`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chromadb
import pytest
from llama_index.core.ingestion import DocstoreStrategy, IngestionPipeline
from llama_index.core.schema import BaseNode, TransformComponent

from rag_app.config import ConfigError, Settings
from rag_app.index.docstore import (
    DOCSTORE_FILE,
    SQLiteKVStore,
    connection_strings,
    docstore_name,
    document_hashes,
    forget_documents,
    open_docstore,
)
from rag_app.ingest.pipeline import MarkdownChunker
from readers.records import NoteRecord


class CountingChunker(TransformComponent):
    """The project's chunker, counting the documents it was handed (what the docstore let through)."""

    seen: list[str] = []

    def __call__(self, nodes: Any, **kwargs: Any) -> list[BaseNode]:
        self.seen.extend(node.id_ for node in nodes)
        return MarkdownChunker()(nodes)


def note(note_id: str, text: str, mtime: int = 1) -> Any:
    return NoteRecord(note_id, text, {"title": note_id}, volatile={"mtime_ts": mtime}).to_document()


def pipeline(docstore: Any, tmp_path: Path) -> tuple[IngestionPipeline, CountingChunker]:
    """UPSERTS acts only with a vector store attached: a real (embedded) Chroma collection."""
    from llama_index.vector_stores.chroma import ChromaVectorStore

    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    store = ChromaVectorStore(chroma_collection=client.get_or_create_collection("chunks"))
    chunker = CountingChunker()
    chunker.seen = []
    return IngestionPipeline(transformations=[chunker], docstore=docstore, vector_store=store,
                             docstore_strategy=DocstoreStrategy.UPSERTS, disable_cache=True), chunker


def check_upserts(docstore: Any, tmp_path: Path) -> None:
    """The behaviour both backends must show, one run after another."""
    run, chunker = pipeline(docstore, tmp_path)
    first = run.run(documents=[note("a", "alpha"), note("b", "same text"), note("c", "same text")],
                    store_doc_text=False)
    assert chunker.seen == ["a", "b", "c"]  # identical text in two notes: both chunked, each under its own id
    assert {n.ref_doc_id for n in first} == {"a", "b", "c"}
    chunker.seen.clear()
    again = run.run(documents=[note("a", "alpha", mtime=2), note("b", "same text, edited"), note("c", "same text")],
                    store_doc_text=False)
    assert chunker.seen == ["b"]  # a touched file (mtime only) and an unchanged note are not chunked again
    assert [n.ref_doc_id for n in again] == ["b"]
    docstore.delete_ref_doc("c", raise_error=False)  # a no-op for input Documents: they have no ref-doc info
    assert docstore.get_document_hash("c")
    forget_documents(docstore, ["c"])
    assert document_hashes(docstore, ["a", "b", "c"]).keys() == {"a", "b"}
    import rag_app.index.docstore as docstore_module

    bulk = docstore_module.BULK_LOOKUP
    docstore_module.BULK_LOOKUP = 1  # many notes: one pass over the hashes gives the same answer
    try:
        assert document_hashes(docstore, ["a", "b", "c"]) == {k: docstore.get_document_hash(k) for k in "ab"}
    finally:
        docstore_module.BULK_LOOKUP = bulk
    assert docstore.get_document("b", raise_error=False) is None  # hashes only: the manifest owns the text


def test_the_home_docstore_is_a_sqlite_file_that_survives_a_reopen(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    check_upserts(open_docstore(settings), tmp_path)
    assert (settings.home / DOCSTORE_FILE).stat().st_size > 0
    reopened = open_docstore(settings)
    assert reopened.get_document_hash("a") == note("a", "alpha").hash
    run, chunker = pipeline(reopened, tmp_path)
    run.run(documents=[note("a", "alpha"), note("c", "same text")])
    assert chunker.seen == ["c"]  # forgotten, so new again


def test_sqlite_kvstore_keeps_collections_apart_and_reports_deletes(tmp_path: Path) -> None:
    store = SQLiteKVStore(tmp_path / "kv.sqlite")
    store.put_all([("k1", {"v": 1}), ("k2", {"v": "二"})], collection="one")
    store.put("k1", {"v": "other"}, collection="two")
    assert store.get_all("one") == {"k1": {"v": 1}, "k2": {"v": "二"}}
    assert (store.get("k1", "two"), store.get("k3", "one")) == ({"v": "other"}, None)
    assert (store.delete("k1", "one"), store.delete("k1", "one")) == (True, False)
    assert store.get_all("one") == {"k2": {"v": "二"}}


def test_a_docstore_url_that_is_not_postgresql_is_refused_without_its_password(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, docstore_url="mysql://me:s3cret-pw@db.example/brain")
    with pytest.raises(ConfigError, match="postgresql://") as caught:
        open_docstore(settings)
    assert "s3cret-pw" not in str(caught.value)


def test_a_team_docstore_lives_in_postgresql(postgres: str, tmp_path: Path) -> None:
    """`[store] docstore_url` gives LlamaIndex's PostgresDocumentStore: same upserts, and nothing in the home."""
    from llama_index.storage.docstore.postgres import PostgresDocumentStore

    settings = Settings(home=tmp_path / "home", docstore_url=postgres)
    docstore = open_docstore(settings)
    assert isinstance(docstore, PostgresDocumentStore)
    check_upserts(docstore, tmp_path)
    assert not (settings.home / DOCSTORE_FILE).exists()
    assert open_docstore(settings).get_document_hash("b") == note("b", "same text, edited").hash


def test_a_home_pointed_at_postgresql_copies_its_notes_there_once(postgres: str, tmp_path: Path) -> None:
    """A home whose notes live in its SQLite docstore, then pointed at a team database: the first sync with a change
    copies every note there (not only the changed one), under the hash it was indexed with; nothing is re-embedded."""
    from rag_app.engine import Brain
    from rag_app.index.manifest import Manifest

    home, vault = tmp_path / "home", tmp_path / "vault"
    vault.mkdir()
    for name in "abc":
        (vault / f"{name}.md").write_text(f"# {name}\n\nnote {name} about compost", encoding="utf-8")
    (home).mkdir()
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n', encoding="utf-8")
    assert not Brain(home).sync(vaults=(str(vault),)).failed
    (home / "config.toml").write_text(f'[embedding]\nmodel = "use-m3"\n\n[store]\ndocstore_url = "{postgres}"\n',
                                      encoding="utf-8")
    (vault / "b.md").write_text("# b\n\nnote b about compost, edited", encoding="utf-8")
    report = Brain(home).sync(vaults=(str(vault),))
    assert not report.failed and report.vectors == {"use-m3": report.chunks_written}
    manifest = Manifest(home / "index.sqlite")
    indexed = {note_id: entry.hash for note_id, entry in manifest.entries().items()}
    manifest.close()
    team = open_docstore(Settings(home=home, docstore_url=postgres))
    assert document_hashes(team, sorted(indexed)) == indexed and len(indexed) == 3


def test_a_docstore_is_named_without_its_credentials() -> None:
    assert docstore_name(Settings(home=Path("/h"))) == "home"
    named = docstore_name(Settings(home=Path("/h"), docstore_url="postgresql://brain:s3cret@db.lan/notes?sslmode=require"))
    assert named == "postgresql://db.lan:5432/notes"


def test_the_docstore_url_is_a_store_setting(tmp_path: Path) -> None:
    from rag_app.config import load_settings

    (tmp_path / "config.toml").write_text('[store]\ndocstore_url = "postgresql://brain@db.lan:5433/notes"\n',
                                          encoding="utf-8")
    assert load_settings(tmp_path).docstore_url == "postgresql://brain@db.lan:5433/notes"


def test_a_postgres_url_keeps_its_tls_settings_and_ipv6_host() -> None:
    sync_url, async_url = connection_strings("postgresql://brain@db.example:5433/notes?sslmode=verify-full")
    assert sync_url == "postgresql+psycopg2://brain@db.example:5433/notes?sslmode=verify-full"
    assert async_url == "postgresql+asyncpg://brain@db.example:5433/notes?ssl=verify-full"
    assert connection_strings("postgres://brain@[::1]/notes")[0] == "postgresql+psycopg2://brain@[::1]:5432/notes"
