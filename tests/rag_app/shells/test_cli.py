"""The `brain` command as a user runs it: a real process, JSON reports, exit codes, no secrets in output."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rag_app.shells import cli
from tests.conftest import REPO, free_port
from tests.doubles.memos_server import MemosDouble, seed_memos
from tests.doubles.openai_server import OpenAIDouble

BRAIN = [sys.executable, "-m", "rag_app.shells.cli"]


def brain(home: Path, *args: str, env: dict[str, str] | None = None,
          cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "BRAIN_HOME")}
    full_env.update(env or {})
    return subprocess.run([*BRAIN, "--home", str(home), *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=300)


def test_sync_json_report_has_the_documented_shape(home, make_vault):
    vault = make_vault({"a.md": "# A\n\nalpha", "b.md": "# B\n\nbeta"})
    done = brain(home, "sync", "--vault", str(vault), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"sources", "chunks_written", "deleted_chunks", "vectors", "reused_vectors", "model_loaded",
                           "interrupted", "fill_error", "store_error", "seconds"}
    source = report["sources"][0]
    assert {"name", "kind", "added", "updated", "deleted", "unchanged", "skipped", "failed", "error"} <= set(source)
    assert (source["name"], source["kind"], source["added"], source["failed"]) == ("notes", "vault", 2, False)
    assert report["chunks_written"] == 2 and report["model_loaded"] is True and report["vectors"] == {"use-m3": 2}
    assert (report["interrupted"], report["fill_error"]) == (False, None)


def test_status_json_has_the_documented_shape(home, make_vault):
    vault = make_vault({"a.md": "# A\n\nalpha"})
    brain(home, "sync", "--vault", str(vault))
    status = json.loads(brain(home, "status", "--json").stdout)
    assert set(status) >= {"notes", "chunks", "sources", "embedding_model", "chunker_version", "home"}
    assert (status["notes"], status["embedding_model"], status["home"]) == (1, "use-m3", str(home))
    assert set(status["sources"][0]) >= {"name", "kind", "notes", "chunks", "last_sync", "last_result"}


def test_failed_source_exits_nonzero_with_one_line_and_no_token(home):
    secret = "memos_pat_SUPERSECRET_123"
    with MemosDouble(mode="head", token=secret) as double:
        seed_memos(double, 5)
        double.faults["fail_after_pages"] = 0
        done = brain(home, "sync", "--memos", double.url, env={"CFLOW_API_TOKEN": secret})
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("brain:")]
    assert len(errors) == 1 and "HTTP 500" in errors[0]
    assert secret not in done.stdout + done.stderr
    assert secret not in (home / "brain.log").read_text(encoding="utf-8")
    assert secret not in brain(home, "status", "--json").stdout


def test_token_is_read_from_memos_token_too(home):
    with MemosDouble(mode="head") as double:
        double.add_memo("a private memo", visibility="PRIVATE")
        done = brain(home, "sync", "--memos", double.url, "--json", env={"MEMOS_TOKEN": "memos_pat_test"})
    assert json.loads(done.stdout)["sources"][0]["added"] == 1


def test_no_sources_is_a_usage_error(home):
    done = brain(home, "sync")
    assert done.returncode == 2 and "no sources" in done.stderr


def test_broken_config_is_a_clear_error(home):
    (home / "config.toml").write_text("[embedding]\nmodel = 'word2vec'\n", encoding="utf-8")
    done = brain(home, "status")
    assert done.returncode == 2 and "embedding.model" in done.stderr


def test_source_remove_command(home, make_vault):
    vault = make_vault({"a.md": "# A\n\nalpha"})
    brain(home, "sync", "--vault", str(vault))
    done = brain(home, "source", "remove", "notes", "--json")
    assert json.loads(done.stdout) == {"removed": "notes", "notes": 1, "still_in_config": False}
    assert json.loads(brain(home, "status", "--json").stdout)["notes"] == 0


def test_terminal_output_never_carries_escape_sequences_or_split_lines(home, make_vault):
    vault = make_vault({
        "evil.md": "---\ntitle: \"\\e]0;pwned\\a\\e[31mred title\\e[0m\"\n---\nwombat facts\n",
        "two\nlines.md": "# wombat diary\n\nwombat again\n",
        "separator.md": "---\ntitle: \"wombat\\Lsplit\"\n---\nwombat once more\n",  # \L: U+2028, a line break
    })
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    found = brain(home, "search", "wombat", "--mode", "bm25")
    assert found.returncode == 0, found.stderr
    assert "\x1b" not in found.stdout and "\x07" not in found.stdout
    result_lines = [line for line in found.stdout.splitlines() if line[:3].strip().rstrip(".").isdigit()]
    assert len(result_lines) == 3 and any("red title" in line for line in result_lines)
    assert any("wombat split" in line for line in result_lines)
    assert any("two lines.md" in line for line in result_lines)
    as_json = json.loads(brain(home, "search", "wombat", "--json").stdout)
    assert any("\x1b" in r["title"] for r in as_json["results"])  # JSON keeps the data exactly, escaped


FILLING_NOTES = 160  # enough that the fill is still running when a `status` poll, ~1 s, first sees a batch


def filling_sync(home: Path, make_vault) -> tuple[subprocess.Popen[str], dict]:
    """A sync of FILLING_NOTES notes with the slow default model, returned once its fill has committed a first batch,
    with the channels `status` reported then. (With 60 the fill's second batch, sized to ~2 s at the measured rate,
    could hold all the rest on an idle machine: the signal came after the end.)"""
    vault = make_vault({f"n{i:02d}.md": f"# Note {i}\n\nzettel{i} " + "words about this and that. " * 12
                        for i in range(FILLING_NOTES)})
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\nsecond_model = ""\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "BRAIN_HOME")}
    sync = subprocess.Popen([*BRAIN, "--home", str(home), "sync", "--vault", str(vault)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        channels = json.loads(brain(home, "status", "--json").stdout).get("channels", {})
        if channels.get("e5-small", {}).get("chunks", 0) > 0:
            break
        assert sync.poll() in (None, 0), sync.communicate()[1]  # a sync that died says why
        time.sleep(0.3)
    return sync, channels


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signalled_sync_stops_within_seconds_and_the_next_one_finishes_the_rest(home, make_vault, signum):
    """Keyword search covers every note before the slow default model starts; a signal ends the fill after the
    batch in hand (exit 130), and the next sync embeds only what is missing."""
    sync, channels = filling_sync(home, make_vault)
    assert channels["bm25"] == {"chunks": FILLING_NOTES, "complete": True}
    signalled = time.monotonic()
    sync.send_signal(signum)
    _, stderr = sync.communicate(timeout=60)
    assert sync.returncode == 130, stderr
    assert time.monotonic() - signalled < 10 and "`brain sync` continues" in stderr
    filled = json.loads(brain(home, "status", "--json").stdout)["channels"]["e5-small"]
    assert 0 < filled["chunks"] < FILLING_NOTES and filled["complete"] is False
    found = json.loads(brain(home, "search", "zettel59", "--json").stdout)
    assert found["results"][0]["note_id"] == "vault:notes/n59.md"

    rest = json.loads(brain(home, "sync", "--json").stdout)
    assert rest["sources"][0]["unchanged"] == FILLING_NOTES
    assert rest["vectors"] == {"e5-small": FILLING_NOTES - filled["chunks"]}
    assert json.loads(brain(home, "status", "--json").stdout)["channels"]["e5-small"]["complete"] is True


def test_a_second_ctrl_c_stops_a_sync_at_once_with_the_documented_code(home, make_vault):
    sync, _ = filling_sync(home, make_vault)
    sync.send_signal(signal.SIGINT)
    time.sleep(0.2)
    sync.send_signal(signal.SIGINT)
    _, stderr = sync.communicate(timeout=60)
    assert sync.returncode == 130 and "Aborted!" not in stderr, stderr
    assert "`brain sync` continues" in stderr and "Traceback" not in stderr
    rest = json.loads(brain(home, "sync", "--json").stdout)
    assert rest["sources"][0]["failed"] is False and rest["sources"][0]["unchanged"] == FILLING_NOTES


def test_the_text_output_names_each_note_by_the_id_get_takes(sample_home):
    shown = brain(sample_home, "search", "观影", "-k", "2").stdout.splitlines()[0]
    assert shown.startswith(" 1. 电影清单  vault:sample_vault/生活/电影清单.md  ")
    opened = brain(sample_home, "get", shown.split()[2])
    assert opened.returncode == 0 and opened.stdout.startswith("电影清单")


def test_a_memos_url_that_is_not_one_is_refused_and_never_remembered(home):
    for bad in ("not-a-url", "memos.example.com", "ftp://memos.example.com", "http://exa mple.com"):
        done = brain(home, "sync", "--memos", bad)
        assert done.returncode == 2 and "the Memos URL must look like https://" in done.stderr, bad
        assert done.stderr.count("brain:") == 1
    assert json.loads(brain(home, "source", "list", "--json").stdout) == []


def test_a_first_sync_that_fails_is_not_remembered_a_later_failure_names_the_way_out(home):
    unreachable = f"http://127.0.0.1:{free_port()}"
    done = brain(home, "sync", "--memos", unreachable, env={"CFLOW_API_TOKEN": "memos_pat_test"})
    assert done.returncode == 1 and "not remembered" in done.stderr and done.stderr.count("brain:") == 1
    assert json.loads(brain(home, "source", "list", "--json").stdout) == []
    with MemosDouble(mode="head") as double:
        double.add_memo("a memo")
        assert brain(home, "sync", "--memos", double.url, env={"CFLOW_API_TOKEN": "memos_pat_test"}).returncode == 0
        url = double.url
    later = brain(home, "sync", env={"CFLOW_API_TOKEN": "memos_pat_test"})
    name = url.removeprefix("http://").replace(":", "-")
    assert later.returncode == 1 and f"brain source remove {name}" in later.stderr
    assert later.stderr.count("connection failed") == 1 and "connection failed" not in later.stdout
    assert [s["name"] for s in json.loads(brain(home, "source", "list", "--json").stdout)] == [name]


def test_searching_an_unknown_source_names_the_known_ones(home, make_vault):
    vault = make_vault({"a.md": "# A\n\nalpha"})
    brain(home, "sync", "--vault", str(vault))
    done = brain(home, "search", "alpha", "--source", "nope")
    assert done.returncode == 2 and "unknown source 'nope'; known: memos, notes, vault" in done.stderr
    assert brain(home, "search", "alpha", "--source", "notes").returncode == 0


@pytest.fixture
def talk_home(home: Path, make_vault, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The conversation vault of test_sessions synced into a fast home; no LLM in the environment."""
    from rag_app.engine import Brain
    from tests.rag_app.answers.test_sessions import CONVERSATION_VAULT, among_other_notes

    for var in ("LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    brain_ = Brain(home)
    assert not brain_.sync(vaults=(str(make_vault(among_other_notes(CONVERSATION_VAULT))),)).failed
    brain_.close()
    return home


def test_sessions_round_trip_without_an_llm(talk_home):
    from tests.rag_app.answers.test_sessions import FIRST, FOLLOW_UP, MOVIES

    first = brain(talk_home, "ask", FIRST, "--session", "films", "-k", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("Extractive answer (no LLM configured)")
    assert "电影清单 › 想看的电影 [1]\n\n- ☐ 《花样年华》——王家卫" in first.stdout and "**" not in first.stdout
    second = brain(talk_home, "ask", FOLLOW_UP, "--session", "films", "-k", "3", "--json")
    data = json.loads(second.stdout)
    assert data["coverage"]["condensed_query"].startswith(f"{FOLLOW_UP} 电影清单")
    assert data["citations"][0]["note_id"] == MOVIES and data["coverage"]["llm"] == "off"
    listed = json.loads(brain(talk_home, "sessions", "--json").stdout)
    assert [(s["name"], s["turns"], s["last_question"]) for s in listed] == [("films", 2, FOLLOW_UP)]
    assert brain(talk_home, "sessions").stdout.startswith(f"films\t2 turn(s)\t{listed[0]['updated']}\t{FOLLOW_UP}")
    assert brain(talk_home, "sessions", "delete", "films").stdout == "deleted session films\n"
    again = brain(talk_home, "sessions", "delete", "films")
    assert (again.returncode, again.stderr) == (2, "brain: no session named 'films'\n")
    bad = brain(talk_home, "ask", FIRST, "--session", "a\tb")
    assert bad.returncode == 2 and "printable characters" in bad.stderr


def test_an_ask_run_again_with_its_turn_id_is_answered_alike_and_stored_once(talk_home):
    from tests.rag_app.answers.test_sessions import FIRST

    asks = [brain(talk_home, "ask", FIRST, "--session", "films", "-k", "3", "--turn-id", "ask-1", "--json")
            for _ in range(2)]
    assert [a.returncode for a in asks] == [0, 0], asks[0].stderr
    assert json.loads(asks[0].stdout) == json.loads(asks[1].stdout)
    listed = json.loads(brain(talk_home, "sessions", "--json").stdout)
    assert [(s["name"], s["turns"]) for s in listed] == [("films", 1)]
    bad = brain(talk_home, "ask", FIRST, "--session", "films", "--turn-id", "a b")
    assert bad.returncode == 2 and "a turn id has 1 to 64 letters" in bad.stderr


def test_sessions_round_trip_with_an_llm(talk_home, monkeypatch):
    from tests.rag_app.answers.test_sessions import FIRST, FOLLOW_UP, MOVIES

    def reply(body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        if "Standalone question:" in prompt:
            return "想看的电影里第二部《一一》是谁导演的？"
        return "《一一》是杨德昌导演的[1]。" if prompt.endswith(FOLLOW_UP) else "想看《花样年华》和《一一》[1]。"

    with OpenAIDouble([reply]) as double:
        env = {"LLM_BASE_URL": double.url, "LLM_MODEL": "qwen2.5"}
        assert brain(talk_home, "ask", FIRST, "--session", "films", "--json", env=env).returncode == 0
        done = brain(talk_home, "ask", FOLLOW_UP, "--session", "films", "--json", env=env)
    data = json.loads(done.stdout)
    assert (data["mode"], data["answer"]) == ("llm", "《一一》是杨德昌导演的[1]。")
    assert data["coverage"]["condensed_query"] == "想看的电影里第二部《一一》是谁导演的？"
    assert data["citations"][0]["note_id"] == MOVIES
    condense = double.requests[-2]["body"]["messages"][-1]["content"]
    first_answer = "想看《花样年华》和《一一》。"  # as sent back: without its [n], which pointed at that turn's sources
    assert f"user: {FIRST}\nassistant: {first_answer}" in condense and f"Follow Up Input: {FOLLOW_UP}" in condense
    sent = double.requests[-1]["body"]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:3]] == [("user", FIRST), ("assistant", first_answer)]
    assert sent[3]["content"].endswith(f"Question: {FOLLOW_UP}")
    stored = json.loads(brain(talk_home, "sessions", "--json").stdout)
    assert stored[0]["turns"] == 2


def test_llm_trouble_is_named_and_no_client_log_reaches_the_terminal(talk_home):
    down = brain(talk_home, "ask", "番茄炒蛋", "-k", "1", env={"LLM_BASE_URL": "http://127.0.0.1:9/v1",
                                                              "LLM_MODEL": "qwen2.5"})
    assert down.returncode == 0, down.stderr
    first_line = down.stdout.splitlines()[0]
    assert first_line.startswith("Extractive answer: LLM unavailable (cannot connect to http://127.0.0.1:9/v1")
    assert "showing passages" in first_line and "no LLM configured" not in down.stdout
    assert down.stderr.startswith("brain: LLM unavailable (cannot connect to") and down.stderr.count("\n") == 1

    def dropped(body):
        raise ConnectionResetError("the server hangs up")

    with OpenAIDouble([dropped]) as double:  # up, but every answer fails: the client retries, into brain.log
        flaky = brain(talk_home, "ask", "番茄炒蛋", "-k", "1", env={"LLM_BASE_URL": double.url, "LLM_MODEL": "qwen2.5"})
    assert flaky.returncode == 0 and flaky.stdout.startswith("Extractive answer: LLM unavailable (Connection error.")
    assert "Retrying" not in flaky.stderr and flaky.stderr.count("\n") == 1
    assert "Retrying" in (talk_home / "brain.log").read_text(encoding="utf-8")  # routed to the log, not dropped
    half = brain(talk_home, "ask", "番茄炒蛋", "-k", "1", env={"LLM_BASE_URL": "http://127.0.0.1:9/v1"})
    assert half.stdout.startswith("Extractive answer: LLM not configured: LLM_BASE_URL is set but LLM_MODEL")
    assert half.stderr == ("brain: LLM not configured: LLM_BASE_URL is set but LLM_MODEL (or model under [llm] in "
                           "config.toml) is missing; showing passages\n")
    as_json = json.loads(brain(talk_home, "ask", "番茄炒蛋", "--json", env={"LLM_MODEL": "qwen2.5"}).stdout)
    assert (as_json["coverage"]["llm"], as_json["coverage"]["llm_missing"]) == ("incomplete", ["LLM_BASE_URL"])


def test_a_question_the_notes_never_answer_is_not_found_on_every_command(talk_home, tmp_path):
    searched = json.loads(brain(talk_home, "search", "量子色动力学格点规范", "--json").stdout)
    assert searched["not_found"] is True and {r["strength"] for r in searched["results"]} == {"weak"}
    plain = brain(talk_home, "search", "量子色动力学格点规范").stdout
    assert plain.startswith("not in your notes") and " weak (0." in plain
    asked = brain(talk_home, "ask", "量子色动力学格点规范")
    assert asked.returncode == 0 and asked.stdout.startswith("Not in your notes")
    assert "Leads (not an answer):" in asked.stdout and "Extractive answer" not in asked.stdout
    lines = tmp_path / "queries.jsonl"
    lines.write_text('{"id": 1, "text": "量子色动力学格点规范"}\n{"id": 2, "text": "番茄炒蛋怎么做"}\n',
                     encoding="utf-8")
    batch = [json.loads(line) for line in brain(talk_home, "search", "--queries", str(lines)).stdout.splitlines()]
    assert [(b["id"], b["not_found"]) for b in batch] == [(1, True), (2, False)]
    assert batch[1]["results"][0]["title"] == "番茄炒蛋" and batch[1]["results"][0]["strength"] != "weak"


def test_an_empty_home_says_which_home_and_how_to_add_notes_without_loading_the_index(home, make_vault):
    nothing = make_vault({"attachment.txt": "not a note"}, name="empty")
    assert brain(home, "sync", "--vault", str(nothing)).returncode == 0  # a home whose sync found no notes
    before = sorted(p.name for p in home.iterdir())
    for command in (["search", "观影"], ["ask", "我想看哪些电影？"]):
        done = brain(home, *command)
        assert (done.returncode, done.stdout) == (0, f"no notes yet in {home}: run brain sync --vault DIR or "
                                                     "--memos URL\n")
    assert json.loads(brain(home, "search", "观影", "--json").stdout)["coverage"]["empty_index"] is True
    assert json.loads(brain(home, "ask", "观影", "--json").stdout)["coverage"]["empty_index"] is True
    assert sorted(p.name for p in home.iterdir()) == before  # no Chroma, no model: nothing was opened to search


def test_after_make_demo_an_empty_home_points_at_the_demo_home(home, tmp_path):
    (tmp_path / ".brain-demo").mkdir()
    for command in (["search", "观影"], ["ask", "观影"]):
        done = brain(home, *command, cwd=tmp_path)
        assert done.stdout.startswith(f"no notes yet in {home}: ") and done.stdout.endswith(
            "; the demo's notes are in .brain-demo: add --home .brain-demo (brain --home .brain-demo search ...)\n")
    missing = brain(tmp_path / "nohome", "status", cwd=tmp_path)
    assert missing.returncode == 2 and "add --home .brain-demo" in missing.stderr
    in_demo = brain(tmp_path / ".brain-demo", "search", "观影", cwd=tmp_path)
    assert in_demo.stdout == f"no notes yet in {tmp_path / '.brain-demo'}: run brain sync --vault DIR or --memos URL\n"


@pytest.mark.parametrize("command", [["search", "观影"], ["search", "观影", "--json"], ["ask", "观影"], ["status"],
                                     ["status", "--json"], ["get", "vault:notes/a.md"], ["sessions"],
                                     ["sessions", "delete", "电影"], ["source", "list"], ["source", "remove", "notes"],
                                     ["doctor"], ["doctor", "--repair"]])
def test_a_command_that_reads_never_creates_a_home(tmp_path, command):
    typo = tmp_path / "hmoe"
    done = brain(typo, *command)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"brain: no home at {typo}: `brain sync --vault DIR` (or --memos URL) with this home "
                                  "creates it")
    assert not typo.exists()


