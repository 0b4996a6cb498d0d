"""What the index holds, per note: content hash, chunk ids, model, chunker. The one place that decides what changed.

SQLite (stdlib, fast to open) so that a sync with nothing to do needs neither Chroma nor LlamaIndex, and so that
each batch of a long sync commits atomically: an interrupted first sync resumes where it stopped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from readers.records import NoteRecord

SQL_BATCH = 500  # ids per `IN (...)`: well under SQLite's limit on bound variables


def enable_wal(db: sqlite3.Connection, wait_seconds: float = 30.0) -> None:
    """Put a database in WAL mode. While another process switches the same new file, SQLite answers "database is
    locked" at once instead of waiting its busy timeout (a sync and a `brain status` starting together): retry."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _in_batches(ids: list[str]) -> Iterator[tuple[list[str], str]]:
    """(batch of ids, "?,?,…" placeholders for it) for queries with `IN (...)` over any number of ids."""
    for start in range(0, len(ids), SQL_BATCH):
        batch = ids[start : start + SQL_BATCH]
        yield batch, ",".join("?" * len(batch))

SCHEMA = """
CREATE TABLE IF NOT EXISTS notes (
    note_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    hash TEXT NOT NULL,
    model TEXT NOT NULL,
    chunker TEXT NOT NULL,
    chunk_ids TEXT NOT NULL,
    synced_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_source ON notes(source);
CREATE TABLE IF NOT EXISTS sources (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    spec TEXT NOT NULL,
    last_sync REAL,
    last_result TEXT
);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id TEXT PRIMARY KEY,
    note_id TEXT NOT NULL,
    source TEXT NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    tokens TEXT,
    embed_hash TEXT
);
CREATE INDEX IF NOT EXISTS chunks_note ON chunks(note_id);
CREATE TABLE IF NOT EXISTS note_docs (
    note_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending_notes (note_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS topic_vectors (text TEXT PRIMARY KEY, vector BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS note_topics (note_id TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (note_id, text));
"""

# Vault files as last parsed: a signature of the bytes (and parsing code) and the content hash the record had. Created
# by `Manifest()` in new and older homes alike; only `trusted_signatures` reads it, and only through `notes`.
SIGNATURE_SCHEMA = """
CREATE TABLE IF NOT EXISTS file_signatures (
    note_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    signature TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS file_signatures_source ON file_signatures(source);
"""

# Vectors of deleted chunks, by the hash of the text a model embedded (`pipeline.embed_hash`) and the model, kept for
# a while: notes that come back (a folder moved back, a confirmed delete undone) get them instead of being embedded.
RETAINED_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained_vectors (
    embed_hash TEXT NOT NULL,
    model TEXT NOT NULL,
    vector BLOB NOT NULL,
    deleted_at REAL NOT NULL,
    PRIMARY KEY (embed_hash, model)
);
"""


@dataclass
class ManifestEntry:
    note_id: str
    source: str
    hash: str
    model: str
    chunker: str
    chunk_ids: list[str]

    @property
    def models(self) -> set[str]:
        """The dense models whose vectors of this note's chunks are stored (the `model` column, "+"-joined)."""
        return split_models(self.model)


def split_models(joined: str) -> set[str]:
    """The one place the "+"-joined model column is read."""
    return {m for m in joined.split("+") if m}


