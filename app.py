"""The chat page (`brain serve`): a Gradio shell over the engine. Asking, searching and syncing live in the engine;
this file only wires them to widgets and turns citations into links."""

from __future__ import annotations

import contextvars
import ipaddress
import math
import os
import queue
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # local-first: the page never reports usage (read at import)

import gradio as gr  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.types import ASGIApp, Message, Receive, Scope, Send  # noqa: E402

from rag_app.engine import Brain, ConfigError, NoteNotFound, SearchError, SourceReport, SyncBusyError  # noqa: E402

EXCERPT_CHARS = 160
QUESTION_PLACEHOLDER = "问你的笔记 / Ask your notes — e.g. 我想看哪些电影？"
LOGIN_FREE_TRIES = 5  # wrong passwords a client may try before it has to wait
LOGIN_LOCKOUT_SECONDS = 30.0  # the first wait; it doubles with every further wrong try
LOGIN_MAX_LOCKOUT_SECONDS = 900.0
LOGIN_CLIENTS = 10_000  # clients remembered (the oldest are forgotten first)
# The page loads only its own assets: an image, script or request to any other host is refused by the browser even if
# something slipped through the answer's sanitising. Gradio's page needs inline scripts and styles, data: fonts and
# blob: workers.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'", "script-src 'self' 'unsafe-inline'", "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'", "media-src 'self' blob:",
    "worker-src 'self' blob:", "frame-src 'none'", "object-src 'none'", "base-uri 'self'", "form-action 'self'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = [(b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"referrer-policy", b"no-referrer"), (b"x-content-type-options", b"nosniff")]
T = TypeVar("T")


def is_loopback(host: str) -> bool:
    bare = host.strip("[]")
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def ui_auth(host: str) -> tuple[str, str] | None:
    """Off this machine the page shows every note to whoever connects: refuse to listen there without a login.

    Both variables set turn the login on for any host, this machine included."""
    user, password = os.environ.get("BRAIN_UI_USER", ""), os.environ.get("BRAIN_UI_PASSWORD", "")
    if user and password:
        return user, password
    if is_loopback(host):
        return None
    raise ConfigError(
        f"--host {host} would put your notes on the network: set BRAIN_UI_USER and BRAIN_UI_PASSWORD to require "
        "a login, or keep the default --host 127.0.0.1"
    )


def escape_markdown(text: str) -> str:
    """Titles, paths and excerpts are note data: show them literally, never as markup or links."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$])", r"\\\1", " ".join(text.split()))


# A URL as the page links it: http(s) or obsidian, and none of the characters that could end a markdown link.
_LINKABLE = re.compile(r"(?:https?|obsidian)://[^\s<>\[\]()\"'`\\]+", re.IGNORECASE)
_TRAILING = ".,;:!?'\")）。，、；：！？」』"
# An inline markdown link or image the LLM wrote: [label](url) or [label](<url> "title").
_MD_LINK = re.compile(r"(!?)\[([^\[\]\n]{0,500})\]\(\s*<?([^\s<>()]{1,2000}?)>?(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'))?\s*\)")
_BARE_URL = re.compile(r"(?:https?|ftp)://[^\s<>\[\]()\"'`\\]+", re.IGNORECASE)


def obsidian_url(vault: str, path: str) -> str:
    return f"obsidian://open?vault={quote(vault, safe='')}&file={quote(path, safe='')}"


def note_href(note: dict[str, Any], obsidian: bool) -> str | None:
    """Where a note's link points: its memo page (http or https only), or Obsidian for a vault note when allowed."""
    url = str(note.get("url") or "")
    if url:
        url = quote(url, safe=":/?#@!$&*+,;=%~")
        return url if _LINKABLE.fullmatch(url) and url.lower().startswith(("http://", "https://")) else None
    path = str(note.get("path") or "")
    if obsidian and path and note["note_id"].startswith("vault:"):
        return obsidian_url(note["note_id"].removeprefix("vault:").split("/", 1)[0], path)
    return None


