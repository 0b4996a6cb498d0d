"""Conversations: stored in the home, shared by threads and processes, and a follow-up searched with its subject."""

from __future__ import annotations

import datetime as dt
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import pytest

from rag_app.answers.sessions import SessionStore, condense_without_llm, refers_back, stands_alone, subject_of
from rag_app.engine import Brain, SessionError, SessionNotFound
from tests.conftest import REPO, SAMPLE_VAULT
from tests.doubles.openai_server import OpenAIDouble

FIRST, FOLLOW_UP = "我想看哪些电影？", "第二部是谁导演的？"
# A follow-up alone finds the wrong note here: "第二部" and "是谁" are written in the book note, never in the movies.
CONVERSATION_VAULT = {
    "电影清单.md": "# 电影清单\n\n## 想看的电影\n- [ ] 《花样年华》——王家卫\n- [ ] 《一一》——杨德昌，三个小时\n"
                 "- [ ] 《海街日记》——是枝裕和\n\n## 已看\n\n| 片名 | 导演 | 评分 |\n| --- | --- | --- |\n"
                 "| 《完美的日子》 | 文德斯 | 9/10 |\n| 《步履不停》 | 是枝裕和 | 9/10 |\n",
    "三体读书笔记.md": "# 《三体》读书笔记\n\n第二部《黑暗森林》是整个系列最好看的一部，面壁计划写得很精彩。"
                  "第二部的作者依然是刘慈欣，是谁都想不到的结局。\n",
    "番茄炒蛋.md": "# 番茄炒蛋\n\n先炒蛋，再炒番茄，最后加糖和盐。\n",
}
MOVIES = "vault:notes/电影清单.md"
OTHER_SUBJECTS = ("番茄", "电影", "三体", "一一")


def among_other_notes(files: dict[str, str]) -> dict[str, str | bytes]:
    """These notes among the sample vault's notes on other subjects (~30): relevance is judged against the rest of a
    home (how rare a word is, how far a match stands out), which three notes alone cannot give."""
    others = {f"other/{path.relative_to(SAMPLE_VAULT).as_posix()}": path.read_bytes()
              for path in SAMPLE_VAULT.rglob("*.md")
              if not any(subject in path.read_text(encoding="utf-8") for subject in OTHER_SUBJECTS)}
    return {**others, **files}
NO_LLM = ("LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY", "OPENAI_API_KEY")


