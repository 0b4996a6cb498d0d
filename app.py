"""The chat page (`brain serve`): a Gradio shell over the engine. Asking, searching and syncing live in the engine;
this file only wires them to widgets and turns citations into links."""

from __future__ import annotations

import contextvars
import os
import queue
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # local-first: the page never reports usage (read at import)

import gradio as gr  # noqa: E402

from rag_app.engine import Brain, ConfigError, NoteNotFound, SearchError, SourceReport, SyncBusyError  # noqa: E402

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
EXCERPT_CHARS = 160
QUESTION_PLACEHOLDER = "问你的笔记 / Ask your notes — e.g. 我想看哪些电影？"
T = TypeVar("T")


def ui_auth(host: str) -> tuple[str, str] | None:
    """Off this machine the page shows every note to whoever connects: refuse to listen there without a login.

    Both variables set turn the login on for any host, this machine included."""
    user, password = os.environ.get("BRAIN_UI_USER", ""), os.environ.get("BRAIN_UI_PASSWORD", "")
    if user and password:
        return user, password
    if host in LOCAL_HOSTS:
        return None
    raise ConfigError(
        f"--host {host} would put your notes on the network: set BRAIN_UI_USER and BRAIN_UI_PASSWORD to require "
        "a login, or keep the default --host 127.0.0.1"
    )


