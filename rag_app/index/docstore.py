"""The ingestion docstore: every indexed note as a LlamaIndex Document with its hash, in a real database.

The embedded default is LlamaIndex's `KVDocumentStore` over `SQLiteKVStore`, one SQLite file in the home
(`docstore.sqlite`); a team deployment sets `[store] docstore_url = "postgresql://..."` and gets LlamaIndex's
`PostgresDocumentStore` next to its `chroma run` server. Why SQLite rather than the DuckDB docstore: see
docs/benchmarks.md ("Docstore at 100k notes").
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from llama_index.core.storage.docstore.keyval_docstore import KVDocumentStore
from llama_index.core.storage.kvstore.types import DEFAULT_BATCH_SIZE, DEFAULT_COLLECTION, BaseKVStore

from rag_app.config import ConfigError, Settings
from rag_app.index.manifest import enable_wal

DOCSTORE_FILE = "docstore.sqlite"
NAMESPACE = "notes"


class SQLiteKVStore(BaseKVStore):
    """LlamaIndex's key-value store interface over one SQLite table (LlamaIndex ships none for SQLite).

    One row per (collection, key), the value as JSON text; `put_all` writes a batch in one transaction. Reads are
    by primary key, so finding one document's hash never loads the store. Safe to share between threads.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
        enable_wal(self._db)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (collection TEXT NOT NULL, key TEXT NOT NULL, "
                         "value TEXT NOT NULL, PRIMARY KEY (collection, key)) WITHOUT ROWID")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(self, key: str, val: dict, collection: str = DEFAULT_COLLECTION) -> None:
        self.put_all([(key, val)], collection=collection)

    async def aput(self, key: str, val: dict, collection: str = DEFAULT_COLLECTION) -> None:
        self.put(key, val, collection=collection)

    def put_all(self, kv_pairs: list[tuple[str, dict]], collection: str = DEFAULT_COLLECTION,
                batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        rows = [(collection, key, json.dumps(val, ensure_ascii=False)) for key, val in kv_pairs]
        with self._lock, self._named():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """SQLite's errors name no file: a write's error names this one (and, read-only, what to do)."""
        try:
            yield
        except sqlite3.Error as exc:
            hint = " (the docstore must be writable by you: chmod u+w)" if "readonly" in str(exc) else ""
            raise type(exc)(f"{self.path}: {exc}{hint}") from exc

    async def aput_all(self, kv_pairs: list[tuple[str, dict]], collection: str = DEFAULT_COLLECTION,
                       batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        self.put_all(kv_pairs, collection=collection, batch_size=batch_size)

    def get(self, key: str, collection: str = DEFAULT_COLLECTION) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM kv WHERE collection = ? AND key = ?",
                                   (collection, key)).fetchone()
        return json.loads(row[0]) if row else None

    async def aget(self, key: str, collection: str = DEFAULT_COLLECTION) -> dict | None:
        return self.get(key, collection=collection)

    def get_all(self, collection: str = DEFAULT_COLLECTION) -> dict[str, dict]:
        with self._lock:
            rows = self._db.execute("SELECT key, value FROM kv WHERE collection = ?", (collection,)).fetchall()
        return {key: json.loads(value) for key, value in rows}

    async def aget_all(self, collection: str = DEFAULT_COLLECTION) -> dict[str, dict]:
        return self.get_all(collection=collection)

    def delete(self, key: str, collection: str = DEFAULT_COLLECTION) -> bool:
        with self._lock, self._named():
            cursor = self._db.execute("DELETE FROM kv WHERE collection = ? AND key = ?", (collection, key))
        return cursor.rowcount > 0

    async def adelete(self, key: str, collection: str = DEFAULT_COLLECTION) -> bool:
        return self.delete(key, collection=collection)


def open_docstore(settings: Settings) -> KVDocumentStore:
    """The home's docstore, or the PostgreSQL one `[store] docstore_url` names. A password is best left out of the
    URL: PostgreSQL's own PGPASSWORD (or ~/.pgpass) supplies it, so it is never in config.toml."""
    url = settings.docstore_url
    if not url:
        return KVDocumentStore(SQLiteKVStore(settings.home / DOCSTORE_FILE), namespace=NAMESPACE)
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname or not parts.path.strip("/"):
        raise ConfigError(f"store.docstore_url must look like postgresql://user@host:5432/database, got {_shown(url)}")
    from llama_index.storage.docstore.postgres import PostgresDocumentStore
    from llama_index.storage.kvstore.postgres import PostgresKVStore

    sync_url, async_url = connection_strings(url)
    kvstore = PostgresKVStore(connection_string=sync_url, async_connection_string=async_url,
                              table_name="brain_docstore")
    return PostgresDocumentStore(kvstore, namespace=NAMESPACE)


def docstore_name(settings: Settings) -> str:
    """Which docstore a home writes to, without credentials: "home" (its SQLite file) or
    postgresql://host:port/database. What a note copied into one docstore is recorded against."""
    url = settings.docstore_url
    if not url:
        return "home"
    parts = urlsplit(url)
    return f"postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"


def connection_strings(url: str) -> tuple[str, str]:
    """SQLAlchemy's psycopg2 and asyncpg URLs for a postgresql:// URL, its query kept (sslmode=require must never be
    dropped silently: the connection would fall back to libpq's "prefer"); asyncpg spells sslmode `ssl`. An IPv6
    host keeps its brackets."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    login = parts.username or ""
    if parts.password:
        login += f":{parts.password}"
    where = f"{login}@{host}:{parts.port or 5432}{parts.path}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    asyncpg = [("ssl" if key == "sslmode" else key, value) for key, value in query]
    return (f"postgresql+psycopg2://{where}" + (f"?{urlencode(query)}" if query else ""),
            f"postgresql+asyncpg://{where}" + (f"?{urlencode(asyncpg)}" if asyncpg else ""))


def _shown(url: str) -> str:
    """A URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        url = url.replace(f":{parts.password}@", ":***@")
    return repr(url)


def document_hashes(docstore: Any, note_ids: list[str]) -> dict[str, str]:
    """The stored hash of each of these notes the docstore holds (key lookups, never the whole store)."""
    return {note_id: digest for note_id in note_ids if (digest := docstore.get_document_hash(note_id))}


def forget_documents(docstore: Any, note_ids: list[str]) -> None:
    """Remove these notes' Documents and hashes. `delete_ref_doc` would do nothing here: the pipeline stores input
    Documents as top-level nodes without ref-doc info (LlamaIndex 0.14), so `delete_document` is the call that works."""
    for note_id in note_ids:
        docstore.delete_document(note_id, raise_error=False)


def close_docstore(docstore: Any) -> None:
    """Release the docstore's database connections (a watcher syncs many times in one process)."""
    kvstore = getattr(docstore, "_kvstore", None)
    if isinstance(kvstore, SQLiteKVStore):
        kvstore.close()
        return
    for engine in (getattr(kvstore, "_engine", None), getattr(kvstore, "_async_engine", None)):
        if engine is not None and hasattr(engine, "sync_engine"):
            engine.sync_engine.dispose()
        elif engine is not None:
            engine.dispose()
