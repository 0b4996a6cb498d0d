"""A damaged home docstore (`docstore.sqlite` cut short, its header overwritten, a folder in its place, emptied to
zero bytes) is named as a store failure, found by `brain doctor`, and rebuilt by `--repair` so that every note the
index holds is in it again; the next sync then carries on as usual.

Through the real CLI in subprocesses (exit codes, stderr) against a real home (fast model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.fault_trials import run_brain, write_notes
from rag_app.config import load_settings
from rag_app.index.docstore import DOCSTORE_FILE, close_docstore, document_hashes, open_docstore
from rag_app.index.manifest import Manifest

NOTES = 8


def manifest_hashes(home: Path) -> dict[str, str]:
    manifest = Manifest(home / "index.sqlite")
    try:
        return {note_id: entry.hash for note_id, entry in manifest.entries().items()}
    finally:
        manifest.close()


def stored(home: Path) -> dict[str, str]:
    """note id → hash of every note of the manifest the docstore holds."""
    docstore = open_docstore(load_settings(home))
    try:
        return document_hashes(docstore, sorted(manifest_hashes(home)))
    finally:
        close_docstore(docstore)


def damage(path: Path, kind: str) -> None:
    """What a crash, a bad disk or a stray command leaves (the -wal/-shm companions gone with the old file)."""
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    size = path.stat().st_size
    if kind == "truncated":
        with path.open("r+b") as f:
            f.truncate(size // 2)
    elif kind == "garbage_header":
        with path.open("r+b") as f:
            f.write(b"not a database, really" * 4)
    elif kind == "zero_length":
        path.write_bytes(b"")
    elif kind == "directory":
        path.unlink()
        path.mkdir()


def synced_vault(home: Path, tmp_path: Path) -> Path:
    vault = tmp_path / "vault"
    write_notes(vault, NOTES)
    done = run_brain(home, "sync", "--vault", str(vault))
    assert done.returncode == 0, done.stderr
    return vault


def edit(vault: Path) -> None:
    """One edited note and one new one: what the sync after the damage must index."""
    (vault / "n001.md").write_text("# Edited\n\nan edited note about compost heaps", encoding="utf-8")
    (vault / "new.md").write_text("# New\n\na new note about mulch", encoding="utf-8")


@pytest.mark.parametrize("kind", ["truncated", "garbage_header", "directory"])
def test_a_damaged_docstore_is_named_found_by_doctor_and_rebuilt_by_repair(home, tmp_path, kind):
    vault = synced_vault(home, tmp_path)
    path = home / DOCSTORE_FILE
    damage(path, kind)
    edit(vault)

    failed = run_brain(home, "sync", "--vault", str(vault))
    assert failed.returncode == 2, failed.stderr  # a store error, as the CLI says any store error
    said = [line for line in failed.stderr.splitlines() if line.startswith("brain:")]
    assert len(said) == 1 and str(path) in said[0] and "brain doctor --repair" in said[0], failed.stderr
    assert "source remove" not in failed.stderr

    status = json.loads(run_brain(home, "status", "--json").stdout)
    assert status["docstore"]["name"] == str(path) and "brain doctor --repair" in status["docstore"]["error"]

    found = run_brain(home, "doctor", "--json")
    assert found.returncode == 1
    problems = json.loads(found.stdout)["problems"]
    assert problems["docstore_unusable"]["count"] == 1 and str(path) in problems["docstore_unusable"]["examples"][0]
    text = run_brain(home, "doctor").stdout
    assert f"docstore: the docstore {path} is damaged" in text and "ok: the stores agree" not in text

    repaired = run_brain(home, "doctor", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    rebuilt = json.loads(repaired.stdout)["repair"]["docstore"]
    assert rebuilt["repaired"] and rebuilt["copied_notes"] == NOTES
    assert [Path(p).name.startswith(f"{DOCSTORE_FILE}.damaged-") for p in rebuilt["set_aside"]] == [True]
    assert Path(rebuilt["set_aside"][0]).exists()  # kept, not deleted
    assert stored(home) == manifest_hashes(home)

    again = run_brain(home, "sync", "--vault", str(vault), "--json")
    assert again.returncode == 0, again.stderr
    source = json.loads(again.stdout)["sources"][0]
    assert (source["added"], source["updated"], source["unchanged"]) == (1, 1, NOTES - 1)
    assert stored(home) == manifest_hashes(home) and len(manifest_hashes(home)) == NOTES + 1
    assert run_brain(home, "doctor").returncode == 0


def test_a_docstore_emptied_to_zero_bytes_is_filled_with_every_note_at_the_next_sync(home, tmp_path):
    """A zero-length file is a valid, empty database: the sync must copy every note in again, not only the ones that
    changed (it used to trust its "filled once" mark and hold 2 of them)."""
    vault = synced_vault(home, tmp_path)
    damage(home / DOCSTORE_FILE, "zero_length")
    edit(vault)
    done = run_brain(home, "sync", "--vault", str(vault))
    assert done.returncode == 0, done.stderr
    assert stored(home) == manifest_hashes(home) and len(manifest_hashes(home)) == NOTES + 1
    assert run_brain(home, "doctor").returncode == 0


def test_repair_fills_a_docstore_that_lost_notes_and_drops_notes_the_index_no_longer_has(home, tmp_path):
    """Rows deleted by hand, one stale hash, one note the index never had: repair forces them all right, although the
    docstore's "filled once" mark is set."""
    import sqlite3

    synced_vault(home, tmp_path)
    ids = sorted(manifest_hashes(home))
    db = sqlite3.connect(str(home / DOCSTORE_FILE), isolation_level=None)
    db.execute("DELETE FROM kv WHERE key IN (?, ?)", (ids[0], ids[1]))
    db.execute("UPDATE kv SET value = '{\"doc_hash\": \"stale\"}' WHERE key = ? AND collection = 'notes/metadata'",
               (ids[2],))
    db.execute("INSERT INTO kv VALUES ('notes/metadata', 'vault:vault/gone.md', '{\"doc_hash\": \"x\"}')")
    db.close()
    found = json.loads(run_brain(home, "doctor", "--json").stdout)["problems"]
    assert found["docstore_missing"]["examples"] == ids[:2]
    assert found["docstore_stale"]["examples"] == [ids[2]]
    assert found["docstore_extra"]["examples"] == ["vault:vault/gone.md"]
    repaired = run_brain(home, "doctor", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stdout
    assert json.loads(repaired.stdout)["repair"]["docstore"]["copied_notes"] == 3
    assert stored(home) == manifest_hashes(home)