@pytest.mark.parametrize("args", [["--vault", "no-such-vault"], [], ["--memos", "memos.example.com"]],
                         ids=["missing vault", "no sources", "not a URL"])
def test_a_sync_refused_for_bad_input_leaves_no_home_behind(tmp_path, args):
    typo = tmp_path / "hmoe"
    done = brain(typo, "sync", *args, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("brain: ")
    assert not typo.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert brain(kept, "sync", *args, cwd=tmp_path).returncode == 2 and kept.is_dir()  # a home that was there stays


def test_sync_creates_the_home_it_is_pointed_at(tmp_path, make_vault):
    nested = tmp_path / "new" / "home"
    assert brain(nested, "sync", "--vault", str(make_vault({"a.md": "# A\n\nalpha"}))).returncode == 0
    assert json.loads(brain(nested, "status", "--json").stdout)["notes"] == 1


def test_plain_status_shows_each_channels_progress_and_time_left(home, make_vault, monkeypatch):
    """During a fill (here stopped after 8 of 12 chunks) the plain status says what --json says."""
    import rag_app.ingest.apply as apply_module
    from rag_app.engine import Brain
    from rag_app.ingest.lock import StopRequested

    vault = make_vault({f"n{i:02d}.md": f"# Note {i}\n\n" + ("text " * 20) for i in range(12)})
    for batch in ("FIRST_FILL_BATCH", "MIN_FILL_BATCH", "MAX_FILL_BATCH"):
        monkeypatch.setattr(apply_module, batch, 4)
    stop, batches = StopRequested(), []
    original = apply_module.Manifest.add_model

    def stop_after_two_batches(self, note_ids, model):
        original(self, note_ids, model)
        batches.append(model)
        if len(batches) == 2:
            stop.set()

    monkeypatch.setattr(apply_module.Manifest, "add_model", stop_after_two_batches)
    assert Brain(home).sync(vaults=(str(vault),), stop=stop).interrupted
    shown = brain(home, "status").stdout.splitlines()
    assert re.fullmatch(r"search channels: bm25 complete; use-m3 8/12 chunks, ~\d+ s left", shown[3]), shown
    assert brain(home, "sync").returncode == 0
    assert brain(home, "status").stdout.splitlines()[3] == "search channels: bm25 complete; use-m3 complete"


def test_a_written_answer_names_its_model_and_a_time_phrase_its_filter(home, make_vault):
    vault = make_vault({"incident.md": "---\ndate: 2024-03-05\n---\n# Payment incident\n\nThe payment service "
                                       "timed out for ten minutes.\n",
                        "plan.md": "---\ndate: 2024-06-01\n---\n# Garden plan\n\nTomatoes and basil.\n"})
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    with OpenAIDouble([lambda body: "The payment service timed out [1]."]) as double:
        url = double.url
        done = brain(home, "ask", "2024年3月的 payment incident", env={"LLM_BASE_URL": url, "LLM_MODEL": "qwen2.5"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["The payment service timed out [1].", f"(written by qwen2.5 at {url})",
                         '(time filter from "2024年3月": 2024-03-01 – 2024-03-31)']
    plain = brain(home, "ask", "2024年3月的 payment incident", env={"LLM_BASE_URL": "", "LLM_MODEL": ""}).stdout
    assert '(time filter from "2024年3月": 2024-03-01 – 2024-03-31)' in plain and "written by" not in plain


def test_a_time_phrase_that_filters_nothing_is_said_in_text_as_in_json(home, make_vault):
    """"1998年" with no note dated then is searched as words: the text output says so, not only --json."""
    vault = make_vault({"cup.md": "---\ndate: 2024-06-01\n---\n# World Cup\n\nFrance won the 1998 World Cup.\n"})
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    line = '("1998年" filtered nothing: no note is dated in that range, so it was searched as words)'
    for command in ("search", "ask"):
        done = brain(home, command, "1998年 World Cup", env={"LLM_BASE_URL": "", "LLM_MODEL": ""})
        assert done.returncode == 0 and line in done.stdout.splitlines(), done.stdout


def test_help_lists_every_command_in_whole_sentences_and_every_json_flag_is_explained(home):
    top = brain(home, "--help").stdout
    commands = top.split("Commands:")[1].strip().splitlines()
    assert len(commands) >= 12 and not any(line.rstrip().endswith("...") for line in commands)
    for command in ("sync", "status", "search", "ask", "sessions", "source list", "doctor", "get", "skill install",
                    "watch"):
        json_line = next(line for line in brain(home, *command.split(), "--help").stdout.splitlines()
                         if "--json" in line)
        assert "JSON" in json_line.split("--json", 1)[1], command


def readme_commands() -> list[str]:
    """Every command line of the README's bash blocks, comments and continuation lines left out."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [line for block in re.findall(r"```bash\n(.*?)```", readme, re.S) for line in block.splitlines()]
    return [line for line in lines if shlex.split(line, comments=True)]


def test_every_readme_command_runs_as_pasted():
    """A README line gets pasted whole: a `|` meaning "or" pipes one command into the next (`brain sessions --json |
    brain sessions delete 电影` deleted a conversation without asking) and `[--json]` is an argument, not a hint."""
    commands = readme_commands()
    assert len(commands) >= 20
    for line in commands:
        words = shlex.split(line, comments=True)
        assert not [w for w in words if "|" in w or w.startswith("[")], line
        if words[0] == "brain":
            parsed = CliRunner().invoke(cli.main, [*words[1:], "--help"], prog_name="brain")
            assert parsed.exit_code == 0 and parsed.output.startswith("Usage: brain"), (line, parsed.output)


def test_make_demo_takes_the_port_and_prints_it():
    planned = subprocess.run(["make", "-n", "demo", "PORT=7861"], capture_output=True, text=True, cwd=REPO, check=True)
    assert "serve --port 7861" in planned.stdout and "http://127.0.0.1:7861" in planned.stdout
    assert "7860" not in planned.stdout


TOPICAL_SET = REPO / "bench" / "topical" / "sample_vault.tsv"  # the sample vault's topical dev set (docs/retrieval.md)
KNOWN_MISSES = {  # asked in Chinese of an English note: the right note is not first (docs/retrieval.md)
    "新员工入职要做什么": "work/onboarding-checklist.md",  # 如何学习新技术 is closer by every channel; the note is 2nd
}


def test_questions_in_a_persons_own_words_find_their_note_and_are_not_called_missing(sample_home, tmp_path):
    """The sample vault's topical questions through `brain search --queries`: the right note first and never "not in
    your notes"; same-domain questions the notes do not answer are never strong, and mostly not_found."""
    rows = [line.split("\t") for line in TOPICAL_SET.read_text(encoding="utf-8").splitlines() if line.strip()]
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": str(n), "text": q}, ensure_ascii=False) + "\n"
                               for n, (q, _) in enumerate(rows)), encoding="utf-8")
    done = brain(sample_home, "search", "--queries", str(queries), "--json", "-k", "5")
    assert done.returncode == 0, done.stderr
    answers = {int(line["id"]): line for line in map(json.loads, done.stdout.splitlines())}
    answerable = [(n, q, path) for n, (q, path) in enumerate(rows) if path]
    assert len(answerable) == 19
    for n, question, path in answerable:
        reply = answers[n]
        assert reply["answer_state"] in ("found", "unsure") and not reply["not_found"], question
        if question not in KNOWN_MISSES:
            assert reply["results"][0]["path"].endswith(path), question
    assert answers[0]["results"][0]["title"] == "电影清单" and answers[0]["results"][0]["strength"] == "related"
    unanswerable = [answers[n] for n, (_, path) in enumerate(rows) if not path]
    assert not any(r["strength"] == "strong" for reply in unanswerable for r in reply["results"])
    assert sum(reply["answer_state"] == "not_found" for reply in unanswerable) >= len(unanswerable) / 2


def test_search_says_which_line_sent_it_to_a_linked_note(sample_home):
    """支付超时事故的根因是什么: the English incident note first, under it the meeting note's line that links to it."""
    lines = brain(sample_home, "search", "支付超时事故的根因是什么", "-k", "3").stdout.splitlines()
    assert lines[0].startswith(" 1. Incident: payment gateway timeouts (2024-03)") and "strong" in lines[0]
    line = "支付超时事故已复盘，改进项跟进中，详见 incident-2024-03-payment-timeout。"
    assert lines[2] == f"    ↳ linked from 周会纪要 2024-04-08: {line}"
    assert lines[3].startswith(" 2. 周会纪要 2024-04-08")


def test_filters_no_note_matches_are_said_not_called_not_in_your_notes(sample_home):
    """A typo'd tag leaves nothing to search: `ask` and `search` name the filters instead of "not in your notes"."""
    asked = brain(sample_home, "ask", "手冲咖啡水温多少度", "--tag", "咖啡豆子")
    assert asked.returncode == 0 and asked.stdout.startswith("No note matches the filters (tag: 咖啡豆子)")
    found = brain(sample_home, "search", "手冲咖啡水温多少度", "--tag", "咖啡豆子", "--since", "2024-01-01")
    assert found.stdout.strip() == "no note matches the filters (tag: 咖啡豆子; since: 2024-01-01)"
    replied = json.loads(brain(sample_home, "ask", "手冲咖啡水温多少度", "--tag", "咖啡豆子", "--json").stdout)
    assert replied["coverage"]["no_note_matches_filters"] is True and replied["mode"] == "not_found"
    kept = json.loads(brain(sample_home, "search", "手冲咖啡水温多少度", "--tag", "咖啡", "--json").stdout)
    assert "no_note_matches_filters" not in kept["coverage"] and kept["results"]


def test_a_lead_the_engine_is_not_sure_of_is_said_as_such(sample_home):
    """"What did I eat in Chengdu?" asks an English question of a Chinese note: its topic (成都) stands out, the
    words and the passages do not; the CLI says it is not sure and names the closest notes."""
    done = brain(sample_home, "search", "What did I eat in Chengdu?", "-k", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("not sure your notes cover this — closest: 成都三日")
    asked = json.loads(brain(sample_home, "ask", "What did I eat in Chengdu?", "--json").stdout)
    assert asked["coverage"]["answer_state"] == "unsure" and asked["mode"] == "unsure"
    assert asked["answer"].startswith("Not sure your notes cover this") and "**成都三日** [1]" in asked["answer"]


def test_search_variants_are_capped_with_a_clear_error(sample_home):
    """Each variant is a search through every channel: 2,500 of them held the index for a minute (issue 30). The CLI
    takes what an agent's MCP call takes, at most MAX_QUERIES texts."""
    from rag_app.engine import MAX_QUERIES

    def search(variants: int) -> subprocess.CompletedProcess[str]:
        return brain(sample_home, "search", "观影", "--mode", "bm25", "--json",
                     *(a for n in range(variants) for a in ("--variant", f"电影 {n}")))

    assert search(MAX_QUERIES - 1).returncode == 0
    over = search(2_500)
    assert (over.returncode, over.stdout) == (2, "")
    assert over.stderr == (f"brain: at most {MAX_QUERIES - 1} query variants per search (with the question, "
                           f"{MAX_QUERIES} queries), got 2500\n")
