"""What a note's hash covers: its text and its metadata, but not file times. `NoteRecord.content_hash` (records.py)
and `NoteDocument.hash` (note_document.py) are both this, so the index and LlamaIndex's docstore agree on it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

VOLATILE_KEYS = frozenset({"mtime", "mtime_ts"})  # metadata a record stores but does not hash (see NoteRecord)


def content_hash_of(text: str, metadata: dict[str, Any]) -> str:
    """What `NoteRecord.content_hash` and `NoteDocument.hash` compute: text and metadata without `VOLATILE_KEYS`."""
    hashed = {key: value for key, value in metadata.items() if key not in VOLATILE_KEYS}
    payload = json.dumps([text, hashed], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
