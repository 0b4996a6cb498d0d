"""Capture into the notes and reading a note again from its source: real files, a real Memos double, a real index."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rag_app.config import ConfigError, SourceSpec
from rag_app.engine import Brain, NoteNotFound, SourceError
from rag_app.ingest.capture import CaptureError, new_note
from rag_app.ingest.fresh import read_note
from rag_app.shells.cli import main
from tests.doubles.memos_server import MemosDouble, Stream

TOKEN = "memos_pat_test"


def configure(home: Path, *sources: str, capture: str = "") -> None:
    """The home's config.toml: the fast model, these [[sources]] tables, an optional [capture] table."""
    text = '[embedding]\nmodel = "use-m3"\n' + "".join(f"\n[[sources]]\n{s}\n" for s in sources)
    (home / "config.toml").write_text(text + (f"\n[capture]\n{capture}\n" if capture else ""), encoding="utf-8")


def vault_home(home: Path, vault: Path, folder: str = "Inbox") -> Brain:
    configure(home, f'name = "notes"\nkind = "vault"\npath = "{vault}"',
              capture=f'enabled = true\nsource = "notes"\nfolder = "{folder}"')
    brain = Brain(home)
    assert not brain.sync().failed
    return brain


def test_a_captured_vault_note_is_a_new_file_in_the_inbox_and_searchable_at_once(home: Path, make_vault):
    umask = os.umask(0o022)
    os.umask(umask)
    vault = make_vault({"movies.md": "# 电影清单\n《千与千寻》\n"})
    brain = vault_home(home, vault)
    brain.search("电影", 3)  # the index is open before the capture: it must notice the new note by itself

    saved = brain.capture("决定周五去看《奥本海默》，买 IMAX 票。", title="观影计划: 周五", tags=["电影", "#计划"])

    assert saved["indexed"] is True and saved["kind"] == "vault"
    assert saved["note_id"] == f"vault:notes/{saved['path']}" and saved["path"].startswith("Inbox/")
    written = (vault / saved["path"]).read_text(encoding="utf-8")
    modes = [stat.S_IMODE((vault / path).stat().st_mode) for path in (saved["path"], "Inbox")]
    assert modes == [0o644 & ~umask, 0o755 & ~umask], "a vault note, not one of the home's private files"
    front = yaml.safe_load(written.split("---\n")[1])
    assert front["title"] == "观影计划: 周五" and front["tags"] == ["电影", "计划"] and front["created"]
    assert written.rstrip().endswith("决定周五去看《奥本海默》，买 IMAX 票。")
    hits = brain.search("奥本海默 IMAX", 3).results
    assert hits[0]["note_id"] == saved["note_id"] and hits[0]["title"] == "观影计划: 周五"
    assert set(brain.get_note(saved["note_id"])["tags"]) == {"电影", "计划"}


def test_captures_never_overwrite_and_never_leave_the_folder(home: Path, make_vault, tmp_path: Path):
    vault = make_vault({"a.md": "# a\n"})
    brain = vault_home(home, vault, folder="Inbox/agent")
    first = brain.capture("same title, first text", title="same")
    second = brain.capture("same title, second text", title="same")
    assert first["path"] != second["path"] and first["path"].startswith("Inbox/agent/")
    assert "first text" in (vault / first["path"]).read_text(encoding="utf-8")
    assert "second text" in (vault / second["path"]).read_text(encoding="utf-8")
    hostile = brain.capture("x", title="../../../etc/passwd")
    assert hostile["path"].startswith("Inbox/agent/") and ".." not in hostile["path"]
    assert not (tmp_path / "etc").exists()

    outside = tmp_path / "outside"
    outside.mkdir()
    other = make_vault({"b.md": "# b\n"}, name="other")
    (other / "Inbox").symlink_to(outside, target_is_directory=True)
    second_home = tmp_path / "second-home"  # pointing "notes" at another vault in the same home is a held mass delete
    second_home.mkdir()
    brain = vault_home(second_home, other)
    with pytest.raises(SourceError, match="must be a real folder inside the vault"):
        brain.capture("this must not land outside the vault")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(("arguments", "says"), [
    ({"text": "   "}, "text is empty"),
    ({"text": "字" * 40_000}, "text is too long: 120000 bytes, at most 102400"),
    ({"text": "ok", "title": "line one\nline two"}, "title contains control characters"),
    ({"text": "ok", "title": "bell\x07"}, "title contains control characters"),
    ({"text": "a\x1b[31mred"}, "text contains control characters"),
    ({"text": "ok", "tags": ["two words"]}, "is not one tag"),
    ({"text": "ok", "tags": "single"}, "tags must be a list of strings"),
    ({"text": 42}, "text must be a string"),
])
def test_bad_capture_input_gets_a_clear_error(arguments: dict, says: str):
    with pytest.raises(CaptureError, match=says):
        new_note(**arguments)


