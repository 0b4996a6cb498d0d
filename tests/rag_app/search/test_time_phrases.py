"""A time phrase in a question becomes a date range and leaves the question; other dates stay words."""

from __future__ import annotations

import datetime as dt

import pytest

from rag_app.search.time_phrases import extract_time_range

TODAY = dt.date(2026, 3, 18)  # a Wednesday


@pytest.mark.parametrize(("query", "rest", "since", "until"), [
    ("上个月的读书笔记", "读书笔记", "2026-02-01", "2026-02-28"),
    ("2024年3月 跑步记录", "跑步记录", "2024-03-01", "2024-03-31"),
    ("2023年的旅行", "旅行", "2023-01-01", "2023-12-31"),
    ("上周 会议", "会议", "2026-03-09", "2026-03-15"),
    ("上上周的周报", "周报", "2026-03-02", "2026-03-08"),
    ("本周计划", "计划", "2026-03-16", "2026-03-22"),
    ("去年的体检", "体检", "2025-01-01", "2025-12-31"),
    ("前年的照片", "照片", "2024-01-01", "2024-12-31"),
    ("今年读了什么", "读了什么", "2026-01-01", "2026-03-18"),
    ("昨天的想法", "想法", "2026-03-17", "2026-03-17"),
    ("notes from last month", "notes", "2026-02-01", "2026-02-28"),
    ("trips in 2023", "trips", "2023-01-01", "2023-12-31"),
    ("budget March 2025", "budget", "2025-03-01", "2025-03-31"),
    ("release 2024-02 notes", "release notes", "2024-02-01", "2024-02-29"),
    ("what did I do yesterday", "what did I do", "2026-03-17", "2026-03-17"),
])
def test_a_time_phrase_becomes_a_range_and_leaves_the_query(query, rest, since, until):
    text, found = extract_time_range(query, TODAY)
    assert found is not None
    assert (text, found.since.isoformat(), found.until.isoformat()) == (rest, since, until)


def test_january_last_month_crosses_the_year():
    _, found = extract_time_range("上个月", dt.date(2026, 1, 10))
    assert (found.since, found.until) == (dt.date(2025, 12, 1), dt.date(2025, 12, 31))


@pytest.mark.parametrize("query", ["电影清单", "ERR_CONN_RESET_4471", "version 2024-02-30 notes"])
def test_without_a_time_phrase_the_query_is_left_alone(query):
    assert extract_time_range(query, TODAY) == (query, None)


def test_an_impossible_month_falls_back_to_its_year():
    text, found = extract_time_range("2024年13月 计划", TODAY)
    assert (found.since, found.until) == (dt.date(2024, 1, 1), dt.date(2024, 12, 31))


def test_a_phrase_alone_keeps_itself_as_the_query():
    text, found = extract_time_range("去年", TODAY)
    assert text == "去年" and found is not None
