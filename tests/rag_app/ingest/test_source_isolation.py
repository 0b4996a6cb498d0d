"""Sources never meet: each note id is unique per source, and a Memos token goes only to the server it belongs to."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import chromadb
import pytest

import readers.memos_client as memos_client
from rag_app.config import ConfigError, SourceSpec, load_settings
from rag_app.engine import Brain
from rag_app.index.manifest import Manifest
from rag_app.index.store import collection_name
from rag_app.ingest.memos_token import TOKEN_ORIGIN
from tests.doubles.memos_server import MemosDouble
from tests.rag_app.ingest.test_sync import chroma_ids, manifest_chunk_ids


def config_with_sources(home: Path, *sources: dict[str, str]) -> None:
    lines = ['[embedding]\nmodel = "use-m3"\n']
    for source in sources:
        lines.append("[[sources]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in source.items()))
    (home / "config.toml").write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture
def two_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_A", "memos_pat_a")
    monkeypatch.setenv("TOKEN_B", "memos_pat_b")


@pytest.mark.parametrize("mode", ["old", "head"])
def test_two_servers_with_the_same_memo_ids_keep_both_sets_of_notes(home: Path, two_tokens: None, mode: str):
    # Old servers number memos 1, 2, …; two current servers here hand out the same uids (same random seed).
    with MemosDouble(mode=mode, token="memos_pat_a") as first, MemosDouble(mode=mode, token="memos_pat_b") as second:
        keys_a = [first.add_memo(f"first server memo {i} about tea") for i in range(3)]
        keys_b = [second.add_memo(f"second server memo {i} about coffee") for i in range(3)]
        assert keys_a == keys_b  # the collision this test is about
        config_with_sources(home, {"name": "a", "kind": "memos", "url": first.url, "token_env": "TOKEN_A"},
                            {"name": "b", "kind": "memos", "url": second.url, "token_env": "TOKEN_B"})
        report = Brain(home).sync()
        assert [(s.name, s.added, s.failed) for s in report.sources] == [("a", 3, False), ("b", 3, False)]
        again = Brain(home).sync()
        assert [(s.added, s.updated, s.deleted, s.unchanged) for s in again.sources] == [(0, 0, 0, 3)] * 2
        assert again.chunks_written == 0
    status = Brain(home).status()
    assert {s["name"]: s["notes"] for s in status["sources"]} == {"a": 3, "b": 3}
    assert chroma_ids(home) == manifest_chunk_ids(home)
    assert {i.split(":chunk:")[0] for i in chroma_ids(home)} == (
        {f"memos:a/{k}" for k in keys_a} | {f"memos:b/{k}" for k in keys_b})
    brain = Brain(home)
    assert "second server" in brain.get_note(f"memos:b/{keys_b[0]}")["text"]
    assert "first server" in brain.get_note(f"memos:a/{keys_a[0]}")["text"]


def test_a_hostile_uid_is_one_encoded_segment_of_the_id_and_the_link(home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        key = double.add_memo("a memo whose server sent a crafted uid")
        dots = double.add_memo("a memo whose uid is two dots")
        double.raw_overrides[key] = {"name": "memos/../../x y", "uid": "../../x y"}
        double.raw_overrides[dots] = {"name": "memos/..", "uid": ".."}
        report = Brain(home).sync(memos=(double.url,))
        assert not report.failed, report.sources[0].error
    brain = Brain(home)
    ids = sorted(r["note_id"] for r in brain.search("crafted uid two dots", k=5).results)
    assert ids == sorted([f"memos:{report.sources[0].name}/..%2F..%2Fx%20y", f"memos:{report.sources[0].name}/%2E%2E"])
    note = brain.get_note(ids[1])
    assert note["url"].endswith("/memos/..%2F..%2Fx%20y") and "crafted" in note["text"]
    assert "two dots" in brain.get_note(ids[0])["text"]


def test_a_home_with_unnamespaced_memo_ids_is_migrated_once_without_re_embedding(home: Path, monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        target = double.add_memo("电影清单：想看《花样年华》 #电影")
        double.add_memo("see the film list above", relations=[target])
        double.add_memo("a comment on the list", parent=target)
        with monkeypatch.context() as old_code:  # the id scheme of earlier releases: memos:<uid>
            old_code.setattr(memos_client, "memo_note_id", lambda source, uid: f"memos:{uid}")
            assert not Brain(home).sync(memos=(double.url,)).failed
        db = sqlite3.connect(home / "index.sqlite")
        db.execute("DELETE FROM meta WHERE key = 'memo_ids'")  # a home from before the scheme was recorded
        db.commit()
        db.close()
        old_ids = chroma_ids(home)
        assert all(i.startswith("memos:") and "/" not in i for i in old_ids)

        report = Brain(home).sync(memos=(double.url,))
    source = report.sources[0].name
    assert (report.chunks_written, report.sources[0].unchanged, report.model_loaded) == (0, 3, False)
    assert chroma_ids(home) == manifest_chunk_ids(home) == {
        f"memos:{source}/{i.removeprefix('memos:')}" for i in old_ids}
    brain = Brain(home)
    hit = brain.search("花样年华", k=1).results[0]
    assert hit["note_id"] == f"memos:{source}/{target}"
    note = brain.get_note(hit["note_id"])
    assert len(note["backlinks"]) == 2 and all(b.startswith(f"memos:{source}/") for b in note["backlinks"])
    collection = chromadb.PersistentClient(path=str(home / "chroma")).get_collection(collection_name("use-m3"))
    metadata = collection.get(ids=[f"memos:{source}/{target}:chunk:0"], include=["metadatas"])["metadatas"][0]
    assert metadata == {"document_id": f"memos:{source}/{target}"}


def test_the_generic_token_goes_only_to_the_first_server_it_was_used_with(home: Path, monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as mine, MemosDouble(mode="head", token="memos_pat_other") as other:
        mine.add_memo("my private memo")
        other.add_memo("a public memo on someone else's server", visibility="PUBLIC")
        assert not Brain(home).sync(memos=(mine.url,)).failed
        report = Brain(home).sync(memos=(other.url,))
        assert not report.failed
        assert "belongs to http://127.0.0.1:" in report.sources[0].warnings[0]
        assert "token_env" in report.sources[0].warnings[0]
        assert all(r["auth"] is None for r in other.requests)
        assert any(r["auth"] == "Bearer memos_pat_test" for r in mine.requests)
        other.requests.clear()
        assert not Brain(home).sync().failed  # a plain re-sync of both: still never sent to the other server
        assert all(r["auth"] is None for r in other.requests)
    manifest_bytes = (home / "index.sqlite").read_bytes()
    assert b"memos_pat_test" not in manifest_bytes and mine.url.encode() in manifest_bytes


def test_removing_the_bound_source_frees_the_generic_token(home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as first:
        first.add_memo("a memo")
        brain = Brain(home)
        assert not brain.sync(memos=(first.url,)).failed
        brain.remove_source(brain.status()["sources"][0]["name"])
    manifest = Manifest(home / "index.sqlite")
    try:
        assert manifest.get_meta(TOKEN_ORIGIN) is None
    finally:
        manifest.close()


def test_a_source_naming_an_unset_token_variable_fails_and_keeps_its_notes(home: Path, two_tokens, monkeypatch):
    with MemosDouble(mode="head", token="memos_pat_a") as server:
        server.add_memo("a memo that must stay indexed")
        config_with_sources(home, {"name": "a", "kind": "memos", "url": server.url, "token_env": "TOKEN_A"})
        assert not Brain(home).sync().failed
        monkeypatch.delenv("TOKEN_A")
        report = Brain(home).sync()
    assert report.failed and "$TOKEN_A" in report.sources[0].error and "not set" in report.sources[0].error
    assert Brain(home).status()["notes"] == 1


@pytest.mark.parametrize("value", ["TOKEN A", "memos_pat_xyz-123", "$TOKEN"])
def test_token_env_must_name_a_variable_not_hold_a_token(value: str):
    with pytest.raises(ConfigError, match="source.token_env: must name an environment variable"):
        SourceSpec.from_dict({"kind": "memos", "url": "https://m.example", "token_env": value})


@pytest.mark.parametrize("name", ["a/b", "..", "tab\tname", " padded"])
def test_a_source_name_that_would_break_note_ids_is_refused(name: str):
    with pytest.raises(ConfigError, match=r"source\.name: up to 100 characters.* not '\.' or '\.\.'"):
        SourceSpec.from_dict({"kind": "vault", "path": "/tmp", "name": name})


@pytest.mark.parametrize("value", ['"false"', '"no"', "0", '"true"'])
def test_allow_private_must_be_a_boolean(tmp_path: Path, value: str):
    (tmp_path / "config.toml").write_text(f"[mcp]\nallow_private = {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mcp.allow_private: input should be a valid boolean"):
        load_settings(tmp_path)


def test_agents_do_not_see_private_memo_ids_in_links_or_backlinks(home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        public = double.add_memo("公开的读书清单 #读书", visibility="PUBLIC")
        private = double.add_memo("私人：这本书是前任送的", visibility="PRIVATE", relations=[public])
        double.add_memo("公开：读书清单的补充", visibility="PUBLIC", relations=[public])
        report = Brain(home).sync(memos=(double.url,))
    source = report.sources[0].name
    brain = Brain(home)
    as_user = brain.get_note(f"memos:{source}/{public}")
    as_agent = brain.get_note(f"memos:{source}/{public}", audience="agent")
    assert f"memos:{source}/{private}" in as_user["backlinks"]
    assert f"memos:{source}/{private}" not in json.dumps(as_agent)
    assert len(as_agent["backlinks"]) == 1
