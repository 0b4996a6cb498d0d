"""Sync: list each source completely, plan against what the index holds, apply (the docstore decides what changed).

Writes come in the order that makes notes searchable soonest (see `Applier`): chunk rows and BM25 tokens first,
then each dense model's vectors, every batch one SQLite commit. A crash between steps leaves work the manifest does
not record as done, so the next sync redoes exactly that; a failing source changes nothing at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from functools import partial
from typing import Any

from rag_app.config import ConfigError, Settings, SourceSpec
from rag_app.index.keyword import TOKENIZER_VERSION
from rag_app.index.keyword_store import refresh_keyword_index
from rag_app.index.manifest import Manifest, ManifestEntry
from rag_app.index.store import StoreError
from rag_app.ingest.apply import RETAIN_SECONDS, Applier
from rag_app.ingest.lock import StopRequested, SyncLock, stop_on_signals
from rag_app.ingest.memos_token import TOKEN_ORIGIN, memos_token, url_origin
from rag_app.ingest.migrations import backfill_docs, namespace_memo_ids, widen_search_beam
from rag_app.ingest.plan import Plan, make_plan
from rag_app.ingest.progress import NoProgress, Progress
from rag_app.ingest.report import SourceReport, SyncReport
from readers.listing import MemosLister, SourceLister, VaultLister
from readers.records import NoteRecord, SourceListing
from readers.redaction import one_line

log = logging.getLogger("cflow_brain.sync")
MASS_DELETE_SHARE, MASS_DELETE_MIN = 0.5, 3  # a listing that would delete this share and this many notes is held


def source_lister(spec: SourceSpec, token: str | None = None, known: Mapping[str, str] | None = None,
                  signatures: Mapping[str, str] | None = None) -> SourceLister:
    """The listing half of this source's reader (`VaultReader`, `MemosReader`). `token`: see `memos_token`; `known`:
    what the index holds of this source (see `_known`), so only new and changed notes come as records; `signatures`
    (memos): what each known memo's record was made from, so an unchanged memo is not even parsed.

    A sync lists with it (no LlamaIndex import: that alone takes 1.2-1.4 s, and a sync that finds nothing changed must
    finish within a second); when something changed, the Documents it chunks come from the reader's
    `lazy_load_data(listing=...)` over that same pass (see `Applier.write_chunks`)."""
    if spec.kind == "vault":
        return VaultLister(spec.path, name=spec.name, known=known)
    return MemosLister(spec.url, token, include_archived=spec.include_archived,
                       include_comments=spec.include_comments, source=spec.name, known=known, signatures=signatures,
                       **spec.memos_limits())


def source_reader(spec: SourceSpec, lister: SourceLister) -> Any:
    """This source's LlamaIndex reader (`VaultReader`, `MemosReader`) over the lister a sync listed with, whose
    `lazy_load_data(listing=...)` yields that pass's Documents: the source is not listed or read twice."""
    # Imported on use: the readers import LlamaIndex (1.2-1.4 s), which a sync that finds nothing changed never needs.
    from readers.memos_reader import MemosReader
    from readers.vault_reader import VaultReader

    return (VaultReader if spec.kind == "vault" else MemosReader).from_lister(lister)


def _documents(spec: SourceSpec, lister: SourceLister, listing: SourceListing) -> Iterable[Any]:
    return source_reader(spec, lister).lazy_load_data(listing=listing)


def reembed_stored(
    settings: Settings, manifest: Manifest, records: dict[str, list[NoteRecord]], progress: Progress | None = None
) -> SyncReport:
    """Chunk and embed notes again from their stored text (source → records), as a sync would.

    For `brain doctor --repair`: no source is read. The caller holds the SyncLock and rebuilds BM25 afterwards.
    """
    report = SyncReport()
    applier = Applier(settings, manifest, report, progress or NoProgress(), StopRequested(), keep_hashes=True)
    try:
        for source, batch in records.items():
            applier.write_chunks(source, batch, forced={r.id for r in batch})
        applier.fill()
        applier.finish()
    finally:
        applier.close()
    return report


