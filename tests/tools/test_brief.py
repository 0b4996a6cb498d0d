"""Search replies sized for an agent: brief previews by default (the best-matching sentences, cut on sentence or line
ends), the matched passages only on request and never twice, the same notes in the same order either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_app.engine import Brain
from tools.brief import (
    MIN_PREVIEW_CHARS,
    PREVIEW_CHARS_BY_STRENGTH,
    REPLY_CHARS,
    brief_result,
    brief_results,
    passages,
    preview,
    query_terms,
)
from tools.function_tools import BrainTools, _brief_coverage

MOVIES = ("# 电影清单\n\n今年的计划是多读书，少刷手机。\n\n- 想看的电影：《千与千寻》、《星际穿越》。\n"
          "- 已经看过：《霸王别姬》。\n\n其他杂事放在别处。")
SAMPLE_QUERIES = ["观影", "how do I deploy the service", "ERR_CONN_RESET_4471", "上个月的读书笔记", "rust async",
                  "我想看哪些电影？"]
TABLE = ("# 预算\n\n| 类别 | 比例 |\n| --- | :---: |\n| 房租 | 28% |\n\n```bash\ngit rebase -i HEAD~3\n```\n"
         "**注意**：见 [[理财笔记|理财]]。")


def test_query_terms_are_the_words_answers_highlight_lower_case():
    """One extractor (rag_app.index.keyword.query_words) for previews, answers and excerpts: jieba's words, never a
    character pair across a word boundary (电影清单 → 影清 matched unrelated notes); one-character words too;
    identifiers whole; both scripts."""
    assert query_terms(["观影 Movies", "电影清单", "a 看"]) == {"观影", "movies", "电影", "清单", "看"}
    assert query_terms(["想看的电影"]) == {"想", "看", "电影"}
    assert query_terms(["ERR_CONN_RESET_4471 的原因", "電影"]) == {"err_conn_reset_4471", "原因", "電影", "电影"}


def test_an_identifier_matches_where_it_starts_a_word():
    text = "Nothing here. The log says ERR_CONN_RESET_4471 twice. The window closed."
    assert preview([text], query_terms(["ERR_CONN_RESET_4471"]), limit=50) == "The log says ERR_CONN_RESET_4471 twice."
    assert preview([text], {"do"}, limit=20) == "Nothing here."  # never "do" in "window"


def test_the_preview_is_the_best_matching_sentence_not_the_notes_start():
    shown = preview([MOVIES], query_terms(["想看的电影"]), limit=40)
    assert shown == "想看的电影：《千与千寻》、《星际穿越》。 已经看过：《霸王别姬》。"
    assert len(shown) <= 40


def test_the_preview_grows_around_the_match_by_whole_sentences_and_drops_markdown_marks():
    shown = preview([MOVIES], query_terms(["想看的电影"]), limit=300)
    assert shown.startswith("电影清单 今年的计划") and shown.endswith("其他杂事放在别处。")
    assert "#" not in shown and "- " not in shown
    assert preview([MOVIES], query_terms(["想看的电影"]), limit=300, title="电影清单").startswith("今年的计划")
    assert preview([TABLE], set(), limit=300) == "预算 类别 | 比例 房租 | 28% git rebase -i HEAD~3 注意：见 理财。"
    assert preview([MOVIES], query_terms(["霸王别姬"]), limit=30) == "已经看过：《霸王别姬》。 其他杂事放在别处。"


def test_a_preview_without_any_query_word_is_the_first_passages_start():
    assert preview(["First line.\nSecond line.", "Other passage."], {"zzz"}, limit=15) == "First line."


def test_a_sentence_longer_than_the_preview_is_windowed_on_word_ends_around_the_match():
    words = " ".join(f"word{i}" for i in range(200))
    text = words + " the deploy target is staging " + words + "."
    shown = preview([text], query_terms(["deploy"]), limit=120)
    assert len(shown) <= 120 and "deploy" in shown and shown.startswith("…") and shown.endswith("…")
    assert all(piece.startswith("word") or piece in {"the", "deploy", "target", "is", "staging"}
               for piece in shown.strip("…").split())


def test_passages_drop_the_text_overlapping_chunks_share_in_either_order_and_are_capped():
    shared = "重叠的这一段文字同时出现在相邻的两个块里，长度超过二十个字。"
    first, second = "甲" * 50 + shared, shared + "乙" * 2_000
    shown = passages([{"text": first, "heading": "H"}, {"text": second}])
    assert shown[0] == {"heading": "H", "text": first}
    assert shown[1]["text"].startswith("乙") and len(shown[1]["text"]) == 1_000
    reversed_ = passages([{"text": second}, {"text": first}])
    assert reversed_[1]["text"] == "甲" * 50
    assert passages([{"text": "短语重复"}, {"text": "短语重复"}]) == [{"heading": "", "text": "短语重复"}]


def test_a_brief_result_names_dates_and_previews_the_note_and_passes_relevance_through():
    result = {"note_id": "vault:notes/movies.md", "title": "电影清单", "source": "notes", "kind": "vault",
              "path": "movies.md", "score": 0.71, "strength": "weak", "relevance": 0.42, "excerpt": "…",
              "chunks": [{"text": MOVIES, "heading": ""}], "tags": ["电影"], "created": "2024-03-15T08:00:00",
              "updated": None, "duplicates": []}
    brief = brief_result(result, query_terms(["想看的电影"]), "brief", 40)
    assert list(brief) == ["note_id", "title", "path", "strength", "relevance", "created", "tags", "preview"]
    assert brief["created"] == "2024-03-15" and len(brief["preview"]) <= 40
    assert brief["preview"].startswith("想看的电影")
    detailed = brief_result(result, set(), "passages")
    assert "preview" not in detailed and detailed["passages"] == [{"heading": "", "text": MOVIES}]
    assert "relevance" not in brief_result({**result, "relevance": None}, set(), "brief")


def test_previews_share_the_room_strong_hits_first_and_never_fall_below_the_minimum():
    hit = {"note_id": "vault:v/a.md", "title": "t", "chunks": [{"text": "字。" * 400}]}
    few = brief_results([{**hit, "strength": "strong"}, {**hit, "strength": "weak"}], ["字"], "brief", 4_000)
    for result, strength in zip(few, ("strong", "weak"), strict=True):  # whole 2-character sentences: 3n - 1
        assert PREVIEW_CHARS_BY_STRENGTH[strength] - 3 < len(result["preview"]) <= PREVIEW_CHARS_BY_STRENGTH[strength]
    many = brief_results([{**hit, "strength": "strong"}] * 10, ["字"], "brief", 2_000)
    assert all(len(r["preview"]) < PREVIEW_CHARS_BY_STRENGTH["strong"] for r in many)
    assert len(json.dumps(many, ensure_ascii=False, separators=(",", ":"))) <= 2_000
    crowded = brief_results([{**hit, "strength": "strong"}] * 20, ["字"], "brief", 1_000)
    assert all(MIN_PREVIEW_CHARS - 3 < len(r["preview"]) <= MIN_PREVIEW_CHARS for r in crowded)


def test_coverage_keeps_what_an_agent_acts_on_and_passes_not_found_through():
    coverage = {"mode": "hybrid", "queries": ["q"], "expanded": False, "not_found": True, "time_phrase": None,
                "filters": {"sources": [], "tags": ["x"], "since": None},
                "channels": {"bm25": {"hits": 3, "weights": [0.25], "skipped": 0}}}
    assert _brief_coverage(coverage) == {"queries": ["q"], "filters": {"tags": ["x"]},
                                         "channels": {"bm25": {"hits": 3, "skipped": 0}}, "not_found": True}


@pytest.fixture(scope="module")
def sample_tools(sample_home: Path) -> BrainTools:
    return BrainTools(Brain(sample_home))


@pytest.mark.parametrize("query", SAMPLE_QUERIES)
def test_a_k10_search_of_the_sample_vault_fits_the_reply_goal_with_the_engines_notes_in_order(sample_tools, query):
    brief = sample_tools.call("search_notes", {"query": query, "k": 10})
    detailed = sample_tools.call("search_notes", {"query": query, "k": 10, "detail": "passages"})
    assert not brief.is_error and len(brief.text) <= REPLY_CHARS, len(brief.text)
    engine_order = [r["note_id"] for r in sample_tools.brain.search(query, 10, expand=False,
                                                                    audience="agent").results]
    results = json.loads(brief.text)["results"]
    assert [r["note_id"] for r in results] == engine_order
    assert [r["note_id"] for r in json.loads(detailed.text)["results"]] == engine_order
    for result in results:
        assert 0 < len(result["preview"]) <= PREVIEW_CHARS_BY_STRENGTH[result["strength"]]
        assert "passages" not in result


def test_passages_on_request_carry_the_matched_text_once(sample_tools):
    reply = json.loads(sample_tools.call("search_notes", {"query": "观影", "detail": "passages"}).text)
    top = reply["results"][0]
    assert top["title"] == "电影清单" and "preview" not in top
    assert any("《千与千寻》" in p["text"] for p in top["passages"])
    texts = [p["text"] for r in reply["results"] for p in r["passages"]]
    assert len(texts) == len(set(texts))
