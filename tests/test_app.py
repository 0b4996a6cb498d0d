"""The chat page's handlers called as Gradio calls them: streaming, citation links, sync, related notes, bind rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from click.testing import CliRunner

import app
from rag_app.cli import EXIT_USAGE, main
from rag_app.engine import Brain, ConfigError
from tests.doubles.openai_server import OpenAIDouble

QUESTION = "我想看哪些电影？"
MOVIES_LINK = app.obsidian_url("sample_vault", "生活/电影清单.md")


def ask(page: app.ChatPage, question: str = QUESTION, **filters: Any) -> list[tuple[str, Any]]:
    options = {"sources": [], "tags": "", "since": "", "until": ""} | filters
    return list(page.chat(question, [], options["sources"], options["tags"], options["since"], options["until"]))


def assert_cumulative(texts: list[str]) -> None:
    """Every streamed message extends the one before: Gradio replaces the bubble with each yield."""
    for before, after in zip(texts, texts[1:], strict=False):
        assert after.startswith(before), (before, after)


@pytest.fixture
def page(sample_brain: Brain) -> Iterator[app.ChatPage]:
    """Obsidian links on, as `[serve] obsidian = true` would set them."""
    chat = app.ChatPage(sample_brain, obsidian=True)
    yield chat
    chat.close()


def test_page_builds_with_every_panel(page: app.ChatPage) -> None:
    blocks = page.build()
    assert isinstance(blocks, gr.Blocks)
    labels = {getattr(block, "label", None) for block in blocks.blocks.values()}
    assert {"Sources", "Tags", "Since", "Until", "Cited note", "Answers from your notes"} <= labels
    assert r"**sample\_vault** (vault): 41 notes" in page.status()


def test_extractive_answer_streams_then_ends_with_citation_links(page: app.ChatPage) -> None:
    outputs = ask(page)
    texts = [text for text, _ in outputs]
    assert_cumulative(texts)
    final, cited = outputs[-1]
    assert final.startswith("Extractive answer")
    assert f"[电影清单]({MOVIES_LINK})" in final.split("**Sources**")[1]
    assert "vault:sample_vault/生活/电影清单.md" in cited["choices"]

    related = page.related(cited["value"])
    assert related.startswith("**Related to") and "obsidian://open?vault=sample_vault" in related


def test_llm_answer_streams_the_models_text(sample_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reply = "你想看《花样年华》和《一一》[1]，都记在电影清单里。"

    def answer(body: dict[str, Any]) -> str:
        return reply if body.get("stream") else "1. 电影 想看"  # the non-streamed call asks for query variants

    with OpenAIDouble([answer]) as double:
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        chat = app.ChatPage(Brain(sample_home), obsidian=False)
        try:
            texts = [text for text, _ in ask(chat)]
        finally:
            chat.close()
    assert_cumulative(texts)
    assert len(texts) > 2, "the answer arrived in one piece, not streamed"
    assert reply in texts[:-1]
    assert texts[-1].startswith(reply + "\n\n**Sources**")
    assert "**电影清单** — 生活/电影清单\\.md" in texts[-1]


def test_bad_filter_is_shown_not_raised(page: app.ChatPage) -> None:
    shown = ask(page, since="last spring")[-1][0]
    assert shown.startswith("⚠️") and "must be a date" in shown


def test_citation_links_per_source_kind() -> None:
    memo = {"n": 1, "note_id": "memos:abc", "title": "[draft] a (b)", "url": "https://m.example/m/abc",
            "excerpt": "x", "strength": "strong"}
    note = {"n": 2, "note_id": "vault:My Notes/a b/c.md", "title": "C", "path": "a b/c.md", "excerpt": "",
            "strength": "weak"}
    assert app.note_link(memo, obsidian=False) == r"[\[draft\] a \(b\)](https://m.example/m/abc)"
    assert app.note_link(note, obsidian=False) == r"**C** — a b/c\.md"
    assert app.note_link(note, obsidian=True) == r"[C](obsidian://open?vault=My%20Notes&file=a%20b%2Fc.md) — a b/c\.md"
    shown = app.citations_markdown([memo, note], obsidian=False, excerpts=True)
    assert shown.splitlines()[2:] == [f"1. {app.note_link(memo, False)} · strong", "   x",
                                      f"2. {app.note_link(note, False)} · weak"]


class RecordingBar:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, progress: Any, **kwargs: Any) -> None:
        self.calls.append(progress)


def test_sync_button_reports_progress_and_refreshes_status(home: Path, make_vault: Any) -> None:
    message, _, _ = app.ChatPage(Brain(home)).sync(progress=RecordingBar())
    assert message.startswith("⚠️ no sources")

    vault = make_vault({"a.md": "# A\nalpha", "b.md": "# B\nbeta"})
    with (home / "config.toml").open("a", encoding="utf-8") as config:
        config.write(f'\n[[sources]]\nname = "notes"\nkind = "vault"\npath = "{vault}"\n')
    bar = RecordingBar()
    message, status, sources = app.ChatPage(Brain(home)).sync(progress=bar)
    assert "notes (vault): 2 added" in message
    assert "**2 notes" in status and "**notes** (vault)" in status
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
