"""What a sync refuses to do on its own: empty a source, let one huge note stop a channel for good, or drop a note it
merely could not read. Real vaults on disk, real Chroma, the Memos and embeddings doubles over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import chromadb

from rag_app.engine import Brain
from rag_app.index.manifest import Manifest
from rag_app.index.store import collection_name
from tests.doubles.embeddings_server import EmbeddingsDouble
from tests.doubles.memos_server import MemosDouble, seed_memos
from tests.rag_app.ingest.test_sync import NOTES, chroma_ids, manifest_chunk_ids
from tests.rag_app.shells.test_cli import brain

SIX = {f"n{i}.md": f"# Note {i}\n\nbody of note {i}, about topic {i * 7}\n" for i in range(6)}


def statuses(home: Path) -> dict[str, int]:
    return {s["name"]: s["notes"] for s in Brain(home).status()["sources"]}


# ---- item 1: a listing that would empty a source deletes nothing ---------------------------------------------


def test_an_emptied_vault_deletes_nothing_exits_1_and_says_how_to_confirm(home, make_vault, tmp_path):
    vault = make_vault(NOTES)
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    before = chroma_ids(home)
    vault.rename(tmp_path / "away")
    vault.mkdir()  # an unmounted disk, a sync client that clears the folder before refilling it

    done = brain(home, "sync", "--json")

    assert done.returncode == 1
    source = json.loads(done.stdout)["sources"][0]
    assert (source["failed"], source["deleted"], source["deletes_held"]) == (True, 0, 3)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr
    assert "found 0 of its 3 notes" in errors[0] and "brain sync --allow-deletes notes" in errors[0]
    assert "brain source remove notes" in errors[0]
    assert chroma_ids(home) == before and statuses(home) == {"notes": 3}


def test_a_confirmed_mass_delete_goes_through_for_that_source_only(home, make_vault):
    vault = make_vault(NOTES)
    other = make_vault(SIX, name="other")
    Brain(home).sync(vaults=(str(vault), str(other)))
    for name in NOTES:
        (vault / name).unlink()
    for name in list(SIX)[:4]:
        (other / name).unlink()

    done = brain(home, "sync", "--allow-deletes", "notes", "--json")

    assert done.returncode == 1  # `other` would lose 4 of 6 notes: held until confirmed too
    report = {s["name"]: s for s in json.loads(done.stdout)["sources"]}
    assert (report["notes"]["failed"], report["notes"]["deleted"]) == (False, 3)
    assert (report["other"]["failed"], report["other"]["deletes_held"]) == (True, 4)
    assert statuses(home) == {"notes": 0, "other": 6}
    assert brain(home, "sync", "--allow-deletes", "nope").returncode == 2  # a name outside the run is a usage error


def test_a_few_deletes_go_through_without_confirmation(home, make_vault):
    """The rule: hold when the listing finds none of a source's notes, or when it would delete at least half of
    them and at least three; deleting one of two notes, or two of six, is an ordinary sync."""
    vault = make_vault(SIX)
    Brain(home).sync(vaults=(str(vault),))
    (vault / "n0.md").unlink()
    (vault / "n1.md").unlink()
    report = Brain(home).sync()
    assert (report.failed, report.sources[0].deleted) == (False, 2)
    small = make_vault({"a.md": "# A\n\nalpha\n", "b.md": "# B\n\nbeta\n"}, name="small")
    Brain(home).sync(vaults=(str(small),))
    (small / "a.md").unlink()
    assert Brain(home).sync(vaults=(str(small),)).sources[0].deleted == 1
    (small / "b.md").unlink()
    last = Brain(home).sync(vaults=(str(small),)).sources[0]
    assert (last.failed, last.deletes_held) == (True, 1)  # the last note of a source: an empty listing
    assert statuses(home) == {"notes": 4, "small": 1}


def test_a_memos_server_that_suddenly_lists_nothing_deletes_nothing(home, monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        keys = seed_memos(double, 8)
        Brain(home).sync(memos=(double.url,))
        before = Brain(home).status()["notes"]
        for key in keys:
            try:
                double.delete_memo(key)
            except KeyError:  # a comment already went with its memo
                pass
        report = Brain(home).sync(memos=(double.url,))
    source = report.sources[0]
    assert (source.failed, source.deleted, source.deletes_held) == (True, 0, before)
    assert "--allow-deletes" in source.error
    assert Brain(home).status()["notes"] == before


def test_notes_deleted_and_restored_within_the_retention_time_reuse_their_vectors(home, make_vault, tmp_path):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    chunks = manifest_chunk_ids(home)
    vault.rename(tmp_path / "away")
    vault.mkdir()
    assert brain(home, "sync", "--allow-deletes", "notes").returncode == 0
    assert chroma_ids(home) == set()
    vault.rmdir()
    (tmp_path / "away").rename(vault)

    back = Brain(home).sync()

    assert back.sources[0].added == 3
    assert back.reused_vectors == len(chunks) and back.vectors == {"use-m3": len(chunks)}
    assert chroma_ids(home) == chunks
    assert Brain(home).search("花样年华", mode="vector").results[0]["note_id"] == "vault:notes/movies.md"


def test_kept_vectors_of_deleted_notes_expire_after_the_retention_time(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    text = (vault / "sleep.md").read_text(encoding="utf-8")
    (vault / "sleep.md").unlink()
    Brain(home).sync()
    manifest = Manifest(home / "index.sqlite")
    assert manifest.db.execute("SELECT COUNT(*) FROM retained_vectors").fetchone()[0] >= 1
    eight_days = 8 * 86_400
    manifest.db.execute("UPDATE retained_vectors SET deleted_at = deleted_at - ?", (eight_days,))
    (vault / "other.md").write_text("# Other\n\nsomething else\n", encoding="utf-8")
    Brain(home).sync()  # any sync purges what expired
    assert manifest.db.execute("SELECT COUNT(*) FROM retained_vectors").fetchone()[0] == 0
    manifest.close()
    (vault / "sleep.md").write_text(text, encoding="utf-8")
    assert Brain(home).sync().reused_vectors == 0


# ---- item 2: one huge note ----------------------------------------------------------------------------------


KEY = "sk-embed-test-0123456789abcdef"


def test_a_note_of_seven_thousand_chunks_is_capped_and_every_channel_completes(home, make_vault, tmp_path,
                                                                                monkeypatch):
    """Before: every sync failed with Chroma's "Batch size of 6999 is greater than max batch size", and search
    stayed BM25-only for good. Now the note is indexed up to the cap, with a warning that says so."""
    for var in ("EMBEDDING_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    lines = "\n\n".join(f"line {i}: " + "measurement of the river level " * 4 for i in range(7000))  # 1 MB
    vault = make_vault({"huge.md": "# Huge log\n\n" + lines, "small.md": "# Small\n\na small note\n"})
    with EmbeddingsDouble(api_key=KEY) as server:
        (home / "config.toml").write_text(
            f'[embedding]\nmodel = "openai:double-embed"\nbase_url = "{server.url}"\nbatch_size = 512\n'
            '[chunking]\nmax_chars = 200\noverlap = 20\n',
            encoding="utf-8")
        report = Brain(home).sync(vaults=(str(vault),))
        assert not report.failed, report.fill_error
        from rag_app.ingest.apply import MAX_NOTE_CHUNKS

        source = report.sources[0]
        assert any(f"first {MAX_NOTE_CHUNKS} of 7" in w and "huge.md" in w for w in source.warnings), source.warnings
        channels = Brain(home).status()["channels"]
        assert channels["openai:double-embed"]["complete"] is True
        assert channels["openai:double-embed"]["chunks"] == MAX_NOTE_CHUNKS + 1
        assert set(Brain(home).search("river level").coverage["channels"]) == {"bm25", "vector"}
    doctor = Brain(home).doctor()
    assert doctor["ok"] is True


def test_chroma_is_written_in_batches_under_its_max_batch_size(home):
    """Chroma refuses an add larger than `max_batch_size` (5461 for the embedded store)."""
    from rag_app.config import load_settings
    from rag_app.index.store import VectorIndex
    from rag_app.ingest.pipeline import chunk_node

    index = VectorIndex(load_settings(home), "use-m3")
    limit = index.client.get_max_batch_size()
    nodes = [chunk_node(f"vault:x/a.md:chunk:{n}", "vault:x/a.md", f"t{n}", {}) for n in range(limit + 10)]
    for n, node in enumerate(nodes):
        node.embedding = [1.0, float(n % 7), 0.5]
    assert index.add(nodes) == limit + 10 and index.count() == limit + 10


def test_chroma_holds_vectors_and_the_note_id_never_a_second_copy_of_the_text(home, make_vault):
    """Issue 31: a chunk's text has one owner, the manifest; Chroma keeps the id, the vector and the note."""
    from rag_app.config import load_settings
    from rag_app.index.store import VectorIndex

    Brain(home).sync(vaults=(str(make_vault({"a.md": "# Rivers\n\nThe river level rose after the storm."})),))
    got = VectorIndex(load_settings(home), "use-m3").collection.get(include=["documents", "metadatas"])
    assert got["ids"] and got["documents"] == [None] * len(got["ids"])
    assert got["metadatas"] == [{"document_id": "vault:notes/a.md"}] * len(got["ids"])
    assert Brain(home).search("river level").results[0]["note_id"] == "vault:notes/a.md"


