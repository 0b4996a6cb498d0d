"""Chroma (embedded or over HTTP): one collection per embedding model.

A model change fills a new collection beside the old one; the old one is dropped only when no note uses it,
so an interrupted re-embed never leaves the index empty.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse, urlsplit

from rag_app.config import Settings, model_slug

COLLECTION_PREFIX = "notes_"
log = logging.getLogger("cflow_brain.store")


class StoreError(Exception):
    """The vector store cannot be opened or written."""


class StoreUnreachable(StoreError):
    """A Chroma server that cannot be reached (down, refused, timed out). A search goes on by keyword and says so."""

    def __init__(self, settings: Settings):
        super().__init__(f"cannot reach the Chroma server at {store_shown(settings.store_url)}")


def unreachable(exc: BaseException) -> bool:
    """Whether an error (or one it came from) says a Chroma server cannot be reached, rather than that it refused a
    request or holds no such collection. An error the index layer already named (an embeddings server that failed:
    RemoteEmbeddingError, raised from the HTTP error it met) is what it says, not a Chroma outage."""
    import httpx

    if isinstance(exc, StoreError) and not isinstance(exc, StoreUnreachable):
        return str(exc).startswith("cannot reach the Chroma server")
    seen: BaseException | None = exc
    chain: list[BaseException] = []
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return any(isinstance(e, StoreUnreachable | httpx.TransportError | ConnectionError)
               or "could not connect to a chroma server" in str(e).lower()
               or (isinstance(e, StoreError) and str(e).startswith("cannot reach the Chroma server")) for e in chain)


class DiskFull(StoreError):
    """A store in the home could not be written for want of space; the message names it. SQLite rolls a failed
    transaction back and every step commits on its own, so what was saved before is intact."""


_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded")
_WRITERS = {"rag_app.index.manifest": "the manifest (index.sqlite)", "rag_app.index.docstore": "the docstore "
            "(docstore.sqlite)", "rag_app.answers.sessions": "the conversations (sessions.sqlite)",
            "rag_app.index.keyword": "the keyword index (bm25/)", "rag_app.index.keyword_store": "the keyword index "
            "(bm25/)", "rag_app.index.topics": "the topics", "chromadb": "Chroma (chroma/)", "logging": "brain.log"}


def disk_full(exc: BaseException, where: str) -> DiskFull | None:
    """The one line for an error a full disk caused, or None for any other error. A failure while handling one (the
    manifest recording that the docstore failed) is the same full disk: the first store that could not be written is
    the one named. `where` is the folder (the home) whose disk is full."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    full = [e for e in chain if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
            or any(text in str(e).lower() for text in _FULL)]
    if not full and _no_room(where):  # SQLite says "disk I/O error" when its -shm file cannot grow
        full = [e for e in chain if "disk i/o error" in str(e).lower()]
    if not full:
        return None
    store = _writer(full[-1]) or "a store"
    return DiskFull(f"the disk of {where} is full: {store} could not be written; nothing was lost (what was saved "
                    "before is kept and searchable): make room, then run the command again")


def _no_room(where: str) -> bool:
    """Whether the disk of `where` has (next to) no room left for this user."""
    try:
        disk = os.statvfs(where)
    except OSError:
        return False
    return disk.f_bavail * disk.f_frsize < 1 << 16


def _writer(exc: BaseException) -> str | None:
    """The store whose code raised `exc`: the innermost frame of a module that writes one."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_globals.get("__name__", ""))
        tb = tb.tb_next
    for module in reversed(frames):
        for prefix, store in _WRITERS.items():
            if module == prefix or module.startswith(prefix + "."):
                return store
    return None


def collection_name(model: str) -> str:
    return COLLECTION_PREFIX + model_slug(model)


def store_shown(url: str) -> str:
    """A Chroma server's URL as `status`, `doctor` and messages show it: scheme://host:port/path, never a user,
    password (user:pw@) or query (?token=...), as the PostgreSQL docstore's URL is shown. "" for the embedded store."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        host = port = None
    if not host:  # not a URL: still never echo what looks like credentials or a query
        scheme, _, rest = url.rpartition("://")
        rest = re.split(r"[?#]", rest.rpartition("@")[2], maxsplit=1)[0]
        return f"{scheme}://{rest}" if scheme else rest
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}{f':{port}' if port else ''}{parts.path.rstrip('/')}"


