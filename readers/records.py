"""The plain record every reader produces, kept free of heavy imports so a no-change sync stays fast."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from readers.note_hash import content_hash_of

ChromaValue = str | int | float | bool


@dataclass
class NoteRecord:
    """One note from one source, before chunking.

    `metadata` holds only values Chroma accepts (str/int/float/bool); lists are encoded by `encode_list`.
    `text` and `metadata` are covered by `content_hash` (note_hash.py); `volatile` (file times and the like) is stored
    but not hashed, so touching a file does not force a re-embed.
    """

    id: str
    text: str
    metadata: dict[str, ChromaValue] = field(default_factory=dict)
    volatile: dict[str, ChromaValue] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return str(self.metadata.get("title", ""))

    @property
    def content_hash(self) -> str:
        return content_hash_of(self.text, self.metadata)

    def to_document(self) -> Any:
        """A LlamaIndex Document with a deterministic id whose `hash` is this `content_hash` (see `NoteDocument`)."""
        # Imported here, not at the top: note_document imports LlamaIndex (2.0-3.3 s: `bench/import_cost.py`,
        # 2026-12-03, load 8 on 2 cores), which a sync that finds nothing changed never needs (readers/listing.py).
        from readers.note_document import NoteDocument

        return NoteDocument(id_=self.id, text=self.text, metadata={**self.volatile, **self.metadata})


@dataclass
class SourceListing:
    """What a reader saw in one complete pass over a source.

    A pass handed what the index knows (`known`: note id → vault file signature or memo content hash) lists only
    new and changed notes as records:
    `kept_ids` are notes that exist but could not be read this time: the sync must keep their old index entries.
    `unchanged_ids` are known notes that match what was last indexed, listed without a record.
    `gone_ids` are known notes the source no longer has (neither listed nor kept): their index entries go.
    `signatures` maps a record's id to a signature of the bytes it was parsed from, for the next pass to compare.
    """

    records: list[NoteRecord]
    kept_ids: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    skipped: int = 0
    unchanged_ids: set[str] = field(default_factory=set)
    signatures: dict[str, str] = field(default_factory=dict)
    gone_ids: set[str] = field(default_factory=set)

    def settle(self, known: Mapping[str, str]) -> None:
        """Compute `gone_ids` once the pass is complete: known ids neither listed, unchanged nor kept."""
        listed = {record.id for record in self.records} | self.unchanged_ids | self.kept_ids
        self.gone_ids = set(known) - listed


def encode_list(values: list[str]) -> str:
    """Encode a list for Chroma metadata as a JSON string (Chroma rejects list values)."""
    return json.dumps(list(values), ensure_ascii=False)


def decode_list(value: object) -> list[str]:
    """Inverse of `encode_list`; tolerant of missing or malformed values."""
    if not isinstance(value, str) or not value:
        return []
    try:
        decoded = json.loads(value)
    except ValueError:
        return []
    return [str(v) for v in decoded] if isinstance(decoded, list) else []