def test_doctor_names_a_channel_the_last_sync_could_not_complete_and_repair_fills_it(home, make_vault,
                                                                                     monkeypatch):
    for var in ("EMBEDDING_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    vault = make_vault(NOTES)
    with EmbeddingsDouble(api_key=KEY) as server:
        (home / "config.toml").write_text(
            f'[embedding]\nmodel = "openai:double-embed"\nbase_url = "{server.url}"\nmax_retries = 0\n',
            encoding="utf-8")
        server.fail_after, server.retry_after = 0, 0
        assert Brain(home).sync(vaults=(str(vault),)).fill_error
        found = Brain(home).doctor()
        assert found["ok"] is False
        stuck = found["problems"]["incomplete_channels"]
        assert stuck["count"] == 1 and "openai:double-embed: 3 notes lack vectors" in stuck["examples"][0]
        assert "HTTP 500" in stuck["examples"][0]
        server.fail_after = None
        repaired = Brain(home).doctor(repair=True)
    assert repaired["ok"] is True and repaired["repair"]["filled_vectors"] == len(manifest_chunk_ids(home))


# ---- item 7: a note over the size limit keeps its indexed copy ----------------------------------------------


def test_a_vault_note_grown_over_the_size_limit_keeps_its_indexed_copy(home, make_vault):
    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    before = chroma_ids(home)
    (vault / "sleep.md").write_text("# Better sleep\n\n" + "zzz " * 600_000, encoding="utf-8")  # 2.4 MB
    source = Brain(home).sync().sources[0]
    assert (source.deleted, source.skipped, source.failed) == (0, 1, False)
    assert any("sleep.md" in w and "indexed copy is kept" in w for w in source.warnings), source.warnings
    assert chroma_ids(home) == before
    assert Brain(home).search("same time every night", mode="bm25").results[0]["path"] == "sleep.md"


# ---- item 8: a model switch keeps searching with the old model until the new one is complete ----------------


def test_after_a_model_switch_search_uses_the_old_models_complete_vectors(home, make_vault):
    from rag_app.ingest.lock import StopRequested

    vault = make_vault(NOTES)
    Brain(home).sync(vaults=(str(vault),))
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\nsecond_model = ""\n', encoding="utf-8")
    stop = StopRequested()
    Brain(home).sync(vaults=(str(vault),), stop=stop, on_searchable=stop.set)  # the new model has nothing yet

    during = Brain(home).search("想看的电影")

    assert set(during.coverage["channels"]) == {"bm25", "vector"}
    assert during.coverage["filling_vectors"] == ["e5-small"]
    assert during.coverage["searched_with"] == ["use-m3"]
    client = chromadb.PersistentClient(path=str(home / "chroma"))
    assert collection_name("use-m3") in {c.name for c in client.list_collections()}  # kept until e5 is complete
    Brain(home).sync(vaults=(str(vault),))
    after = Brain(home).search("想看的电影")
    assert "filling_vectors" not in after.coverage and "searched_with" not in after.coverage
