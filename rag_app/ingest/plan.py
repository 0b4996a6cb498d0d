"""The plan of one source's sync: which listed notes to offer the ingestion docstore, which to delete, which the
listing already verified unchanged. Whether an offered note changed is not decided here: the IngestionPipeline's
docstore decides that, by the hash LlamaIndex keeps (see `Applier.write_chunks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rag_app.index.manifest import ManifestEntry
from readers.records import NoteRecord


@dataclass
class Plan:
    """`offered`: the listed notes with a record, each once, for the docstore to chunk, replace or skip. `forced`: of
    those, the ones the index holds no current chunks of (new to it, or chunked by another chunker), chunked whatever
    the docstore holds. `unchanged`: notes the reader verified unchanged without a record (file or memo signatures).
    Vectors are not planned: every sync fills in the vectors any note lacks (`Manifest.notes_lacking`)."""

    offered: list[NoteRecord] = field(default_factory=list)
    new: set[str] = field(default_factory=set)
    forced: set[str] = field(default_factory=set)
    deleted: list[str] = field(default_factory=list)
    unchanged: int = 0


def make_plan(
    entries: dict[str, ManifestEntry], records: list[NoteRecord], kept_ids: set[str], chunker: str,
    unchanged_ids: set[str] | frozenset[str] = frozenset(),
) -> Plan:
    """Compare a complete listing of one source against what the index holds of it.

    `unchanged_ids` are notes the reader verified unchanged without a record (from `Manifest.trusted_signatures`, so
    with this chunker): with no record to chunk, any other state is a caller's error. `kept_ids`: listed notes that
    could not be read this time (kept, never deleted)."""
    plan = Plan()
    seen: set[str] = set(unchanged_ids)
    for note_id in unchanged_ids:
        entry = entries.get(note_id)
        if entry is None or entry.chunker != chunker:
            raise ValueError(f"{note_id} was listed as unchanged but its index entry is not current")
    plan.unchanged = len(unchanged_ids)
    for record in records:
        if record.id in seen:
            continue
        seen.add(record.id)
        plan.offered.append(record)
        entry = entries.get(record.id)
        if entry is None:
            plan.new.add(record.id)
        if entry is None or entry.chunker != chunker:
            plan.forced.add(record.id)
    plan.deleted = sorted(set(entries) - seen - kept_ids)
    return plan