def open_chroma(settings: Settings, writing: bool = False) -> Any:
    """An embedded PersistentClient under the home, or an HttpClient when `store.url` is set. `writing` (a sync, under
    the sync lock): the embedded folder is read afresh when another process wrote it since this one last did
    (`_forget_if_stale`)."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    chroma_settings = ChromaSettings(anonymized_telemetry=False)
    if settings.store_url:
        parsed = urlparse(settings.store_url)
        if not parsed.hostname:
            raise StoreError(f"store.url must look like http://127.0.0.1:8000, got {store_shown(settings.store_url)!r}")
        try:
            return chromadb.HttpClient(
                host=parsed.hostname,
                port=parsed.port or (443 if parsed.scheme == "https" else 8000),
                ssl=parsed.scheme == "https",
                settings=chroma_settings,
            )
        except Exception as exc:  # chromadb raises plain ValueError/ConnectionError variants
            raise StoreError(f"cannot reach the Chroma server at {store_shown(settings.store_url)}: {exc}") from None
    settings.chroma_path.mkdir(parents=True, exist_ok=True)
    with _OPENING:
        _forget_if_stale(settings, writing)
        return chromadb.PersistentClient(path=str(settings.chroma_path), settings=chroma_settings)


# Embedded Chroma keeps one system per folder per process, the folder's vector indexes in memory. Another process
# writing the folder meanwhile (a second watcher, a `brain sync` from a terminal beside a long-running watcher or
# server) leaves them stale: this process's next write of a chunk that process added failed ("Error finding id", a
# sync in ~80 with two watchers). Every write leaves a mark naming the writer (`WRITER_MARK` in the folder); a sync's
# open (under the sync lock, so no other process writes meanwhile) that finds another writer's mark lets go of the
# system, so its client reads the folder as it is now. Only a writer does: a reader reloading while another process
# is mid-write read half-written indexes ("Error finding id" on 1 `related` call in 20); readers keep the system they
# have, as before. The old system is let go, not stopped (its clients may be reading); no brain code closes a Chroma
# client, whose close() would count down the new system's references instead.
WRITER_MARK = ".last-writer"
_marks_seen: dict[str, str] = {}  # per Chroma folder: the mark this process last wrote or read


def _forget_if_stale(settings: Settings, writing: bool) -> None:
    from chromadb.api.shared_system_client import SharedSystemClient

    key = str(settings.chroma_path)
    try:
        mark = (settings.chroma_path / WRITER_MARK).read_text(encoding="utf-8")
    except OSError:
        mark = ""
    systems = SharedSystemClient._identifier_to_system
    if key not in systems:
        _marks_seen[key] = mark  # a new system reads the folder as it is now
        return
    if writing and _marks_seen.get(key, "") != mark:
        log.info("Chroma at %s was written by another process: reading it afresh", key)
        systems.pop(key, None)
        SharedSystemClient._identifier_to_refcount.pop(key, None)
        _marks_seen[key] = mark


def wrote(settings: Settings) -> None:
    """Leave this process's mark in the embedded Chroma folder after writing it (see `_forget_if_stale`)."""
    if settings.store_url:
        return
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    path = settings.chroma_path / WRITER_MARK
    try:
        temporary = path.with_name(f"{WRITER_MARK}.{os.getpid()}")
        temporary.write_text(mark, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:  # a full disk: the write it follows failed first, or is reported by the store itself
        log.warning("could not mark Chroma as written: %s", exc)
        return
    _marks_seen[str(settings.chroma_path)] = mark


def write_failure(settings: Settings, exc: BaseException) -> StoreError:
    """A sync's call Chroma refused, as the store's one line: which store, the cause, that nothing was lost (never the
    source's fault: its notes stay as they were and the next sync writes them again)."""
    where = store_shown(settings.store_url) or f"{settings.chroma_path}"
    cause = " ".join(str(exc).split())[:300] or type(exc).__name__
    return StoreError(f"Chroma ({where}) refused a write: {cause}. Nothing was lost: the next sync writes it again. "
                      "Another brain process writing it at the same time (a second `brain watch`, or a `brain sync` "
                      "beside a long-running server) causes this; if it recurs, run brain doctor")


# Chroma shares one system per path in a process but publishes it before it has started: a second thread opening the
# same path meanwhile (a watcher's sync beside the page's search) got "RustBindingsAPI has no attribute bindings".
_OPENING = threading.Lock()


SEARCH_EF = 400


def exact_enough(collection: Any) -> None:
    """Widen the HNSW search beam (Chroma's default ef_search is 100). With 100, the top 50 of the very same query
    vector differed from one process to the next (measured: locomo_dev nDCG@10 moved by ±0.01 between runs); with
    400 they are stable, at well under a millisecond per query at 10k chunks."""
    try:
        hnsw = (collection.configuration or {}).get("hnsw")
        if hnsw is not None and hnsw.get("ef_search") != SEARCH_EF:  # None: not an HNSW index (a SPANN server)
            collection.modify(configuration={"hnsw": {"ef_search": SEARCH_EF}})
    except Exception as exc:  # an older or locked-down server: search still works, with Chroma's default beam
        log.warning("could not set ef_search on %s: %s", collection.name, exc)


class VectorIndex:
    """The Chroma collection of one embedding model."""

    def __init__(self, settings: Settings, model: str, client: Any | None = None):
        self.settings = settings
        self.model = model
        self.client = client or open_chroma(settings)
        self.collection = self.client.get_or_create_collection(
            collection_name(model), metadata={"hnsw:space": "cosine", "embedding_model": model}
        )
        exact_enough(self.collection)

    def add(self, nodes: Sequence[Any]) -> int:
        """Write chunk vectors: the id, the vector and the note it belongs to, nothing else. A chunk's text and
        metadata have one owner, the manifest (search reads ids and distances here, never documents); a document
        here would be a second copy of every chunk, with Chroma's full-text index over it. Written in batches Chroma
        accepts (`max_batch_size`, 5,461 for the embedded store); a write Chroma refuses is a StoreError
        (`write_failure`), and each write leaves this process's mark (`wrote`). Returns how many were written."""
        step = self.client.get_max_batch_size()
        with writing(self.settings):
            for start in range(0, len(nodes), step):
                part = nodes[start : start + step]
                self.collection.upsert(ids=[n.id_ for n in part], embeddings=[list(n.embedding) for n in part],
                                       metadatas=[{"document_id": n.ref_doc_id} for n in part])
        return len(nodes)

    def forget(self, note_ids: list[str]) -> None:
        """Remove every chunk of these notes (by their document id, so orphans of a crashed run go too)."""
        with writing(self.settings):
            for start in range(0, len(note_ids), 200):
                batch = note_ids[start : start + 200]
                self.collection.delete(where={"document_id": {"$in": batch}})

    def vectors_by(self, keys: dict[str, str]) -> dict[str, bytes]:
        """The stored vectors of these chunk ids, as float32 bytes under the key each id maps to."""
        import numpy as np

        ids = sorted(keys)
        out: dict[str, bytes] = {}
        with writing(self.settings, mark=False):  # read before a delete: a refusal is the store's, as a write's
            for start in range(0, len(ids), 500):
                got = self.collection.get(ids=ids[start : start + 500], include=["embeddings"])
                for chunk_id, vector in zip(got["ids"], got["embeddings"], strict=True):
                    out[keys[chunk_id]] = np.asarray(vector, dtype=np.float32).tobytes()
        return out

    def count(self) -> int:
        return self.collection.count()

    def ids(self) -> set[str]:
        return collection_ids(self.collection)


@contextmanager
def writing(settings: Settings | None, mark: bool = True) -> Iterator[None]:
    """Around a sync's call to Chroma: a refusal by Chroma itself becomes the store's StoreError (a full disk stays
    what it is, for its own message); after a write (`mark`), this process's mark is left (`wrote`)."""
    from chromadb.errors import ChromaError

    try:
        yield
    except ChromaError as exc:
        if settings is None or disk_full(exc, str(settings.home)) is not None:
            raise
        _marks_seen[str(settings.chroma_path)] = "\0"  # this process's system may be stale: the next open drops it
        raise write_failure(settings, exc) from exc
    if settings is not None and mark:
        wrote(settings)


def collection_ids(collection: Any) -> set[str]:
    """Every id in a collection, read in pages (one `get` of a large collection is slow and memory-hungry)."""
    out: set[str] = set()
    offset = 0
    while True:
        got = collection.get(include=[], limit=5000, offset=offset)["ids"]
        out.update(got)
        if len(got) < 5000:
            return out
        offset += len(got)


def rename_chunks(collection: Any, renames: dict[str, str], remap: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Move chunks to new ids with their vectors and remapped metadata (documents too, in an older home's rows): no
    re-embedding.

    Upsert under the new id, then delete the old: repeating it after a crash finds the old ids gone and moves nothing.
    """
    old_ids = list(renames)
    moved = 0
    for start in range(0, len(old_ids), 500):
        got = collection.get(ids=old_ids[start : start + 500], include=["embeddings", "metadatas", "documents"])
        if not got["ids"]:
            continue
        collection.upsert(ids=[renames[i] for i in got["ids"]], embeddings=got["embeddings"],
                          metadatas=[remap(dict(m or {})) for m in got["metadatas"]],
                          documents=got["documents"] if any(got["documents"]) else None)  # rows of older homes
        collection.delete(ids=got["ids"])
        moved += len(got["ids"])
    return moved


def _swapped_away(exc: Exception) -> bool:
    """Chroma's answer to a call on a collection `brain doctor --compact` is deleting: not found once it is gone, or,
    from a server caught mid-delete, "Missing field: [Missing metadata segment]"."""
    from chromadb.errors import ChromaError, NotFoundError

    return isinstance(exc, NotFoundError) or (isinstance(exc, ChromaError) and "missing" in str(exc).lower()
                                              and "segment" in str(exc).lower())


class LiveCollection:
    """A collection for a long-lived reader: when its id vanishes (`brain doctor --compact` swapped in a rebuilt copy
    under the same name), it is looked up again by name and the call is retried once. The lookup waits out the
    instant of the swap when neither copy has the name (up to ~1 s)."""

    def __init__(self, client: Any, name: str):
        self._client = client
        self._name = name
        self._collection = client.get_collection(name)

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._collection, attr)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except Exception as exc:
                if not _swapped_away(exc):
                    raise
                self._collection = self._look_up_again()
                return getattr(self._collection, attr)(*args, **kwargs)

        return call

    def _look_up_again(self) -> Any:
        from chromadb.errors import NotFoundError

        for _ in range(10):
            try:
                return self._client.get_collection(self._name)
            except NotFoundError:
                time.sleep(0.1)
        return self._client.get_collection(self._name)


def drop_unused_collections(settings: Settings, client: Any, models_in_use: set[str]) -> list[str]:
    """Delete the collections of models no note uses any more, e.g. after a model switch."""
    keep = {collection_name(m) for m in models_in_use}
    dropped = []
    for collection in client.list_collections():
        name = collection if isinstance(collection, str) else collection.name
        if name.startswith(COLLECTION_PREFIX) and name not in keep:
            client.delete_collection(name)
            dropped.append(name)
    shutil.rmtree(settings.home / "docstore", ignore_errors=True)  # earlier releases wrote a docstore here, never read
    return dropped