def note_link(note: dict[str, Any], obsidian: bool) -> str:
    """A memo links to its web page; a vault note shows its path, linked into Obsidian when the config allows."""
    title = escape_markdown(str(note.get("title") or note["note_id"]))
    href = note_href(note, obsidian)
    path = "" if note.get("url") else str(note.get("path") or "")
    where = f" — {escape_markdown(path)}" if path else ""
    return f"[{title}]({href}){where}" if href else f"**{title}**{where}"


def urls_in(text: str) -> set[str]:
    """The http(s) URLs written in a note: the only web addresses an answer about it may link to."""
    return {url.rstrip(_TRAILING) for url in _LINKABLE.findall(text) if url.lower().startswith(("http:", "https:"))}


def safe_markdown(text: str, allowed: Iterable[str] = ()) -> str:
    """LLM (or note) text as markdown the page can show without the browser fetching anything.

    No image and no raw HTML survives (every `[`, `]`, `!`, `<` and backslash is escaped, which also disarms
    reference links and footnotes; inside code the escapes show). A link, written as markdown or bare, stays a link
    only if its URL is in `allowed` (the cited notes' own links and the URLs written in them), else its label stays
    as plain text. Bare URLs, www. and e-mail addresses are kept from being auto-linked. Headings, lists and
    emphasis still render."""
    allowed = frozenset(allowed)
    out: list[str] = []
    pos = 0
    for match in _MD_LINK.finditer(text):
        bang, label, url = match.groups()
        out.append(_inert(text[pos:match.start()], allowed))
        if url in allowed and _LINKABLE.fullmatch(url):  # an image of it becomes a link: `!` is escaped
            out.append(f"{_escape_inline(bang)}[{_inert(label, frozenset())}]({url})")
        else:
            out.append(_inert(bang + label, allowed))
        pos = match.end()
    out.append(_inert(text[pos:], allowed))
    return "".join(out)


def _inert(text: str, allowed: frozenset[str]) -> str:
    """Plain text as markdown that renders the same words and can form no link, image or HTML; a bare URL in
    `allowed` becomes an explicit link."""
    out: list[str] = []
    pos = 0
    for match in _BARE_URL.finditer(text):
        url = match.group(0).rstrip(_TRAILING)
        if url in allowed and _LINKABLE.fullmatch(url):
            out += [_escape_inline(text[pos:match.start()]), f"[{_escape_inline(url)}]({url})"]
            pos = match.start() + len(url)
    out.append(_escape_inline(text[pos:]))
    return "".join(out)


def _escape_inline(text: str) -> str:
    text = re.sub(r"[\\\[\]<!]", r"\\\g<0>", text)
    text = re.sub(r"(?i)(https?|ftp):(?=//)", r"\1\\:", text)  # no autolink: http\://…
    text = re.sub(r"(?i)(www)\.", r"\1\\.", text)
    return re.sub(r"(?<=[\w.+-])@(?=[\w-]+\.)", r"\\@", text)


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
            yield safe_markdown(text), gr.skip()
        try:
            response = future.result().to_dict()
        except (SearchError, ConfigError) as exc:
            yield f"⚠️ {safe_markdown(str(exc))}", gr.skip()
            return
        final = safe_markdown(response["answer"], self._run(self.allowed_links, response["citations"]))
        if response["coverage"].get("llm_error"):
            final += f"\n\n_The LLM failed ({escape_markdown(response['coverage']['llm_error'])}): passages shown._"
        if response["citations"]:
            final += "\n\n" + citations_markdown(response["citations"], self.obsidian, response["mode"] == "llm")
        cited = [c["note_id"] for c in response["citations"]]
        yield final, gr.update(choices=cited, value=cited[0] if cited else None)

    def allowed_links(self, citations: list[dict[str, Any]]) -> set[str]:
        """The URLs an answer may link to: each cited note's own link and the http(s) URLs written in it."""
        allowed: set[str] = set()
        for citation in citations:
            href = note_href(citation, self.obsidian)
            if href:
                allowed.add(href)
            try:
                allowed |= urls_in(self.brain.get_note(citation["note_id"])["text"])
            except (NoteNotFound, SearchError):
                continue  # deleted since the search: its URLs are simply not linkable
        return allowed

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
                        # LaTeX off (KaTeX could link); answers arrive sanitised (safe_markdown), and Gradio's
                        # own HTML sanitiser stays on with no custom tags let through.
                        chatbot=gr.Chatbot(label="Answers from your notes", height=620, latex_delimiters=[],
                                           sanitize_html=True, allow_tags=False),
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


