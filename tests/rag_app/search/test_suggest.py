"""Example questions for an empty chat come from the user's own notes: recent titles and frequent tags."""

from __future__ import annotations

import json
from pathlib import Path

from rag_app.engine import Brain
from rag_app.search.suggest import example_questions


def note(title: str, tags: list[str], updated: int) -> dict[str, object]:
    return {"title": title, "tags": json.dumps(tags, ensure_ascii=False), "updated_ts": updated}


def test_recent_titles_and_frequent_tags_take_turns() -> None:
    metadata = {f"n{k}": meta for k, meta in enumerate([
        note("电影清单", ["电影", "清单"], 30), note("2024-05-02 周四", ["daily", "电影"], 50),
        note("Rust ownership", ["rust"], 40), note("番茄炒蛋", ["菜谱", "清单"], 10),
        note("Borrowing", ["rust"], 5), note("x", ["daily"], 1), note("y", ["daily"], 2), note("z", ["daily"], 3)])}
    assert example_questions(metadata) == ["What did I write in “Rust ownership”?", "我的笔记里关于「电影」记了什么？",
                                           "「电影清单」里写了什么？", "我的笔记里关于「清单」记了什么？"]
    assert example_questions(metadata, 1) == ["What did I write in “Rust ownership”?"]
    assert example_questions({}) == []


def test_a_question_is_asked_in_chinese_only_for_han_text() -> None:
    """The Han rule shared by every layer (readers.markdown_syntax.HAN): a Yijing hexagram is not Chinese text."""
    assert example_questions({"a": note("䷀ 乾卦", [], 2), "b": note("䷀䷁", [], 1)}) == [
        "「䷀ 乾卦」里写了什么？", "What did I write in “䷀䷁”?"]


def test_the_engine_offers_them_without_loading_a_model(sample_home: Path, tmp_path: Path) -> None:
    brain = Brain(sample_home)
    try:
        questions = brain.example_questions()
    finally:
        brain.close()
    assert len(questions) == 4 and all(q.endswith(("？", "?")) for q in questions)
    empty = Brain(tmp_path / "empty")
    assert empty.example_questions() == []
    empty.close()