def fill_vectors(settings: Settings, manifest: Manifest, progress: Progress | None = None) -> SyncReport:
    """Give every note the vectors it lacks, reading no source: `brain doctor --repair` of a channel a sync could not
    complete. The caller holds the SyncLock."""
    report = SyncReport()
    applier = Applier(settings, manifest, report, progress or NoProgress(), StopRequested())
    try:
        applier.fill()
    except Exception as exc:  # still failing: said in the repair report, recorded for the next doctor
        report.fill_error = one_line(exc)
    applier.finish()
    return report


def sync_sources(
    settings: Settings,
    specs: list[SourceSpec],
    progress: Progress | None = None,
    on_source: Callable[[SourceReport], None] | None = None,
    stop: StopRequested | None = None,
    on_searchable: Callable[[], None] | None = None,
    allow_deletes: frozenset[str] = frozenset(),
) -> SyncReport:
    """Sync the given sources (and only those) into the index under `settings.home`.

    Every source is listed and its changes chunked first, then BM25 is saved (keyword search covers every note), then
    the dense models fill in their vectors (`on_searchable` hears when that starts). `stop` (or, in the main thread,
    Ctrl-C / SIGTERM) ends it early: what is committed stays searchable, and the next sync resumes. A listing that
    would delete most of a source is held (see `_mass_delete`) unless the source is named in `allow_deletes`."""
    started = time.monotonic()
    report = SyncReport()
    progress = progress or NoProgress()
    stop = stop if stop is not None else StopRequested()
    with SyncLock(settings.home, settings.lock_wait_seconds), stop_on_signals(stop):
        manifest = Manifest(settings.manifest_path)
        applier = Applier(settings, manifest, report, progress, stop)
        try:
            if not manifest.counts() and manifest.get_meta("tokenizer_version") is None:
                manifest.set_meta("tokenizer_version", TOKENIZER_VERSION)  # a new home: its tokens are all current
            namespace_memo_ids(settings, manifest)
            for spec in specs:
                if stop:
                    break
                source_report = _sync_one(spec, manifest, applier, spec.name in allow_deletes)
                report.sources.append(source_report)
                if on_source:
                    on_source(source_report)
                if source_report.store_failed and report.store_error is None:
                    report.store_error = source_report.error
            refresh_keyword_index(settings, manifest)
            if on_searchable:
                on_searchable()
            try:
                applier.fill()
            except Exception as exc:  # a model or store failure: the chunks are searchable, the rest is retried
                report.fill_error = one_line(exc)
                log.error("filling vectors failed: %s", report.fill_error)
            applier.finish()
            with manifest.transaction():
                manifest.purge_retained(time.time() - RETAIN_SECONDS, set(settings.models))
            if report.fill_error is None:  # a store that just failed is tried again at the next sync
                widen_search_beam(settings, manifest)
        finally:
            applier.close()
            manifest.close()
    report.interrupted = bool(stop)
    report.seconds = time.monotonic() - started
    return report


def remove_source(settings: Settings, name: str) -> int:
    """Drop a source, its notes' chunks and vectors, under the lock; returns how many notes went. The generic token's
    binding goes with the last source of its server."""
    with SyncLock(settings.home, settings.lock_wait_seconds):
        manifest = Manifest(settings.manifest_path)
        try:
            if name not in manifest.sources():
                raise ConfigError(f"unknown source {name!r}; known: {sorted(manifest.sources()) or 'none'}")
            note_ids = sorted(manifest.entries(name))
            applier = Applier(settings, manifest, SyncReport(), NoProgress(), StopRequested())
            try:
                applier.delete(note_ids, retain=False)  # removing a source is explicit: its vectors go at once
            finally:
                applier.close()
            with manifest.transaction():
                manifest.delete_source(name)
                servers = {url_origin(str(row["spec"].get("url"))) for row in manifest.sources().values()
                           if row["kind"] == "memos"}
                if manifest.get_meta(TOKEN_ORIGIN) not in servers:
                    manifest.delete_meta(TOKEN_ORIGIN)
            refresh_keyword_index(settings, manifest)
        finally:
            manifest.close()
    return len(note_ids)