@pytest.mark.parametrize(("text", "title"), [
    ("---\ntitle: 周会纪要\ntags: [work]\n---\n今天讨论了发布。", "周会纪要"),
    ("---\nsource: web\n---\n\n# 发布复盘\n正文", "发布复盘"),
    ("---\n\n***\n正文第一行\n", "正文第一行"),  # an unclosed fence and a rule: neither is a title
    ("---\ntitle: [1, 2]\n---\n列表不是标题", "列表不是标题"),
    ("---\n---", "note"),
    ("# 读书笔记\n---\n正文", "读书笔记"),
])
def test_a_frontmatter_fence_or_a_rule_is_never_the_default_title(text: str, title: str):
    assert new_note(text).title == title


def test_capture_is_refused_when_off_or_pointed_at_an_unknown_source(home: Path, make_vault):
    vault = make_vault({"a.md": "# a\n"})
    configure(home, f'name = "notes"\nkind = "vault"\npath = "{vault}"')
    brain = Brain(home)
    assert brain.capture_enabled is False
    with pytest.raises(ConfigError, match="capture is off"):
        brain.capture("anything")
    configure(home, f'name = "notes"\nkind = "vault"\npath = "{vault}"', capture='enabled = true\nsource = "nope"')
    with pytest.raises(ConfigError, match="'nope' is not a known source; known: \\['notes'\\]"):
        Brain(home).capture("anything")
    assert [p.name for p in vault.iterdir()] == ["a.md"]


@pytest.mark.parametrize("mode", ["head", "v0.22", "old"])
def test_a_captured_memo_is_private_on_the_server_and_searchable_at_once(home: Path, monkeypatch, mode: str):
    monkeypatch.setenv("CFLOW_API_TOKEN", TOKEN)
    with MemosDouble(mode=mode, token=TOKEN) as double:
        double.add_memo("Weekly review #review", visibility="PUBLIC")
        configure(home, f'name = "cflow"\nkind = "memos"\nurl = "{double.url}"',
                  capture='enabled = true\nsource = "cflow"')
        brain = Brain(home)
        assert not brain.sync().failed

        saved = brain.capture("牙医预约改到周六上午十点。", title="牙医预约", tags=["health"])

        posts = [r for r in double.requests if r["method"] == "POST" and r["path"].endswith(("/memo", "/memos"))]
        assert len(posts) == 1 and posts[0]["auth"] == f"Bearer {TOKEN}" and posts[0]["status"] == 200
        assert saved["visibility"] == "PRIVATE" and saved["note_id"].startswith("memos:cflow/")
        stored = double.memo_json(saved["note_id"].rsplit("/", 1)[1])
        assert stored["visibility"] == "PRIVATE" and "牙医预约改到周六" in stored["content"]
        assert "#health" in stored["content"]
        assert saved["indexed"] is True
        assert brain.search("牙医 周六", 3).results[0]["note_id"] == saved["note_id"]


def test_capture_into_memos_without_the_servers_token_is_refused(home: Path, monkeypatch):
    with MemosDouble(mode="head", token=TOKEN) as double:
        double.add_memo("public note", visibility="PUBLIC")
        configure(home, f'name = "cflow"\nkind = "memos"\nurl = "{double.url}"',
                  capture='enabled = true\nsource = "cflow"')
        brain = Brain(home)
        brain.sync()
        with pytest.raises(SourceError, match="needs its token"):
            brain.capture("no token, no memo")
        monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_wrong")
        with pytest.raises(SourceError, match="HTTP 401") as refused:
            brain.capture("a wrong token is refused")
        assert "memos_pat_wrong" not in str(refused.value)
        assert not [r for r in double.requests if r["method"] == "POST" and r["status"] == 200]


def memos_capture_home(home: Path, double: MemosDouble, limits: str = "") -> Brain:
    """A home synced from the double, capturing into it (the double's list path is left unbent until now)."""
    configure(home, f'name = "cflow"\nkind = "memos"\nurl = "{double.url}"\n{limits}',
              capture='enabled = true\nsource = "cflow"')
    brain = Brain(home)
    assert not brain.sync().failed
    return brain


def test_a_server_dripping_its_answer_to_a_capture_is_cut_at_the_request_deadline(home: Path, monkeypatch):
    """Issue 22 item 6: one byte every 0.2 s never trips a read timeout; the source's request_deadline ends it."""
    monkeypatch.setenv("CFLOW_API_TOKEN", TOKEN)
    with MemosDouble(mode="head", token=TOKEN) as double:
        double.add_memo("public note", visibility="PUBLIC")
        brain = memos_capture_home(home, double, "request_deadline = 1.0")
        double.faults["stream"] = Stream(chunk=b" ", interval=0.2, count=50)  # 10 s, then the answer ends
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"no complete answer within 1 s \(request_deadline\); the memo may"):
            brain.capture("a note for a slow server")
        assert time.monotonic() - started < 5


def test_a_token_echoed_past_the_cut_of_a_capture_error_is_redacted_whole(home: Path, monkeypatch):
    """Issue 22 item 4: the old reply kept the first 300 bytes and redacted those, leaving the token's head."""
    monkeypatch.setenv("CFLOW_API_TOKEN", TOKEN)
    with MemosDouble(mode="head", token=TOKEN) as double:
        double.add_memo("public note", visibility="PUBLIC")
        brain = memos_capture_home(home, double)
        double.faults["raw_reply"] = (400, b" " * (300 - 12) + f"{TOKEN} is not allowed".encode())
        with pytest.raises(SourceError, match=r"HTTP 400 \[redacted\] is not allowed$") as refused:
            brain.capture("a note the server refuses")
        assert TOKEN[:8] not in str(refused.value)


