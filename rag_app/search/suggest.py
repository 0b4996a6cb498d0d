"""Example questions for an empty chat, built from the user's own notes: what they write about most (frequent tags)
and what they wrote last (recent titles), so a first question is one the notes can answer."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from readers.markdown_syntax import HAN
from readers.records import decode_list

_DATE_LIKE = re.compile(r"^[\d\s./:年月日号周一二三四五六七天-]+$")  # a daily note's title asks nothing


def _when(meta: dict[str, Any]) -> float:
    return float(meta.get("updated_ts") or meta.get("created_ts") or meta.get("mtime_ts") or 0)


def _about_tag(tag: str) -> str:
    return f"我的笔记里关于「{tag}」记了什么？" if HAN.search(tag) else f"What do my notes say about {tag}?"


def _about_title(title: str) -> str:
    return f"「{title}」里写了什么？" if HAN.search(title) else f"What did I write in “{title}”?"


def example_questions(metadata: dict[str, dict[str, Any]], count: int = 4) -> list[str]:
    """Up to `count` questions, a recent title and a frequent tag in turn; none for an empty index. Titles that are
    only a date and tags shared by nearly every note (`daily`) say nothing about a subject, so they are left out."""
    notes = list(metadata.values())
    tags = Counter(tag for meta in notes for tag in dict.fromkeys(decode_list(meta.get("tags"))) if tag.strip())
    common = [tag for tag, n in tags.most_common() if n >= 2 and n < max(3, len(notes) * 0.5)]
    titles = [str(meta.get("title") or "").strip() for meta in sorted(notes, key=_when, reverse=True)]
    recent = list(dict.fromkeys(t for t in titles if t and len(t) <= 40 and not _DATE_LIKE.match(t)))
    questions: list[str] = []
    for k in range(count):
        for pool, ask in ((recent, _about_title), (common, _about_tag)):
            if k < len(pool) and len(questions) < count:
                questions.append(ask(pool[k]))
    return list(dict.fromkeys(questions))