def _sync_one(spec: SourceSpec, manifest: Manifest, applier: Applier, allow_deletes: bool = False) -> SourceReport:
    result = SourceReport(name=spec.name, kind=spec.kind)
    first_time = spec.name not in manifest.sources()
    manifest.put_source(spec.name, spec.kind, spec.to_dict())
    try:
        token, token_warning = memos_token(spec, manifest) if spec.kind == "memos" else (None, None)
        entries = manifest.entries(spec.name)
    except Exception as exc:
        return _source_failed(spec, manifest, result, exc, first_time)
    try:
        known = _known(spec, manifest, entries, applier)
    except StoreError as exc:  # the docstore cannot be read (a database down, a damaged file): nothing changed
        return _store_failed(spec.name, manifest, result, exc)
    try:
        signatures = manifest.trusted_signatures(spec.name, applier.chunker_id) if spec.kind == "memos" else None
        lister = source_lister(spec, token, known=known, signatures=signatures)
        listing = lister.list()
    except Exception as exc:
        return _source_failed(spec, manifest, result, exc, first_time)
    if token and not spec.token_env and manifest.get_meta(TOKEN_ORIGIN) is None:
        manifest.set_meta(TOKEN_ORIGIN, url_origin(spec.url))
    result.warnings = ([token_warning] if token_warning else []) + listing.warnings
    result.skipped = listing.skipped
    for warning in listing.warnings:
        log.warning("%s: %s", spec.name, warning)
    try:
        reread = _held_unchanged(listing, entries, applier)
    except StoreError as exc:  # the docstore cannot be read (a database down, a damaged file): nothing changed
        return _store_failed(spec.name, manifest, result, exc)
    plan = make_plan(entries, [r for r in listing.records if r.id not in reread], listing.kept_ids,
                     applier.chunker_id, unchanged_ids=listing.unchanged_ids | reread)
    held = None if allow_deletes else _mass_delete(spec.name, len(entries), plan)
    if held:
        result.failed, result.error, result.deletes_held = True, held, len(plan.deleted)
        log.warning("source %s: %s", spec.name, held)
        manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    backfill_docs(manifest, spec.name, listing.records)
    result.unchanged = plan.unchanged
    try:
        for warning in applier.apply(spec.name, plan, partial(_documents, spec, lister, listing)):
            result.warnings.append(warning)
            log.warning("%s: %s", spec.name, warning)
    except StoreError as exc:  # the docstore or Chroma failed part-way: finished batches are committed
        _count_done(result, plan, applier)
        return _store_failed(spec.name, manifest, result, exc)
    except Exception as exc:  # a model failure part-way: finished batches are committed, the rest retried
        _count_done(result, plan, applier)
        result.failed = True
        result.error = one_line(exc, spec.token_env)
        log.error("source %s: applying changes failed: %s", spec.name, result.error)
        manifest.record_result(spec.name, asdict(result), succeeded=False)
        return result
    _count_done(result, plan, applier)
    _remember_signatures(spec, manifest, listing, known)
    manifest.record_result(spec.name, asdict(result), succeeded=True)
    log.info("synced %s: +%d ~%d -%d =%d", spec.name, result.added, result.updated, result.deleted, result.unchanged)
    return result


def _source_failed(spec: SourceSpec, manifest: Manifest, result: SourceReport, exc: Exception,
                   first_time: bool) -> SourceReport:
    """Any failure of the source itself (its listing, its token): everything it had is kept."""
    result.failed = True
    result.error = one_line(exc, spec.token_env)
    log.warning("source %s failed, nothing changed: %s", spec.name, result.error)
    if first_time:  # a typo or an unreachable server is not remembered: a plain `brain sync` won't retry it
        manifest.delete_source(spec.name)
        result.remembered = False
    else:
        manifest.record_result(spec.name, asdict(result), succeeded=False)
    return result


def _held_unchanged(listing: SourceListing, entries: Mapping[str, ManifestEntry], applier: Applier) -> set[str]:
    """Notes read again with the same bytes (a note with a warning has no signature, so the reader parses it at
    every sync, to repeat the warning) that the docstore holds under the hash they have: unchanged by the docstore's
    own record, read by key without LlamaIndex, so a sync with no change loads none. Notes whose bytes changed go to
    the pipeline, whose upserts decide; notes journaled by a sync that died are never taken as unchanged."""
    candidates = [r for r in listing.records if r.id not in listing.signatures
                  and (entry := entries.get(r.id)) is not None and entry.chunker == applier.chunker_id]
    pending = set(applier.manifest.pending_notes()) if candidates else set()
    candidates = [r for r in candidates if r.id not in pending]
    held = applier.stored_hashes([r.id for r in candidates])
    return {r.id for r in candidates if held.get(r.id) == r.content_hash}