class PageGuard:
    """ASGI middleware around the page: security headers on every response, and a brake on password guessing.

    After LOGIN_FREE_TRIES wrong logins a client (by address) must wait `lockout` seconds (429 with Retry-After),
    twice as long after each further wrong one, up to LOGIN_MAX_LOCKOUT_SECONDS. A good login clears its count. A
    try counts when it starts, so a burst of parallel guesses gets no more tries than a sequence."""

    def __init__(self, app: ASGIApp, free_tries: int = LOGIN_FREE_TRIES, lockout: float = LOGIN_LOCKOUT_SECONDS):
        self.app = app
        self.free_tries = free_tries
        self.lockout = lockout
        self._clients: dict[str, tuple[int, float]] = {}  # address -> (tries since the last good login, locked until)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def send_guarded(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        if scope["method"] != "POST" or not scope["path"].rstrip("/").endswith("/login"):
            await self.app(scope, receive, send_guarded)
            return
        client = str((scope.get("client") or ("unknown",))[0])
        now = time.monotonic()
        tries, locked_until = self._clients.pop(client, (0, 0.0))
        if now < locked_until:
            self._clients[client] = (tries, locked_until)
            wait = math.ceil(locked_until - now)
            refused = JSONResponse({"detail": f"Too many wrong logins: try again in {wait} s."}, status_code=429,
                                   headers={"Retry-After": str(wait)})
            await refused(scope, receive, send_guarded)
            return
        tries += 1
        over = tries - self.free_tries
        self._clients[client] = (tries, now + min(self.lockout * 2 ** over, LOGIN_MAX_LOCKOUT_SECONDS)
                                 if over >= 0 else 0.0)
        while len(self._clients) > LOGIN_CLIENTS:
            del self._clients[next(iter(self._clients))]
        await self.app(scope, receive, send_guarded)
        if status == 200:
            self._clients.pop(client, None)


def start_page(chat: ChatPage, host: str, port: int, auth: tuple[str, str] | None) -> tuple[gr.Blocks, str]:
    """Build and start the page without blocking; returns it and its URL. An IPv6 address is bracketed the way
    Gradio expects; a host or port that cannot be bound is a ConfigError of one line."""
    bare = host.strip("[]")
    _check_bindable(host, port)
    page = chat.build()
    guard = Middleware(PageGuard, free_tries=LOGIN_FREE_TRIES, lockout=LOGIN_LOCKOUT_SECONDS)
    try:
        _, url, _ = page.launch(server_name=f"[{bare}]" if ":" in bare else bare, server_port=port, auth=auth,
                                share=False, ssr_mode=False, quiet=True, prevent_thread_lock=True,
                                app_kwargs={"middleware": [guard]})
    except (OSError, ValueError) as exc:
        page.close()
        reason = " ".join(str(exc).split(". ")[0].split())
        raise ConfigError(f"cannot listen on {host} port {port}: {reason}") from None
    return page, url


def _check_bindable(host: str, port: int) -> None:
    """Bind once ourselves: Gradio would report any failure as "Cannot find empty port" after uvicorn's own log."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None


def serve(brain: Brain, host: str = "127.0.0.1", port: int = 7860) -> None:
    """Start the page and block until Ctrl+C; refuses a non-local host without a login (see ui_auth)."""
    auth = ui_auth(host)
    chat = ChatPage(brain)
    try:
        page, url = start_page(chat, host, port, auth)
        print(f"brain: chat page on {url} (Ctrl+C stops it)", flush=True)
        page.block_thread()
    finally:
        chat.close()
