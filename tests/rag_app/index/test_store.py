"""The vector store's long-lived reader handle: `brain doctor --compact` may swap the collection under it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import chromadb
from chromadb.errors import ChromaError

from rag_app.index.store import LiveCollection


def swap_in_a_copy(client: Any, name: str) -> None:
    """What compaction does: a rebuilt copy takes the name, the old collection is deleted."""
    old = client.get_collection(name)
    fresh = client.create_collection(name + "_fresh")
    got = old.get(include=["embeddings", "documents"])
    fresh.add(ids=got["ids"], embeddings=got["embeddings"], documents=got["documents"])
    old.modify(name=name + "_old")
    fresh.modify(name=name)
    client.delete_collection(name + "_old")


def test_a_reader_whose_collection_was_swapped_reads_the_new_one(tmp_path: Path) -> None:
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    client.create_collection("notes").add(ids=["a"], embeddings=[[1.0, 0.0]], documents=["alpha"])
    live = LiveCollection(client, "notes")
    assert live.count() == 1
    swap_in_a_copy(client, "notes")
    assert live.query(query_embeddings=[[1.0, 0.0]], n_results=1)["ids"] == [["a"]]


class MidDelete:
    """A collection a server is deleting: its first call fails as Chroma's server answers then."""

    def __init__(self, message: str):
        self.message, self.calls = message, 0

    def count(self) -> int:
        self.calls += 1
        raise ChromaError(self.message)


class Client:
    def __init__(self, first: Any, then: Any):
        self.handles = [first, then]

    def get_collection(self, name: str) -> Any:
        return self.handles.pop(0)


def test_a_server_caught_mid_delete_is_asked_again_by_name_and_other_errors_are_not_hidden(tmp_path: Path) -> None:
    real = chromadb.PersistentClient(path=str(tmp_path / "chroma")).create_collection("notes")
    live = LiveCollection(Client(MidDelete("Missing field: [Missing metadata segment]"), real), "notes")
    assert live.count() == 0  # before: ChromaError reached the search (a CI run under `doctor --compact`)
    failing = LiveCollection(Client(MidDelete("Quota exceeded"), real), "notes")
    try:
        failing.count()
    except ChromaError as exc:
        assert "Quota" in str(exc)
    else:
        raise AssertionError("an unrelated Chroma error must reach the caller")