def _count_done(result: SourceReport, plan: Plan, applier: Applier) -> None:
    """What this source's sync really committed (a failure or a stop part-way leaves the rest for the next sync): the
    docstore's decisions, new notes added, others updated, and offered notes it held unchanged."""
    offered = [r.id for r in plan.offered]
    result.added = sum(1 for note_id in offered if note_id in applier.written and note_id in plan.new)
    result.updated = sum(1 for note_id in offered if note_id in applier.written and note_id not in plan.new)
    result.unchanged = plan.unchanged + sum(1 for note_id in offered if note_id in applier.kept)
    result.deleted = sum(1 for note_id in plan.deleted if note_id in applier.deleted)


def _store_failed(name: str, manifest: Manifest, result: SourceReport, exc: StoreError) -> SourceReport:
    """A store (the docstore, the Chroma server) failed while this source synced: the store is named, with what to do,
    in one line (never SQL or note text). Later sources still sync: one with nothing to write never opens it."""
    result.failed = result.store_failed = True
    result.error = one_line(exc)
    log.error("source %s: %s", name, result.error)
    manifest.record_result(name, asdict(result), succeeded=False)
    return result


def _mass_delete(name: str, indexed: int, plan: Plan) -> str | None:
    """Why this plan's deletions are held, or None. An unmounted disk, a sync client that empties a folder before
    refilling it, a wrong path in config.toml or a Memos server that suddenly lists nothing all look like a source
    whose notes were deleted: a listing that finds none of the source's notes, or that would delete at least half of
    them and at least `MASS_DELETE_MIN`, deletes nothing until confirmed. A few deletions in a small source pass."""
    deleted = len(plan.deleted)
    listed = indexed - deleted
    if not deleted or (listed and (deleted < MASS_DELETE_MIN or deleted < MASS_DELETE_SHARE * indexed)):
        return None
    return (f"the listing found {listed} of its {indexed} notes, so this sync would delete {deleted} "
            f"({100 * deleted // indexed} %); nothing was changed. If they are really gone: "
            f"brain sync --allow-deletes {name} (or brain source remove {name})")


def _known(spec: SourceSpec, manifest: Manifest, entries: Mapping[str, ManifestEntry],
           applier: Applier) -> dict[str, str]:
    """What the index holds of this source for its reader: note id → vault file signature, or the hash the docstore
    holds of a memo (a memo read again with that hash is unchanged: the docstore's say, read by key).

    A note is trusted (its fingerprint given) only when its entry is current: chunked with this chunker, its text kept
    (see `Manifest.trusted_signatures`). Any other note maps to "", so the reader reads and lists it again."""
    if spec.kind == "vault":
        trusted = manifest.trusted_signatures(spec.name, applier.chunker_id)
    else:
        without_docs = manifest.notes_without_docs(spec.name)
        trusted = applier.stored_hashes([note_id for note_id, entry in entries.items()
                                         if entry.chunker == applier.chunker_id and note_id not in without_docs])
    return {note_id: trusted.get(note_id, "") for note_id in entries}


def _remember_signatures(spec: SourceSpec, manifest: Manifest, listing: SourceListing,
                         known: Mapping[str, str]) -> None:
    """Store the signatures of the notes parsed this time (vault files, memo answers) with their hashes, for the next
    sync to compare."""
    hashes = {r.id: r.content_hash for r in listing.records}
    if spec.kind == "memos":  # parsed and found unchanged (its answer changed, not its record): the hash it had
        hashes.update({i: known[i] for i in listing.signatures if i not in hashes and known.get(i)})
    parsed = {note_id: (signature, hashes[note_id]) for note_id, signature in listing.signatures.items()
              if note_id in hashes}
    with manifest.transaction():
        manifest.put_signatures(spec.name, parsed, listing.unchanged_ids | listing.kept_ids)
