"""The chat page (rag_app.shells.page) called as Gradio calls it: conversations kept in the engine, streaming, citations
that open notes in the page, notes rendered safely, sources, LLM state, status, sync, the bind rule and the launcher."""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

import gradio as gr
import httpx
import pytest
from click.testing import CliRunner

from rag_app.engine import Brain, ConfigError
from rag_app.shells import page as app
from rag_app.shells.cli import EXIT_USAGE, main
from tests.conftest import REPO, free_port, stop
from tests.doubles.openai_server import OpenAIDouble

QUESTION, FOLLOW_UP = "我想看哪些电影？", "第二部是谁导演的？"
MOVIES = "vault:sample_vault/生活/电影清单.md"
MOVIES_LINK = app.obsidian_url("sample_vault", "生活/电影清单.md")
NO_LLM = ("LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY", "OPENAI_API_KEY")
STRONG = "<span class='brain-strength brain-strong'>strong</span>"
RELATED = "<span class='brain-strength brain-related'>related</span>"


class Tab:
    """What Gradio hands a handler about the open tab it serves: gr.Request's session_hash and the page's query
    string, whose `conversation` names the conversation on screen (none: a new chat)."""

    def __init__(self, name: str, conversation: str | None = None):
        self.session_hash = name
        self.query_params = {app.CONVERSATION_PARAM: conversation} if conversation else {}


def ask(chat: app.ChatPage, question: str = QUESTION, history: list[dict[str, Any]] | None = None,
        session: str | None = None, tab: Any = None, **filters: Any) -> list[tuple[Any, ...]]:
    """Every update the page streams for one question; `tab` stands for the gr.Request of an open tab."""
    options = {"sources": [], "tags": "", "since": "", "until": ""} | filters
    return list(chat.chat(question, history or [], session, options["sources"], options["tags"], options["since"],
                          options["until"], tab))


def answers(outputs: list[tuple[Any, ...]]) -> list[str]:
    """The last chat bubble of every streamed update."""
    return [messages[-1]["content"] for messages, *_ in outputs]


def alnum(text: str) -> str:
    return "".join(char for char in text if char.isalnum())


def assert_cumulative(texts: list[str]) -> None:
    """Every streamed message extends the one before: Gradio replaces the bubble with each yield."""
    for before, after in zip(texts, texts[1:], strict=False):
        assert after.startswith(before), (before, after)


