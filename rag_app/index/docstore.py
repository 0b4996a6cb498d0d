"""The ingestion docstore: the hash of every indexed note, by which the IngestionPipeline decides what changed.

It keeps no note text (`store_doc_text=False`): the manifest owns each text, once (docs/architecture.md).

The embedded default is LlamaIndex's `KVDocumentStore` over `SQLiteKVStore`, one SQLite file in the home
(`docstore.sqlite`); a team deployment sets `[store] docstore_url = "postgresql://..."` and gets LlamaIndex's
`PostgresDocumentStore` next to its `chroma run` server. Why SQLite rather than the DuckDB docstore: see
docs/benchmarks.md ("Docstore at 100k notes").
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from llama_index.core.storage.docstore.keyval_docstore import KVDocumentStore
from llama_index.core.storage.kvstore.types import DEFAULT_BATCH_SIZE, DEFAULT_COLLECTION, BaseKVStore

from rag_app.config import Settings, check_docstore_url
from rag_app.index.docstore_health import (
    DOCSTORE_FILE,
    NAMESPACE,
    DocstoreError,
    docstore_failure,
    docstore_name,
    has_kv_table,
)
from rag_app.index.manifest import enable_wal


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
        # No table yet: a new file, or one emptied to zero bytes (a valid, empty database): the caller fills it.
        self.created = not has_kv_table(self._db)
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
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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
        with self._lock:
            cursor = self._db.execute("DELETE FROM kv WHERE collection = ? AND key = ?", (collection, key))
        return cursor.rowcount > 0

    async def adelete(self, key: str, collection: str = DEFAULT_COLLECTION) -> bool:
        return self.delete(key, collection=collection)

    def clear(self, collection: str) -> int:
        """Delete a whole collection in one statement; returns how many rows went."""
        with self._lock:
            return self._db.execute("DELETE FROM kv WHERE collection = ?", (collection,)).rowcount


class GuardedKVStore(BaseKVStore):
    """The docstore's key-value store with every failure turned into a `DocstoreError` (see `docstore_failure`): the
    one place a database error becomes a message, whichever LlamaIndex call (the pipeline's upserts, a hash lookup)
    met it. SQLAlchemy's own text holds the statement and its parameters, which are notes' JSON."""

    def __init__(self, inner: BaseKVStore, settings: Settings):
        self.inner = inner
        self.settings = settings

    def _guarded(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            raise docstore_failure(self.settings, exc) from None

    async def _aguarded(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await call(*args, **kwargs)
        except Exception as exc:
            raise docstore_failure(self.settings, exc) from None

    def put(self, key: str, val: dict, collection: str = DEFAULT_COLLECTION) -> None:
        self._guarded(self.inner.put, key, val, collection=collection)

    async def aput(self, key: str, val: dict, collection: str = DEFAULT_COLLECTION) -> None:
        await self._aguarded(self.inner.aput, key, val, collection=collection)

    def put_all(self, kv_pairs: list[tuple[str, dict]], collection: str = DEFAULT_COLLECTION,
                batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        self._guarded(self.inner.put_all, kv_pairs, collection=collection, batch_size=batch_size)

    async def aput_all(self, kv_pairs: list[tuple[str, dict]], collection: str = DEFAULT_COLLECTION,
                       batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        await self._aguarded(self.inner.aput_all, kv_pairs, collection=collection, batch_size=batch_size)

    def get(self, key: str, collection: str = DEFAULT_COLLECTION) -> dict | None:
        return self._guarded(self.inner.get, key, collection=collection)

    async def aget(self, key: str, collection: str = DEFAULT_COLLECTION) -> dict | None:
        return await self._aguarded(self.inner.aget, key, collection=collection)

    def get_all(self, collection: str = DEFAULT_COLLECTION) -> dict[str, dict]:
        return self._guarded(self.inner.get_all, collection=collection)

    async def aget_all(self, collection: str = DEFAULT_COLLECTION) -> dict[str, dict]:
        return await self._aguarded(self.inner.aget_all, collection=collection)

    def delete(self, key: str, collection: str = DEFAULT_COLLECTION) -> bool:
        return self._guarded(self.inner.delete, key, collection=collection)

    async def adelete(self, key: str, collection: str = DEFAULT_COLLECTION) -> bool:
        return await self._aguarded(self.inner.adelete, key, collection=collection)


def open_docstore(settings: Settings) -> KVDocumentStore:
    """The home's docstore, or the PostgreSQL one `[store] docstore_url` names. A password is best left out of the
    URL: PostgreSQL's own PGPASSWORD (or ~/.pgpass) supplies it, so it is never in config.toml. Raises
    `DocstoreError` when it cannot be opened."""
    url = settings.docstore_url
    if not url:
        try:
            kvstore = SQLiteKVStore(settings.home / DOCSTORE_FILE)
        except (sqlite3.Error, OSError) as exc:
            raise docstore_failure(settings, exc) from None
        return KVDocumentStore(GuardedKVStore(kvstore, settings), namespace=NAMESPACE)
    check_docstore_url(url)
    try:
        from llama_index.storage.docstore.postgres import PostgresDocumentStore
        from llama_index.storage.kvstore.postgres import PostgresKVStore
        from sqlalchemy import create_engine
    except ImportError:
        raise DocstoreError(f"the docstore {docstore_name(settings)} needs the PostgreSQL packages: "
                            "pip install 'cflow-brain[postgres]'") from None
    sync_url, async_url = connection_strings(url)
    engine = create_engine(sync_url, connect_args={"connect_timeout": CONNECT_TIMEOUT})
    kvstore = PostgresKVStore(engine=engine, connection_string=sync_url, async_connection_string=async_url,
                              table_name="brain_docstore")
    return PostgresDocumentStore(GuardedKVStore(kvstore, settings), namespace=NAMESPACE)


CONNECT_TIMEOUT = 10  # seconds: a database host that does not answer is named, not waited for until TCP gives up


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


BULK_LOOKUP = 200  # more notes than this are read in one pass over the hashes, not one query each (a PostgreSQL round
# trip per memo made a no-change sync of 3,000 memos wait on 3,000 queries)


def document_hashes(docstore: Any, note_ids: list[str]) -> dict[str, str]:
    """The stored hash of each of these notes the docstore holds: key lookups for a few, one read of every hash (no
    text: the docstore keeps none) for many."""
    if len(note_ids) <= BULK_LOOKUP:
        return {note_id: digest for note_id in note_ids if (digest := docstore.get_document_hash(note_id))}
    rows = docstore._kvstore.get_all(collection=docstore._metadata_collection)
    return {note_id: str(row["doc_hash"]) for note_id in note_ids if (row := rows.get(note_id)) and row.get("doc_hash")}


def drop_stored_texts(docstore: Any) -> int:
    """Remove the note texts a docstore of an earlier version kept beside the hashes (its data collection): the
    manifest owns each note's text, the docstore only what it decides by. Returns how many texts went."""
    collection = docstore._node_collection
    kvstore = _inner_kvstore(docstore)
    if isinstance(kvstore, SQLiteKVStore):
        return kvstore.clear(collection)
    keys = list(docstore._kvstore.get_all(collection=collection))
    for key in keys:
        docstore._kvstore.delete(key, collection=collection)
    return len(keys)


def forget_documents(docstore: Any, note_ids: list[str]) -> None:
    """Remove these notes' Documents and hashes. `delete_ref_doc` would do nothing here: the pipeline stores input
    Documents as top-level nodes without ref-doc info (LlamaIndex 0.14), so `delete_document` is the call that works."""
    for note_id in note_ids:
        docstore.delete_document(note_id, raise_error=False)


def _inner_kvstore(docstore: Any) -> Any:
    kvstore = getattr(docstore, "_kvstore", None)
    return kvstore.inner if isinstance(kvstore, GuardedKVStore) else kvstore


def is_new_docstore(docstore: Any) -> bool:
    """True when this open created the home's docstore table (no file, or an empty one): whatever the manifest says
    was copied into it before is not there."""
    return bool(getattr(_inner_kvstore(docstore), "created", False))


def close_docstore(docstore: Any) -> None:
    """Release the docstore's database connections (a watcher syncs many times in one process)."""
    kvstore = _inner_kvstore(docstore)
    if isinstance(kvstore, SQLiteKVStore):
        kvstore.close()
        return
    for engine in (getattr(kvstore, "_engine", None), getattr(kvstore, "_async_engine", None)):
        if engine is not None and hasattr(engine, "sync_engine"):
            engine.sync_engine.dispose()
        elif engine is not None:
            engine.dispose()
