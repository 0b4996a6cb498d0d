"""A question that names a thing no note mentions is "not in your notes", whatever its other words match."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag_app.config import load_settings
from rag_app.engine import Brain
from rag_app.search.cross_language import english_lexicon
from rag_app.search.retrieve import KeywordRetriever, SearchIndex
from rag_app.search.unmentioned import names, nonwords, unmentioned
from rag_app.shells import cli
from tests.conftest import write_files


def test_a_name_is_a_capitalised_word_inside_an_english_sentence():
    assert names("import my Kindle highlights into notes", english_home=True) == ["Kindle"]
    assert names("How do Jon and Gina both like to destress?", english_home=True) == ["Jon", "Gina"]
    assert names("can I sync over WebDAV or RemNote?", english_home=True) == ["WebDAV", "RemNote"]


def test_no_name_in_a_sentences_first_word_a_pronoun_an_abbreviation_a_month_a_weekday_or_a_time():
    assert names("Kindle highlights", english_home=True) == []
    assert names("What did I do on Monday in December? Then what.", english_home=True) == []
    assert names("Would she have Dr. Seuss books?", english_home=True) == []
    assert names("✨ Summarise the roadmap\nInclude the extension", english_home=True) == []
    assert names("What happens at 3 PM?", english_home=True) == []


def test_no_name_in_a_question_typed_in_title_case_or_capitals():
    assert names("Where Do My Photos Get Backed Up?", english_home=True) == []
    assert names("WHERE DO MY PHOTOS GET BACKED UP?", english_home=True) == []


def test_a_piece_of_a_longer_word_is_no_name():
    """An accented word is not cut at its accent (Atat|ürk), a unit or a count is not cut off its number."""
    assert names("What is Atatürk known for?", english_home=True) == []
    assert names("充电宝 20000mAh 能带上飞机吗？和经理 1on1 聊了什么", english_home=False) == []
    assert names("Where are my 2FA backup codes?", english_home=True) == []


def test_a_latin_word_with_a_capital_or_digit_inside_a_chinese_question_is_a_name():
    """Not an English word a person drops into Chinese (deadline, todo), nor a unit."""
    assert names("用Syncthing在几台电脑之间同步笔记", english_home=False) == ["Syncthing"]
    assert names("美国CPI上涨了多少？", english_home=False) == ["CPI"]
    assert names("我家猫有几kg，日语考试的 deadline 是什么时候，还有哪些 todo", english_home=False) == []


def test_a_year_the_question_is_anchored_to_is_a_name_in_any_language_but_not_a_count():
    assert names("2022年12月美国CPI上涨了多少？", english_home=False) == ["2022", "CPI"]
    assert names("What did I do in 2019?", english_home=False) == ["2019"]
    assert names("2000步够吗, or 2000 steps?", english_home=True) == []


def test_an_english_question_about_notes_mostly_in_chinese_is_not_read_for_names():
    """Such notes write Chengdu as 成都: a name they never spell in Latin letters can still be their subject."""
    assert names("What did I eat in Chengdu?", english_home=False) == []


def test_only_the_names_no_note_holds_are_unmentioned():
    held = {"gina"}
    assert unmentioned("How do Jon and Gina relax?", lambda n: n.lower() in held, english_home=True) == ["Jon"]


def test_a_question_of_words_no_note_holds_and_no_dictionary_knows_is_unreadable():
    def nothing_held(word: str) -> bool:
        return False

    assert nonwords("tdipmhotpcsepw", nothing_held, english_lexicon) == ["tdipmhotpcsepw"]
    assert nonwords("what is opwphforlfgy?", nothing_held, english_lexicon) == ["opwphforlfgy"]


def test_one_readable_word_makes_a_question_readable():
    """A dictionary word, a word the notes hold, a Han character or a number: there is a subject to look for."""
    def nothing_held(word: str) -> bool:
        return False

    assert nonwords("what time do I go to bed", nothing_held, english_lexicon) == []
    assert nonwords("kazoo glaciers", nothing_held, english_lexicon) == []
    assert nonwords("tdipmhotpcsepw syncthing", lambda w: w == "syncthing", english_lexicon) == []
    assert nonwords("opwphforlfgy 笔记", nothing_held, english_lexicon) == []
    assert nonwords("opwphforlfgy 2024", nothing_held, english_lexicon) == []


def test_a_british_spelling_a_typo_or_pinyin_is_read():
    """The notes may say license for licence, a reader knows pyhton is python, and 火锅 is written huoguo in letters;
    the typo is judged by the dictionary alone (a hidden note's words must not decide what an agent is told)."""
    def held(word: str) -> bool:
        return word in {"license", "color"}

    assert nonwords("licence", held, english_lexicon) == nonwords("colour", held, english_lexicon) == []
    assert nonwords("pyhton", lambda w: False, english_lexicon) == []
    assert nonwords("huoguo", lambda w: False, english_lexicon) == []
    assert nonwords("zorblax", lambda w: w == "zorbla", english_lexicon) == ["zorblax"]


def test_an_unreadable_question_is_not_in_your_notes_even_where_the_notes_are_chinese(sample_brain):
    """Its letters matched a Chinese note by meaning alone (a chemical's name, 0.67 by title); a word no dictionary
    knows is spelled the same in any note, so the notes' language is no reason to doubt it."""
    found = sample_brain.search("tdipmhotpcsepw", 5, expand=False)
    assert found.answer_state == "not_found" and found.coverage["unmentioned"] == ["tdipmhotpcsepw"]
    assert sample_brain.search("what time do I go to bed", 5, expand=False).answer_state == "found"


def test_a_chinese_question_naming_an_absent_tool_is_not_in_your_notes_and_says_why(sample_brain):
    found = sample_brain.search("用 Syncthing 在几台电脑之间同步笔记", 5, expand=False)
    assert found.answer_state == "not_found" and found.not_found
    assert found.coverage["unmentioned"] == ["Syncthing"]
    assert found.results and all(r["strength"] == "weak" for r in found.results)  # still shown, as leads
    answer = sample_brain.ask("用 Syncthing 在几台电脑之间同步笔记")
    assert answer.mode == "not_found" and "No note mentions Syncthing" in answer.answer


def test_a_named_thing_the_notes_hold_is_searched_as_before(sample_brain):
    found = sample_brain.search("Docker 怎么清理没用的镜像", 5, expand=False)
    assert "unmentioned" not in found.coverage and found.answer_state == "found"


@pytest.fixture
def english_home(tmp_path: Path, home: Path) -> Path:
    """A home over a small English vault (and one Chinese note), synced with the fast model."""
    vault = write_files(tmp_path / "vault", {
        "public/import.md": "# Importing notes\n\nThe markdown import keeps the highlights and the frontmatter of "
                            "notes brought over from other tools.\n",
        "public/sync.md": "# Sync\n\nThe vault syncs over git every evening; conflicts are merged by hand.\n",
        "public/setup.md": "# Setup\n\nVS Code settings sync through a gist, when the office Wi-Fi lets it. The "
                           "PostgreSQL dumps run nightly.\n",
        "public/Kobo.md": "---\naliases: [Tolino reader]\n---\n# My e-reader\n\nIt lasts three weeks a charge.\n",
        "public/travel.md": "# Travel\n\nThree days in Zürich, mostly at the lake. Read Gödel on the train.\n",
        "public/成都三日.md": "# 成都三日\n\n国庆去了成都，吃了火锅、兔头和钟水饺。\n",
        "private/reading.md": "# Reading\n\nMy Kindle highlights are exported once a month.\n",
    })
    brain = Brain(home)
    try:
        assert not brain.sync(vaults=(str(vault),)).failed
    finally:
        brain.close()
    return home


@pytest.fixture
def english_brain(english_home: Path) -> Iterator[Brain]:
    brain = Brain(english_home)
    yield brain
    brain.close()


def test_a_word_only_a_filtered_out_note_holds_is_unknown_to_a_filtered_search(english_home, english_brain):
    """A word no chunk the filter allows holds is unknown (no IDF): an agent's relevance figures cannot tell whether a
    private note holds a word (before, a word only a private memo held made the public notes' relevance 16 times a
    made-up word's)."""
    index = SearchIndex(load_settings(english_home))
    try:
        public = {c for c in index.keyword().ids if "/public/" in c}
        hidden = KeywordRetriever(index, 50, public).query_terms("Kindle highlights")
        absent = KeywordRetriever(index, 50, public).query_terms("Zyzzyva highlights")
        assert hidden.dfs[0] == 0 and hidden.idfs[0] is None
        assert hidden.idfs[1:] == absent.idfs[1:] and hidden.dfs[1:] == absent.dfs[1:]
        assert KeywordRetriever(index, 50, None).query_terms("Kindle highlights").dfs[0] == 1
    finally:
        index.close()

    def rated(query: str) -> dict[str, float]:
        found = english_brain.search(query, 5, mode="bm25", path_prefix="public/", expand=False)
        return {r["path"]: r["relevance"] for r in found.results}

    assert rated("kindle highlights") == rated("zyzzyva highlights")


def test_a_name_only_a_filtered_out_note_holds_counts_as_unmentioned(english_brain):
    """What a filtered search (every agent search) is told must not depend on the notes it may not show."""
    question = "import my Kindle highlights into notes"
    assert "unmentioned" not in english_brain.search(question, 5, expand=False).coverage
    hidden = english_brain.search(question, 5, expand=False, path_prefix="public/")
    assert hidden.coverage["unmentioned"] == ["Kindle"] and hidden.answer_state == "not_found"


def test_a_name_the_notes_spell_apart_accent_or_only_name_a_note_by_is_mentioned(english_brain):
    """VSCode for VS Code, WiFi for Wi-Fi, Postgres for PostgreSQL, Zurich for Zürich, Goedel for Gödel, a file name
    (Kobo) and an alias (Tolino) the text never says: a false "not in your notes" costs an answer the person wrote
    down."""
    for question in ("How does the VSCode settings sync work?", "Why does the WiFi block the sync?",
                     "When do the Postgres dumps run?", "How long did I stay in Zurich?",
                     "Where did I read Goedel?",
                     "How long does the Kobo last?", "How long does my Tolino last?"):
        found = english_brain.search(question, 5, expand=False)
        assert "unmentioned" not in found.coverage, question


def test_a_year_no_note_mentions_or_is_dated_in_is_not_in_your_notes(english_brain):
    """The time phrase filters nothing (no note is dated in 2019), so it stays in the question, and no note says it."""
    found = english_brain.search("What did I read on the train in 2019?", 5, expand=False)
    assert found.coverage["time_phrase_ignored"] and found.coverage["unmentioned"] == ["2019"]
    assert found.answer_state == "not_found"


def test_an_english_question_whose_leads_are_chinese_notes_is_not_read_for_names(english_brain):
    """A note in Chinese writes Chengdu as 成都: the name may be its subject though no note spells it in Latin."""
    found = english_brain.search("What did I eat in Chengdu?", 5, expand=False)
    assert "成都三日" in [r["title"] for r in found.results[:3]]
    assert "unmentioned" not in found.coverage


def test_a_name_an_agents_variant_does_not_need_is_not_held_against_the_question(english_brain):
    question = "how do I keep notes in sync over WebDAV"
    assert english_brain.search(question, 5, expand=False).coverage["unmentioned"] == ["WebDAV"]
    found = english_brain.search(question, 5, variants=["vault sync over git"])
    assert "unmentioned" not in found.coverage


def test_the_cli_says_which_name_no_note_mentions(english_home):
    home = english_home
    runner = CliRunner()
    shown = runner.invoke(cli.main, ["--home", str(home), "--no-daemon", "search", "sync my vault over WebDAV"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("not in your notes: no note mentions WebDAV; the nearest notes, as leads:")
    data = json.loads(runner.invoke(cli.main, ["--home", str(home), "--no-daemon", "search",
                                               "sync my vault over WebDAV", "--json"]).output)
    assert data["answer_state"] == "not_found" and data["coverage"]["unmentioned"] == ["WebDAV"]
    filtered = runner.invoke(cli.main, ["--home", str(home), "--no-daemon", "search", "sync my vault over WebDAV",
                                        "--since", "2020-01-01"])
    assert filtered.output.startswith("not in your notes: no note matching the filters (since: 2020-01-01) mentions "
                                      "WebDAV;")
