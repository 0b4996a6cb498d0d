"""The manifest: what the index holds of each note (chunks, models, signatures), its journal and its sources."""

from __future__ import annotations

import pytest

from rag_app.index.manifest import Manifest, ManifestEntry, split_models
from readers.records import NoteRecord

CHUNKER = "md-v3:600:100"


def entry(record: NoteRecord, chunker: str = CHUNKER, model: str = "e5-small+use-m3") -> ManifestEntry:
    return ManifestEntry(record.id, "notes", record.content_hash, model, chunker, [f"{record.id}:chunk:0"])


A, B, C = (NoteRecord(f"vault:notes/{n}.md", f"text of {n}", {"title": n}) for n in "abc")


def test_models_are_read_in_one_place():
    assert split_models("e5-small+use-m3") == {"e5-small", "use-m3"} and split_models("") == set()


def test_notes_lacking_a_model_in_a_stable_order_and_progress_counts(tmp_path):
    manifest = Manifest(tmp_path / "index.sqlite")
    try:
        with manifest.transaction():
            for record, model in ((C, "use-m3"), (A, ""), (B, "e5-small+use-m3")):
                manifest.put_note(record, "notes", model, CHUNKER, [f"{record.id}:chunk:{n}" for n in range(2)])
        assert manifest.notes_lacking("use-m3") == [A.id]
        assert manifest.notes_lacking("e5-small") == [A.id, C.id]
        before = manifest.progress_stamp()
        with manifest.transaction():
            manifest.add_model([A.id, C.id], "e5-small")
        assert manifest.progress_stamp() != before
        assert manifest.channel_counts() == (6, {"e5-small": 6, "use-m3": 4})
        with manifest.transaction():
            manifest.keep_only_models({"e5-small"})
        assert manifest.models_in_use() == {"e5-small"}
    finally:
        manifest.close()


def test_an_older_home_opened_twice_at_once_gains_its_columns_once(tmp_path):
    """Two shells opening a home whose chunks table predates a column: the second one to get the write lock finds it
    added and adds nothing (before: "duplicate column name: embed_hash")."""
    import sqlite3
    import threading
    import time

    path = tmp_path / "index.sqlite"
    Manifest(path).close()
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("DROP INDEX chunks_embed_hash")
    old.execute("ALTER TABLE chunks DROP COLUMN embed_hash")  # a home from before the column
    old.execute("BEGIN IMMEDIATE")
    old.execute("ALTER TABLE chunks ADD COLUMN embed_hash TEXT")  # the other opener, not yet committed
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            Manifest(path).close()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    opener = threading.Thread(target=open_it)
    opener.start()
    time.sleep(0.5)  # it has read the columns and waits for the write lock
    old.execute("COMMIT")
    opener.join(timeout=30)
    assert errors == []
    columns = [row[1] for row in old.execute("PRAGMA table_info(chunks)")]
    assert columns.count("embed_hash") == 1


def test_a_new_home_opened_while_another_process_writes_it_waits_instead_of_failing(tmp_path):
    """A sync creating the home while `brain status` opens it: SQLite refuses the switch to WAL at once ("database is
    locked", no busy wait) while the other side holds the write lock; opening waits for it (before: the sync died)."""
    import sqlite3
    import threading

    path = tmp_path / "index.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # another process, first write
    other.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.5, lambda: other.execute("COMMIT")).start()
    manifest = Manifest(path)
    manifest.set_meta("opened", "yes")
    assert manifest.get_meta("opened") == "yes"
    manifest.close()


def test_only_a_locked_database_is_retried_and_only_until_the_deadline():
    import sqlite3

    from rag_app.index.manifest import enable_wal

    class Refusing:
        def __init__(self, message: str, times: int):
            self.message, self.times, self.calls = message, times, 0

        def execute(self, sql: str) -> None:
            self.calls += 1
            if self.calls <= self.times:
                raise sqlite3.OperationalError(self.message)

    locked_twice = Refusing("database is locked", 2)
    enable_wal(locked_twice)  # type: ignore[arg-type]
    assert locked_twice.calls == 3
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        enable_wal(Refusing("disk I/O error", 1))  # type: ignore[arg-type]
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        enable_wal(Refusing("database is locked", 10**6), wait_seconds=0.2)  # type: ignore[arg-type]
