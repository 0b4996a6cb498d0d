"""`brain doctor`: finds every way Chroma, the manifest and BM25 can disagree, repairs them re-embedding only broken
notes, and compacts Chroma while open searchers keep working."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import chromadb
import numpy as np

from bench.fault_trials import convergence_problems, run_brain, write_notes
from rag_app.engine import Brain
from rag_app.index.store import collection_name
from rag_app.ingest.lock import SyncLock

COLLECTION = collection_name("use-m3")


def synced(home: Path, tmp_path: Path, count: int) -> tuple[Path, dict[str, str]]:
    vault = tmp_path / "vault"
    titles = write_notes(vault, count)
    assert not Brain(home).sync(vaults=(str(vault),)).failed
    return vault, titles


def collection(home: Path, name: str = COLLECTION):
    return chromadb.PersistentClient(path=str(home / "chroma")).get_collection(name)


def chunk_ids(home: Path, note_id: str) -> list[str]:
    db = sqlite3.connect(str(home / "index.sqlite"))
    try:
        return json.loads(db.execute("SELECT chunk_ids FROM notes WHERE note_id = ?", (note_id,)).fetchone()[0])
    finally:
        db.close()


def sql(home: Path, statement: str, *args: object) -> None:
    db = sqlite3.connect(str(home / "index.sqlite"), isolation_level=None)
    try:
        db.execute(statement, args)
    finally:
        db.close()


def test_a_clean_index_agrees_and_the_cli_exits_0(home, tmp_path):
    synced(home, tmp_path, 4)
    done = run_brain(home, "doctor", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["store"] == "embedded" and report["model"] == "use-m3"
    counts = report["counts"]
    assert counts["notes"] == 4
    assert counts["manifest_chunks"] == counts["chunk_rows"] == counts["vectors"] == counts["bm25_ids"] >= 8
    assert all(p == {"count": 0, "examples": []} for p in report["problems"].values())
    text = run_brain(home, "doctor")
    assert text.returncode == 0 and "ok: the stores agree" in text.stdout


def test_every_kind_of_disagreement_is_found_and_repair_reembeds_only_broken_notes(home, tmp_path):
    vault, titles = synced(home, tmp_path, 8)
    a, b, c, e = (f"vault:vault/n{i:03d}.md" for i in range(4))
    broken = {n: chunk_ids(home, n) for n in (a, b, c)}
    col = collection(home)
    col.delete(ids=[broken[a][0]])  # a: a missing vector
    col.add(ids=["vault:vault/ghost.md:chunk:0"], embeddings=[np.ones(512).tolist()],
            metadatas=[{"document_id": "vault:vault/ghost.md"}], documents=["ghost"])
    sql(home, "DELETE FROM chunks WHERE chunk_id = ?", broken[b][0])  # b: a missing chunk row
    sql(home, "INSERT INTO chunks (chunk_id, note_id, source, text, metadata, tokens) "
              "VALUES ('vault:vault/gone.md:chunk:0', 'vault:vault/gone.md', 'vault', 'x', '{}', 'x')")
    sql(home, "UPDATE notes SET model = 'e5-small' WHERE note_id = ?", c)  # c: embedded by another model
    e_ids = chunk_ids(home, e)
    col.delete(ids=[e_ids[0]])  # e: a missing vector and no stored text
    sql(home, "DELETE FROM note_docs WHERE note_id = ?", e)
    bm25 = home / "bm25" / "ids.json"
    saved = json.loads(bm25.read_text())
    bm25.write_text(json.dumps({"stamp": "0/kw-v1", "ids": saved["ids"][1:] + ["vault:vault/old.md:chunk:0"]}))

    done = run_brain(home, "doctor", "--json")
    assert done.returncode == 1
    problems = {kind: found["examples"] for kind, found in json.loads(done.stdout)["problems"].items()}
    assert problems["orphan_vectors"] == ["vault:vault/ghost.md:chunk:0"] + sorted(broken[c])
    assert problems["missing_vectors"] == sorted([broken[a][0], e_ids[0]] + broken[c])
    assert problems["orphan_chunks"] == ["vault:vault/gone.md:chunk:0"]
    assert problems["missing_chunks"] == [broken[b][0]]
    assert problems["bm25_missing"] == [saved["ids"][0]] and problems["bm25_stale"] == ["vault:vault/old.md:chunk:0"]
    assert problems["bm25_stamp"] == [f"saved 0/kw-v1, current {saved['stamp']}"]

    result = Brain(home).doctor(repair=True)
    assert result["ok"] is True, {k: v for k, v in result["problems"].items() if v["count"]}
    repair = result["repair"]
    assert repair["reembedded_notes"] == 3
    assert repair["chunks_written"] == sum(len(ids) for ids in broken.values())
    # the ghost, and e's vectors once e left the manifest; c's old vectors went when c was re-embedded
    assert (repair["deleted_vectors"], repair["deleted_chunk_rows"], repair["needs_sync"]) == (len(e_ids), 1, [e])
    assert repair["found"]["missing_vectors"]["count"] == len(problems["missing_vectors"])
    again = Brain(home).sync(vaults=(str(vault),)).sources[0]
    assert (again.added, again.updated, again.unchanged) == (1, 0, 7)  # e comes back; repaired notes kept their hash
    assert convergence_problems(home, titles) == []


def test_compact_reclaims_churned_space_keeps_every_vector_and_open_searchers_follow(home, tmp_path):
    _, titles = synced(home, tmp_path, 20)
    col = collection(home)
    before = col.get(include=["embeddings", "metadatas", "documents"])
    for _ in range(15):  # what many small syncs do: delete and re-add the same chunks (chroma-core/chroma#2594)
        for start in range(0, len(before["ids"]), 5):
            part = slice(start, start + 5)
            col.delete(ids=before["ids"][part])
            col.add(ids=before["ids"][part], embeddings=before["embeddings"][part],
                    metadatas=before["metadatas"][part], documents=before["documents"][part])
    reader = Brain(home)
    title = titles["vault:vault/n007.md"]
    found = [r["note_id"] for r in reader.search(title, k=3, mode="vector", expand=False).results]

    done = run_brain(home, "doctor", "--compact", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    compact = report["compact"]
    assert report["ok"] is True
    assert compact["collections"] == [{"collection": COLLECTION, "vectors": len(before["ids"])}]
    assert compact["vacuum"] == "done" and compact["bytes_after"] < compact["bytes_before"]
    after = collection(home).get(ids=before["ids"], include=["embeddings", "metadatas", "documents"])
    order = [after["ids"].index(i) for i in before["ids"]]
    assert np.allclose(np.asarray(after["embeddings"])[order], np.asarray(before["embeddings"]))
    assert [after["metadatas"][i] for i in order] == before["metadatas"]
    assert [after["documents"][i] for i in order] == before["documents"]
    client = chromadb.PersistentClient(path=str(home / "chroma"))
    assert [c.name for c in client.list_collections()] == [COLLECTION]
    assert len([p for p in (home / "chroma").iterdir() if p.is_dir()]) == 1  # the dropped copy's folder is gone
    assert [r["note_id"] for r in reader.search(title, k=3, mode="vector", expand=False).results] == found
    reader.close()


def test_an_interrupted_compaction_is_reported_then_undone_without_reembedding(home, tmp_path):
    synced(home, tmp_path, 3)
    client = chromadb.PersistentClient(path=str(home / "chroma"))
    client.get_collection(COLLECTION).modify(name=COLLECTION + ".compact-old")
    client.create_collection(COLLECTION + ".compact-new")  # the half-made copy
    check = Brain(home).doctor()
    assert check["ok"] is False
    assert check["problems"]["interrupted_compaction"]["examples"] == [COLLECTION + ".compact-new",
                                                                      COLLECTION + ".compact-old"]
    fixed = Brain(home).doctor(repair=True)
    assert fixed["ok"] is True and fixed["repair"]["reembedded_notes"] == 0
    assert [c.name for c in client.list_collections()] == [COLLECTION]


def test_doctor_waits_for_a_running_sync_then_reports_busy(home, tmp_path):
    synced(home, tmp_path, 2)
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[sync]\nlock_wait_seconds = 0.3\n')
    with SyncLock(home, wait=0):
        done = run_brain(home, "doctor", "--repair")
    assert done.returncode == 3 and "another sync is running" in done.stderr


def test_a_note_of_two_models_needs_its_chunks_in_both_collections(home, tmp_path):
    """The manifest records every dense model of a note ("use-m3+e5-small"): each one's collection is checked."""
    synced(home, tmp_path, 2)
    sql(home, "UPDATE notes SET model = 'use-m3+e5-small'")
    report = Brain(home).doctor()
    problems = {kind: found["count"] for kind, found in report["problems"].items() if found["count"]}
    chunks = report["counts"]["manifest_chunks"]
    assert problems == {"missing_vectors": chunks}  # nothing in notes_e5-small, no orphans
