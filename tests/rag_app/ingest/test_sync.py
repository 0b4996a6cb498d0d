"""Incremental sync into a real on-disk Chroma: exactly the changed notes are embedded, nothing is lost on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import chromadb
import pytest

from rag_app.config import ConfigError
from rag_app.engine import Brain
from rag_app.index.manifest import Manifest
from rag_app.index.store import collection_name
from rag_app.ingest.lock import SyncBusyError, SyncLock
from tests.conftest import REPO
from tests.doubles.memos_server import MemosDouble, seed_memos

NOTES = {
    "movies.md": "---\ntitle: 电影清单\ntags: [电影]\n---\n# 电影清单\n\n想看：《花样年华》《一一》。\n",
    "sleep.md": "# Better sleep\n\nGo to bed at the same time every night. No screens after ten.\n",
    "work/incident.md": (
        "# Incident\n\nPayments failed with ERR_CONN_RESET_4471.\n\n```bash\n# restart\nsystemctl restart pay\n```\n"
    ),
}


def chroma_ids(home: Path, model: str = "use-m3") -> set[str]:
    client = chromadb.PersistentClient(path=str(home / "chroma"))
    collection = client.get_collection(collection_name(model))
    return set(collection.get(include=[])["ids"])


def manifest_chunk_ids(home: Path) -> set[str]:
    manifest = Manifest(home / "index.sqlite")
    try:
        return {c for e in manifest.entries().values() for c in e.chunk_ids}
    finally:
        manifest.close()


def test_first_sync_indexes_every_note_and_chroma_matches_manifest(home, make_vault):
    vault = make_vault(NOTES)
    report = Brain(home).sync(vaults=(str(vault),))
    source = report.sources[0]
    assert (source.name, source.added, source.updated, source.deleted, source.failed) == ("notes", 3, 0, 0, False)
    assert report.model_loaded is True
    ids = chroma_ids(home)
    assert ids == manifest_chunk_ids(home)
    assert report.chunks_written == len(ids) >= 3
    assert all(i.startswith("vault:notes/") and ":chunk:" in i for i in ids)
    collection = chromadb.PersistentClient(path=str(home / "chroma")).get_collection(collection_name("use-m3"))
    assert collection.configuration["hnsw"]["ef_search"] == 400  # a wide beam: the same query, the same top 50
    status = Brain(home).status()
    assert (status["notes"], status["chunks"]) == (3, len(ids))
    assert status["sources"][0]["name"] == "notes" and status["sources"][0]["last_sync"]


def test_no_change_sync_embeds_nothing_and_loads_no_model(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    report = Brain(home).sync(vaults=(str(vault),))
    assert (report.sources[0].unchanged, report.chunks_written, report.model_loaded) == (3, 0, False)


@pytest.mark.parametrize("warned", [False, True], ids=["clean", "a note with a warning"])
def test_no_change_sync_imports_neither_llama_index_nor_chromadb_nor_numpy(home, make_vault, warned):
    """The fast path is what keeps a no-change sync of thousands of notes under a second (numpy alone: 0.1 s). A
    note with a warning (unreadable frontmatter) is read again at every sync: its hash is looked up in the home's
    docstore file directly, not through LlamaIndex (a real 3,176-note vault's no-change sync took 1.2 s for it)."""
    notes = dict(NOTES, **({"broken.md": "---\ntitle: [unclosed\n---\n# Broken\n\nStill a note.\n"} if warned else {}))
    vault = make_vault(notes)
    Brain(home).sync(vaults=(str(vault),))
    code = (
        "import sys; from rag_app.engine import Brain; "
        f"r = Brain({str(home)!r}).sync(vaults=({str(vault)!r},)); "
        "print(r.chunks_written, r.model_loaded, 'llama_index.core' in sys.modules, 'chromadb' in sys.modules, "
        "'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["0", "False", "False", "False", "False"]


def test_a_tokenizer_upgrade_retokenizes_cached_chunks_once_without_embedding(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    manifest = Manifest(home / "index.sqlite")
    fresh = dict((c, t) for c, t, _, _ in manifest.chunk_tokens())
    manifest.set_tokens([(c, "stale tokens of an older tokenizer") for c in fresh])
    manifest.set_meta("tokenizer_version", "kw-v1")
    (home / "bm25" / "ids.json").unlink()  # as after an upgrade: the saved index no longer matches
    Brain(home).search("ERR_CONN_RESET_4471", 3, mode="bm25")  # a reader builds from what is cached, writes nothing
    assert manifest.get_meta("tokenizer_version") == "kw-v1"
    assert {t for _, t, _, _ in manifest.chunk_tokens()} == {"stale tokens of an older tokenizer"}
    report = Brain(home).sync(vaults=(str(vault),))
    assert report.chunks_written == 0
    assert dict((c, t) for c, t, _, _ in manifest.chunk_tokens()) == fresh
    manifest.close()
    hits = Brain(home).search("ERR_CONN_RESET_4471", 3, mode="bm25").results
    assert hits and hits[0]["path"] == "work/incident.md"


def test_a_home_made_before_the_wide_search_beam_gets_it_on_its_next_sync(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    client = chromadb.PersistentClient(path=str(home / "chroma"))
    client.get_collection(collection_name("use-m3")).modify(configuration={"hnsw": {"ef_search": 100}})
    manifest = Manifest(home / "index.sqlite")
    manifest.db.execute("DELETE FROM meta WHERE key = 'hnsw_ef_search'")
    report = Brain(home).sync(vaults=(str(vault),))
    assert report.chunks_written == 0 and manifest.get_meta("hnsw_ef_search") == "400"
    manifest.close()
    reopened = chromadb.PersistentClient(path=str(home / "chroma")).get_collection(collection_name("use-m3"))
    assert reopened.configuration["hnsw"]["ef_search"] == 400


def test_edit_delete_add_touch_exactly_those_notes(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    before = chroma_ids(home)
    (vault / "sleep.md").write_text("# Better sleep\n\nA dark, cool room helps.\n", encoding="utf-8")
    (vault / "work/incident.md").unlink()
    (vault / "new.md").write_text("# 新笔记\n\n今天学习了 Rust。\n", encoding="utf-8")
    report = Brain(home).sync(vaults=(str(vault),))
    source = report.sources[0]
    assert (source.added, source.updated, source.deleted, source.unchanged) == (1, 1, 1, 1)
    after = chroma_ids(home)
    assert not any(i.startswith("vault:notes/work/incident.md") for i in after)
    assert any(i.startswith("vault:notes/new.md") for i in after)
    movie_chunks = {i for i in before if i.startswith("vault:notes/movies.md")}
    assert movie_chunks <= after
    assert after == manifest_chunk_ids(home)
    assert report.chunks_written == len([i for i in after if "sleep.md" in i or "new.md" in i])


def test_touching_a_file_without_changing_it_does_not_reembed(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    path = vault / "movies.md"
    later = time.time() + 100
    os.utime(path, (later, later))
    assert Brain(home).sync(vaults=(str(vault),)).chunks_written == 0


def test_renamed_file_is_one_delete_and_one_add(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    (vault / "sleep.md").rename(vault / "睡眠.md")
    source = Brain(home).sync(vaults=(str(vault),)).sources[0]
    assert (source.added, source.deleted, source.unchanged) == (1, 1, 2)
    assert any(i.startswith("vault:notes/睡眠.md:chunk:") for i in chroma_ids(home))


def test_sync_touches_only_the_sources_it_ran(home, make_vault, tmp_path):
    first = make_vault(NOTES, name="first")
    second = make_vault({"b.md": "# B\n\nsecond vault note"}, name="second")
    brain = Brain(home)
    brain.sync(vaults=(str(first),))
    brain.sync(vaults=(str(second),))
    status = Brain(home).status()
    assert {s["name"]: s["notes"] for s in status["sources"]} == {"first": 3, "second": 1}
    again = Brain(home).sync(vaults=(str(second),))
    assert [s.name for s in again.sources] == ["second"]
    assert Brain(home).status()["notes"] == 4


def test_plain_sync_reruns_remembered_sources(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    (vault / "x.md").write_text("# X\n\nnew", encoding="utf-8")
    report = Brain(home).sync()
    assert [(s.name, s.added) for s in report.sources] == [("notes", 1)]


def test_removing_a_source_is_explicit_and_deletes_its_chunks(home, make_vault):
    vault = make_vault(NOTES)
    brain = Brain(home)
    brain.sync(vaults=(str(vault),))
    result = brain.remove_source("notes")
    assert result["notes"] == 3
    assert chroma_ids(home) == set()
    assert Brain(home).status()["notes"] == 0
    with pytest.raises(ConfigError, match="unknown source"):
        brain.remove_source("notes")


def test_missing_vault_folder_is_a_clear_error(home, tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        Brain(home).sync(vaults=(str(tmp_path / "nope"),))


def test_vault_that_disappears_fails_that_source_and_keeps_its_notes(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    before = chroma_ids(home)
    vault.rename(vault.with_name("moved"))
    report = Brain(home).sync()
    assert report.failed and "not found" in report.sources[0].error
    assert chroma_ids(home) == before
    assert Brain(home).status()["sources"][0]["last_result"]["failed"] is True


def test_model_change_fills_a_new_collection_and_drops_the_old_once_complete(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    chunks = manifest_chunk_ids(home)
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\nsecond_model = ""\n', encoding="utf-8")
    report = Brain(home).sync(vaults=(str(vault),))
    assert (report.sources[0].updated, report.sources[0].unchanged) == (0, 3)  # the notes did not change
    assert (report.chunks_written, report.vectors) == (0, {"e5-small": len(chunks)})
    client = chromadb.PersistentClient(path=str(home / "chroma"))
    assert {c.name for c in client.list_collections()} == {collection_name("e5-small")}
    assert chroma_ids(home, "e5-small") == manifest_chunk_ids(home) == chunks


def test_adding_the_second_model_embeds_only_with_it(home, make_vault):
    """Turning on the second dense channel adds its vectors; the main model's vectors are kept, not redone."""
    vault = make_vault(NOTES)
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\nsecond_model = ""\n', encoding="utf-8")
    Brain(home).sync(vaults=(str(vault),))
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\n', encoding="utf-8")
    report = Brain(home).sync(vaults=(str(vault),))
    assert (report.sources[0].updated, report.sources[0].unchanged) == (0, 3)
    assert (report.chunks_written, report.vectors) == (0, {"use-m3": len(manifest_chunk_ids(home))})
    assert chroma_ids(home, "use-m3") == chroma_ids(home, "e5-small") == manifest_chunk_ids(home)
    again = Brain(home).sync(vaults=(str(vault),))
    assert (again.chunks_written, again.vectors, again.model_loaded) == (0, {}, False)


def test_chunk_size_change_rechunks_every_note(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[chunking]\nmax_chars = 200\n', encoding="utf-8")
    assert Brain(home).sync(vaults=(str(vault),)).sources[0].updated == 3


def test_a_second_writer_waits_then_gets_a_clear_busy_error(home, make_vault):
    vault = make_vault(NOTES)
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[sync]\nlock_wait_seconds = 0.3\n')
    with SyncLock(home, wait=0):
        with pytest.raises(SyncBusyError, match="another sync is running"):
            Brain(home).sync(vaults=(str(vault),))
    assert Brain(home).sync(vaults=(str(vault),)).sources[0].added == 3


def test_concurrent_syncs_in_threads_never_corrupt(home, make_vault):
    vault = make_vault({f"n{i}.md": f"# Note {i}\n\nbody {i}" for i in range(20)})
    errors: list[BaseException] = []

    def run() -> None:
        try:
            Brain(home).sync(vaults=(str(vault),))
        except SyncBusyError:
            pass
        except BaseException as exc:  # noqa: BLE001 - the test reports any other failure
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert chroma_ids(home) == manifest_chunk_ids(home)
    assert Brain(home).status()["notes"] == 20


def test_a_stopped_first_sync_keeps_its_batches_and_the_next_resumes_without_redoing_them(home, make_vault,
                                                                                           monkeypatch):
    """A stop request (Ctrl-C, SIGTERM) ends the fill after the batch in hand: BM25 already covers every note, the
    finished vectors stay, and the next run embeds only the rest; the result equals a one-pass index."""
    import rag_app.ingest.apply as apply_module
    from rag_app.ingest.lock import StopRequested

    vault = make_vault({f"n{i:02d}.md": f"# Note {i}\n\n" + ("text " * 20) for i in range(12)})
    monkeypatch.setattr(apply_module, "FIRST_FILL_BATCH", 4)
    monkeypatch.setattr(apply_module, "MIN_FILL_BATCH", 4)
    monkeypatch.setattr(apply_module, "MAX_FILL_BATCH", 4)
    stop = StopRequested()
    batches = {"n": 0}
    original = apply_module.Manifest.add_model

    def stop_after_two_batches(self, note_ids, model):
        original(self, note_ids, model)
        batches["n"] += 1
        if batches["n"] == 2:
            stop.set()

    monkeypatch.setattr(apply_module.Manifest, "add_model", stop_after_two_batches)
    first = Brain(home).sync(vaults=(str(vault),), stop=stop)
    assert first.interrupted
    assert (first.sources[0].added, first.chunks_written, first.vectors) == (12, 12, {"use-m3": 8})
    assert len(chroma_ids(home)) == 8 and len(manifest_chunk_ids(home)) == 12
    assert [r["note_id"] for r in Brain(home).search("Note 11", k=1, mode="bm25").results] == ["vault:notes/n11.md"]
    status = Brain(home).status()["channels"]
    assert status["bm25"] == {"chunks": 12, "complete": True}
    assert (status["use-m3"]["chunks"], status["use-m3"]["complete"]) == (8, False)

    second = Brain(home).sync(vaults=(str(vault),))
    assert (second.interrupted, second.sources[0].unchanged, second.chunks_written, second.vectors) == (
        False, 12, 0, {"use-m3": 4})
    assert chroma_ids(home) == manifest_chunk_ids(home) and len(chroma_ids(home)) == 12
    assert Brain(home).status()["channels"]["use-m3"] == {"chunks": 12, "complete": True, "seconds_left": 0}


def test_a_stop_inside_a_long_note_ends_after_one_slice_and_loses_no_vector(home, make_vault, monkeypatch):
    """Batches are bounded in chunks, not notes: a note of 20 chunks is embedded in slices of 4, a stop is honoured
    after the slice in hand (not after the whole note), the note is not half in the index, and the next sync reuses
    the slice's vectors and embeds only the rest."""
    import rag_app.ingest.apply as apply_module
    from rag_app.ingest.lock import StopRequested

    long_note = "# Long\n\n" + "\n\n".join(f"## Part {i}\n\n" + f"paragraph {i} " * 60 for i in range(20))
    vault = make_vault({"long.md": long_note})
    for name in ("FIRST_FILL_BATCH", "MIN_FILL_BATCH", "MAX_FILL_BATCH"):
        monkeypatch.setattr(apply_module, name, 4)
    stop = StopRequested()

    class StopAfterOneSlice:
        """Counts what the fill reports and asks to stop at its first slice."""

        def __init__(self) -> None:
            self.step, self.slices = "", []

        def start(self, total: int, description: str, unit: str = "chunk") -> None:
            self.step = description

        def advance(self, count: int) -> None:
            if self.step == "use-m3":
                self.slices.append(count)
                stop.set()

        def close(self) -> None:
            pass

    progress = StopAfterOneSlice()
    first = Brain(home).sync(vaults=(str(vault),), stop=stop, progress=progress)
    chunks = len(manifest_chunk_ids(home))
    assert chunks >= 16
    assert first.interrupted and first.vectors.get("use-m3", 0) == 0
    assert progress.slices == [4] and chroma_ids(home) == set()  # one slice embedded, none of it half-indexed

    second = Brain(home).sync(vaults=(str(vault),))
    assert (second.interrupted, second.reused_vectors, second.vectors) == (False, 4, {"use-m3": chunks})
    assert chroma_ids(home) == manifest_chunk_ids(home)


def test_a_long_note_is_filled_whole_when_the_slice_size_changes_under_it(home, make_vault, monkeypatch):
    """The slice size follows the measured rate: when it shrinks inside a note (a loaded machine), no chunk is
    skipped and none embedded twice."""
    import rag_app.ingest.apply as apply_module

    long_note = "# Long\n\n" + "\n\n".join(f"## Part {i}\n\n" + f"paragraph {i} " * 60 for i in range(20))
    vault = make_vault({"long.md": long_note, "short.md": "# Short\n\nA short note."})
    monkeypatch.setattr(apply_module, "FIRST_FILL_BATCH", 8)
    monkeypatch.setattr(apply_module, "MIN_FILL_BATCH", 2)
    monkeypatch.setattr(apply_module, "FILL_BATCH_SECONDS", 1e-9)  # every measured rate asks for the smallest slice
    report = Brain(home).sync(vaults=(str(vault),))
    chunks = manifest_chunk_ids(home)
    assert (report.interrupted, report.failed, report.vectors) == (False, False, {"use-m3": len(chunks)})
    assert chroma_ids(home) == chunks


def test_a_bm25_index_saved_before_its_stamp_was_recorded_still_counts_as_complete(home, make_vault):
    """Homes from older versions have the saved index but no `bm25_saved` record: status reads the index's own stamp
    (before, such a home showed BM25 0/N until its next sync), and a no-change sync does not rebuild it."""
    vault = make_vault({"a.md": "# A\n\nalpha words", "b.md": "# B\n\nbeta words"})
    Brain(home).sync(vaults=(str(vault),))
    manifest = Manifest(home / "index.sqlite")
    manifest.db.execute("DELETE FROM meta WHERE key = 'bm25_saved'")
    manifest.db.commit()
    manifest.close()
    assert Brain(home).status()["channels"]["bm25"] == {"chunks": 2, "complete": True}
    saved = (home / "bm25" / "ids.json").stat().st_mtime_ns
    Brain(home).sync(vaults=(str(vault),))
    assert (home / "bm25" / "ids.json").stat().st_mtime_ns == saved  # not rebuilt, and now recorded:
    manifest = Manifest(home / "index.sqlite")
    assert json.loads(manifest.get_meta("bm25_saved") or "{}")["chunks"] == 2
    manifest.close()

# ---- Memos ---------------------------------------------------------------------------------------


@pytest.fixture
def memos(monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        seed_memos(double, 40)
        yield double


def test_memos_full_then_incremental_sync(home, memos):
    brain = Brain(home)
    first = brain.sync(memos=(memos.url,)).sources[0]
    assert first.failed is False and first.added > 30
    keys = [m.removeprefix("memos/") for m in (memo["name"] for memo in _listed(memos))]
    memos.edit_memo(keys[0], "改过的内容 #读书")
    memos.delete_memo(keys[1])
    memos.add_memo("a brand new memo about sleep #health", visibility="PRIVATE")
    second = Brain(home).sync(memos=(memos.url,)).sources[0]
    assert (second.added, second.updated, second.deleted) == (1, 1, 1)
    assert not any(i.startswith(f"memos:{keys[1]}:") for i in chroma_ids(home))
    assert chroma_ids(home) == manifest_chunk_ids(home)


def test_a_memos_sync_hands_the_reader_what_the_index_knows(home, memos, monkeypatch):
    """The second pass lists only the edited memo as a record (the rest by id, unchanged; the deleted one as gone):
    only changes become Documents."""
    from readers.listing import MemosLister

    Brain(home).sync(memos=(memos.url,))
    keys = [m.removeprefix("memos/") for m in (memo["name"] for memo in _listed(memos))]
    memos.edit_memo(keys[0], "changed words")
    memos.delete_memo(keys[1])
    passes = []
    original = MemosLister.list
    monkeypatch.setattr(MemosLister, "list", lambda lister: passes.append(original(lister)) or passes[-1])
    source = Brain(home).sync(memos=(memos.url,)).sources[0]
    (listing,) = passes
    assert [r.text for r in listing.records] == ["changed words"]
    assert len(listing.gone_ids) == 1 and next(iter(listing.gone_ids)).endswith(keys[1])
    assert (source.updated, source.deleted, source.unchanged) == (1, 1, len(listing.unchanged_ids))


def _listed(double: MemosDouble) -> list[dict]:
    import httpx

    body = httpx.get(f"{double.url}/api/v1/memos", params={"pageSize": 1000},
                     headers={"Authorization": "Bearer memos_pat_test"}).json()
    return body["memos"]


def test_memos_failure_mid_listing_keeps_index_and_manifest(home, memos):
    Brain(home).sync(memos=(memos.url,))
    before_ids, before_status = chroma_ids(home), Brain(home).status()
    memos.delete_memo(_listed(memos)[0]["name"].removeprefix("memos/"))
    memos.faults["truncate_page"] = 0
    report = Brain(home).sync(memos=(memos.url,))
    assert report.failed and "malformed JSON" in report.sources[0].error
    assert chroma_ids(home) == before_ids
    after = Brain(home).status()
    assert (after["notes"], after["chunks"]) == (before_status["notes"], before_status["chunks"])


def test_memos_bad_token_is_an_auth_error_and_deletes_nothing(home, memos, monkeypatch):
    Brain(home).sync(memos=(memos.url,))
    before = chroma_ids(home)
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_WRONG_SECRET")
    report = Brain(home).sync(memos=(memos.url,))
    assert report.failed and "token" in report.sources[0].error
    assert "memos_pat_WRONG_SECRET" not in str(report.to_dict())
    assert chroma_ids(home) == before


def test_memos_paging_over_a_thousand_memos(home, monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        for i in range(1205):
            double.add_memo(f"memo {i} #n{i % 7}", visibility="PRIVATE")
        report = Brain(home).sync(memos=(double.url,))
        pages = [r for r in double.requests if r["path"] == "/api/v1/memos"]
    assert report.sources[0].added == 1205
    assert len(pages) == 2
    assert Brain(home).status()["notes"] == 1205


def test_search_during_the_fill_uses_only_complete_channels(home, make_vault, monkeypatch):
    """BM25 alone before any dense model is complete, then BM25 + USE-m3 (fast mode) until e5 is complete too."""
    import rag_app.ingest.apply as apply_module
    from rag_app.ingest.lock import StopRequested

    vault = make_vault(NOTES)
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\n', encoding="utf-8")
    for name in ("FIRST_FILL_BATCH", "MIN_FILL_BATCH", "MAX_FILL_BATCH"):
        monkeypatch.setattr(apply_module, name, 1)
    stop = StopRequested()
    Brain(home).sync(vaults=(str(vault),), stop=stop, on_searchable=stop.set)
    before_any = Brain(home).search("ERR_CONN_RESET_4471")
    assert set(before_any.coverage["channels"]) == {"bm25"}
    assert before_any.coverage["filling_vectors"] == ["e5-small", "use-m3"]
    assert before_any.results[0]["note_id"] == "vault:notes/work/incident.md"

    original = apply_module.Manifest.add_model
    stop = StopRequested()

    def stop_after_first_e5_batch(self, note_ids, model):
        original(self, note_ids, model)
        if model == "e5-small":
            stop.set()

    monkeypatch.setattr(apply_module.Manifest, "add_model", stop_after_first_e5_batch)
    Brain(home).sync(vaults=(str(vault),), stop=stop)
    during = Brain(home).search("想看的电影")
    assert during.coverage["filling_vectors"] == ["e5-small"]
    assert set(during.coverage["channels"]) == {"bm25", "vector"}  # USE-m3 as the only dense channel: fast mode
    monkeypatch.setattr(apply_module.Manifest, "add_model", original)
    Brain(home).sync(vaults=(str(vault),))
    after = Brain(home).search("想看的电影")
    assert "filling_vectors" not in after.coverage and set(after.coverage["channels"]) == {"bm25", "vector", "vector2"}


def test_the_same_text_anywhere_in_the_home_is_embedded_once(home, tmp_path):
    """A note copied into a second vault gets its vectors from the first copy, and search shows it once."""
    import numpy as np

    from tests.conftest import write_files

    first = write_files(tmp_path / "first", NOTES)
    second = write_files(tmp_path / "second", {"copied/movies.md": NOTES["movies.md"], "own.md": "# Own\n\nunique\n"})
    Brain(home).sync(vaults=(str(first),))
    report = Brain(home).sync(vaults=(str(second),))
    copied_chunks = len([c for c in manifest_chunk_ids(home) if c.startswith("vault:second/copied/")])
    assert report.reused_vectors == copied_chunks >= 1 and report.vectors == {"use-m3": copied_chunks + 1}
    collection = chromadb.PersistentClient(path=str(home / "chroma")).get_collection(collection_name("use-m3"))
    got = collection.get(ids=["vault:first/movies.md:chunk:0", "vault:second/copied/movies.md:chunk:0"],
                         include=["embeddings"])
    assert np.allclose(got["embeddings"][0], got["embeddings"][1])
    results = Brain(home).search("花样年华").results
    movie_hits = [r for r in results if r["note_id"].endswith("movies.md")]
    assert len(movie_hits) == 1
    assert {movie_hits[0]["note_id"], *movie_hits[0]["duplicates"]} == {"vault:first/movies.md",
                                                                         "vault:second/copied/movies.md"}
