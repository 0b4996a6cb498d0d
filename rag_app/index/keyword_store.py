"""The BM25 index's store: where it lives (`Settings.bm25_path`), whether it is current, and rebuilding it.

Sync refreshes it (under the sync lock), search loads it, doctor asks it. The index is rebuilt from the chunk tokens
cached in the manifest, and stamped with the manifest's chunk generation and the tokenizer version.
"""

from __future__ import annotations

import json
from typing import Any

from rag_app.config import Settings
from rag_app.index.keyword import TOKENIZER_VERSION, KeywordIndex, chunk_index_text, tokenize
from rag_app.index.manifest import Manifest


def keyword_stamp(manifest: Manifest) -> str:
    """What the saved index must be stamped with to be current."""
    return f"{manifest.generation()}/{TOKENIZER_VERSION}"


def refresh_keyword_index(settings: Settings, manifest: Manifest, force: bool = False) -> bool:
    """Rebuild and save the BM25 index when chunks changed since it was saved, or when `force`d. True if rebuilt.
    The caller holds the SyncLock (it may rewrite cached tokens)."""
    stamp = keyword_stamp(manifest)
    current_tokens = manifest.get_meta("tokenizer_version") == TOKENIZER_VERSION
    if not force and current_tokens and _saved_stamp(settings, manifest) == stamp:
        if manifest.get_meta("bm25_saved") is None:  # saved by an older version: record it, so status stops reading ids
            saved = json.dumps({"stamp": stamp, "chunks": len(saved_keyword_ids(settings)[1])})
            manifest.set_meta("bm25_saved", saved)
        return False
    index = KeywordIndex.build(load_keyword_rows(manifest, persist=True))
    index.save(settings.bm25_path, stamp)
    manifest.set_meta("bm25_saved", json.dumps({"stamp": stamp, "chunks": len(index.ids)}))
    return True


def open_keyword_index(settings: Settings, manifest: Manifest) -> KeywordIndex:
    """The saved index when current; otherwise one built in memory from the cached tokens (a sync is writing)."""
    return KeywordIndex.load(settings.bm25_path, keyword_stamp(manifest)) or KeywordIndex.build(
        load_keyword_rows(manifest))


def keyword_progress(settings: Settings, manifest: Manifest, total_chunks: int) -> dict[str, Any]:
    """The BM25 channel's part of `brain status`: chunks the saved index covers, and whether it is current."""
    current = _saved_stamp(settings, manifest) == keyword_stamp(manifest)
    saved = json.loads(manifest.get_meta("bm25_saved") or "{}")
    return {"chunks": total_chunks if current else int(saved.get("chunks", 0)), "complete": current}


def _saved_stamp(settings: Settings, manifest: Manifest) -> str | None:
    """The stamp of the saved index, as recorded when it was saved (cheap: not its whole id list)."""
    if not (settings.bm25_path / "ids.json").exists():
        return None
    recorded = manifest.get_meta("bm25_saved")
    if recorded is None:  # saved by a version that did not record it: read the index's own stamp once
        return saved_keyword_ids(settings)[0]
    return json.loads(recorded).get("stamp")


def saved_keyword_ids(settings: Settings) -> tuple[str | None, set[str]]:
    """(stamp, chunk ids) of the saved index, or (None, empty) when there is none: what doctor compares."""
    try:
        meta = json.loads((settings.bm25_path / "ids.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, set()
    return meta.get("stamp"), set(meta.get("ids") or [])


def load_keyword_rows(manifest: Manifest, persist: bool = False) -> list[tuple[str, list[str]]]:
    """Cached tokens of every chunk.

    Only a writer holding the sync lock (`persist`) re-tokenizes chunks cached by an older tokenizer and saves the
    tokens: a search process must never write them, or a sync editing a note meanwhile could get the old text's
    tokens saved over the new. A reader uses the cached tokens as they are and tokenizes chunks that have none in
    memory only.
    """
    stale = persist and manifest.get_meta("tokenizer_version") != TOKENIZER_VERSION
    rows, fresh = [], []
    for chunk_id, tokens, text, metadata in manifest.chunk_tokens():
        if tokens is None or stale:
            tokens = " ".join(tokenize(chunk_index_text(text, json.loads(metadata))))
            fresh.append((chunk_id, tokens))
        rows.append((chunk_id, tokens.split()))
    if persist and (fresh or stale):
        with manifest.transaction():
            manifest.set_tokens(fresh)
            manifest.set_meta("tokenizer_version", TOKENIZER_VERSION)
    return rows
