"""What a sync did, per source and in all: the figures `brain sync --json` prints and the page shows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass


class SourceReport:
    name: str
    kind: str
    added: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped: int = 0
    deletes_held: int = 0  # notes this sync would have deleted but did not: see `_mass_delete`
    failed: bool = False
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    remembered: bool = True  # False: its first sync failed, so later syncs do not try it again
    store_failed: bool = False  # the failure was a store's (the docstore, Chroma), not this source's

@dataclass


class SyncReport:
    """`chunks_written`: chunks (re)written, searchable by BM25 at once; `vectors`: chunk vectors added per model."""

    sources: list[SourceReport] = field(default_factory=list)
    chunks_written: int = 0
    deleted_chunks: int = 0
    vectors: dict[str, int] = field(default_factory=dict)
    reused_vectors: int = 0  # of those, copied from identical text elsewhere in the home instead of embedded
    model_loaded: bool = False
    interrupted: bool = False
    fill_error: str | None = None
    store_error: str | None = None  # the first store failure a source met (each such source failed, kept its notes)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(s.failed for s in self.sources) or self.fill_error is not None or self.store_error is not None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data