def escape_markdown(text: str) -> str:
    """Titles, paths and excerpts are note data: show them literally, never as markup or links."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$])", r"\\\1", " ".join(text.split()))


def obsidian_url(vault: str, path: str) -> str:
    return f"obsidian://open?vault={quote(vault, safe='')}&file={quote(path, safe='')}"


def note_link(note: dict[str, Any], obsidian: bool) -> str:
    """A memo links to its web page; a vault note shows its path, linked into Obsidian when the config allows."""
    title = escape_markdown(str(note.get("title") or note["note_id"]))
    if note.get("url"):
        return f"[{title}]({quote(note['url'], safe=':/?#@!$&*+,;=%~')})"
    path = str(note.get("path") or "")
    where = f" — {escape_markdown(path)}" if path else ""
    if obsidian and path and note["note_id"].startswith("vault:"):
        vault = note["note_id"].removeprefix("vault:").split("/", 1)[0]
        return f"[{title}]({obsidian_url(vault, path)}){where}"
    return f"**{title}**{where}"


def citations_markdown(citations: list[dict[str, Any]], obsidian: bool, excerpts: bool) -> str:
    """The numbered sources under an answer; `excerpts` off when the answer already quotes them (extractive)."""
    lines = ["**Sources**", ""]
    for citation in citations:
        lines.append(f"{citation['n']}. {note_link(citation, obsidian)} · {citation['strength']}")
        excerpt = " ".join(str(citation.get("excerpt") or "").split())
        if excerpts and excerpt:
            lines.append(f"   {escape_markdown(excerpt[:EXCERPT_CHARS])}{'…' if len(excerpt) > EXCERPT_CHARS else ''}")
    return "\n".join(lines)


def status_markdown(status: dict[str, Any]) -> str:
    lines = [f"**{status['notes']} notes, {status['chunks']} chunks** · model `{status['embedding_model']}`", ""]
    if not status["sources"]:
        return "\n".join([*lines, "Nothing indexed yet: add sources, then press Sync."])
    for src in status["sources"]:
        error = (src["last_result"] or {}).get("error")
        lines.append(f"- **{escape_markdown(src['name'])}** ({src['kind']}): {src['notes']} notes, {src['chunks']} "
                     f"chunks, last sync {src['last_sync'] or 'never'}"
                     + (f" — failed: {escape_markdown(str(error))}" if error else ""))
    return "\n".join(lines)


def split_tags(text: str) -> tuple[str, ...]:
    return tuple(tag for tag in re.split(r"[,\s]+", text or "") if tag)


class PageProgress:
    """The engine's Progress protocol drawn on the page's progress bar."""

    def __init__(self, bar: Callable[..., Any]):
        self._bar = bar
        self._total = self._done = 0
        self._description = ""

    def start(self, total: int, description: str) -> None:
        self._total, self._done, self._description = total, 0, description
        self._bar((0, total), desc=description, unit="chunks")

    def advance(self, count: int) -> None:
        self._done += count
        self._bar((self._done, self._total), desc=self._description, unit="chunks")

    def close(self) -> None:
        self._bar(None)


class ChatPage:
    """The page's handlers over one Brain."""

    def __init__(self, brain: Brain, obsidian: bool | None = None):
        self.brain = brain
        self.obsidian = bool(brain.settings.serve.get("obsidian", False)) if obsidian is None else obsidian
        # One worker runs engine calls: answers stream from it while the page yields; a sync never overlaps a question.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brain")

    def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the Brain's thread, keeping Gradio's context so progress bars still reach this request."""
        return self._worker.submit(contextvars.copy_context().run, fn, *args, **kwargs).result()

    def close(self) -> None:
        """Close the Brain on its own thread (SQLite insists), then stop that thread."""
        self._run(self.brain.close)
        self._worker.shutdown()

    def chat(self, message: str, history: list[dict[str, Any]], sources: list[str] | None, tags: str, since: str,
             until: str) -> Iterator[tuple[str, Any]]:
        """Stream the answer as it is written (cumulative text), then add the citations as links.

        Each question stands alone (the engine answers from the notes, not from `history`). The second value fills
        the "cited notes" dropdown for the related-notes view."""
        tokens: queue.Queue[str | None] = queue.Queue()
        future = self._worker.submit(
            self.brain.ask, message, sources=tuple(sources or ()), tags=split_tags(tags), since=since or None,
            until=until or None, on_token=tokens.put,
        )
        future.add_done_callback(lambda _: tokens.put(None))
        text = ""
        while (piece := tokens.get()) is not None:
            text += piece
            yield text, gr.skip()
        try:
            response = future.result().to_dict()
        except (SearchError, ConfigError) as exc:
            yield f"⚠️ {exc}", gr.skip()
            return
        final = response["answer"]
        if response["coverage"].get("llm_error"):
            final += f"\n\n_The LLM failed ({escape_markdown(response['coverage']['llm_error'])}): passages shown._"
        if response["citations"]:
            final += "\n\n" + citations_markdown(response["citations"], self.obsidian, response["mode"] == "llm")
        cited = [c["note_id"] for c in response["citations"]]
        yield final, gr.update(choices=cited, value=cited[0] if cited else None)

    def related(self, note_id: str | None) -> str:
        if not note_id:
            return "Ask a question first, then pick one of its cited notes."
        try:
            data = self._run(self.brain.related, note_id)
        except (NoteNotFound, SearchError) as exc:
            return f"⚠️ {exc}"
        lines = [f"**Related to {escape_markdown(str(data['title'] or note_id))}**", ""]
        for note in data["links"] + data["similar"]:
            lines.append(f"- {note_link(note, self.obsidian)} · {note['relation']}")
        if len(lines) == 2:
            lines.append("No linked or similar notes.")
        return "\n".join(lines)

    def status(self) -> str:
        """Read on every call: the manifest is cheap to open, and a sync from the CLI shows up too."""
        return status_markdown(self.brain.status())

    def source_choices(self) -> list[str]:
        return [src["name"] for src in self.brain.status()["sources"]]

    def sync(self, progress: gr.Progress = gr.Progress()) -> tuple[str, str, Any]:  # noqa: B008
        """Sync every known source (a `gr.Progress()` default is how Gradio knows to draw a progress bar).

        Returns the outcome, the new status and the refreshed source filter."""
        lines: list[str] = []

        def on_source(result: SourceReport) -> None:
            head = f"- {escape_markdown(result.name)} ({result.kind}): "
            lines.append(head + (f"failed, nothing changed — {escape_markdown(str(result.error))}" if result.failed
                                 else f"{result.added} added, {result.updated} updated, {result.deleted} deleted, "
                                 f"{result.unchanged} unchanged"))

        try:
            report = self._run(self.brain.sync, progress=PageProgress(progress), on_source=on_source)
        except (ConfigError, SyncBusyError) as exc:
            lines.append(f"⚠️ {exc}")
        else:
            lines.insert(0, f"Synced in {report.seconds:.1f} s: {report.embedded_chunks} chunks embedded, "
                            f"{report.deleted_chunks} removed.")
        return "\n".join(lines), self.status(), gr.update(choices=self.source_choices())

    def build(self) -> gr.Blocks:
        with gr.Blocks(title="cflow-brain") as page:
            with gr.Row():
                with gr.Column(scale=1, min_width=280):
                    gr.Markdown("## cflow-brain")
                    with gr.Accordion("Filters", open=True):
                        sources = gr.Dropdown(self.source_choices(), multiselect=True, label="Sources",
                                              info="Empty: all sources.")
                        tags = gr.Textbox(label="Tags", placeholder="reading, 电影")
                        since = gr.Textbox(label="Since", placeholder="YYYY-MM-DD")
                        until = gr.Textbox(label="Until", placeholder="YYYY-MM-DD")
                    with gr.Accordion("Status", open=True):
                        status = gr.Markdown()
                        sync_button = gr.Button("Sync now")
                        sync_result = gr.Markdown()
                    with gr.Accordion("Related notes", open=True):
                        cited = gr.Dropdown([], label="Cited note", allow_custom_value=True)
                        related_button = gr.Button("Show related notes")
                        related = gr.Markdown()
                with gr.Column(scale=3):
                    gr.ChatInterface(
                        self.chat,
                        chatbot=gr.Chatbot(label="Answers from your notes", height=620),
                        textbox=gr.Textbox(placeholder=QUESTION_PLACEHOLDER, submit_btn=True, stop_btn=True,
                                           elem_id="question"),
                        additional_inputs=[sources, tags, since, until],
                        additional_outputs=[cited],
                        flagging_mode="never",
                    )
            page.load(self.status, outputs=status)
            sync_button.click(self.sync, outputs=[sync_result, status, sources])
            related_button.click(self.related, inputs=cited, outputs=related)
        return page


def serve(brain: Brain, host: str = "127.0.0.1", port: int = 7860) -> None:
    """Start the page and block until Ctrl+C; refuses a non-local host without a login (see ui_auth)."""
    auth = ui_auth(host)
    chat = ChatPage(brain)
    page = chat.build()
    try:
        _, url, _ = page.launch(server_name=host, server_port=port, auth=auth, share=False, ssr_mode=False,
                                quiet=True, prevent_thread_lock=True)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from None
    print(f"brain: chat page on {url} (Ctrl+C stops it)", flush=True)
    try:
        page.block_thread()
    finally:
        chat.close()