def test_fresh_read_of_a_vault_note_says_stale_after_an_edit_and_deleted_after_a_removal(home: Path, make_vault):
    vault = make_vault({"plan.md": "# 计划\n先做灰度发布。\n"})
    brain = vault_home(home, vault)
    current = brain.get_note("vault:notes/plan.md", fresh=True)
    assert current["stale"] is False and current["fresh"] is True and "先做灰度发布" in current["text"]

    (vault / "plan.md").write_text("# 计划\n改为一次性全量发布。\n", encoding="utf-8")
    edited = brain.get_note("vault:notes/plan.md", fresh=True)
    assert edited["stale"] is True and "一次性全量发布" in edited["text"] and "灰度" not in edited["text"]
    assert "先做灰度发布" in brain.get_note("vault:notes/plan.md")["text"]  # the index is untouched until a sync

    (vault / "plan.md").unlink()
    gone = brain.get_note("vault:notes/plan.md", fresh=True)
    assert gone["deleted_at_source"] is True and gone["stale"] is True and gone["text"] == ""


def test_fresh_read_uses_the_stored_path_only_and_stays_inside_the_vault(home: Path, make_vault, tmp_path: Path):
    vault = make_vault({"note.md": "# note\ninside\n"})
    brain = vault_home(home, vault)
    spec = SourceSpec(name="notes", kind="vault", path=str(vault))
    for hostile in ("../outside.md", "/etc/passwd", "a/../../x.md", ".obsidian/x.md", ""):
        with pytest.raises(SourceError, match="not a path inside its vault"):
            read_note(spec, "vault:notes/note.md", {"path": hostile}, None)
    secret = tmp_path / "secret.md"
    secret.write_text("# secret\n", encoding="utf-8")
    (vault / "note.md").unlink()
    os.symlink(secret, vault / "note.md")
    with pytest.raises(SourceError, match="points outside its vault"):
        brain.get_note("vault:notes/note.md", fresh=True)
    with pytest.raises(NoteNotFound):
        brain.get_note("vault:notes/never-indexed.md", fresh=True)


@pytest.mark.parametrize("mode", ["head", "v0.22", "old"])
def test_fresh_read_of_a_memo_gets_the_servers_text_and_keeps_private_memos_from_agents(home: Path, monkeypatch,
                                                                                      mode: str):
    monkeypatch.setenv("CFLOW_API_TOKEN", TOKEN)
    with MemosDouble(mode=mode, token=TOKEN) as double:
        public = double.add_memo("发布计划：先灰度。#work", visibility="PUBLIC")
        private = double.add_memo("私人：牙医三千元。", visibility="PRIVATE")
        configure(home, f'name = "cflow"\nkind = "memos"\nurl = "{double.url}"')
        brain = Brain(home)
        assert not brain.sync().failed
        ids = {hit["visibility"]: hit["note_id"] for hit in brain.search("发布计划 牙医", 5).results}
        assert brain.get_note(ids["PUBLIC"], fresh=True)["stale"] is False

        double.edit_memo(public, "发布计划：改为全量发布。#work")
        fresh = brain.get_note(ids["PUBLIC"], fresh=True, audience="agent")
        assert fresh["stale"] is True and "改为全量发布" in fresh["text"]
        with pytest.raises(NoteNotFound):
            brain.get_note(ids["PRIVATE"], fresh=True, audience="agent")
        assert "牙医" in brain.get_note(ids["PRIVATE"], fresh=True)["text"]

        double.delete_memo(private)
        assert brain.get_note(ids["PRIVATE"], fresh=True)["deleted_at_source"] is True


def test_brain_get_prints_a_note_and_with_fresh_says_whether_the_index_is_stale(home: Path, make_vault):
    vault = make_vault({"plan.md": "# 计划\n先做灰度发布。\n"})
    vault_home(home, vault)
    (vault / "plan.md").write_text("# 计划\n改为全量发布。\n", encoding="utf-8")
    runner = CliRunner()
    indexed = runner.invoke(main, ["--home", str(home), "get", "vault:notes/plan.md"])
    assert indexed.exit_code == 0 and "先做灰度发布" in indexed.output
    fresh = runner.invoke(main, ["--home", str(home), "get", "vault:notes/plan.md", "--fresh", "--json"])
    assert fresh.exit_code == 0
    note = json.loads(fresh.output)
    assert note["stale"] is True and "改为全量发布" in note["text"]
    text = runner.invoke(main, ["--home", str(home), "get", "vault:notes/plan.md", "--fresh"])
    assert "the index holds an older copy" in text.output and "改为全量发布" in text.output
    assert runner.invoke(main, ["--home", str(home), "get", "vault:notes/missing.md"]).exit_code == 1
    assert runner.invoke(main, ["--home", str(home), "get", "/etc/passwd"]).exit_code == 2