class Manifest:
    """The SQLite file in the home: notes, sources and the chunk texts the keyword index is built from."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Shells (chat page, MCP, agent tools) call from worker threads; callers serialise use (see Brain._lock).
        self.db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        enable_wal(self.db)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.db.executescript(SIGNATURE_SCHEMA)
        self.db.executescript(RETAINED_SCHEMA)
        if self._missing_columns():  # an older home: its chunks get them when next chunked
            with self.transaction():  # checked again under the write lock: another process may be opening it too
                for column in self._missing_columns():
                    self.db.execute(f"ALTER TABLE chunks ADD COLUMN {column} TEXT")
        self.db.execute("CREATE INDEX IF NOT EXISTS chunks_embed_hash ON chunks(embed_hash)")

    def _missing_columns(self) -> list[str]:
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(chunks)")}
        return [column for column in ("tokens", "embed_hash") if column not in columns]

    def close(self) -> None:
        self.db.close()

    def transaction(self) -> sqlite3.Connection:
        """`with manifest.transaction():` — one atomic commit (BEGIN IMMEDIATE … COMMIT/ROLLBACK)."""
        return _Transaction(self.db)  # type: ignore[return-value]

    def entries(self, source: str | None = None) -> dict[str, ManifestEntry]:
        query = "SELECT note_id, source, hash, model, chunker, chunk_ids FROM notes"
        rows = self.db.execute(query + " WHERE source = ?", (source,)) if source else self.db.execute(query)
        return {r[0]: ManifestEntry(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows}

    def entries_for(self, note_ids: list[str]) -> dict[str, ManifestEntry]:
        out: dict[str, ManifestEntry] = {}
        for batch, marks in _in_batches(note_ids):
            rows = self.db.execute(
                "SELECT note_id, source, hash, model, chunker, chunk_ids FROM notes "
                f"WHERE note_id IN ({marks})",
                batch,
            )
            out.update({r[0]: ManifestEntry(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows})
        return out

    def put_note(self, record: NoteRecord, source: str, model: str, chunker: str, chunk_ids: list[str],
                 content_hash: str | None = None) -> None:
        """`content_hash` overrides the record's own (a note re-embedded from its stored text keeps its source hash)."""
        self.db.execute(
            "INSERT OR REPLACE INTO notes VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.id, source, content_hash or record.content_hash, model, chunker, json.dumps(chunk_ids),
             time.time()),
        )
        self.put_doc(record, source)

    def put_doc(self, record: NoteRecord, source: str) -> None:
        metadata = json.dumps({**record.volatile, **record.metadata}, ensure_ascii=False)
        self.db.execute(
            "INSERT OR REPLACE INTO note_docs VALUES (?, ?, ?, ?)", (record.id, source, record.text, metadata)
        )

    def trusted_signatures(self, source: str, chunker: str) -> dict[str, str]:
        """note id → file signature, for notes whose index entry is current: the hash stored with the signature is the
        note's hash, it was chunked with this chunker, and its text is kept. A file whose bytes still match needs no
        parsing; any other note is parsed and compared as usual. (Missing vectors are filled in apart from this.)"""
        rows = self.db.execute(
            "SELECT s.note_id, s.signature FROM file_signatures s "
            "JOIN notes n ON n.note_id = s.note_id AND n.hash = s.hash "
            "JOIN note_docs d ON d.note_id = s.note_id "
            "WHERE s.source = ? AND n.source = ? AND n.chunker = ?",
            (source, source, chunker),
        )
        return dict(rows.fetchall())

    def put_signatures(self, source: str, signatures: dict[str, tuple[str, str]], present: set[str]) -> None:
        """Store (signature, content hash) per note id; forget the source's other notes unless `present`, and
        signatures of notes no longer indexed."""
        stale = [n for (n,) in self.db.execute("SELECT note_id FROM file_signatures WHERE source = ?", (source,))
                 if n not in present and n not in signatures]
        for batch, marks in _in_batches(stale):
            self.db.execute(f"DELETE FROM file_signatures WHERE note_id IN ({marks})", batch)
        self.db.executemany("INSERT OR REPLACE INTO file_signatures VALUES (?, ?, ?, ?)",
                            [(n, source, sig, h) for n, (sig, h) in signatures.items()])
        self.db.execute("DELETE FROM file_signatures WHERE note_id NOT IN (SELECT note_id FROM notes)")

    def notes_without_docs(self, source: str) -> set[str]:
        rows = self.db.execute(
            "SELECT n.note_id FROM notes n LEFT JOIN note_docs d ON d.note_id = n.note_id "
            "WHERE n.source = ? AND d.note_id IS NULL", (source,))
        return {r[0] for r in rows}

    def note_doc(self, note_id: str) -> tuple[str, dict[str, Any]] | None:
        """(full text, metadata) of a note as last synced."""
        row = self.db.execute("SELECT text, metadata FROM note_docs WHERE note_id = ?", (note_id,)).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def note_metadata(self) -> dict[str, dict[str, Any]]:
        """note id → metadata for every note (the link graph is built from these)."""
        return {n: json.loads(m) for n, m in self.db.execute("SELECT note_id, metadata FROM note_docs")}

    def rename_notes(self, renames: dict[str, str], remap: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Give notes new ids in every table, their chunks following (`<note id>:chunk:<n>`), without re-embedding.

        `remap` rewrites ids inside metadata (links, parent). A note whose stored hash is that of its stored text and
        metadata gets the hash of the remapped metadata, so the next listing, which carries the new ids, matches it.
        """
        hashes = self.renamed_hashes(renames, remap)
        for old, new in renames.items():
            row = self.db.execute("SELECT chunk_ids FROM notes WHERE note_id = ?", (old,)).fetchone()
            if row is None:
                continue
            content_hash, chunk_ids = hashes[new], json.loads(row[0])
            doc = self.db.execute("SELECT metadata FROM note_docs WHERE note_id = ?", (old,)).fetchone()
            if doc is not None:
                self.db.execute("UPDATE note_docs SET note_id = ?, metadata = ? WHERE note_id = ?",
                                (new, json.dumps(remap(json.loads(doc[0])), ensure_ascii=False), old))
            self.db.execute("UPDATE notes SET note_id = ?, hash = ?, chunk_ids = ? WHERE note_id = ?",
                            (new, content_hash, json.dumps([new + c[len(old):] for c in chunk_ids]), old))
            chunks = self.db.execute("SELECT chunk_id, metadata FROM chunks WHERE note_id = ?", (old,)).fetchall()
            self.db.executemany(
                "UPDATE chunks SET chunk_id = ?, note_id = ?, metadata = ? WHERE chunk_id = ?",
                [(new + c[len(old):], new, json.dumps(remap(json.loads(m)), ensure_ascii=False), c) for c, m in chunks],
            )
        if renames:
            self.bump_generation()

    def renamed_hashes(self, renames: dict[str, str], remap: Callable[[dict[str, Any]], dict[str, Any]]
                       ) -> dict[str, str]:
        """new id → the hash each note will have under it: a note whose stored hash is that of its stored text and
        metadata gets the hash of the remapped metadata (the next listing carries the new ids); any other keeps its."""
        out: dict[str, str] = {}
        for old, new in renames.items():
            row = self.db.execute("SELECT hash FROM notes WHERE note_id = ?", (old,)).fetchone()
            if row is None:
                continue
            out[new] = row[0]
            doc = self.db.execute("SELECT text, metadata FROM note_docs WHERE note_id = ?", (old,)).fetchone()
            if doc is not None and row[0] == NoteRecord(old, doc[0], json.loads(doc[1])).content_hash:
                out[new] = NoteRecord(new, doc[0], remap(json.loads(doc[1]))).content_hash
        return out

    def confirm_versions(self, hashes: dict[str, str]) -> None:
        """The docstore found these notes unchanged: their chunks are of this version (the journal keeps the two in
        step), so the index records it, and their signatures are trusted again."""
        with self.transaction():
            self.db.executemany("UPDATE notes SET hash = ? WHERE note_id = ? AND hash != ?",
                                [(digest, note_id, digest) for note_id, digest in hashes.items()])

    def mark_pending(self, note_ids: list[str]) -> None:
        """Journal notes about to go through the ingestion pipeline: its docstore is written before their chunks are
        committed here, so a crash in between would leave the docstore holding a version the index lacks."""
        with self.transaction():
            self.db.executemany("INSERT OR IGNORE INTO pending_notes VALUES (?)", [(i,) for i in note_ids])

    def pending_notes(self) -> list[str]:
        """Notes a sync journaled and never committed (it died between the docstore and the index)."""
        return [row[0] for row in self.db.execute("SELECT note_id FROM pending_notes ORDER BY note_id")]

    def clear_pending(self, note_ids: list[str]) -> None:
        for batch, marks in _in_batches(note_ids):
            self.db.execute(f"DELETE FROM pending_notes WHERE note_id IN ({marks})", batch)

    def delete_notes(self, note_ids: list[str]) -> None:
        if note_ids:
            self.bump_generation()
        for batch, marks in _in_batches(note_ids):
            self.db.execute(f"DELETE FROM notes WHERE note_id IN ({marks})", batch)
            self.db.execute(f"DELETE FROM note_docs WHERE note_id IN ({marks})", batch)
            self.db.execute(f"DELETE FROM chunks WHERE note_id IN ({marks})", batch)
            self.db.execute(f"DELETE FROM pending_notes WHERE note_id IN ({marks})", batch)

    def put_chunks(self, rows: list[tuple[str, str, str, str, dict[str, Any], list[str], str]]) -> None:
        """Rows of (chunk_id, note_id, source, text, metadata, keyword tokens, hash of the text a model embeds); old
        chunks must be deleted first."""
        self.db.executemany(
            "INSERT OR REPLACE INTO chunks (chunk_id, note_id, source, text, metadata, tokens, embed_hash) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(c, n, s, t, json.dumps(m, ensure_ascii=False), " ".join(k), h) for c, n, s, t, m, k, h in rows],
        )
        self.bump_generation()

    def embedded_copies(self, chunk_ids: list[str], model: str) -> dict[str, str]:
        """chunk id → another chunk with the very same text to embed whose note already has `model`'s vectors: the
        same text anywhere in the home (a note copied into a second vault, a memo archived into a vault) is embedded
        once."""
        out: dict[str, str] = {}
        for batch, marks in _in_batches(chunk_ids):
            rows = self.db.execute(
                "SELECT mine.chunk_id, other.chunk_id FROM chunks mine "
                "JOIN chunks other ON other.embed_hash = mine.embed_hash AND other.chunk_id != mine.chunk_id "
                "JOIN notes n ON n.note_id = other.note_id AND instr('+' || n.model || '+', ?) > 0 "
                f"WHERE mine.chunk_id IN ({marks}) AND mine.embed_hash IS NOT NULL", [f"+{model}+", *batch])
            for mine, other in rows:
                out.setdefault(mine, other)
        return out

    def embed_hashes_of(self, note_ids: list[str]) -> dict[str, str]:
        """chunk id → hash of the text a model embeds, for these notes' chunks (older rows without one are left out)."""
        out: dict[str, str] = {}
        for batch, marks in _in_batches(note_ids):
            rows = self.db.execute(f"SELECT chunk_id, embed_hash FROM chunks WHERE note_id IN ({marks}) "
                                   "AND embed_hash IS NOT NULL", batch)
            out.update(dict(rows.fetchall()))
        return out

    def retain_vectors(self, model: str, vectors: dict[str, bytes]) -> None:
        """Keep deleted chunks' vectors (embed hash → float32 bytes) of `model`, stamped now (see `purge_retained`)."""
        now = time.time()
        self.db.executemany("INSERT OR REPLACE INTO retained_vectors VALUES (?, ?, ?, ?)",
                            [(h, model, v, now) for h, v in vectors.items()])

    def retained_vectors(self, hashes: list[str], model: str) -> dict[str, bytes]:
        """embed hash → kept vector of `model` (float32 bytes), for the hashes that have one."""
        out: dict[str, bytes] = {}
        for batch, marks in _in_batches(hashes):
            rows = self.db.execute(f"SELECT embed_hash, vector FROM retained_vectors WHERE model = ? "
                                   f"AND embed_hash IN ({marks})", [model, *batch])
            out.update(dict(rows.fetchall()))
        return out

    def purge_retained(self, deleted_before: float, models: set[str]) -> int:
        """Drop kept vectors deleted before that time, and those of models no longer configured; returns how many."""
        marks = ",".join("?" * len(models)) or "''"
        return self.db.execute(f"DELETE FROM retained_vectors WHERE deleted_at < ? OR model NOT IN ({marks})",
                               [deleted_before, *sorted(models)]).rowcount

    def bump_generation(self) -> None:
        """Count chunk changes, so readers can tell whether a saved keyword index is current."""
        self.set_meta("chunk_generation", str(int(self.get_meta("chunk_generation") or 0) + 1))

    def generation(self) -> str:
        return self.get_meta("chunk_generation") or "0"

    def progress_stamp(self) -> str:
        """Changes whenever chunks or any model's vectors changed: cheap to read before every search."""
        return f"{self.generation()}/{self.get_meta('vector_generation') or '0'}"

    def chunk_tokens(self) -> list[tuple[str, str | None, str, str]]:
        """(chunk_id, tokens or None, text, metadata json) for every chunk, in a stable order."""
        return self.db.execute("SELECT chunk_id, tokens, text, metadata FROM chunks ORDER BY chunk_id").fetchall()

    def set_tokens(self, rows: list[tuple[str, str]]) -> None:
        self.db.executemany("UPDATE chunks SET tokens = ? WHERE chunk_id = ?", [(t, c) for c, t in rows])

    def chunks_by_id(self, chunk_ids: list[str]) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """chunk id → (note id, text, metadata)."""
        out: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for batch, marks in _in_batches(chunk_ids):
            rows = self.db.execute(
                f"SELECT chunk_id, note_id, text, metadata FROM chunks WHERE chunk_id IN ({marks})", batch
            )
            out.update({r[0]: (r[1], r[2], json.loads(r[3])) for r in rows})
        return out

    def chunks_of_notes(self, note_ids: list[str]) -> dict[str, list[str]]:
        """note id → its chunk texts in order (for duplicate detection and full text)."""
        out: dict[str, list[str]] = {}
        for batch, marks in _in_batches(note_ids):
            rows = self.db.execute(
                f"SELECT note_id, text, chunk_id FROM chunks WHERE note_id IN ({marks})", batch
            ).fetchall()
            rows.sort(key=lambda r: (r[0], int(r[2].rsplit(":", 1)[1])))
            for note_id, text, _ in rows:
                out.setdefault(note_id, []).append(text)
        return out

    def note_filter_rows(self) -> list[tuple[str, str]]:
        """(chunk ids json, metadata json) per note: the note's kept metadata, else its first chunk's."""
        return self.db.execute(
            "SELECT n.chunk_ids, COALESCE(d.metadata, (SELECT c.metadata FROM chunks c WHERE c.note_id = n.note_id "
            "LIMIT 1), '{}') FROM notes n LEFT JOIN note_docs d ON d.note_id = n.note_id").fetchall()

    def chunk_topic_rows(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(note id, text, the metadata a topic is read from: title, aliases, tags, heading) of every chunk."""
        rows = self.db.execute(
            "SELECT note_id, text, json_extract(metadata, '$.title'), json_extract(metadata, '$.aliases'), "
            "json_extract(metadata, '$.tags'), json_extract(metadata, '$.heading') FROM chunks ORDER BY note_id")
        return [(n, x, {"title": t, "aliases": a, "tags": g, "heading": h}) for n, x, t, a, g, h in rows]

    def stored_note_topics(self) -> list[tuple[str, str, bytes]]:
        """(note id, topic, vector) as the last topic fill stored them (rag_app.index.topics)."""
        return self.db.execute("SELECT n.note_id, n.text, v.vector FROM note_topics n JOIN topic_vectors v "
                               "ON v.text = n.text ORDER BY n.rowid").fetchall()

    def put_note_topics(self, pairs: list[tuple[str, str]]) -> None:
        self.db.execute("DELETE FROM note_topics")
        self.db.executemany("INSERT OR IGNORE INTO note_topics (note_id, text) VALUES (?, ?)", pairs)

    def topic_vectors(self, texts: list[str]) -> dict[str, bytes]:
        """The stored vectors of these topics (rag_app.index.topics)."""
        out: dict[str, bytes] = {}
        for batch, marks in _in_batches(texts):
            out.update(self.db.execute(f"SELECT text, vector FROM topic_vectors WHERE text IN ({marks})", batch))
        return out

    def topics_without_vectors(self, texts: list[str]) -> list[str]:
        stored = set()
        for batch, marks in _in_batches(texts):
            stored.update(r[0] for r in self.db.execute(f"SELECT text FROM topic_vectors WHERE text IN ({marks})",
                                                        batch))
        return [t for t in texts if t not in stored]

    def put_topic_vectors(self, rows: list[tuple[str, bytes]]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO topic_vectors (text, vector) VALUES (?, ?)", rows)

    def keep_topic_vectors(self, texts: list[str]) -> None:
        """Drop the vectors of topics no note names any more."""
        kept = set(texts)
        gone = [r[0] for r in self.db.execute("SELECT text FROM topic_vectors") if r[0] not in kept]
        for batch, marks in _in_batches(gone):
            self.db.execute(f"DELETE FROM topic_vectors WHERE text IN ({marks})", batch)

    def stored_chunk_ids(self) -> set[str]:
        """Every chunk id the chunk table holds (doctor compares them with the notes' own lists)."""
        return {row[0] for row in self.db.execute("SELECT chunk_id FROM chunks")}

    def delete_chunks(self, chunk_ids: list[str]) -> None:
        """Delete chunk rows by id (rows no note owns any more: `brain doctor --repair`)."""
        if chunk_ids:
            self.bump_generation()
        for batch, marks in _in_batches(chunk_ids):
            self.db.execute(f"DELETE FROM chunks WHERE chunk_id IN ({marks})", batch)

    def delete_chunks_of(self, note_ids: list[str]) -> None:
        if note_ids:
            self.bump_generation()
        for batch, marks in _in_batches(note_ids):
            self.db.execute(f"DELETE FROM chunks WHERE note_id IN ({marks})", batch)

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per source: (notes, chunks)."""
        out: dict[str, tuple[int, int]] = {}
        for source, notes, chunk_ids in self.db.execute(
            "SELECT source, COUNT(*), SUM(json_array_length(chunk_ids)) FROM notes GROUP BY source"
        ):
            out[source] = (notes, chunk_ids or 0)
        return out

    def models_in_use(self) -> set[str]:
        return {m for row in self.db.execute("SELECT DISTINCT model FROM notes") for m in split_models(row[0])}

    def notes_lacking(self, model: str, limit: int | None = None) -> list[str]:
        """Notes whose chunks have no vectors of `model` yet, in a stable order (a resumed fill goes on from there)."""
        query = "SELECT note_id FROM notes WHERE instr('+' || model || '+', ?) = 0 ORDER BY source, note_id LIMIT ?"
        return [r[0] for r in self.db.execute(query, (f"+{model}+", limit or -1))]

    def chunk_counts(self, note_ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for batch, marks in _in_batches(note_ids):
            rows = self.db.execute(
                f"SELECT note_id, json_array_length(chunk_ids) FROM notes WHERE note_id IN ({marks})", batch)
            out.update(dict(rows.fetchall()))
        return out

    def add_model(self, note_ids: list[str], model: str) -> None:
        """Record that these notes' chunks now have vectors of `model`."""
        rows = self.entries_for(note_ids)
        self.db.executemany("UPDATE notes SET model = ? WHERE note_id = ?",
                            [("+".join(sorted(e.models | {model})), n) for n, e in rows.items()])
        self.set_meta("vector_generation", str(int(self.get_meta("vector_generation") or 0) + 1))

    def keep_only_models(self, models: set[str]) -> None:
        """Forget vectors of models no longer configured (their collection is dropped next)."""
        for joined, in self.db.execute("SELECT DISTINCT model FROM notes").fetchall():
            kept = "+".join(sorted(split_models(joined) & models))
            if kept != joined:
                self.db.execute("UPDATE notes SET model = ? WHERE model = ?", (kept, joined))

    def channel_counts(self) -> tuple[int, dict[str, int]]:
        """(chunks in all, chunks with vectors per model): how far each search channel has come."""
        total, per_model = 0, {}
        for joined, chunks in self.db.execute(
                "SELECT model, SUM(json_array_length(chunk_ids)) FROM notes GROUP BY model"):
            total += chunks or 0
            for model in split_models(joined):
                per_model[model] = per_model.get(model, 0) + (chunks or 0)
        return total, per_model

    def chunks_for_notes(self, note_ids: list[str]) -> list[tuple[str, str, str, dict[str, Any]]]:
        """(chunk_id, note_id, text, metadata) of these notes' chunks."""
        out = []
        for batch, marks in _in_batches(note_ids):
            rows = self.db.execute(f"SELECT chunk_id, note_id, text, metadata FROM chunks WHERE note_id IN ({marks})",
                                   batch)
            out += [(c, n, t, json.loads(m)) for c, n, t, m in rows]
        return out

    def sources(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, kind, spec, last_sync, last_result in self.db.execute("SELECT * FROM sources ORDER BY name"):
            out[name] = {
                "name": name,
                "kind": kind,
                "spec": json.loads(spec),
                "last_sync": last_sync,
                "last_result": json.loads(last_result) if last_result else None,
            }
        return out

    def put_source(self, name: str, kind: str, spec: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT INTO sources(name, kind, spec) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET kind = excluded.kind, spec = excluded.spec",
            (name, kind, json.dumps(spec)),
        )

    def record_result(self, name: str, result: dict[str, Any], succeeded: bool) -> None:
        """Store the last result; `last_sync` moves only when the source synced successfully."""
        if succeeded:
            self.db.execute(
                "UPDATE sources SET last_sync = ?, last_result = ? WHERE name = ?",
                (time.time(), json.dumps(result), name),
            )
        else:
            self.db.execute("UPDATE sources SET last_result = ? WHERE name = ?", (json.dumps(result), name))

    def delete_source(self, name: str) -> None:
        self.db.execute("DELETE FROM sources WHERE name = ?", (name,))

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def delete_meta(self, key: str) -> None:
        self.db.execute("DELETE FROM meta WHERE key = ?", (key,))


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