@pytest.fixture
def own_home(sample_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the synced sample home (conversations are written into the home; the shared one stays as it was),
    no LLM in the environment."""
    for var in NO_LLM:
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    return home


@pytest.fixture
def pages() -> Iterator[Callable[..., app.ChatPage]]:
    """`pages(home)` opens a ChatPage (Obsidian links on, as `[serve] obsidian = true` sets them), closed after."""
    opened: list[app.ChatPage] = []

    def open_page(home: Path, obsidian: bool = True) -> app.ChatPage:
        opened.append(app.ChatPage(Brain(home), obsidian=obsidian))
        return opened[-1]

    yield open_page
    for chat in opened:
        chat.close()


@pytest.fixture
def page(own_home: Path, pages: Callable[..., app.ChatPage]) -> app.ChatPage:
    return pages(own_home)


def test_page_builds_with_every_panel(page: app.ChatPage) -> None:
    blocks = page.build()
    assert isinstance(blocks, gr.Blocks)
    labels = {getattr(block, "label", None) for block in blocks.blocks.values()}
    assert {"Sources", "Tags", "Since", "Until", "Conversations", "Rename to", "Answers from your notes"} <= labels
    assert r"**sample\_vault** (vault): 41 notes" in page.status()


def test_the_page_module_is_installed_and_app_py_only_launches_it() -> None:
    launcher = (REPO / "app.py").read_text(encoding="utf-8")
    assert "from rag_app.shells.page import serve" in launcher and "gr." not in launcher
    assert Path(app.__file__).resolve().parent == REPO / "rag_app" / "shells"


def test_an_extractive_answer_streams_then_links_every_citation_into_the_page(page: app.ChatPage) -> None:
    outputs = ask(page)
    texts = answers(outputs)
    assert_cumulative(texts[1:-1])  # streamed pieces; the last replaces them with citations linked
    messages, session, listing, _ = outputs[-1]
    assert [m["role"] for m in messages] == ["user", "assistant"] and messages[0]["content"] == QUESTION
    final = texts[-1]
    assert final.startswith(f"{STRONG}\n\nExtractive answer (no LLM configured)")
    movies_ref = app.note_ref(MOVIES, 0, 1)
    assert f"[\\[1\\]]({movies_ref})" in final, "the [1] marker opens the note in the page"
    sources = final.split("**Sources**")[1]
    assert f"1. [电影清单]({movies_ref}) — 生活/电影清单\\.md {STRONG} · [open in Obsidian]({MOVIES_LINK})" in sources
    assert session == QUESTION, "a new conversation is named after its first question"
    opened = f"<a href='{html.escape(app.conversation_ref(session))}' class='brain-conv-open'"
    assert listing.count("<a ") == 1 and opened in listing and "1 turn<" in listing
    assert page.brain.session(session)["turns"][0]["question"] == QUESTION


def test_a_conversation_continues_and_survives_a_restart(own_home: Path,
                                                         pages: Callable[..., app.ChatPage]) -> None:
    first = pages(own_home)
    messages, session, _, _ = ask(first)[-1]
    messages, again, _, _ = ask(first, FOLLOW_UP, messages, session)[-1]
    assert again == session and len(messages) == 4
    assert "_Searched for: 第二部是谁导演的？" in messages[-1]["content"]  # the follow-up carried its subject
    assert app.note_ref(MOVIES, 1, 1) in messages[-1]["content"]  # …and found the movies note again
    first.close()

    chat, name, listing, llm_line, status, first, earlier = pages(own_home).load(Tab("t", session))  # a restart
    assert name == session and "brain-conv-open" in listing
    assert [m["content"] for m in chat["value"]] == [m["content"] for m in messages]
    assert len(chat["examples"]) == 4, "example questions from the notes, for an empty chat"
    assert (first, earlier["visible"]) == (0, False)
    assert llm_line.startswith("**cflow-brain** · No LLM configured") and "41 notes" in status


def listed(listing: str) -> list[str]:
    """The conversations' titles in the sidebar's list, top to bottom."""
    return [html.unescape(t) for t in re.findall(r"<span class='brain-conv-title'>(.*?)</span>", listing)]


def test_conversations_are_listed_renamed_and_deleted(page: app.ChatPage) -> None:
    _, first, _, _ = ask(page)[-1]
    page.brain.rename_session(first, "films")
    chat, none, listing, box, first, earlier = page.new_session()
    assert (chat, none, box, first, earlier["visible"]) == ([], None, app.NOTE_HINT, 0, False)
    assert listed(listing) == ["films"] and "brain-conv-open" not in listing
    _, second, listing, _ = ask(page, "番茄炒蛋怎么做")[-1]
    assert second == "番茄炒蛋怎么做" and listed(listing) == ["番茄炒蛋怎么做", "films"]
    assert re.search(r"<span class='brain-conv-meta'>today \d\d:\d\d · 1 turn</span>", listing)

    renamed, listing, box, outcome = page.rename_session(second, "  番茄  ")
    assert (renamed, listed(listing), box, outcome) == ("番茄", ["番茄", "films"], "", "Renamed to 番茄.")
    kept, _, _, outcome = page.rename_session("番茄", "films")
    assert kept == "番茄" and outcome.startswith("⚠️") and "already exists" in outcome

    shown, name, listing, *_ = page.open_session(app.conversation_ref("films"))
    assert name == "films" and shown[0]["content"] == QUESTION
    assert "class='brain-conv-open' aria-current='true'><span class='brain-conv-title'>films<" in listing
    row, question = page.ask_delete("films")
    assert row["visible"] and "films" in question
    shown, name, listing, outcome, row, *_ = page.delete_session("films")
    assert name == "番茄" and shown[0]["content"] == "番茄炒蛋怎么做" and outcome == "Deleted films."
    assert listed(listing) == ["番茄"] and not row["visible"]
    assert page.delete_session("films")[1] == "番茄"  # deleted elsewhere meanwhile: no error
    assert page.open_session(app.conversation_ref("films"))[1] is None, "a deleted one opens as a new chat"


def test_the_url_names_the_conversation_every_call_acts_on(page: app.ChatPage) -> None:
    """Issue 29 item 3: a question typed just after a reload showed a new chat but joined the most recently used
    conversation, and a reload opened that one, not the one on screen. The URL names the conversation on screen
    (none: a new chat); a load and a question both act on it, whatever the page's state says."""
    _, old, _, _ = ask(page)[-1]
    chat, session, listing, *_ = page.load(Tab("fresh"))
    assert (chat["value"], session) == ([], None) and "brain-conv-open" not in listing, "no name: a new chat"
    assert listed(listing) == [old]
    outputs = ask(page, "番茄炒蛋怎么做", [], old, Tab("fresh"))  # the page's state still says: the old one
    assert [o[1] for o in outputs] == ["番茄炒蛋怎么做"] * len(outputs) and page.brain.session(old)["total"] == 1
    assert "class='brain-conv-open' aria-current='true'><span class='brain-conv-title'>番茄炒蛋怎么做<" in \
        outputs[0][2], "listed as open with the first update: the page's script puts it in the URL at once"

    chat, session, listing, *_ = page.load(Tab("reload", old))
    assert session == old and [m["content"] for m in chat["value"]][:1] == [QUESTION], "not the newest: the URL's"
    assert "class='brain-conv-open' aria-current='true'><span class='brain-conv-title'>我想看哪些电影？<" in listing
    shown, again, _, _ = ask(page, FOLLOW_UP, [], None, Tab("asked-before-the-turns-showed", old))[-1]
    assert again == old and page.brain.session(old)["total"] == 2
    assert [m["content"] for m in shown[::2]] == [QUESTION, FOLLOW_UP], "the whole conversation shown, not one turn"
    assert page.load(Tab("shared", "no such conversation"))[1] is None, "a link to one deleted since: a new chat"

    tab = Tab("tab-1", old)
    page.new_session(tab)  # pressed before the load below finished
    chat, session, listing, *_ = page.load(tab)
    assert session == gr.skip() and "value" not in chat, "the load leaves the new chat alone"
    assert "brain-conv-open" not in listing
    names = [ask(page, "同一个问题", [], None, tab)[-1][1] for tab in (Tab("a"), Tab("b"))]
    assert names == ["同一个问题", "同一个问题 (2)"], "two new chats never share a conversation"


def repeat_turn(home: Path, session: str, times: int) -> None:
    """The session's one real turn copied until it holds `times` turns, the questions numbered (20,000 real asks
    would take hours); one transaction on the home's sessions.sqlite."""
    with closing(sqlite3.connect(home / "sessions.sqlite")) as conn, conn:
        conn.executemany(
            "INSERT INTO turns (session_id, question, answer, citations, coverage, mode, asked) "
            "SELECT session_id, ?, answer, citations, coverage, mode, asked FROM turns ORDER BY id LIMIT 1",
            [(f"问题 {n}",) for n in range(1, times)])


def test_a_long_conversation_shows_its_last_turns_and_loads_earlier_ones_on_request(own_home: Path,
                                                                                    pages: Callable[..., app.ChatPage]
                                                                                    ) -> None:
    """Issue 22 item 9: 20,000 turns (~60 MB) never rendered and grew the server to 900 MB: the page reads a page of
    turns from sessions.sqlite, never the whole history."""
    page = pages(own_home)
    _, session, _, _ = ask(page)[-1]
    repeat_turn(own_home, session, 20_000)
    fresh = pages(own_home)
    tracemalloc.start()
    started = time.monotonic()
    try:
        chat, name, _, _, _, first, earlier = fresh.load(Tab("t", session))
        shown = chat["value"]
        seconds, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert name == session and (first, len(shown)) == (20_000 - app.PAGE_TURNS, 2 * app.PAGE_TURNS)
    assert shown[0]["content"] == f"问题 {first}" and earlier["visible"] and "19,950 more" in earlier["value"]
    # Memory is the proof (rendering every turn took 900 MB); the time bound is wide for a loaded CI machine, and
    # `bench/limits_bench.py --only page` prints the seconds.
    assert seconds < 60 and peak < 30 * 2**20, (seconds, peak)
    assert app.note_ref(MOVIES, 19_999, 1) in shown[-1]["content"], "citations keep the turn's own number"
    assert "brain-hit" in fresh.open_note(app.note_ref(MOVIES, 19_999, 1), session)

    more, first, earlier = fresh.earlier_turns(session, first, shown)
    assert first == 20_000 - 2 * app.PAGE_TURNS and more[2 * app.PAGE_TURNS:] == shown
    assert more[0]["content"] == f"问题 {first}" and earlier["visible"]
    start, first, earlier = fresh.earlier_turns(session, 30, more)  # the first page is a short one
    assert first == 0 and len(start) == 60 + len(more) and start[0]["content"] == QUESTION and not earlier["visible"]


def test_clicking_a_citation_opens_the_note_with_the_cited_passage_lit(page: app.ChatPage) -> None:
    _, session, _, _ = ask(page)[-1]
    cited = page.brain.session(session)["turns"][0]["citations"][0]
    shown = page.open_note(app.note_ref(MOVIES, 0, 1), session)
    assert "\n" not in shown, "one line: the Markdown component passes it on whole"
    assert "<h2>电影清单</h2>" in shown and "<span class='brain-tag'>#电影</span>" in shown
    assert "created 2023-12-30 · updated 2025-01-05" in shown
    obsidian = html.escape(MOVIES_LINK)
    assert f"<a href='{obsidian}' target='_blank' rel='noopener noreferrer'>Open in Obsidian ↗</a>" in shown
    assert "<table>" in shown and "<th>导演</th>" in shown
    lit = re.findall(r"<(\w+) class=\"brain-hit\"[^>]*>(.*?)</\1>", shown)
    assert shown.count('id="brain-hit"') == 1 and lit
    lit_text = re.sub(r"<[^>]+>", "", "".join(body for _, body in lit))
    assert alnum(cited["excerpt"])[:30] in alnum(lit_text), "the passage the answer cited is the one lit"
    assert "<span class='brain-task'>☐</span> 《花样年华》——王家卫" in shown
    backlink = app.note_ref("vault:sample_vault/index.md")
    assert "<h4>Backlinks</h4>" in shown and f"<li><a href='{backlink}'>首页</a></li>" in shown
    link = app.note_ref("vault:sample_vault/生活/台北咖啡館筆記.md")
    assert f'<a href="{link}">台北咖啡館筆記</a>' in shown, "the [[wikilink]] opens its note in place"
    assert "<h4>Related</h4>" in shown

    plain = page.open_note(app.note_ref(MOVIES), session)  # a link from another note: nothing to light
    assert "brain-hit" not in plain and "<h2>电影清单</h2>" in plain
    assert "no note with id" in page.open_note(app.note_ref("vault:sample_vault/nope.md"), session)
    assert "a note id looks like" in page.open_note("#brain-note?id=..%2Fetc%2Fpasswd", session)
    assert page.open_note("", session) == app.NOTE_HINT
    # the page's script numbers each request: the answer carries the number, so a note shown again is known to be in
    again = page.open_note(app.note_ref(MOVIES) + "&ask=7", session)
    assert again == f"<div class='brain-ask-7'>{plain}</div>"
    assert page.open_note("#brain-note?id=..%2Fetc%2Fpasswd&ask=8", session).startswith("<div class='brain-ask-8'>")


def test_note_refs_round_trip_and_refuse_junk() -> None:
    note_id = "vault:My Notes/a&b=c?.md"
    assert app.parse_note_ref(app.note_ref(note_id, 3, 12)) == (note_id, 3, 12)
    assert app.parse_note_ref(app.note_ref(note_id)) == (note_id, None, None)
    assert app.parse_note_ref("#brain-note?id=x&turn=-1&n=99999999") == ("x", None, None)
    assert app.parse_note_ref(app.note_ref(note_id, 3, 12) + "&ask=5") == (note_id, 3, 12)
    assert [app.note_ask(f"#brain-note?id=x&ask={ask}") for ask in ("5", "-1", "5'><b", "1" * 10)] == [5, None, None,
                                                                                                      None]
    # digits only in ASCII ("²" passes str.isdigit and then fails int()), and the script's number is the last one
    assert app.parse_note_ref("#brain-note?id=x&turn=²&n=٣") == ("x", None, None)
    assert [app.note_ask(f"#brain-note?id=x&ask={ask}") for ask in ("²", "٣", "1&ask=2")] == [None, None, 2]


HOSTILE_NOTE = """# Title <script>alert(1)</script>

Text with <img src="http://127.0.0.1:9/leak"> and ![pixel](http://127.0.0.1:9/img.png) and
[js](javascript:alert(1)) [data](data:text/html,x) [web](https://example.com/a) <https://example.com/auto>
[[Linked note|shown label]] [[Unknown note]] ![[embedded.png]]

- [ ] open task
- [x] done task

| a | b |
| --- | --- |
| <b>1</b> | 2 |

```html
<iframe src="http://127.0.0.1:9/frame"></iframe>
```

`<span onclick=x>`
"""


def test_note_text_renders_as_markdown_that_loads_and_runs_nothing() -> None:
    shown = app.note_markdown_html(HOSTILE_NOTE, wikilinks={"linked note": "vault:v/Linked note.md"})
    assert "<h1>Title &lt;script&gt;alert(1)&lt;/script&gt;</h1>" in shown
    assert "&lt;img src=&quot;http://127.0.0.1:9/leak&quot;&gt;" in shown and "[pixel]" in shown
    assert not re.search(r"<(img|script|iframe|svg|picture|source|object|embed)\b", shown)
    assert re.findall(r"<span\b[^>]*>", shown) == ["<span class='brain-task'>"] * 2, "only the page's task boxes"
    assert 'href="javascript' not in shown and 'href="data' not in shown and ">js<" not in shown
    assert '<a href="https://example.com/a" target="_blank" rel="noopener noreferrer">web</a>' in shown
    assert '<a href="https://example.com/auto" target="_blank" rel="noopener noreferrer">' in shown
    assert f'<a href="{app.note_ref("vault:v/Linked note.md")}">shown label</a>' in shown
    assert "Unknown note" in shown and "embedded.png" in shown and shown.count("<a ") == 3
    assert "<li><span class='brain-task'>☐</span> open task</li>" in shown, "one box, the bullet dropped (CSS)"
    assert "<li><span class='brain-task'>☑</span> done task</li>" in shown
    assert "<td>&lt;b&gt;1&lt;/b&gt;</td>" in shown
    assert '<pre><code class="language-html">&lt;iframe src=&quot;http://127.0.0.1:9/frame&quot;&gt;' in shown
    assert "<code>&lt;span onclick=x&gt;</code>" in shown


def test_a_task_list_in_an_answer_shows_one_box_per_task_and_code_as_written() -> None:
    """Issue 29 item 7: task items showed a bullet and a box ("○ ☐"). Each becomes one box the page's CSS puts in
    the bullet's place, whether the engine wrote it (☐ ☑) or an LLM did (`[ ]`, `[x]`); code is not touched."""
    answer = "- ☐ 《一一》 [1]\n- [x] done\n  - [ ] nested\n1. [X] numbered\n- plain\n\n```\n- [ ] in code\n```\n" \
             "text - [ ] mid-line `- [ ] code`"
    shown = app.turn_markdown({"question": "q", "answer": answer, "citations": [], "mode": "llm"}, 0, (), False)
    box, done = app.task_box(False), app.task_box(True)
    assert f"- {box} 《一一》 \\[1\\]\n- {done} done\n  - {box} nested\n1. {done} numbered\n- plain\n" in shown
    assert "- [ ] in code" in shown and "text - \\[ \\] mid-line `- [ ] code`" in shown


def test_the_cited_passage_is_found_however_the_excerpt_was_flattened() -> None:
    text = ("intro\n\n# 电影清单\n\n## 想看的电影\n\n- [ ] 《花样年华》——王家卫\n- [ ] 《一一》——杨德昌\n\n"
            "## 已看\n\nlast line\n")
    assert app.hit_lines(text, "想看的电影 - ☐ 《花样年华》——王家卫 - ☐ 《一一》") == (4, 8)
    assert app.hit_lines(text, "…《一一》——杨德昌 已看…") == (7, 10)
    assert app.hit_lines(text, "《花样年华》——王家卫 and text that was edited away since the sync") == (6, 7)
    assert app.hit_lines(text, "nothing like it") is None and app.hit_lines(text, "…") is None
    shown = app.note_markdown_html(text, (6, 8))
    assert shown.count('class="brain-hit"') == 2 and '<li class="brain-hit" id="brain-hit">' in shown


def test_sources_show_the_cited_and_strong_ones_and_keep_the_rest_behind_more() -> None:
    citations = [{"n": n, "note_id": f"vault:v/{n}.md", "title": f"T{n}", "path": f"{n}.md", "excerpt": f"e{n}",
                  "strength": strength} for n, strength in enumerate(["strong", "related", "weak", "weak"], 1)]
    turn = {"question": "q", "answer": "From the third ［3］ and 【1】 [1][9]", "citations": citations,
            "coverage": {"cited": [1, 3], "condensed_query": "q about T"}, "mode": "llm"}
    shown = app.turn_markdown(turn, 4, (), obsidian=False)
    answer, sources = shown.split("**Sources**")
    assert answer.startswith(f"{STRONG}\n\nFrom the third [\\[3\\]]({app.note_ref('vault:v/3.md', 4, 3)}) and "
                             f"[\\[1\\]]({app.note_ref('vault:v/1.md', 4, 1)})")
    assert "\\[9\\]" in answer and "_Searched for: q about T_" in answer
    glossed = app.turn_markdown(turn | {"coverage": {"translation": "see other people have bad luck"}}, 4, (),
                                obsidian=False)
    assert '_Also searched in English, word by word: "see other people have bad luck"_' in glossed
    undated = app.turn_markdown(turn | {"coverage": {"time_phrase_ignored": "1998年"}}, 4, (), obsidian=False)
    assert '_"1998年" filtered nothing: no note is dated in that range, so it was searched as words_' in undated
    dated = app.turn_markdown(turn | {"coverage": {"time_phrase": {"phrase": "上个月", "since": "2026-11-01",
                                                                   "until": "2026-11-30"}}}, 4, (), obsidian=False)
    assert '_Time filter from "上个月": 2026\\-11\\-01 – 2026\\-11\\-30_' in dated, "the page says a time filter"
    first, more = sources.split("<details><summary>2 more</summary>")
    assert re.findall(r"^(\d)\. ", first, re.M) == ["1", "3"] and re.findall(r"^(\d)\. ", more, re.M) == ["2", "4"]
    assert "   e1" in first, "an LLM answer's sources show their excerpts"
    extractive = app.turn_markdown(turn | {"mode": "extractive", "answer": "**T2** [2]"}, 0, (), obsidian=False)
    assert "<summary>2 more</summary>" in extractive and "   e2" not in extractive
    assert re.findall(r"^(\d)\. ", extractive.split("<details>")[0], re.M) == ["1", "2"]


def test_answers_and_sources_show_how_well_the_notes_answer() -> None:
    def turn(strengths: list[str], **coverage: Any) -> dict[str, Any]:
        citations = [{"n": n, "note_id": f"vault:v/{n}.md", "title": f"T{n}", "path": f"{n}.md", "strength": s,
                      "excerpt": "想看的电影 - ☐ 《花样年华》 - ☐ *Before Sunrise*——一直 [[跑步记录…"}
                     for n, s in enumerate(strengths, 1)]
        return {"question": "q", "answer": "a [1]", "citations": citations, "coverage": {"cited": [1], **coverage},
                "mode": "llm"}

    related = app.turn_markdown(turn(["related", "weak"]), 0, (), obsidian=False)
    assert related.startswith("<span class='brain-strength brain-related'>related</span>\n\na")
    assert "1. [T1](" in related and "<span class='brain-strength brain-related'>related</span>\n" in related
    assert "   想看的电影 ☐ 《花样年华》 ☐ *Before Sunrise*——一直 跑步记录…" in related, "excerpts render, no raw marks"
    missing = app.turn_markdown(turn(["weak"], not_found=True), 0, (), obsidian=False)
    assert missing.startswith("<span class='brain-strength brain-not-found'>not in your notes</span>")
    assert "**Nearest leads** (not an answer)" in missing
    assert not app.turn_markdown(turn([], empty_index=True), 0, (), obsidian=False).startswith("<span")


def test_an_example_question_is_asked_as_if_typed(page: app.ChatPage) -> None:
    example = gr.SelectData(None, {"index": 0, "value": {"text": QUESTION}})
    messages, session, listing, _ = list(page.ask_example([], None, [], "", "", "", example, Tab("t")))[-1]
    assert session == QUESTION and messages[0]["content"] == QUESTION and listed(listing) == [QUESTION]


def test_conversations_say_when_they_were_last_used() -> None:
    now = dt.datetime(2026, 12, 1, 15, 0).astimezone()
    at = (now - dt.timedelta(hours=1)).astimezone(dt.UTC).isoformat()
    assert app.when_label(at, now) == f"today {now - dt.timedelta(hours=1):%H:%M}"
    assert app.when_label((now - dt.timedelta(days=1)).isoformat(), now).startswith("yesterday ")
    assert app.when_label("2024-03-15T08:00:00Z", now) == "2024-03-15" and app.when_label("junk", now) == ""
    assert "No conversations yet" in app.conversations_html([], None)
    assert app.parse_conversation_ref(app.conversation_ref("a&b=c #2")) == "a&b=c #2"


def test_an_llm_conversation_sends_the_first_turn_with_the_follow_up(own_home: Path,
                                                                   pages: Callable[..., app.ChatPage],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def reply(body: dict[str, Any]) -> str:
        prompt = body["messages"][-1]["content"]
        if "Standalone question:" in prompt:
            return "想看的电影里第二部《一一》是谁导演的？"
        return "《一一》是杨德昌导演的[1]。" if prompt.endswith(FOLLOW_UP) else "你想看《花样年华》和《一一》[1]。"

    with OpenAIDouble([reply]) as double:
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        chat = pages(own_home, obsidian=False)
        shown_url = double.url.replace("http://", "http\\://")  # not autolinked
        assert chat.llm_line() == f"**cflow-brain** · LLM **qwen2\\.5** at {shown_url}"
        first = ask(chat)
        messages, session, _, _ = first[-1]
        second = ask(chat, FOLLOW_UP, messages, session)
    texts = answers(second)
    assert_cumulative(texts[1:-1])
    assert len(texts) > 3, "the answer arrived in one piece, not streamed"
    sent = double.requests[-1]["body"]["messages"]
    first_answer = "你想看《花样年华》和《一一》。"  # as sent back: without the [n] of that turn's sources
    assert [(m["role"], m["content"]) for m in sent[1:3]] == [("user", QUESTION), ("assistant", first_answer)]
    final = texts[-1]
    label, _, answer = final.partition("\n\n")
    # The note holds the answer, so "strong" is right; the relevance fit with rgb_zh_dev:default gives it 0.22 (was
    # 0.46): "related", a known miss (docs/retrieval.md). Either way an answer from the note, never a lead.
    assert label in (STRONG, RELATED)
    assert answer.startswith(f"《一一》是杨德昌导演的[\\[1\\]]({app.note_ref(MOVIES, 1, 1)})。")
    assert "_Searched for: 想看的电影里第二部《一一》是谁导演的？_" in final
    assert "1. [电影清单](" in final.split("**Sources**")[1] and "open in" not in final  # Obsidian links off


def test_the_llm_line_says_what_a_half_done_configuration_lacks() -> None:
    assert "LLM configured but incomplete: missing LLM\\_MODEL" in app.llm_markdown(
        {"configured": False, "missing": ["LLM_MODEL"], "model": None, "base_url": "http://127.0.0.1:11434/v1"})
    assert "No LLM configured" in app.llm_markdown({"configured": False, "missing": [], "model": None,
                                                    "base_url": None})


def test_an_unreachable_llm_is_named_in_the_answer(own_home: Path, pages: Callable[..., app.ChatPage],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that refuses connections is named at once, on the LLM line of a page just loaded and in the answer
    (passages, without the client's retries)."""
    port = free_port()
    monkeypatch.setenv("LLM_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("LLM_MODEL", "qwen2.5")
    page = pages(own_home)
    line = page.llm_line()
    assert "⚠️ LLM **qwen2\\.5** unreachable: cannot connect to http\\://127.0.0.1:" in line
    assert "answers are passages of your notes until it is back" in line
    final = answers(ask(page))[-1].removeprefix(f"{STRONG}\n\n")
    assert final.startswith(f"Extractive answer: LLM unavailable (cannot connect to http\\://127.0.0.1:{port}/v1")
    assert "showing passages" in final


def test_status_shows_each_channels_progress_and_time_left() -> None:
    status = {"notes": 3, "chunks": 120, "embedding_model": "e5-small", "sources": [
        {"name": "notes", "kind": "vault", "notes": 3, "chunks": 120, "last_sync": None, "last_result": None}],
        "channels": {"bm25": {"chunks": 120, "complete": True},
                     "use-m3": {"chunks": 120, "complete": True, "seconds_left": 0},
                     "e5-small": {"chunks": 40, "complete": False, "seconds_left": 400}}}
    shown = app.status_markdown(status)
    assert "Search channels: BM25 (keywords) ✓ · use\\-m3 ✓ · e5\\-small 40/120, ~7 min left" in shown
    unknown = {**status["channels"], "e5-small": {"chunks": 0, "complete": False, "seconds_left": None},
               "bm25": {"chunks": 0, "complete": False}}
    assert "BM25 (keywords) 0/120 ·" in app.status_markdown(status | {"channels": unknown})
    assert "e5\\-small 0/120, time left unknown" in app.status_markdown(status | {"channels": unknown})


def test_bad_filter_is_shown_not_raised(page: app.ChatPage) -> None:
    shown = answers(ask(page, since="last spring"))[-1]
    assert shown.startswith("⚠️") and "must be a date" in shown
    assert page.brain.sessions() == [], "a conversation whose first question failed is not kept"


def test_citation_links_per_source_kind() -> None:
    memo = {"n": 1, "note_id": "memos:abc", "title": "[draft] a (b)", "url": "https://m.example/m/abc",
            "excerpt": "x", "strength": "strong"}
    note = {"n": 2, "note_id": "vault:My Notes/a b/c.md", "title": "C", "path": "a b/c.md", "excerpt": "",
            "strength": "strong"}
    assert app.note_href(memo, obsidian=False) == "https://m.example/m/abc"
    assert app.note_href(note, obsidian=False) is None
    assert app.note_href(note, obsidian=True) == "obsidian://open?vault=My%20Notes&file=a%20b%2Fc.md"
    shown = app.sources_markdown([memo, note], {1, 2}, obsidian=False, excerpts=True, turn=0)
    assert shown.splitlines()[2:] == [
        rf"1. [\[draft\] a \(b\)]({app.note_ref('memos:abc', 0, 1)}) {STRONG} · [open in Memos](https://m.example/m/abc)",
        "   x", rf"2. [C]({app.note_ref('vault:My Notes/a b/c.md', 0, 2)}) — a b/c\.md {STRONG}"]
    assert quote("vault:My Notes/a b/c.md", safe="") in app.note_ref("vault:My Notes/a b/c.md")


@pytest.mark.parametrize(("written", "shown"), [
    ("ok [1]. ![c](http://127.0.0.1:9/leak?d=SECRET)", r"ok \[1\]. \!c"),
    ('<img src="http://127.0.0.1:9/leak?d=SECRET">', r'\<img src="http\://127.0.0.1:9/leak?d=SECRET">'),
    ("<IMG SRC=x onerror=alert(1)>", r"\<IMG SRC=x onerror=alert(1)>"),
    ("[more](http://evil.example/x?d=SECRET 'title')", "more"),
    ("[r][ref] ![i][ref] [^1]\n\n[ref]: http://evil.example/r", "\\[r\\]\\[ref\\] \\!\\[i\\]\\[ref\\] \\[^1\\]\n\n"
     "\\[ref\\]: http\\://evil.example/r"),
    ("see http://evil.example/x, WWW.evil.example and me@evil.example",
     r"see http\://evil.example/x, WWW\.evil.example and me\@evil.example"),
    ("<http://evil.example/auto> <!-- c --> <script>x</script>",
     r"\<http\://evil.example/auto> \<\!-- c --> \<script>x\</script>"),
    ("\\[x](http://evil.example)", "\\\\x"),
    ("# 结论\n- **粗体** _斜体_ `code` [1][2]", "# 结论\n- **粗体** _斜体_ `code` \\[1\\]\\[2\\]"),
    ("use `&v[0]` and `Vec<i32>`!", r"use `&v[0]` and `Vec<i32>`\!"),
    ("```rust\nlet v: Vec<i32> = vec![];\nprintln!(\"{}\", &v[0]); // (careful!)\n```",
     "```rust\nlet v: Vec<i32> = vec![];\nprintln!(\"{}\", &v[0]); // (careful!)\n```\n"),
    ("````md\n```\n<img src=x>\n````\nafter", "````md\n```\n<img src=x>\n````\nafter"),
    ("~~~\n<img src=x>", "```\n<img src=x>\n```\n"),
    ("x `a\nb` <img src=x> `c`", "x \\`a\nb`<img src=x>`c\\`"),
    ("a ` b ``<img src=x>``", r"a \` b `<img src=x>`"),
    ("~~ not a fence ~~\n\\`<img src=x>`", r"\~\~ not a fence \~\~" "\n" r"\\\`\<img src=x>\`"),
    ("~~~~ python title\nx = [1] < 2\n~~~~", "```python\nx = [1] < 2\n```\n"),
    ("`a\r\r<img src=x>`", "\\`a\n\n\\<img src=x>\\`"),  # a lone CR is a line end: found by a red-team fuzzer
    ("`a\r<script>alert(1)</script>\rb`", "\\`a\n\\<script>alert(1)\\</script>\nb\\`"),
    ("| a | b |\n|---|---|\n| `x|<img src=x>` | c |", "| a | b |\n|---|---|\n| \\`x|\\<img src=x>\\` | c |"),
])
def test_answers_are_shown_without_images_html_or_foreign_links(written: str, shown: str) -> None:
    assert app.safe_markdown(written) == shown


def test_a_citation_marker_the_model_fakes_still_opens_only_in_the_page() -> None:
    citations = [{"n": 1, "note_id": "vault:v/a.md"}]
    shown = app.link_citations(app.safe_markdown("see [1], [1](http://evil.example) and [2]"), citations, 0)
    assert shown == "see [\\[1\\]](#brain-note?id=vault%3Av%2Fa.md&turn=0&n=1), 1 and \\[2\\]"
    in_code = app.link_citations(app.safe_markdown("`v[1]` and\n```\n\\[1\\]\n```\nsee [1]"), citations, 0)
    assert in_code == "`v[1]` and\n```\n\\[1\\]\n```\nsee [\\[1\\]](#brain-note?id=vault%3Av%2Fa.md&turn=0&n=1)"


def test_only_links_to_the_cited_notes_and_their_urls_stay_links() -> None:
    allowed = {"https://status.example.com/incidents/8812", "obsidian://open?vault=v&file=a.md"}
    shown = app.safe_markdown("[状态页](https://status.example.com/incidents/8812) [笔记](obsidian://open?vault=v&file=a.md)"
                              " ![x](https://status.example.com/incidents/8812) https://status.example.com/incidents/8812."
                              " https://status.example.com/incidents/8812/../leak?d=1 [y](https://status.example.com/)",
                              allowed)
    assert shown == ("[状态页](https://status.example.com/incidents/8812) [笔记](obsidian://open?vault=v&file=a.md)"
                     r" \![x](https://status.example.com/incidents/8812)"
                     r" [https\://status.example.com/incidents/8812](https://status.example.com/incidents/8812)."
                     r" https\://status.example.com/incidents/8812/../leak?d=1 y")
    assert app.urls_in("Status: https://status.example.com/incidents/8812. See (https://a.example/b)") == {
        "https://status.example.com/incidents/8812", "https://a.example/b"}


def test_an_llm_answer_links_only_to_urls_in_its_cited_notes(own_home: Path, pages: Callable[..., app.ChatPage],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    reply = ("Timeouts came from the gateway: [status page](https://status.example.com/incidents/8812). "
             "![pixel](http://127.0.0.1:9/leak?d=ERR_CONN_RESET_4471) [details](http://127.0.0.1:9/leak?d=2)")

    with OpenAIDouble([reply]) as double:
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        texts = answers(ask(pages(own_home, obsidian=False), "payment gateway timeout incident ERR_CONN_RESET_4471"))
    answer_part = texts[-1].split("\n\n**Sources**")[0].removeprefix(f"{STRONG}\n\n")
    assert answer_part == (r"Timeouts came from the gateway: "
                           "[status page](https://status.example.com/incidents/8812). \\!pixel details")
    assert not [text for text in texts if "http://127.0.0.1:9" in text], "a streamed piece kept a foreign link"


class RecordingBar:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, progress: Any, **kwargs: Any) -> None:
        self.calls.append(progress)


def test_sync_button_reports_progress_and_refreshes_status(home: Path, make_vault: Any,
                                                           pages: Callable[..., app.ChatPage]) -> None:
    message, _, _ = pages(home).sync(progress=RecordingBar())
    assert message.startswith("⚠️ no sources")

    vault = make_vault({"a.md": "# A\nalpha", "b.md": "# B\nbeta"})
    with (home / "config.toml").open("a", encoding="utf-8") as config:
        config.write(f'\n[[sources]]\nname = "notes"\nkind = "vault"\npath = "{vault}"\n')
    bar = RecordingBar()
    message, status, sources = pages(home).sync(progress=bar)
    assert "notes (vault): 2 added" in message
    assert "**2 notes" in status and "**notes** (vault)" in status and "BM25 (keywords) ✓" in status
    assert sources["choices"] == ["notes"]
    assert bar.calls[0] == (0, bar.calls[-2][1]) and bar.calls[-1] is None


def test_public_bind_needs_a_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BRAIN_UI_USER", raising=False)
    monkeypatch.delenv("BRAIN_UI_PASSWORD", raising=False)
    assert app.ui_auth("127.0.0.1") is None
    with pytest.raises(ConfigError, match="BRAIN_UI_USER and BRAIN_UI_PASSWORD"):
        app.ui_auth("0.0.0.0")
    result = CliRunner().invoke(main, ["--home", str(tmp_path), "serve", "--host", "0.0.0.0", "--port", "7999"])
    assert result.exit_code == EXIT_USAGE
    assert "would put your notes on the network" in result.output

    monkeypatch.setenv("BRAIN_UI_USER", "me")
    monkeypatch.setenv("BRAIN_UI_PASSWORD", "secret")
    assert app.ui_auth("0.0.0.0") == ("me", "secret")


@pytest.fixture
def started(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`started(host, auth, trusted_proxies)` starts the page in this process and returns its URL; stopped after the
    test (the environment variable the page sets for uvicorn is restored)."""
    opened: list[tuple[app.ChatPage, gr.Blocks]] = []
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")  # uvicorn's own default: start_page replaces it

    def start(host: str = "127.0.0.1", auth: tuple[str, str] | None = None, trusted_proxies: tuple[str, ...] = ()
              ) -> str:
        chat = app.ChatPage(Brain(home))
        try:
            blocks, url = app.start_page(chat, host, free_port(), auth, trusted_proxies)
        except BaseException:
            chat.close()
            raise
        opened.append((chat, blocks))
        return url

    yield start
    for chat, blocks in opened:
        blocks.close()
        chat.close()


def test_programs_get_the_structured_answer_and_open_a_note_by_its_bare_id(own_home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """gradio_client against the launched page: `/answer` is `brain ask --json` (citations, relevance, not_found as
    data, not markdown to regex), and `/open_note` takes the note id a citation carries."""
    from gradio_client import Client

    asked = CliRunner().invoke(main, ["--home", str(own_home), "ask", QUESTION, "--json"])
    unknown = CliRunner().invoke(main, ["--home", str(own_home), "ask", "xylophonegiraffe", "-k", "3", "--json"])
    assert asked.exit_code == 0 and unknown.exit_code == 0, asked.output + unknown.output
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
    chat = app.ChatPage(Brain(own_home))
    blocks, url = app.start_page(chat, "127.0.0.1", free_port(), None)
    try:
        client = Client(url, verbose=False, download_files=False)
        answer = client.predict(QUESTION, api_name="/answer")
        assert answer == json.loads(asked.output)
        assert answer["answer_state"] == "found" and answer["citations"][0]["note_id"] == MOVIES
        assert {"n", "note_id", "title", "path", "excerpt", "strength"} <= set(answer["citations"][0])
        nothing = client.predict("xylophonegiraffe", 3, api_name="/answer")
        assert nothing == json.loads(unknown.output) and nothing["not_found"] is True
        with pytest.raises(Exception, match="k must be an integer from 1 to 20"):
            client.predict(QUESTION, 50, api_name="/answer")
        with pytest.raises(Exception, match="date like 2024-03-15"):
            client.predict(QUESTION, 6, [], "", "last week", api_name="/answer")

        note = client.predict(answer["citations"][0]["note_id"], api_name="/open_note")
        assert "《花样年华》" in note and "电影清单" in note
        assert "a note id looks like" in client.predict("../../etc/passwd", api_name="/open_note")
        assert "《花样年华》" in client.predict(app.note_ref(MOVIES), api_name="/open_note")  # the page's links too
    finally:
        blocks.close()
        chat.close()
    assert Brain(own_home).sessions() == []  # the API starts no conversation


def test_the_page_forbids_third_party_images_scripts_and_requests(started: Any) -> None:
    response = httpx.get(started())
    assert response.status_code == 200
    policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
    for directive in ("img-src", "script-src", "connect-src", "default-src", "style-src", "font-src"):
        assert "http" not in policy[directive] and "*" not in policy[directive], directive
        assert policy[directive].startswith("'self'")
    assert "unsafe-eval" not in policy["script-src"]
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
    assert response.headers["referrer-policy"] == "no-referrer"


def test_logins_slow_down_after_five_wrong_passwords(started: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "LOGIN_LOCKOUT_SECONDS", 1.0)
    url = started(auth=("me", "right-password-1"))

    def login(password: str) -> httpx.Response:
        return httpx.post(f"{url}login", data={"username": "me", "password": password})

    assert [login("guess").status_code for _ in range(5)] == [400] * 5
    refused = login("right-password-1")
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "content-security-policy" in refused.headers
    time.sleep(1.1)
    assert login("guess").status_code == 400  # the sixth wrong try: locked again, now for twice as long
    time.sleep(1.1)
    assert login("right-password-1").status_code == 429
    time.sleep(1.0)
    assert login("right-password-1").status_code == 200
    assert [login("guess").status_code for _ in range(5)] == [400] * 5  # a good login starts the count again


def forwarded_login(url: str, password: str, client: str) -> int:
    """A login try that says it is forwarded for `client`; its status."""
    return httpx.post(f"{url}login", data={"username": "me", "password": password},
                      headers={"X-Forwarded-For": client}).status_code


def test_a_new_forwarded_for_header_per_try_does_not_escape_the_lockout(started: Any) -> None:
    """Issue 22 item 5: uvicorn believed X-Forwarded-For from this machine, so each try could be a new client."""
    url = started(auth=("me", "right-password-1"))
    assert [forwarded_login(url, "guess", f"203.0.113.{n}") for n in range(5)] == [400] * 5
    assert forwarded_login(url, "guess", "203.0.113.5") == 429
    assert forwarded_login(url, "right-password-1", "203.0.113.6") == 429  # the address that connected is locked


def test_behind_a_trusted_proxy_each_forwarded_client_is_counted_apart(started: Any) -> None:
    url = started(auth=("me", "right-password-1"), trusted_proxies=("127.0.0.1",))
    assert [forwarded_login(url, "guess", "203.0.113.7") for _ in range(5)] == [400] * 5
    assert forwarded_login(url, "guess", "203.0.113.7") == 429
    assert forwarded_login(url, "guess", "198.51.100.1, 203.0.113.8") == 400  # the proxy's own append is the client
    assert forwarded_login(url, "right-password-1", "203.0.113.9") == 200


def test_a_burst_of_parallel_guesses_gets_no_more_tries(started: Any) -> None:
    url = started(auth=("me", "right-password-1"))
    codes: list[int] = []

    def guess() -> None:
        codes.append(httpx.post(f"{url}login", data={"username": "me", "password": "guess"}).status_code)

    threads = [threading.Thread(target=guess) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes) == [400] * 5 + [429] * 15


def test_the_page_binds_ipv6_loopback(started: Any) -> None:
    url = started("::1")
    assert url.startswith("http://[::1]:")
    assert httpx.get(url).status_code == 200
    assert app.ui_auth("::1") is None and app.ui_auth("[::1]") is None


@pytest.mark.parametrize(("host", "reason"), [("192.0.2.1", "Cannot assign requested address"),
                                              ("no-such-host.invalid", "Name or service not known")])
def test_an_address_that_cannot_be_bound_is_one_line(started: Any, host: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        started(host, auth=("me", "right-password-1"))
    assert str(refused.value).startswith(f"cannot listen on {host} port ") and str(refused.value).endswith(reason)
    assert "\n" not in str(refused.value)


def test_brain_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["--home", str(tmp_path), "serve", "--port", str(port)])
    assert result.exit_code == EXIT_USAGE
    assert result.output.strip() == f"brain: cannot listen on 127.0.0.1 port {port}: Address already in use"


def test_python_app_py_serves_the_page(home: Path, tmp_path: Path) -> None:
    """The Hugging Face Spaces way: `python app.py`, configured by the environment, started from anywhere."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (*NO_LLM, "BRAIN_UI_USER", "BRAIN_UI_PASSWORD")} | {
        "BRAIN_HOME": str(home), "GRADIO_SERVER_PORT": str(port)}
    server = subprocess.Popen([sys.executable, str(REPO / "app.py")], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    announced = f"brain: chat page on http://127.0.0.1:{port}/"
    seen: list[str] = []
    watchdog = threading.Timer(120, server.kill)  # a server that hangs silently ends the read below
    watchdog.start()
    try:
        assert server.stdout is not None
        for line in server.stdout:  # the announcement comes once the page answers; a dead server ends the loop
            seen.append(line)
            if announced in line:
                break
        else:
            pytest.fail(f"python app.py did not announce the page: {''.join(seen)}")
        response = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert response.status_code == 200 and "content-security-policy" in response.headers
    finally:
        watchdog.cancel()
        stop(server)

    refused = subprocess.run([sys.executable, str(REPO / "app.py")], cwd=tmp_path, capture_output=True, text=True,
                             env=env | {"GRADIO_SERVER_NAME": "0.0.0.0"}, timeout=120)
    assert refused.returncode == 2 and "BRAIN_UI_USER and BRAIN_UI_PASSWORD" in refused.stderr


def test_a_source_found_through_another_ones_link_says_so() -> None:
    note = {"n": 1, "note_id": "vault:v/incident.md", "title": "Incident", "path": "incident.md", "excerpt": "",
            "strength": "strong", "linked_from": "周会纪要 *2024*"}
    head = app.sources_markdown([note], {1}, obsidian=False, excerpts=False, turn=0).splitlines()[2]
    assert head.endswith(rf"{STRONG} · linked from 周会纪要 \*2024\*")


def test_filters_no_note_matches_get_no_relevance_badge() -> None:
    """Nothing was searched: the answer names the filters, and no "not in your notes" badge says otherwise."""
    turn = {"mode": "not_found", "citations": [], "coverage": {"not_found": True, "no_note_matches_filters": True}}
    assert app.answer_strength(turn) is None


def test_a_not_sure_answers_possible_matches_are_quoted_once() -> None:
    """An extractive not-sure answer quotes each possible match's passage itself: the sources under it list them
    without their excerpts again; a not-found answer lists titles only, so its leads keep their excerpts."""
    lead = {"n": 1, "note_id": "vault:v/hangzhou.md", "title": "Hangzhou", "path": "hangzhou.md",
            "excerpt": "Bought a small tin for my parents.", "strength": "weak"}
    unsure = app.sources_markdown([lead], set(), obsidian=False, excerpts=False, turn=0, leads=True, unsure=True)
    missing = app.sources_markdown([lead], set(), obsidian=False, excerpts=False, turn=0, leads=True)
    assert "Possible matches" in unsure and "Bought a small tin" not in unsure
    assert "Nearest leads" in missing and "Bought a small tin" in missing
