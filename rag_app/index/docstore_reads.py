"""What the docstore holds, read for `brain status` and `brain doctor`: the home's file straight from SQLite (no
LlamaIndex, so a status stays quick), a PostgreSQL docstore through LlamaIndex's store."""

from __future__ import annotations

from rag_app.config import Settings
from rag_app.index.docstore_health import METADATA_COLLECTION, home_file_count, home_file_stored


def all_stored_hashes(settings: Settings, check: bool = False) -> dict[str, str]:
    """Every note the docstore holds → its hash, in one read, creating nothing (a home without the file holds none).
    `check`: the home's file must also pass SQLite's quick_check. Raises `DocstoreError`."""
    if not settings.docstore_url:
        return home_file_stored(settings, check)
    # Imported on use: the PostgreSQL docstore is LlamaIndex's (1.2-1.4 s to import), which a home's file never needs.
    from rag_app.index.docstore import close_docstore, open_docstore

    docstore = open_docstore(settings)
    try:
        rows = docstore._kvstore.get_all(collection=METADATA_COLLECTION)
    finally:
        close_docstore(docstore)
    return {key: str(value.get("doc_hash")) for key, value in rows.items()}


def stored_count(settings: Settings) -> int:
    """How many notes the docstore holds (`brain status`). Raises `DocstoreError`."""
    return len(all_stored_hashes(settings)) if settings.docstore_url else home_file_count(settings)