@pytest.fixture
def talk_home(home: Path, make_vault, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home over the conversation vault (fast model), no LLM configured."""
    for var in NO_LLM:
        monkeypatch.delenv(var, raising=False)
    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(among_other_notes(CONVERSATION_VAULT))),)).failed
    brain.close()
    return home


def turn(question: str, answer: str = "a", **coverage: object) -> dict[str, object]:
    return {"question": question, "answer": answer, "citations": [], "coverage": coverage, "mode": "extractive"}


def test_a_session_round_trip(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions.sqlite")
    assert store.list() == [] and store.turns("nothing yet") == []
    store.append("films", turn("q1", "a1 [1]", cited=[1]))
    store.append("cooking", turn("q2"))
    store.append("films", turn("q3"))
    listed = store.list()
    assert [(s["name"], s["turns"], s["last_question"]) for s in listed] == [("films", 2, "q3"), ("cooking", 1, "q2")]
    assert dt.datetime.fromisoformat(listed[0]["updated"].replace("Z", "+00:00")).tzinfo is not None
    films = store.get("films")
    assert [t["question"] for t in films["turns"]] == ["q1", "q3"]
    assert films["turns"][0] | {"asked": None} == {"question": "q1", "answer": "a1 [1]", "citations": [],
                                                   "coverage": {"cited": [1]}, "mode": "extractive", "asked": None}
    store.rename("films", "电影 🎬")
    assert store.get("电影 🎬")["turns"][1]["question"] == "q3"
    with pytest.raises(SessionNotFound):
        store.get("films")
    with pytest.raises(SessionError, match="already exists"):
        store.rename("cooking", "电影 🎬")
    store.delete("cooking")
    assert [s["name"] for s in store.list()] == ["电影 🎬"]
    with pytest.raises(SessionNotFound):
        store.delete("cooking")


def test_a_turn_with_an_id_is_stored_once_however_often_it_comes(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions.sqlite")
    assert store.stored_turn("films", "ask-1", "q1") is None
    assert store.append("films", turn("q1", "a1"), "ask-1") is True
    assert store.append("films", turn("q1", "another answer"), "ask-1") is False, "the same ask run again"
    assert store.append("films", turn("q2"), "ask-2") and store.append("films", turn("q3"))
    assert store.append("cooking", turn("q1"), "ask-1"), "an id is the session's own"
    assert [t["question"] for t in store.turns("films")] == ["q1", "q2", "q3"]
    assert store.stored_turn("films", "ask-1", "q1") | {"asked": None} == turn("q1", "a1") | {"asked": None}
    threads = [threading.Thread(target=store.append, args=("race", turn("q"), "ask-3")) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store.turns("race")) == 1


def test_a_sessions_file_from_before_turn_ids_keeps_its_turns_and_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    with closing(sqlite3.connect(path)) as db, db:
        db.executescript("""
            CREATE TABLE sessions (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created REAL NOT NULL,
                                   updated REAL NOT NULL);
            CREATE TABLE turns (id INTEGER PRIMARY KEY, session_id INTEGER NOT NULL REFERENCES sessions(id)
                ON DELETE CASCADE, question TEXT NOT NULL, answer TEXT NOT NULL, citations TEXT NOT NULL,
                coverage TEXT NOT NULL, mode TEXT NOT NULL, asked REAL NOT NULL);
            INSERT INTO sessions VALUES (1, 'films', 1.0, 1.0);
            INSERT INTO turns VALUES (1, 1, 'old question', 'old answer', '[]', '{}', 'extractive', 1.0);""")
    store = SessionStore(path)
    assert store.append("films", turn("new"), "ask-1") and not store.append("films", turn("new"), "ask-1")
    assert [t["question"] for t in store.turns("films")] == ["old question", "new"]


@pytest.mark.parametrize("turn_id", ["", "x" * 65, "a b", "a\nb", "../x", "é", 7])
def test_a_turn_id_is_one_to_sixty_four_plain_characters(tmp_path: Path, turn_id: object) -> None:
    with pytest.raises(SessionError, match="a turn id has"):
        SessionStore(tmp_path / "s.sqlite").append("films", turn("q"), turn_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "   ", "x" * 81, "a\nb", "tab\there", "bell\x07", "\u202eevil", 7])
def test_names_are_one_to_eighty_printable_characters(tmp_path: Path, name: object) -> None:
    with pytest.raises(SessionError):
        SessionStore(tmp_path / "s.sqlite").append(name, turn("q"))  # type: ignore[arg-type]


def test_new_names_are_readable_and_unused(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s.sqlite")
    now = dt.datetime(2026, 12, 1, 14, 3)
    assert store.new_name(now) == "2026-12-01 14:03"
    store.append("2026-12-01 14:03", turn("q"))
    store.append("2026-12-01 14:03 (2)", turn("q"))
    assert store.new_name(now) == "2026-12-01 14:03 (3)"


def test_a_new_session_is_named_after_its_first_question_and_never_shares_a_name(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s.sqlite")
    assert store.create("  我想看\n哪些电影？ ") == "我想看 哪些电影？"
    assert store.create("我想看 哪些电影？") == "我想看 哪些电影？ (2)"
    assert store.get("我想看 哪些电影？ (2)")["total"] == 0, "stored at once, before its first turn"
    long = store.create("x" * 100)
    assert long == "x" * 39 + "…"
    store.append(long, turn("q"))
    assert [(s["name"], s["turns"]) for s in store.list()][0] == (long, 1)
    names: list[str] = []
    threads = [threading.Thread(target=lambda: names.append(store.create("同一个问题"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(names)) == 8


def test_threads_and_processes_append_to_one_session_without_losing_a_turn(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    script = ("import sys; from pathlib import Path; from rag_app.answers.sessions import SessionStore\n"
              "for i in range(10): SessionStore(Path(sys.argv[1])).append('shared', {'question': f'p{sys.argv[2]}-{i}',"
              " 'answer': 'a', 'citations': [], 'coverage': {}, 'mode': 'extractive'})")
    processes = [subprocess.Popen([sys.executable, "-c", script, str(path), str(n)], cwd=REPO) for n in range(2)]

    def write(n: int) -> None:
        for i in range(10):
            SessionStore(path).append("shared", turn(f"t{n}-{i}"))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(p.wait(timeout=60) == 0 for p in processes)
    questions = [t["question"] for t in SessionStore(path).turns("shared")]
    assert len(questions) == len(set(questions)) == 60
    assert SessionStore(path).list()[0]["turns"] == 60


def test_without_an_llm_a_follow_up_keeps_the_subject_of_the_last_turn() -> None:
    first = {"question": FIRST, "answer": "…", "coverage": {},
             "citations": [{"n": 1, "title": "电影清单", "strength": "strong"},
                           {"n": 2, "title": "成都三日", "strength": "weak"}]}
    assert subject_of(first) == ["电影清单", "电影"]
    assert condense_without_llm(FOLLOW_UP, [first]) == f"{FOLLOW_UP} 电影清单 电影"
    cited_by_llm = first | {"coverage": {"cited": [2], "condensed_query": "成都 旅行"}}
    assert subject_of(cited_by_llm) == ["成都三日", "成都", "旅行"]
    assert condense_without_llm("成都好玩吗", [cited_by_llm]) == "成都好玩吗 成都三日 旅行"
    assert condense_without_llm(FIRST, []) == FIRST


@pytest.mark.parametrize(("question", "leans_back"), [
    ("那第三部呢？", True), ("第二部是谁导演的？", True), ("它的评分是多少", True),
    ("what about the second one?", True), ("How do I deploy it", True),
    ("番茄炒蛋怎么做", False), ("猫咪日常", False), ("docker 怎么删除停止的容器", False),
])
def test_a_question_that_refers_back_is_told_from_one_that_starts_afresh(question: str, leans_back: bool) -> None:
    assert refers_back(question) is leans_back


def test_without_an_llm_a_question_the_notes_answer_by_itself_starts_a_new_subject() -> None:
    first = {"question": FIRST, "answer": "…", "coverage": {},
             "citations": [{"n": 1, "title": "电影清单", "strength": "strong"}]}
    assert condense_without_llm("番茄炒蛋怎么做", [first], stands_alone=True) == "番茄炒蛋怎么做"
    assert condense_without_llm("番茄炒蛋怎么做", [first], stands_alone=False).startswith("番茄炒蛋怎么做 电影清单")


def test_a_question_starts_a_new_subject_only_when_its_own_leads_are_not_the_last_turns_notes() -> None:
    coffee = {"question": "手冲咖啡水温多少度", "coverage": {},
              "citations": [{"n": 1, "note_id": "coffee", "title": "咖啡冲煮记录", "strength": "strong"}]}

    def lead(note_id: str, relevance: float) -> dict:
        return {"note_id": note_id, "relevance": relevance}

    assert stands_alone("番茄要选什么样的", [lead("tomato", 0.19), lead("x", 0.0)], "found", coffee, 0.02)
    assert not stands_alone("那研磨度呢？", [lead("tomato", 0.9)], "found", coffee, 0.02)  # points back
    assert not stands_alone("水温多少度", [lead("coffee", 0.14), lead("plants", 0.01)], "found", coffee, 0.02)
    assert not stands_alone("要多少钱", [lead("pack", 0.2), lead("coffee", 0.28)], "found", coffee, 0.02)
    assert not stands_alone("导演是谁", [lead("x", 0.01)], "unsure", coffee, 0.02)  # no lead of its own
    assert not stands_alone("导演是谁", [], "not_found", coffee, 0.02)


def test_a_new_subject_in_a_conversation_is_searched_as_asked(talk_home: Path) -> None:
    brain = Brain(talk_home)
    brain.ask(FIRST, 3, session="films")
    recipe = brain.ask("番茄炒蛋怎么做", 3, session="films")
    assert recipe.coverage["condensed_query"] == "番茄炒蛋怎么做"
    assert recipe.citations[0]["title"] == "番茄炒蛋"


def test_a_turn_id_given_again_with_another_question_is_refused_not_answered_with_the_old_turn(talk_home) -> None:
    brain = Brain(talk_home)
    first = brain.ask(FIRST, 3, session="films", turn_id="ask-1")
    assert brain.ask(FIRST, 3, session="films", turn_id="ask-1").answer == first.answer, "the same ask, run again"
    with pytest.raises(SessionError, match="turn id 'ask-1' .* another question"):
        brain.ask("番茄炒蛋怎么做", 3, session="films", turn_id="ask-1")
    with pytest.raises(SessionError, match="turn id 'ask-1' .* another question"):
        brain._sessions.append("films", turn("番茄炒蛋怎么做"), "ask-1")
    assert [t["question"] for t in brain.session("films")["turns"]] == [FIRST]


def test_a_follow_up_finds_the_note_of_the_conversation_not_the_words_alone(talk_home: Path) -> None:
    brain = Brain(talk_home)
    alone = brain.search(FOLLOW_UP, 3).results
    assert alone[0]["note_id"] != MOVIES, "the follow-up alone must miss for this test to mean anything"
    first = brain.ask(FIRST, 3, session="films")
    assert first.citations[0]["note_id"] == MOVIES and "condensed_query" not in first.coverage
    second = brain.ask(FOLLOW_UP, 3, session="films")
    assert second.coverage["condensed_query"].startswith(FOLLOW_UP + " 电影清单")
    assert second.citations[0]["note_id"] == MOVIES
    stored = brain.session("films")["turns"]
    assert [t["question"] for t in stored] == [FIRST, FOLLOW_UP]
    assert stored[1]["coverage"]["condensed_query"] == second.coverage["condensed_query"]
    assert stored[1]["answer"] == second.answer and stored[1]["citations"] == second.citations
    assert brain.sessions()[0] | {"updated": None} == {"name": "films", "turns": 2, "last_question": FOLLOW_UP,
                                                       "updated": None}
    assert "sessions.sqlite" in {p.name for p in talk_home.iterdir()}
    with pytest.raises(SessionNotFound):
        brain.session("never used")


def test_with_an_llm_the_follow_up_is_condensed_and_the_answer_carries_the_first_turn(talk_home, monkeypatch):
    def reply(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        if "Standalone question:" in prompt:
            return "Standalone question: 想看的电影里第二部《一一》是谁导演的？"
        return "《一一》是杨德昌导演的[1]。" if prompt.endswith(FOLLOW_UP) else "想看《花样年华》和《一一》[1]。"

    with OpenAIDouble([reply]) as double:
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        brain = Brain(talk_home)
        brain.ask(FIRST, 3, session="films")
        second = brain.ask(FOLLOW_UP, 3, session="films")
    assert second.mode == "llm" and second.answer == "《一一》是杨德昌导演的[1]。"
    assert second.coverage["condensed_query"] == "想看的电影里第二部《一一》是谁导演的？"
    assert second.citations[0]["note_id"] == MOVIES
    condense = [r["body"]["messages"] for r in double.requests if "Standalone question:" in
                r["body"]["messages"][-1]["content"]]
    assert len(condense) == 1
    assert f"user: {FIRST}\nassistant: 想看《花样年华》和《一一》。" in condense[0][-1]["content"]
    assert f"Follow Up Input: {FOLLOW_UP}" in condense[0][-1]["content"]
    answer = double.requests[-1]["body"]["messages"]
    assert [m["role"] for m in answer] == ["system", "user", "assistant", "user"]
    assert answer[1]["content"] == FIRST and answer[2]["content"] == "想看《花样年华》和《一一》。"
    assert answer[3]["content"].endswith(f"Question: {FOLLOW_UP}") and "杨德昌" in answer[3]["content"]


def test_history_stays_within_the_budget(talk_home, monkeypatch):
    with OpenAIDouble(["想看的电影里第二部《一一》是谁导演的？", "答[1]"]) as double:
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        store = SessionStore(talk_home / "sessions.sqlite")
        for n in range(30):
            store.append("long", turn(f"问题{n}", "长" * 3000))
        Brain(talk_home).ask(FOLLOW_UP, 3, session="long", budget=6000)
    sent = double.requests[-1]["body"]["messages"]
    assert sum(len(m["content"]) for m in sent[1:]) <= 6000 + 500
    assert sent[-2]["role"] == "assistant" and sent[-3]["content"] == "问题29"


def test_half_an_llm_configuration_says_what_is_missing(talk_home, monkeypatch):
    monkeypatch.setenv("LLM_BASE_URL", "http://user:SECRET@127.0.0.1:9/v1")
    brain = Brain(talk_home)
    assert brain.llm_state() == {"configured": False, "missing": ["LLM_MODEL"], "model": None,
                                 "base_url": "http://127.0.0.1:9/v1", "error": None}
    response = brain.ask(FIRST, 2)
    assert (response.mode, response.coverage["llm"], response.coverage["llm_missing"]) == (
        "extractive", "incomplete", ["LLM_MODEL"])
    assert response.answer.startswith("Extractive answer: LLM not configured: LLM_BASE_URL is set but LLM_MODEL")
    assert "no LLM configured" not in response.answer
    monkeypatch.delenv("LLM_BASE_URL")
    monkeypatch.setenv("LLM_MODEL", "qwen2.5")
    assert Brain(talk_home).llm_state() | {"model": None} == {"configured": False, "missing": ["LLM_BASE_URL"],
                                                              "model": None, "base_url": None, "error": None}


def test_an_unreachable_llm_is_named_as_such_and_the_turn_is_kept(talk_home, monkeypatch):
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LLM_MODEL", "qwen2.5")
    (talk_home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[llm]\nmax_retries = 0\ntimeout = 2\n',
                                           encoding="utf-8")
    brain = Brain(talk_home)
    assert brain.llm_state()["configured"] is True
    brain.ask(FIRST, 2, session="down")
    response = brain.ask(FOLLOW_UP, 2, session="down")
    assert (response.mode, response.coverage["llm"]) == ("extractive", "unavailable")
    assert "Connection" in response.coverage["llm_error"]
    assert response.answer.startswith(f"Extractive answer: LLM unavailable ({response.coverage['llm_error']}); "
                                      "showing passages.")
    assert response.coverage["condensed_query"].startswith(FOLLOW_UP + " 电影清单")  # the rule without an LLM
    assert [t["mode"] for t in brain.session("down")["turns"]] == ["extractive", "extractive"]


def test_a_damaged_sessions_file_is_named_by_every_session_command_and_doctor_sets_it_aside(talk_home: Path):
    """Issue 30 (Medium 11): a sessions.sqlite that is not a database, once a traceback on every session command."""
    from tests.rag_app.shells.test_cli import brain

    damaged = talk_home / "sessions.sqlite"
    damaged.write_bytes(b"not a database at all " * 100)
    for args in (["ask", FIRST, "--session", "films"], ["sessions"], ["sessions", "--json"],
                 ["sessions", "delete", "films"]):
        done = brain(talk_home, *args)
        assert done.returncode == 2, (args, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(f"brain: {damaged} is damaged (file is not a database); `brain doctor --repair` sets "
                               "it aside"), line
    checked = brain(talk_home, "doctor")
    assert checked.returncode == 1 and f"sessions: {damaged} is damaged" in checked.stdout
    assert "ok: the stores agree" in checked.stdout, "the notes' stores are fine: only conversations are lost"
    assert damaged.read_bytes().startswith(b"not a database"), "a check changes nothing"
    repaired = brain(talk_home, "doctor", "--repair")
    assert repaired.returncode == 0, repaired.stdout
    [aside] = talk_home.glob("sessions.sqlite.damaged-*")
    assert f"sessions: the damaged file was set aside as {aside}" in repaired.stdout
    assert aside.read_bytes().startswith(b"not a database") and not damaged.exists()
    assert brain(talk_home, "ask", FIRST, "--session", "films").returncode == 0
    assert brain(talk_home, "sessions").stdout.startswith("films\t1 turn(s)")
    assert brain(talk_home, "doctor").returncode == 0


def test_a_sessions_file_locked_past_the_wait_still_prints_the_answer_and_says_it_was_not_saved(
        talk_home: Path, monkeypatch: pytest.MonkeyPatch):
    """Issue 30 (Low): another process holding the file's write lock longer than the wait (30 s; 1 s here) once
    lost the answer already computed to a traceback."""
    from click.testing import CliRunner

    from rag_app.answers import sessions
    from rag_app.shells import cli

    monkeypatch.setattr(sessions, "WAIT_SECONDS", 1.0)
    Brain(talk_home).ask(FIRST, session="films")  # the file exists, in WAL mode
    holder = sqlite3.connect(talk_home / "sessions.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer that does not let go: readers go on, other writers wait
    try:
        done = CliRunner().invoke(cli.main, ["--home", str(talk_home), "--no-daemon", "ask", FOLLOW_UP,
                                             "--session", "films"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("Extractive answer (no LLM configured)")
    [line] = done.stderr.splitlines()[-1:]
    assert line == (f"brain: this answer was not saved in session 'films': {talk_home / 'sessions.sqlite'} is locked "
                    "by another process (waited 1 s); conversations are not saved until it lets go")
    assert [s["turns"] for s in Brain(talk_home).sessions()] == [1]
