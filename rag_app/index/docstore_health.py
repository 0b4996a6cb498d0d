"""Which ingestion docstore a home uses, its failures as one line, and what it holds, read without LlamaIndex.

`brain status` and `brain doctor` ask how many notes the docstore holds and whether they are the manifest's: for the
home's SQLite file that is one query, and importing LlamaIndex for it (as rag_app.index.docstore does) would cost a
status call seconds. A PostgreSQL docstore is read through LlamaIndex's own store.
"""

from __future__ import annotations

import sqlite3
from urllib.parse import urlsplit

from rag_app.config import Settings
from rag_app.index.store import StoreError

DOCSTORE_FILE = "docstore.sqlite"
NAMESPACE = "notes"
METADATA_COLLECTION = NAMESPACE + "/metadata"  # LlamaIndex's KVDocumentStore: note id → {"doc_hash": ...}


class DocstoreError(StoreError):
    """The ingestion docstore cannot be opened, read or written. Its message is one line naming the store (the home's
    file, or postgresql://host:port/database) and the cause, never a login, SQL, its parameters or note text, and says
    what to do: a store failure, never one of the source being synced. `damaged`: the home's file is unreadable as a
    database (cut short, overwritten, not a file), which `brain doctor --repair` sets aside and rebuilds."""

    def __init__(self, message: str, damaged: bool = False):
        super().__init__(message)
        self.damaged = damaged


def docstore_name(settings: Settings) -> str:
    """Which docstore a home writes to, without credentials: "home" (its SQLite file) or
    postgresql://host:port/database. What a note copied into one docstore is recorded against."""
    url = settings.docstore_url
    if not url:
        return "home"
    parts = urlsplit(url)
    return f"postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"


def docstore_shown(settings: Settings) -> str:
    """The docstore as `brain status` and messages name it: the home's file, or postgresql://host:port/database."""
    return str(settings.home / DOCSTORE_FILE) if not settings.docstore_url else docstore_name(settings)


def docstore_failure(settings: Settings, exc: BaseException) -> DocstoreError:
    """An error of the docstore as one line: which store, the cause, what to do."""
    cause = _cause(exc, settings.docstore_url)
    if settings.docstore_url:
        name = docstore_name(settings)
        if _unreachable(exc):
            return DocstoreError(f"the docstore {name} cannot be reached ({cause}): start the database, or check "
                                 "[store] docstore_url in config.toml")
        return DocstoreError(f"the docstore {name} failed ({cause}): the database's log says more; check it and "
                             "[store] docstore_url in config.toml")
    path = docstore_shown(settings)
    low = cause.lower()
    if "locked" in low or "busy" in low:
        advice = "another program holds it: try again when it is done"
    elif "readonly" in low or "read-only" in low or "permission" in low or isinstance(exc, PermissionError):
        advice = "it cannot be written: check its owner and permissions"
    elif "full" in low:
        advice = "the disk is full: free some space and sync again"
    else:
        return DocstoreError(f"the docstore {path} is damaged ({cause}): run `brain doctor --repair`, which sets it "
                             "aside and rebuilds it from the index", damaged=True)
    return DocstoreError(f"the docstore {path} failed ({cause}): {advice}")


def _cause(exc: BaseException, url: str) -> str:
    """The driver's own first line: SQLAlchemy's wrapper adds the statement and its parameters (`[SQL: ...]`,
    `[parameters: ...]`), PostgreSQL a DETAIL line that may quote a value; a login never shows."""
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    line = lines[0].split("[SQL:")[0].strip() if lines else ""
    password = urlsplit(url).password if url else None
    if password:
        line = line.replace(password, "***")
    return line[:200] or type(orig or exc).__name__


def _unreachable(exc: BaseException) -> bool:
    """The database did not answer or dropped the connection (as opposed to refusing a statement)."""
    if isinstance(exc, OSError):
        return True
    try:
        from sqlalchemy import exc as sa_exc
    except ImportError:
        return False
    return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)


def has_kv_table(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kv'").fetchone() is not None


def home_file_stored(settings: Settings, check: bool = False) -> dict[str, str]:
    """Every note the home's docstore file holds → its hash, in one read, creating nothing (no file: none).
    `check`: the file must also pass SQLite's quick_check (a file cut short still opens and answers some reads).
    Raises `DocstoreError`."""
    return dict(_home_file_rows(settings, "SELECT key, json_extract(value, '$.doc_hash')", check))


def home_file_count(settings: Settings) -> int:
    """How many notes the home's docstore file holds: one COUNT. Raises `DocstoreError`."""
    rows = _home_file_rows(settings, "SELECT count(*)")
    return int(rows[0][0]) if rows else 0


def home_file_hashes(settings: Settings, note_ids: list[str]) -> dict[str, str] | None:
    """The home file's hash of each of these notes it holds, by key, without LlamaIndex (a sync that re-reads a few
    notes, e.g. ones with a warning, must not import it to learn nothing changed); None when the file or its table is
    not there yet or cannot be read here (the docstore is then opened the LlamaIndex way, which names a damaged
    one)."""
    path = settings.home / DOCSTORE_FILE
    if settings.docstore_url or not path.is_file():
        return None
    try:
        db = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=30.0)
        try:
            if not has_kv_table(db):
                return None
            found: dict[str, str] = {}
            for start in range(0, len(note_ids), 500):
                keys = note_ids[start : start + 500]
                found.update(db.execute(
                    f"SELECT key, json_extract(value, '$.doc_hash') FROM kv WHERE collection = ? AND key IN "
                    f"({','.join('?' * len(keys))})", (METADATA_COLLECTION, *keys)).fetchall())
            return {key: str(digest) for key, digest in found.items() if digest}
        finally:
            db.close()
    except (sqlite3.Error, OSError):
        return None


def _home_file_rows(settings: Settings, select: str, check: bool = False) -> list[tuple]:
    """`select` over the notes' metadata rows of the home's docstore file; none when there is no file (opened as it
    is: nothing is created, not even through a dangling link)."""
    path = settings.home / DOCSTORE_FILE
    if not path.exists() and not path.is_symlink():
        return []
    try:
        db = sqlite3.connect(path.absolute().as_uri() + "?mode=rw", uri=True, timeout=30.0)
        try:
            if check:
                problems = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
                if problems != ["ok"]:
                    raise sqlite3.DatabaseError("; ".join(problems))
            if not has_kv_table(db):
                return []
            return db.execute(f"{select} FROM kv WHERE collection = ?", (METADATA_COLLECTION,)).fetchall()
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        raise docstore_failure(settings, exc) from None


