"""The chat page (`brain serve`): a Gradio shell over the engine. Asking, conversations, search and sync live in the
engine; this module wires them to widgets, renders answers and notes safely, and turns citations into links that
open the note in the page."""

from __future__ import annotations

import contextvars
import datetime as dt
import gc
import html
import ipaddress
import math
import os
import queue
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # local-first: the page never reports usage (read at import)

import gradio as gr  # noqa: E402
from markdown_it import MarkdownIt  # noqa: E402
from markdown_it.rules_inline import StateInline  # noqa: E402
from markdown_it.token import Token  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.types import ASGIApp, Message, Receive, Scope, Send  # noqa: E402

from rag_app.answers.answer import cited_numbers, excerpt_markdown  # noqa: E402
from rag_app.answers.code_spans import Part, render, split_code  # noqa: E402
from rag_app.answers.search_notes import search_notes  # noqa: E402
from rag_app.engine import (  # noqa: E402
    Brain,
    ConfigError,
    NoteNotFound,
    SearchError,
    SessionNotFound,
    SourceReport,
    StopRequested,
    SyncBusyError,
    stop_on_signals,
    time_left,
)
from readers.markdown_syntax import WIKILINK, wikilink_shown  # noqa: E402

EXCERPT_CHARS = 160
QUESTION_PLACEHOLDER = "问你的笔记 / Ask your notes — e.g. 我想看哪些电影？"
NOTE_HINT = "<p class='brain-note-hint'>Click a [n] marker or a source under an answer to read the note here.</p>"
ANSWER_MAX_K = 20  # as `brain ask -k`
NOTE_REF = "#brain-note?"  # in-page links: the page's script opens them in the note panel, the browser never follows
LOGIN_FREE_TRIES = 5  # wrong passwords a client may try before it has to wait
LOGIN_LOCKOUT_SECONDS = 30.0  # the first wait; it doubles with every further wrong try
LOGIN_MAX_LOCKOUT_SECONDS = 900.0
LOGIN_CLIENTS = 10_000  # clients remembered (the oldest are forgotten first)
PAGE_TURNS = 50  # turns a conversation shows at first, and how many more each "earlier turns" press adds
TABS_REMEMBERED = 10_000  # open tabs whose conversation the server keeps (the oldest are forgotten first)
STATUS_SECONDS = 5.0  # the status panel re-reads the manifest this often (a sync from the CLI shows up too)
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
# A click on an in-page link (a citation, a source, a note's link) hands its reference to a hidden textbox and presses
# a hidden button: the note opens in the panel without leaving the page or the conversation. The page evaluates no
# script strings (the policy has no 'unsafe-eval'): no `js=` on events and no gr.HTML, whose templates are eval'd.
PAGE_HEAD = """<script>
const BRAIN_LINKS = {"#brain-note?": ["note-request", "note-open"], "#brain-conv?": ["conv-request", "conv-open"]};
let brainNoteAsks = 0, brainNoteWait = 0;
document.addEventListener("click", (event) => {
  const link = event.target instanceof Element ? event.target.closest('a[href^="#brain-"]') : null;
  const href = link ? link.getAttribute("href") : "";
  const prefix = Object.keys(BRAIN_LINKS).find((p) => href.startsWith(p));
  if (!prefix) return;
  event.preventDefault();
  event.stopPropagation();
  const [boxId, buttonId] = BRAIN_LINKS[prefix];
  const box = document.querySelector(`#${boxId} textarea, #${boxId} input`);
  const button = document.getElementById(buttonId);
  if (!box || !button) return;
  // A note request is numbered and its answer carries the number: the note asked for is the one whose answer is in
  // (not Gradio's loading overlay, which a slow machine shows first, nor the note already on screen, which a
  // second click on the same citation leaves as it is).
  const asked = prefix === "#brain-note?" ? String(brainNoteAsks += 1) : "";
  box.value = href.slice(1) + (asked && `&ask=${asked}`);
  box.dispatchEvent(new Event("input", {bubbles: true}));
  button.click();
  if (!asked) return;
  clearInterval(brainNoteWait);  // only the note asked for last is brought into view (not one asked for before it)
  let waited = 0;
  const shown = brainNoteWait = setInterval(() => {  // once the note is in, show its cited passage; a request never
    const arrived = document.querySelector(`#note-view .brain-ask-${asked}`);  // answered (an error) scrolls nowhere
    if (arrived || (waited += 100) > 20000) {
      clearInterval(shown);
      const target = document.getElementById("brain-hit") || document.getElementById("note-view");
      if (arrived && target) target.scrollIntoView({block: "center"});
    }
  }, 100);
}, true);
// The chat never jumps to the end of an answer: a new question (asked, or the last one of a conversation opened) is
// brought to the top of the chat as soon as there is room, and the answer streams in below it. Scrolling by hand
// ends that until the next question.
let brainAsked = {count: 0, first: null, last: null};
let brainPinned = false;
function brainScroller(element, chat) {
  let box = element.parentElement;
  while (box && box !== chat && !(box.scrollHeight > box.clientHeight + 1 &&
         ["auto", "scroll"].includes(getComputedStyle(box).overflowY))) box = box.parentElement;
  return box && box !== chat ? box : null;
}
new MutationObserver(() => {
  const chat = document.getElementById("chat");
  const questions = chat ? [...chat.querySelectorAll("[data-testid='user']")] : [];
  const now = {count: questions.length, first: questions.length ? questions[0].textContent : null,
               last: questions.length ? questions[questions.length - 1].textContent : null};
  const before = brainAsked;
  if (now.count !== before.count || now.first !== before.first || now.last !== before.last) {
    brainAsked = now;
    const earlier = now.last === before.last && now.count > before.count && now.first !== before.first;
    if (!earlier) brainPinned = now.count > 0;  // earlier turns put above: the reader stays where they were
  }
  if (!brainPinned || !questions.length) return;
  const last = questions[questions.length - 1];
  const box = brainScroller(last, chat);
  if (!box) return;
  const below = last.getBoundingClientRect().top - box.getBoundingClientRect().top - 8;
  if (below > 1) box.scrollTop += below;  // only ever down to the question, never past it
}).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
// On a phone the conversations are a drawer: closed when the page opens, and closed again once one is picked.
const brainNarrow = window.matchMedia("(max-width: 768px)");
function brainCloseDrawer() {
  const sidebar = document.getElementById("sidebar");
  if (brainNarrow.matches && sidebar && sidebar.classList.contains("open")) {
    sidebar.querySelector(".toggle-button")?.click();
  }
}
let brainDrawerTries = 0;
const brainDrawerStart = setInterval(() => {  // until the drawer has closed once (its button works after hydration)
  const sidebar = document.getElementById("sidebar");
  if (!brainNarrow.matches || (brainDrawerTries += 1) > 100 || (sidebar && !sidebar.classList.contains("open"))) {
    clearInterval(brainDrawerStart);
  } else {
    brainCloseDrawer();
  }
}, 100);
document.addEventListener("pointerdown", (event) => {  // a hand on the drawer decides: it is not closed under it
  if (event.isTrusted && event.target instanceof Element && event.target.closest("#sidebar")) {
    clearInterval(brainDrawerStart);
  }
}, true);
document.addEventListener("click", (event) => {
  const picked = event.target instanceof Element &&
    event.target.closest('#new-session, #confirm-delete, #conversations a[href^="#brain-conv?"]');
  if (picked) setTimeout(brainCloseDrawer, 0);
}, true);
for (const kind of ["wheel", "touchmove", "keydown"]) {
  document.addEventListener(kind, (event) => {
    if (event.target instanceof Element && event.target.closest("#chat")) brainPinned = false;
  }, {passive: true, capture: true});
}
</script>"""
# The URL names the conversation on screen (?conversation=NAME; none: a new chat). Gradio sends the page's query
# string with every call, so a question goes to the conversation the URL names (conversation_on_screen), never to one
# a load or another tab picked. The script puts a conversation picked in the sidebar (or none, for "New
# conversation") in the URL the moment it is clicked, follows the conversation the server marks open in the sidebar
# (a first question names the new one, a rename, a delete), and opens the URL's conversation on back and forward.
CONVERSATION_URL_SCRIPT = """<script>
const BRAIN_PARAM = "conversation";
function brainUrlConversation() {
  return new URLSearchParams(location.search).get(BRAIN_PARAM) || "";
}
function brainShowInUrl(name, push) {
  if (name === brainUrlConversation()) return;
  const query = new URLSearchParams(location.search);
  if (name) query.set(BRAIN_PARAM, name); else query.delete(BRAIN_PARAM);
  const search = query.toString();
  const url = location.pathname + (search ? `?${search}` : "") + location.hash;
  if (push) history.pushState(null, "", url); else history.replaceState(null, "", url);
}
function brainLinkedConversation(href) {
  return new URLSearchParams((href || "").split("?").slice(1).join("?")).get("name") || "";
}
document.addEventListener("click", (event) => {
  const target = event.target instanceof Element ? event.target : null;
  const link = target && target.closest('#conversations a[href^="#brain-conv?"]');
  if (link) brainShowInUrl(brainLinkedConversation(link.getAttribute("href")), true);
  else if (target && target.closest("#new-session")) brainShowInUrl("", true);
}, true);
let brainMarked = null;  // the conversation the sidebar last marked open ("": a new chat; null: no list yet)
new MutationObserver(() => {
  const list = document.getElementById("conversations");
  if (!list || !list.querySelector(".brain-convs, .brain-note-hint")) return;
  const open = list.querySelector("a.brain-conv-open");
  const name = open ? brainLinkedConversation(open.getAttribute("href")) : "";
  if (name === brainMarked) return;  // only a change is news: a click may have put the URL ahead of the list
  brainMarked = name;
  brainShowInUrl(name, false);
}).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
window.addEventListener("popstate", () => {
  const box = document.querySelector("#conv-request textarea, #conv-request input");
  const button = document.getElementById("conv-open");
  if (!box || !button) return;
  box.value = `brain-conv?name=${encodeURIComponent(brainUrlConversation())}`;
  box.dispatchEvent(new Event("input", {bubbles: true}));
  button.click();
});
</script>"""
PAGE_CSS = """
#note-view { max-height: 78vh; overflow-y: auto; }
.brain-note { line-height: 1.55; }
.brain-note h2 { margin: 0 0 .2em; }
.brain-note-meta, .brain-note-actions, .brain-note-hint { color: var(--body-text-color-subdued); font-size: .9em; }
.brain-tag { display: inline-block; margin-right: .4em; padding: 0 .4em; border-radius: .6em;
             background: var(--background-fill-secondary); }
.brain-note-body th, .brain-note-body td { border: 1px solid var(--border-color-primary); padding: .15em .5em; }
.brain-note-body pre { overflow-x: auto; padding: .5em; background: var(--background-fill-secondary); }
.brain-note-body .brain-hit { background: rgba(255, 196, 0, .28); box-shadow: -4px 0 0 rgba(255, 170, 0, .9); }
.brain-note-links h4 { margin: .8em 0 .2em; }
/* A table scrolls sideways in its own box instead of squeezing its columns to a character a line. */
#note-view table, #chat table { display: block; max-width: 100%; overflow-x: auto; border-collapse: collapse; }
#note-view th, #note-view td, #chat th, #chat td { min-width: 4.5em; }
/* Conversations: the sidebar's list; the open one is marked. */
.brain-convs a { display: block; padding: .35em .5em; margin: .1em 0; border-radius: .4em; text-decoration: none;
                 color: var(--body-text-color); }
.brain-convs a:hover { background: var(--background-fill-secondary); }
.brain-convs a.brain-conv-open { background: var(--color-accent-soft); }
.brain-conv-title { display: block; font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.brain-conv-meta { display: block; font-size: .85em; color: var(--body-text-color-subdued); }
/* How well the notes answer: strong, related, or not in them at all. */
.brain-strength { display: inline-block; padding: 0 .5em; border-radius: .6em; font-size: .85em; font-weight: 600; }
.brain-strong { background: rgba(34, 160, 90, .18); color: rgb(20, 120, 60); }
.brain-related, .brain-unsure { background: rgba(230, 160, 0, .2); color: rgb(150, 95, 0); }
.brain-weak, .brain-not-found { background: rgba(120, 120, 120, .18); color: rgb(85, 85, 85); }
/* Lists: a bullet for an item, one checkbox for a task (in the bullet's place, not beside a bullet). */
#chat ul > li, #note-view ul > li { list-style-type: disc; }
#chat li:has(> .brain-task:first-child), #chat li:has(> p:first-child > .brain-task:first-child),
#note-view li:has(> .brain-task:first-child) { list-style-type: none; }
.brain-task { display: inline-block; width: 1.3em; margin-left: -1.3em; }
/* The chat's "scroll down" arrow stays under the conversations drawer (Gradio puts it on its top layer). */
#chat .scroll-down-button-container { z-index: 10; }
/* One way to start fresh: "New conversation". The chat's own trash button would only hide the turns. */
#chat button[aria-label="Clear"], #chat button[title="Clear"] { display: none; }
@media (max-width: 768px) {
  #note-view { max-height: none; overflow-y: visible; }  /* no nested scroll box: the page scrolls to the passage */
  #note-view th, #note-view td, #chat th, #chat td { white-space: nowrap; }  /* a row a line; the table scrolls */
}
"""
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


def note_ref(note_id: str, turn: int | None = None, n: int | None = None) -> str:
    """An in-page link to a note; with a turn and citation number the note opens with that citation's passage lit."""
    ref = f"{NOTE_REF}id={quote(note_id, safe='')}"
    return ref + (f"&turn={turn}&n={n}" if turn is not None and n is not None else "")


def parse_note_ref(ref: str) -> tuple[str, int | None, int | None]:
    """The note id, turn and citation number of an in-page link (what the browser hands back; untrusted)."""
    query = parse_qs(ref.strip().lstrip("#").removeprefix(NOTE_REF.lstrip("#")), keep_blank_values=True)
    turn, n = ((query.get(key) or [""])[0] for key in ("turn", "n"))
    return (query.get("id") or [""])[0], _plain_number(turn, 6), _plain_number(n, 6)


def as_note_ref(ref: str) -> str:
    """An API client's bare note id as the in-page link to it; an in-page link stays as it is."""
    text = ref.strip()
    return note_ref(text) if text and not text.startswith(("#", NOTE_REF.lstrip("#"))) else ref


def note_ask(ref: str) -> int | None:
    """The number the page's script gave a note request (`&ask=N`); its answer carries it back, so the script knows
    when the note asked for is in, even when it is the one already shown."""
    asks = parse_qs(ref.strip().lstrip("#").removeprefix(NOTE_REF.lstrip("#"))).get("ask") or [""]
    return _plain_number(asks[-1], 9)  # the script's own number comes last, after whatever the link held


def _plain_number(value: str, digits: int) -> int | None:
    """`value` as a number of at most `digits` ASCII digits, else None: str.isdigit also takes "²" and "٣"."""
    return int(value) if re.fullmatch(rf"[0-9]{{1,{digits}}}", value) else None


def urls_in(text: str) -> set[str]:
    """The http(s) URLs written in a note: the only web addresses an answer about it may link to."""
    return {url.rstrip(_TRAILING) for url in _LINKABLE.findall(text) if url.lower().startswith(("http:", "https:"))}


def safe_markdown(text: str, allowed: Iterable[str] = ()) -> str:
    """LLM (or note) text as markdown the page can show without the browser fetching anything.

    Code (fenced blocks, inline spans) is shown exactly as written, in fences no text inside can close (inline code
    holding `|` is prose: a table row would split it there and leave its rest unescaped). In the prose
    no image and no raw HTML survives (every `[`, `]`, `!`, `<`, backtick, `~` and backslash is escaped, which also
    disarms reference links, footnotes and code the splitter did not see). A link, written as markdown or bare, stays
    a link only if its URL is in `allowed` (the cited notes' own links and the URLs written in them), else its label
    stays as plain text. Bare URLs, www. and e-mail addresses are kept from being auto-linked. Headings, lists and
    emphasis still render."""
    allowed = frozenset(allowed)
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # a lone CR ends a line for the renderer too
    parts = [part if part.kind != "inline" or "|" not in part.text else Part(part.raw)  # a table cell splits at |
             for part in split_code(text)]
    return render([replace(part, text=_safe_prose(part.text, allowed)) if part.kind == "prose" else part
                   for part in parts])


def _safe_prose(text: str, allowed: frozenset[str]) -> str:
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
    text = re.sub(r"[\\\[\]<!`~]", r"\\\g<0>", text)
    text = re.sub(r"(?i)(https?|ftp):(?=//)", r"\1\\:", text)  # no autolink: http\://…
    text = re.sub(r"(?i)(www)\.", r"\1\\.", text)
    return re.sub(r"(?<=[\w.+-])@(?=[\w-]+\.)", r"\\@", text)


# A citation marker as safe_markdown leaves it (`\[1\]`), or in the fullwidth forms Chinese models write.
_SAFE_CITATION = re.compile(r"\\\[(\d{1,4})\\\]|［(\d{1,4})］|【(\d{1,4})】")


def link_citations(markdown: str, citations: list[dict[str, Any]], turn: int) -> str:
    """Every `[n]` of a sanitised answer that names one of its citations becomes an in-page link to that note."""
    by_n = {c["n"]: c for c in citations}

    def link(match: re.Match[str]) -> str:
        n = int(next(g for g in match.groups() if g))
        citation = by_n.get(n)
        return f"[\\[{n}\\]]({note_ref(citation['note_id'], turn, n)})" if citation else match.group(0)

    return "".join(_SAFE_CITATION.sub(link, part.text) if part.kind == "prose" else part.raw
                   for part in split_code(markdown))


# A task list item as the answer's markdown holds it: its box as the engine writes it (☐ ☑) or as an LLM does
# (`[ ]`, `[x]`, escaped by safe_markdown).
_TASK_ITEM = re.compile(r"(?m)^([ \t]*(?:[-*+]|\d{1,9}[.)])[ \t]+)(☐|☑|\\\[ \\\]|\\\[[xX]\\\])(?=[ \t])")


def task_box(done: bool) -> str:
    """A task's checkbox, one glyph where the list's bullet would be (the page's CSS drops that bullet)."""
    return f"<span class='brain-task'>{'☑' if done else '☐'}</span>"


def task_boxes(markdown: str) -> str:
    """Each task list item of a sanitised answer shows one checkbox, not a bullet and a box; code is left as is."""
    out: list[str] = []
    for part in split_code(markdown):
        if part.kind != "prose":
            out.append(part.raw)
            continue
        text = part.text
        at_line_start = not out or out[-1].endswith("\n")
        head, newline, rest = ("", "", text) if at_line_start else text.partition("\n")
        rest = _TASK_ITEM.sub(lambda m: m.group(1) + task_box(m.group(2) not in ("☐", "\\[ \\]")), rest)
        out.append(head + newline + rest)
    return "".join(out)


def shown_citations(citations: list[dict[str, Any]], cited: Iterable[int]) -> set[int]:
    """The sources worth showing at once: those the answer cites and the strong ones; the rest go behind "more"."""
    cited = set(cited)
    return {c["n"] for c in citations if c["n"] in cited or c.get("strength") == "strong"}


def sources_markdown(citations: list[dict[str, Any]], shown: set[int], obsidian: bool, excerpts: bool,
                     turn: int, leads: bool = False, unsure: bool = False) -> str:
    """The numbered sources under an answer: each title opens the note in the page, the memo or Obsidian link opens
    it where it lives; `excerpts` off when the answer already quotes them (extractive). `leads`: nothing answered
    (not in your notes), so they are the nearest notes, shown as leads with their excerpts; `unsure`: they may be
    about the question, shown as possible matches (with excerpts only when `excerpts`: an extractive not-sure answer
    quotes their passages itself)."""

    def lines(citation: dict[str, Any]) -> list[str]:
        title = escape_markdown(str(citation.get("title") or citation["note_id"]))
        head = f"{citation['n']}. [{title}]({note_ref(citation['note_id'], turn, citation['n'])})"
        path = "" if citation.get("url") else str(citation.get("path") or "")
        head += f" — {escape_markdown(path)}" if path else ""
        head += f" {strength_badge(str(citation.get('strength') or 'weak'))}"
        if citation.get("linked_from"):
            head += f" · linked from {escape_markdown(str(citation['linked_from']))}"
        href = note_href(citation, obsidian)
        if href:
            head += f" · [open in {'Memos' if citation.get('url') else 'Obsidian'}]({href})"
        excerpt = " ".join(str(citation.get("excerpt") or "").split())
        if not (excerpts and excerpt):
            return [head]
        cut = excerpt[:EXCERPT_CHARS] + ("…" if len(excerpt) > EXCERPT_CHARS else "")
        return [head, f"   {safe_markdown(excerpt_markdown(cut))}"]

    if leads:  # a not-sure answer without an LLM quotes its possible matches' passages already
        excerpts, shown = excerpts or not unsure, {c["n"] for c in citations[:3]}
    first = [line for c in citations if c["n"] in shown for line in lines(c)]
    rest = [line for c in citations if c["n"] not in shown for line in lines(c)]
    heading = "**Possible matches** (not sure)" if unsure else "**Nearest leads** (not an answer)" if leads else (
        "**Sources**")
    out = [heading, "", *first]
    if rest:
        count = sum(1 for c in citations if c["n"] not in shown)
        out += ["", f"<details><summary>{count} more</summary>", "", *rest, "", "</details>"]
    return "\n".join(out)


STRENGTH_LABELS = {"strong": "strong", "related": "related", "weak": "weak", "unsure": "not sure",
                   "not-found": "not in your notes"}


def strength_badge(strength: str) -> str:
    """How well a note (or an answer) matches, as the engine judged it: strong, related, weak, not sure, not in your
    notes."""
    key = strength if strength in STRENGTH_LABELS else "weak"
    return f"<span class='brain-strength brain-{key}'>{STRENGTH_LABELS[key]}</span>"


def answer_strength(turn: dict[str, Any]) -> str | None:
    """An answer's relevance state: "not-found" when the engine found nothing close, "unsure" when only leads it is
    not sure about, else the best strength among its sources; None when there was nothing to search (an empty
    index, or filters no note matches)."""
    coverage = turn.get("coverage") or {}
    if coverage.get("empty_index") or coverage.get("no_note_matches_filters"):
        return None
    if coverage.get("answer_state") == "unsure" or turn.get("mode") == "unsure":
        return "unsure"
    strengths = {c.get("strength") for c in turn.get("citations") or []}
    if coverage.get("not_found") or turn.get("mode") == "not_found" or not strengths & {"strong", "related"}:
        return "not-found"
    return "strong" if "strong" in strengths else "related"


def turn_markdown(turn: dict[str, Any], index: int, allowed: Iterable[str], obsidian: bool) -> str:
    """One answer as the chat shows it: its relevance state, the sanitised answer with its `[n]` linked (an
    extractive answer says itself why the LLM did not write it), the query a follow-up was condensed to, what else
    shaped the search (the gloss it was also searched as, a time phrase's filter), then the sources."""
    coverage = turn.get("coverage") or {}
    citations = turn.get("citations") or []
    state = answer_strength(turn)
    parts = [strength_badge(state)] if state else []
    parts.append(task_boxes(link_citations(safe_markdown(str(turn.get("answer") or ""), allowed), citations, index)))
    condensed = str(coverage.get("condensed_query") or "").strip()
    if condensed and condensed != str(turn.get("question") or "").strip():
        parts.append(f"_Searched for: {escape_markdown(condensed)}_")
    parts += [f"_{escape_markdown(note[:1].upper() + note[1:])}_" for note in search_notes(coverage)]
    if citations:
        cited = coverage.get("cited") if turn.get("mode") == "llm" else None
        if cited is None:
            cited = cited_numbers(str(turn.get("answer") or ""), max(c["n"] for c in citations))
        shown = shown_citations(citations, cited)
        parts.append(sources_markdown(citations, shown, obsidian, turn.get("mode") == "llm", index,
                                      leads=bool(coverage.get("not_found")) or state == "unsure",
                                      unsure=state == "unsure"))
    return "\n\n".join(parts)


def llm_markdown(state: dict[str, Any]) -> str:
    """The LLM line above the chat, honest about a half-done configuration."""
    if state.get("configured") and state.get("error"):
        return (f"**cflow-brain** · ⚠️ LLM **{escape_markdown(str(state.get('model') or ''))}** unreachable: "
                f"{_inert(str(state['error']), frozenset())}; answers are passages of your notes until it is back")
    if state.get("configured"):
        return (f"**cflow-brain** · LLM **{escape_markdown(str(state.get('model') or ''))}** at "
                f"{_inert(str(state.get('base_url') or ''), frozenset())}")  # shown, not autolinked
    missing = [str(m) for m in state.get("missing") or []]
    if missing:
        return (f"**cflow-brain** · ⚠️ LLM configured but incomplete: missing {escape_markdown(', '.join(missing))}; "
                "answers are passages from your notes.")
    return ("**cflow-brain** · No LLM configured: answers are the passages of your notes that match "
            "(set LLM\\_BASE\\_URL and LLM\\_MODEL for written answers).")


def channels_markdown(channels: dict[str, dict[str, Any]], chunks: int) -> str:
    """Each search channel's progress: a sync fills BM25 first, then each dense model's vectors."""
    parts = []
    for name, channel in channels.items():
        label = "BM25 (keywords)" if name == "bm25" else escape_markdown(name)
        if channel.get("complete"):
            parts.append(f"{label} ✓")
        else:
            left = "" if name == "bm25" else f", {time_left(channel.get('seconds_left'))}"
            parts.append(f"{label} {channel.get('chunks', 0)}/{chunks}{left}")
    return "Search channels: " + " · ".join(parts) if parts else ""


def status_markdown(status: dict[str, Any]) -> str:
    lines = [f"**{status['notes']} notes, {status['chunks']} chunks** · model `{status['embedding_model']}`", ""]
    if not status["sources"]:
        return "\n".join([*lines, "Nothing indexed yet: add sources, then press Sync."])
    channels = channels_markdown(status.get("channels") or {}, status["chunks"])
    if channels:
        lines += [channels, ""]
    for src in status["sources"]:
        error = (src["last_result"] or {}).get("error")
        lines.append(f"- **{escape_markdown(src['name'])}** ({src['kind']}): {src['notes']} notes, {src['chunks']} "
                     f"chunks, last sync {src['last_sync'] or 'never'}"
                     + (f" — failed: {escape_markdown(str(error))}" if error else ""))
    return "\n".join(lines)


def split_tags(text: str) -> tuple[str, ...]:
    return tuple(tag for tag in re.split(r"[,\s]+", text or "") if tag)


def hit_lines(text: str, excerpt: str) -> tuple[int, int] | None:
    """The lines [first, last) of `text` an excerpt was cut from, or None when it is not there (the note changed).

    Compared on letters and digits only: excerpts are flattened and shown without markdown scaffolding (heading
    marks, table rules, task boxes, wikilink brackets), so the two agree on little else. A passage edited in the
    middle is found by its start and its end."""
    needle = "".join(char for char in excerpt if char.isalnum())
    if not needle:
        return None
    origin = [i for i, char in enumerate(text) if char.isalnum()]
    hay = "".join(text[i] for i in origin)
    start = hay.find(needle)
    end = start + len(needle) - 1
    for probe in (24, 12, 6):  # edited since: the longest start or end of the passage still there
        if start >= 0 or len(needle) < probe:
            break
        head, tail = hay.find(needle[:probe]), hay.find(needle[-probe:])
        if head >= 0 or tail >= 0:
            start = head if head >= 0 else tail
            end = tail + probe - 1 if tail >= start else start + probe - 1
    if start < 0:
        return None
    return text.count("\n", 0, origin[start]), text.count("\n", 0, origin[end]) + 1


_LIT_BLOCKS = {"paragraph_open", "heading_open", "list_item_open", "fence", "code_block", "tr_open", "hr"}


def _wikilink_rule(state: StateInline, silent: bool) -> bool:
    """`[[target#heading|label]]` (and `![[embed]]`): a link that opens the target in the page when the note links
    to it, else its label as text."""
    match = WIKILINK.match(state.src, state.pos)
    if not match:
        return False
    if not silent:
        shown = wikilink_shown(match) or match.group(0)
        note_id = state.env.get("wikilinks", {}).get(_link_key(match.group(2)))
        if note_id:
            token = state.push("link_open", "a", 1)
            token.attrs = {"href": note_ref(note_id)}
        text = state.push("text", "", 0)
        text.content = shown
        if note_id:
            state.push("link_close", "a", -1)
    state.pos = match.end()
    return True


def _link_key(target: str) -> str:
    return target.strip().lower().removesuffix(".md").rsplit("/", 1)[-1]


def _note_renderer() -> MarkdownIt:
    """CommonMark with tables and strikethrough, raw HTML off (shown as text), wikilinks, task boxes."""
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.inline.ruler.before("link", "wikilink", _wikilink_rule)
    return md


_MARKDOWN = _note_renderer()


def _disarm(tokens: list[Token]) -> None:
    """Inline tokens after parsing: images become their alt text (nothing is fetched), a link stays only to an
    http(s) address or another note in the page (opens in a new tab, sends no referrer), task boxes become ☐ / ☑."""
    for index, token in enumerate(tokens):
        if token.type != "inline" or not token.children:
            continue
        if index >= 2 and tokens[index - 2].type == "list_item_open" and token.children[0].type == "text":
            _task_box_token(token)
        open_links: list[bool] = []
        for child in token.children:
            if child.type == "image":
                alt = "".join(c.content for c in child.children or []) or child.content
                child.type, child.tag, child.content, child.children, child.attrs = "text", "", f"[{alt}]", None, {}
            elif child.type == "link_open":
                href = str(child.attrGet("href") or "")
                keep = href.lower().startswith(("http://", "https://")) or href.startswith(NOTE_REF)
                open_links.append(keep)
                if not keep:
                    child.type, child.tag, child.content, child.attrs = "text", "", "", {}
                elif not href.startswith(NOTE_REF):
                    child.attrs.update(target="_blank", rel="noopener noreferrer")
            elif child.type == "link_close" and open_links and not open_links.pop():
                child.type, child.tag, child.content = "text", "", ""


def _task_box_token(inline: Token) -> None:
    """A list item's leading `[ ]` / `[x]` becomes its one checkbox (task_box), in its own token before the text."""
    first = inline.children[0] if inline.children else None
    match = re.match(r"\[([ xX])\]\s", first.content) if first is not None else None
    if first is None or match is None:
        return
    box = Token("html_inline", "", 0)
    box.content = task_box(match.group(1) != " ") + " "
    first.content = first.content[match.end():]
    inline.children.insert(0, box)


def note_markdown_html(text: str, lit: tuple[int, int] | None = None, wikilinks: dict[str, str] | None = None) -> str:
    """A note's markdown as HTML that can load nothing and run nothing: raw HTML is shown as text, images as their
    alt text, links only to http(s) addresses (new tab, no referrer) and to linked notes (in the page). The blocks
    on lines `lit` carry the class brain-hit (the first also the id, to scroll to)."""
    env: dict[str, Any] = {"wikilinks": wikilinks or {}}
    tokens = _MARKDOWN.parse(text, env)
    _disarm(tokens)
    if lit is not None:
        first = True
        for token in tokens:
            if (token.type in _LIT_BLOCKS and not token.hidden and token.map and token.map[0] < lit[1]
                    and token.map[1] > lit[0]):
                token.attrJoin("class", "brain-hit")
                if first:
                    token.attrSet("id", "brain-hit")
                    first = False
    return _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, env)


def _day(value: Any) -> str:
    return str(value)[:10] if value else ""


def note_html(note: dict[str, Any], related: dict[str, Any] | None, excerpt: str | None, obsidian: bool) -> str:
    """The note panel: title, where it lives and when, tags, "open in" links, the rendered text with the cited
    passage lit, then its links, backlinks and related notes, each opening in place."""
    esc = html.escape
    related = related or {"links": [], "similar": [], "broken_links": []}
    outgoing = [n for n in related["links"] if n.get("relation") == "links to"]
    incoming = [n for n in related["links"] if n.get("relation") != "links to"]
    wikilinks: dict[str, str] = {}
    for linked in outgoing:
        for key in (str(linked.get("path") or ""), str(linked.get("title") or "")):
            if key:
                wikilinks.setdefault(_link_key(key), linked["note_id"])
    where = [str(note.get("source") or "")]
    if note.get("path"):
        where.append(str(note["path"]))
    if note.get("created"):
        where.append(f"created {_day(note['created'])}")
    if note.get("updated") and _day(note["updated"]) != _day(note.get("created")):
        where.append(f"updated {_day(note['updated'])}")
    out = ["<article class='brain-note'>", f"<h2>{esc(str(note.get('title') or note['note_id']))}</h2>",
           f"<p class='brain-note-meta'>{esc(' · '.join(w for w in where if w))}</p>"]
    if note.get("tags"):
        out.append("<p class='brain-note-tags'>" + "".join(f"<span class='brain-tag'>#{esc(str(tag))}</span>"
                                                           for tag in note["tags"]) + "</p>")
    href = note_href(note, obsidian)
    if href:
        label = "Open in Memos" if note.get("url") else "Open in Obsidian"
        out.append(f"<p class='brain-note-actions'><a href='{esc(href)}' target='_blank' rel='noopener noreferrer'>"
                   f"{label} ↗</a></p>")
    text = str(note.get("text") or "")
    lit = hit_lines(text, excerpt) if excerpt else None
    out.append(f"<div class='brain-note-body'>{note_markdown_html(text, lit, wikilinks)}</div>")
    if note.get("truncated"):
        out.append(f"<p class='brain-note-meta'>Showing the first {len(text):,} of {note.get('chars', 0):,} "
                   "characters.</p>")
    sections = [("Links", outgoing), ("Backlinks", incoming), ("Related", related["similar"])]
    out.append("<section class='brain-note-links'>")
    for heading, notes in sections:
        if notes:
            items = "".join(f"<li><a href='{esc(note_ref(n['note_id']))}'>{esc(str(n.get('title') or n['note_id']))}"
                            "</a></li>" for n in notes)
            out.append(f"<h4>{heading}</h4><ul>{items}</ul>")
    if related.get("broken_links"):
        items = "".join(f"<li>{esc(str(link))} (no such note)</li>" for link in related["broken_links"])
        out.append(f"<h4>Unresolved links</h4><ul>{items}</ul>")
    out.append("</section></article>")
    # One line of HTML: the Markdown component passes it on whole as an HTML block (a blank line would end it).
    return "".join(out).replace("\n", "&#10;")


CONVERSATION_REF = "#brain-conv?"  # an in-page link that opens a conversation (the page's script hands it over)


def conversation_ref(name: str) -> str:
    return f"{CONVERSATION_REF}name={quote(name, safe='')}"


def parse_conversation_ref(ref: str) -> str:
    """The conversation name of an in-page link (what the browser hands back; untrusted: checked by the engine)."""
    query = parse_qs(ref.strip().lstrip("#").removeprefix(CONVERSATION_REF.lstrip("#")), keep_blank_values=True)
    return (query.get("name") or [""])[0]


def when_label(iso_time: str, now: dt.datetime | None = None) -> str:
    """A conversation's last use in this machine's time: "today 14:03", "yesterday 09:10", else the date."""
    try:
        moment = dt.datetime.fromisoformat(iso_time.replace("Z", "+00:00")).astimezone()
    except ValueError:
        return ""
    today = (now or dt.datetime.now().astimezone()).date()
    if moment.date() == today:
        return f"today {moment:%H:%M}"
    if moment.date() == today - dt.timedelta(days=1):
        return f"yesterday {moment:%H:%M}"
    return f"{moment:%Y-%m-%d}"


def conversations_html(listing: list[dict[str, Any]], open_name: str | None, now: dt.datetime | None = None) -> str:
    """The sidebar's list, newest first: each conversation's title (its name), when it was last used and how many
    turns it has; the open one marked. One line of HTML, like the note panel."""
    if not listing:
        return "<p class='brain-note-hint'>No conversations yet: your first question starts one.</p>"
    esc = html.escape
    items = []
    for session in listing:
        turns = int(session.get("turns") or 0)
        meta = " · ".join(part for part in (when_label(str(session.get("updated") or ""), now),
                                             f"{turns} turn{'s' if turns != 1 else ''}") if part)
        mark = " class='brain-conv-open' aria-current='true'" if session["name"] == open_name else ""
        items.append(f"<a href='{esc(conversation_ref(session['name']))}'{mark}>"
                     f"<span class='brain-conv-title'>{esc(session['name'])}</span>"
                     f"<span class='brain-conv-meta'>{esc(meta)}</span></a>")
    return "<nav class='brain-convs'>" + "".join(items) + "</nav>"


def _tab_of(request: gr.Request | None) -> str | None:
    """The open tab a request comes from (Gradio's session hash), None outside Gradio."""
    return getattr(request, "session_hash", None) or None


CONVERSATION_PARAM = "conversation"  # ?conversation=NAME: the page's URL names the conversation on screen


def conversation_on_screen(request: gr.Request | None, session: str | None) -> str | None:
    """The conversation a call acts on: the one the tab's URL names (Gradio sends the page's query string with
    every call, and the page's script keeps the URL on the conversation shown), None for a new chat. Outside
    Gradio (a test, a script calling the handlers) there is no URL: the caller's `session` says."""
    params = getattr(request, "query_params", None)
    if params is None:
        return session
    return str(params.get(CONVERSATION_PARAM) or "") or None


def earlier_button(first: int) -> Any:
    """The earlier-turns button: shown while turns before the first one shown exist, saying how many."""
    return gr.update(visible=first > 0, value=f"Show earlier turns ({first:,} more)")


class PageProgress:
    """The engine's Progress protocol drawn on the page's progress bar."""

    def __init__(self, bar: Callable[..., Any]):
        self._bar = bar
        self._total = self._done = 0
        self._description = ""
        self._unit = "chunks"

    def start(self, total: int, description: str, unit: str = "chunk") -> None:
        self._total, self._done, self._description, self._unit = total, 0, description, f"{unit}s"
        self._bar((0, total), desc=description, unit=self._unit)

    def advance(self, count: int) -> None:
        self._done += count
        self._bar((self._done, self._total), desc=self._description, unit=self._unit)

    def close(self) -> None:
        self._bar(None)


Messages = list[dict[str, Any]]


class ChatPage:
    """The page's handlers over one Brain. The conversation lives in the engine's sessions (the home's store), so
    a reload or a restart shows it again; the tab's URL names which one it is in (conversation_on_screen)."""

    def __init__(self, brain: Brain, obsidian: bool | None = None):
        self.brain = brain
        self.obsidian = brain.obsidian_links if obsidian is None else obsidian
        # One worker runs engine calls: answers stream from it while the page yields; a sync never overlaps a question.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brain")
        self._closed = False
        # Which conversation each open tab last chose (None: a new chat), by Gradio's session hash: a load that
        # finishes after "New conversation" (or a first question) leaves the chat alone. Which conversation a call
        # acts on is the one the tab's URL names (conversation_on_screen).
        self._tabs: OrderedDict[str, str | None] = OrderedDict()
        self._tabs_lock = threading.Lock()

    def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the Brain's thread, keeping Gradio's context so progress bars still reach this request."""
        return self._worker.submit(contextvars.copy_context().run, fn, *args, **kwargs).result()

    def close(self) -> None:
        """Close the Brain on its own thread (SQLite insists), then stop that thread; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._run(self.brain.close)
        self._worker.shutdown()

    # Conversations

    def conversation(self, name: str | None, before: int | None = None) -> tuple[Messages, int]:
        """The last PAGE_TURNS turns of a stored session (of those before turn `before`) as chat messages, and the
        number of the first one shown; empty for none, or one deleted meanwhile. A long session is never read whole:
        20,000 turns would take the page minutes and the server gigabytes."""
        if not name:
            return [], 0
        try:
            shown = self._run(self.brain.session, name, PAGE_TURNS, before)
        except SessionNotFound:
            return [], 0
        messages: Messages = []
        for offset, turn in enumerate(shown["turns"]):
            messages += self._turn_messages(turn, shown["first"] + offset)
        return messages, shown["first"]

    def earlier_turns(self, session: str | None, first: int, history: Messages | None,
                      request: gr.Request | None = None) -> tuple[Messages, int, Any]:
        """The page of turns before the first one shown, put above them; returns the chat, the new first turn and
        the button."""
        session = conversation_on_screen(request, session)
        older, first = self.conversation(session, first) if session and first > 0 else ([], first)
        return [*older, *(history or [])], first, earlier_button(first)

    def _turn_messages(self, turn: dict[str, Any], index: int) -> Messages:
        allowed = self._run(self.allowed_links, turn.get("citations") or [])
        return [{"role": "user", "content": safe_markdown(str(turn.get("question") or ""))},
                {"role": "assistant", "content": turn_markdown(turn, index, allowed, self.obsidian)}]

    # Which conversation a tab is in

    def _chosen(self, request: gr.Request | None) -> str | None:
        """The conversation this tab chose last (None: a new chat, or none chosen yet)."""
        tab = _tab_of(request)
        with self._tabs_lock:
            return self._tabs.get(tab) if tab else None

    def _choose(self, request: gr.Request | None, name: str | None, unless_chosen: bool = False) -> bool:
        """Put the tab in conversation `name` (None: a new chat); with `unless_chosen`, only if the tab has not
        chosen yet. Returns whether it did."""
        tab = _tab_of(request)
        if not tab:
            return True
        with self._tabs_lock:
            if unless_chosen and tab in self._tabs:
                return False
            self._tabs[tab] = name
            self._tabs.move_to_end(tab)
            while len(self._tabs) > TABS_REMEMBERED:
                self._tabs.popitem(last=False)
        return True

    def conversations(self, open_name: str | None) -> str:
        return conversations_html(self._run(self.brain.sessions), open_name)

    def load(self, request: gr.Request | None = None) -> tuple[Any, Any, str, str, str, Any, Any]:
        """On (re)load: the conversation the URL names (a new chat when it names none, or one that is gone), unless
        this tab chose another, or a new chat, while it loaded; the sidebar's list, the LLM line, the status, the
        first turn shown and the earlier-turns button. The chat's example questions come from the notes, for when
        it is empty."""
        listing = self._run(self.brain.sessions)
        wanted = conversation_on_screen(request, None)
        name = wanted if any(s["name"] == wanted for s in listing) else None
        shown, first = self.conversation(name)
        examples = [{"text": question} for question in self._run(self.brain.example_questions)]
        if not self._choose(request, name, unless_chosen=True):  # the tab moved on while this loaded
            return (gr.update(examples=examples), gr.skip(), self.conversations(self._chosen(request)),
                    self.llm_line(), self.status(), gr.skip(), gr.skip())
        return (gr.update(value=shown, examples=examples), name, conversations_html(listing, name),
                self.llm_line(), self.status(), first, earlier_button(first))

    def chat(self, message: str, history: Messages | None, session: str | None, sources: list[str] | None,
             tags: str, since: str, until: str, request: gr.Request | None = None
             ) -> Iterator[tuple[Messages, str | None, Any, Any]]:
        """Stream the answer as it is written (cumulative text), then show it with linked citations and sources.

        The turn goes into the tab's conversation; the first question of a new chat creates one on the server,
        named after it, so a follow-up is read in the light of the turns before it. Yields the chat, the
        conversation's name, the sidebar's list and the question box."""
        message = (message or "").strip()
        history = list(history or [])
        if not message:
            yield history, session, gr.skip(), gr.skip()
            return
        session = conversation_on_screen(request, session)
        started = session is None
        if started:
            session = self._run(self.brain.start_session, message)
            history, index = [], 0
        else:
            try:
                index = self._run(self.brain.session, session, 0)["total"]
            except SessionNotFound:
                index = 0
        self._choose(request, session)  # a load still under way leaves this chat alone
        asked = [*history, {"role": "user", "content": safe_markdown(message)}]
        # A new conversation is listed (and marked open) with the first update, so the page's script puts its name
        # in the URL while the answer is still coming. Listed before the question goes to the engine's one thread.
        listing = self.conversations(session) if started else gr.skip()
        tokens: queue.Queue[str | None] = queue.Queue()
        future = self._worker.submit(
            self.brain.ask, message, session=session, sources=tuple(sources or ()), tags=split_tags(tags),
            since=since or None, until=until or None, on_token=tokens.put,
        )
        future.add_done_callback(lambda _: tokens.put(None))
        yield [*asked, {"role": "assistant", "content": "…"}], session, listing, ""
        text = ""
        while (piece := tokens.get()) is not None:
            text += piece
            yield [*asked, {"role": "assistant", "content": safe_markdown(text)}], session, gr.skip(), gr.skip()
        try:
            response = future.result().to_dict()
        except (SearchError, ConfigError) as exc:
            if started and index == 0:
                self._forget_if_empty(session)
                self._choose(request, None)
                session = None
            yield [*asked, {"role": "assistant", "content": f"⚠️ {safe_markdown(str(exc))}"}], session, \
                self.conversations(session), gr.skip()
            return
        if index and not history:  # asked before the page showed the conversation's turns: show them now
            yield self.conversation(session)[0], session, self.conversations(session), gr.skip()
            return
        turn = {"question": message, **response}
        yield [*history, *self._turn_messages(turn, index)], session, self.conversations(session), gr.skip()

    def _forget_if_empty(self, name: str) -> None:
        """A conversation whose first question failed holds nothing: it is not kept."""
        try:
            if self._run(self.brain.session, name, 0)["total"] == 0:
                self._run(self.brain.delete_session, name)
        except SessionNotFound:
            pass

    def ask_example(self, history: Messages | None, session: str | None, sources: list[str] | None, tags: str,
                    since: str, until: str, selected: gr.SelectData, request: gr.Request
                    ) -> Iterator[tuple[Messages, str | None, Any, Any]]:
        """An example question clicked in the empty chat is asked as if typed."""
        value = selected.value if isinstance(selected.value, dict) else {"text": str(selected.value or "")}
        yield from self.chat(str(value.get("text") or ""), history, session, sources, tags, since, until, request)

    def open_session(self, ref: str, request: gr.Request | None = None) -> tuple[Messages, str | None, str, str, int,
                                                                                 Any]:
        """A conversation picked in the sidebar (an in-page link): its last turns, the list with it marked."""
        name = parse_conversation_ref(ref or "") or None
        shown, first = self.conversation(name)
        if not shown:
            name = None  # deleted meanwhile (another tab, the CLI): a new chat
        self._choose(request, name)
        return shown, name, self.conversations(name), NOTE_HINT, first, earlier_button(first)

    def new_session(self, request: gr.Request | None = None) -> tuple[Messages, None, str, str, int, Any]:
        """A fresh conversation: the next question creates it on the server (and names it)."""
        self._choose(request, None)
        return [], None, self.conversations(None), NOTE_HINT, 0, earlier_button(0)

    def rename_session(self, session: str | None, new_name: str, request: gr.Request | None = None
                       ) -> tuple[str | None, Any, str, str]:
        """Returns the conversation, the sidebar's list, the rename box and a one-line outcome."""
        session = conversation_on_screen(request, session)
        new_name = " ".join((new_name or "").split())
        if not session:
            return session, gr.skip(), new_name, "Ask a question first: a conversation is saved with its first turn."
        if not new_name:
            return session, gr.skip(), new_name, "Type the new name first."
        try:
            self._run(self.brain.rename_session, session, new_name)
        except (SessionNotFound, ConfigError, SearchError, ValueError) as exc:
            return session, gr.skip(), new_name, f"⚠️ {escape_markdown(str(exc))}"
        self._choose(request, new_name)
        return new_name, self.conversations(new_name), "", f"Renamed to {escape_markdown(new_name)}."

    def ask_delete(self, session: str | None, request: gr.Request | None = None) -> tuple[Any, str]:
        """Deleting is asked twice: the first press shows what would go and a confirm button."""
        session = conversation_on_screen(request, session)
        if not session:
            return gr.update(visible=False), "Nothing to delete: this conversation is not saved yet."
        return gr.update(visible=True), f"Delete the conversation {escape_markdown(session)} and all its turns?"

    def delete_session(self, session: str | None, request: gr.Request | None = None
                       ) -> tuple[Messages, str | None, str, str, Any, int, Any]:
        """Delete the open conversation and show the newest one left (or a new chat)."""
        session = conversation_on_screen(request, session)
        if session:
            try:
                self._run(self.brain.delete_session, session)
            except SessionNotFound:
                pass  # gone already (another tab, the CLI): the list below shows what is left
        listing = self._run(self.brain.sessions)
        name = listing[0]["name"] if listing else None
        self._choose(request, name)
        outcome = f"Deleted {escape_markdown(session)}." if session else ""
        shown, first = self.conversation(name)
        return (shown, name, conversations_html(listing, name), outcome, gr.update(visible=False), first,
                earlier_button(first))

    # Notes

    def open_note(self, ref: str, session: str | None, request: gr.Request | None = None) -> str:
        """The note panel for an in-page link; a citation's link lights the passage it was cited for. The request's
        number, if the page's script gave one, is on the panel's outer element as the class brain-ask-N (the page's
        sanitiser drops data- attributes)."""
        ref = as_note_ref(ref or "")
        panel = self._note_panel(ref, session, request)
        ask = note_ask(ref)
        return panel if ask is None else f"<div class='brain-ask-{ask}'>{panel}</div>"

    def _note_panel(self, ref: str, session: str | None, request: gr.Request | None) -> str:
        session = conversation_on_screen(request, session)
        note_id, turn, n = parse_note_ref(ref)
        if not note_id:
            return NOTE_HINT
        try:
            note = self._run(self.brain.get_note, note_id)
        except (NoteNotFound, SearchError) as exc:
            return f"<p class='brain-note-hint'>⚠️ {html.escape(str(exc))}</p>"
        try:
            related = self._run(self.brain.related, note_id)
        except (NoteNotFound, SearchError):
            related = None
        excerpt = self._cited_excerpt(session, turn, n, note_id) if turn is not None and n is not None else None
        return note_html(note, related, excerpt, self.obsidian)

    def _cited_excerpt(self, session: str | None, turn: int, n: int, note_id: str) -> str | None:
        if not session:
            return None
        try:
            shown = self._run(self.brain.session, session, 1, turn + 1)
        except SessionNotFound:
            return None
        citations = shown["turns"][0].get("citations") or [] if shown["turns"] and shown["first"] == turn else []
        found = [c for c in citations if c.get("n") == n and c.get("note_id") == note_id]
        return str(found[0].get("excerpt") or "") if found else None

    # The API for programs (gradio_client): structured, not the page's markdown

    def answer(self, question: str, k: int = 6, sources: list[str] | None = None, tags: str = "", since: str = "",
               until: str = "") -> dict[str, Any]:
        """The answer as `brain ask --json` gives it: answer text, citations (note_id, title, path or url, excerpt,
        strength), coverage, mode, not_found and answer_state. Stateless: no conversation is started or continued."""
        if not (question or "").strip():
            raise gr.Error("question is empty: give the question to answer from the notes", print_exception=False)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= ANSWER_MAX_K:
            raise gr.Error(f"k must be an integer from 1 to {ANSWER_MAX_K}", print_exception=False)
        try:
            response = self._run(self.brain.ask, question.strip(), k, sources=tuple(sources or ()),
                                 tags=split_tags(tags or ""), since=since or None, until=until or None)
        except (SearchError, ConfigError) as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        return response.to_dict()

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

    # Status

    def llm_line(self) -> str:
        return llm_markdown(self.brain.llm_state(probe=True))

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
            lines.insert(0, f"Synced in {report.seconds:.1f} s: {report.chunks_written} chunks embedded, "
                            f"{report.deleted_chunks} removed.")
        return "\n".join(lines), self.status(), gr.update(choices=self.source_choices())

    def build(self) -> gr.Blocks:
        """Conversations in a sidebar (a drawer on a phone); the chat first, filling the window, with the note
        panel beside it on a wide screen and below it on a phone; filters and status in the sidebar."""
        with gr.Blocks(title="cflow-brain") as page:
            session = gr.State(None)
            first = gr.State(0)  # the number of the first turn shown: earlier ones load on request
            with gr.Sidebar(label="Conversations", elem_id="sidebar", width=300):
                new_button = gr.Button("＋ New conversation", variant="primary", size="sm", elem_id="new-session")
                listing = gr.Markdown(elem_id="conversations", sanitize_html=True, latex_delimiters=[])
                with gr.Accordion("This conversation", open=False, elem_id="conversation-actions"):
                    rename_box = gr.Textbox(label="Rename to", elem_id="rename-to")
                    rename_button = gr.Button("Rename", size="sm", elem_id="rename-session")
                    delete_button = gr.Button("Delete", size="sm", variant="stop", elem_id="delete-session")
                    with gr.Row(visible=False) as confirm_row:
                        confirm_button = gr.Button("Yes, delete it", size="sm", variant="stop",
                                                   elem_id="confirm-delete")
                        cancel_button = gr.Button("Keep it", size="sm")
                    outcome = gr.Markdown(elem_id="conversation-outcome")
                with gr.Accordion("Filters", open=False):
                    sources = gr.Dropdown(self.source_choices(), multiselect=True, label="Sources",
                                          info="Empty: all sources.")
                    tags = gr.Textbox(label="Tags", placeholder="reading, 电影")
                    since = gr.Textbox(label="Since", placeholder="YYYY-MM-DD")
                    until = gr.Textbox(label="Until", placeholder="YYYY-MM-DD")
                with gr.Accordion("Status", open=False):
                    status = gr.Markdown()
                    sync_button = gr.Button("Sync now", size="sm")
                    sync_result = gr.Markdown()
            with gr.Row(equal_height=False):
                with gr.Column(scale=3, min_width=340):
                    llm_line = gr.Markdown(elem_id="llm-state")
                    earlier = gr.Button("Show earlier turns", size="sm", visible=False, elem_id="earlier-turns")
                    # LaTeX off (KaTeX could link); answers arrive sanitised (safe_markdown), and Gradio's own HTML
                    # sanitiser stays on with no custom tags let through. It fills the window and never scrolls by
                    # itself: the page's script keeps the question asked in view (autoscroll would jump to the end).
                    chatbot = gr.Chatbot(label="Answers from your notes", show_label=False, elem_id="chat",
                                         height="calc(100dvh - 190px)", min_height=320, autoscroll=False,
                                         latex_delimiters=[], sanitize_html=True, allow_tags=False,
                                         buttons=["copy"], feedback_options=None,
                                         placeholder="**Ask your notes** — or start with one of these:")
                    question = gr.Textbox(placeholder=QUESTION_PLACEHOLDER, submit_btn=True, stop_btn=True,
                                          show_label=False, lines=1, max_lines=6, elem_id="question")
                with gr.Column(scale=2, min_width=320):
                    with gr.Accordion("Note", open=True):
                        note = gr.Markdown(NOTE_HINT, elem_id="note-view", latex_delimiters=[], sanitize_html=True)
            note_request = gr.Textbox(visible="hidden", elem_id="note-request")
            note_button = gr.Button(visible="hidden", elem_id="note-open")
            conversation_request = gr.Textbox(visible="hidden", elem_id="conv-request")
            conversation_button = gr.Button(visible="hidden", elem_id="conv-open")

            page.load(self.load, outputs=[chatbot, session, listing, llm_line, status, first, earlier])
            filters = [sources, tags, since, until]
            asking = question.submit(self.chat, inputs=[question, chatbot, session, *filters],
                                     outputs=[chatbot, session, listing, question])
            question.stop(None, cancels=[asking])
            chatbot.example_select(self.ask_example, inputs=[chatbot, session, *filters],
                                   outputs=[chatbot, session, listing, question])
            opened = [chatbot, session, listing, note, first, earlier]
            conversation_button.click(self.open_session, inputs=conversation_request, outputs=opened)
            new_button.click(self.new_session, outputs=opened)
            chatbot.clear(self.new_session, outputs=opened)  # hidden; if it shows anyway, it starts afresh
            earlier.click(self.earlier_turns, inputs=[session, first, chatbot], outputs=[chatbot, first, earlier])
            rename_button.click(self.rename_session, inputs=[session, rename_box],
                                outputs=[session, listing, rename_box, outcome])
            delete_button.click(self.ask_delete, inputs=session, outputs=[confirm_row, outcome])
            cancel_button.click(lambda: (gr.update(visible=False), ""), outputs=[confirm_row, outcome])
            confirm_button.click(self.delete_session, inputs=session,
                                 outputs=[chatbot, session, listing, outcome, confirm_row, first, earlier])
            note_button.click(self.open_note, inputs=[note_request, session], outputs=note, show_progress="hidden",
                              trigger_mode="always_last")  # a note asked for while one is coming is not dropped
            sync_button.click(self.sync, outputs=[sync_result, status, sources])
            gr.api(self.answer, api_name="answer")
            gr.Timer(STATUS_SECONDS).tick(self.status, outputs=status, show_progress="hidden")
        return page


class PageGuard:
    """ASGI middleware around the page: security headers on every response, and a brake on password guessing.

    After LOGIN_FREE_TRIES wrong logins a client (by the address that connected, or the one a trusted proxy
    forwards: see start_page) must wait `lockout` seconds (429 with Retry-After),
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


def start_page(chat: ChatPage, host: str, port: int, auth: tuple[str, str] | None,
               trusted_proxies: Iterable[str] = ()) -> tuple[gr.Blocks, str]:
    """Build and start the page without blocking; returns it and its URL. An IPv6 address is bracketed the way
    Gradio expects; a host or port that cannot be bound is a ConfigError of one line.

    Only `trusted_proxies` may say whom they forward (X-Forwarded-For): uvicorn, under Gradio, otherwise believes
    any client on this machine, which could then name a new address for every login try and never be locked out."""
    bare = host.strip("[]")
    _check_bindable(host, port)
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(trusted_proxies)  # read when Gradio builds uvicorn's config
    page = chat.build()
    guard = Middleware(PageGuard, free_tries=LOGIN_FREE_TRIES, lockout=LOGIN_LOCKOUT_SECONDS)
    try:
        _, url, _ = page.launch(server_name=f"[{bare}]" if ":" in bare else bare, server_port=port, auth=auth,
                                share=False, ssr_mode=False, quiet=True, prevent_thread_lock=True,
                                app_kwargs={"middleware": [guard]}, css=PAGE_CSS,
                                head=PAGE_HEAD + CONVERSATION_URL_SCRIPT,
                                footer_links=[])
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
    """Start the page and block until Ctrl+C or SIGTERM; refuses a non-local host without a login (see ui_auth)."""
    auth = ui_auth(host)
    chat = ChatPage(brain)
    try:
        page, url = start_page(chat, host, port, auth, brain.settings.serve["trusted_proxies"])
        print(f"brain: chat page on {url} (Ctrl+C stops it)", flush=True)
        run_until_stopped(page)
    finally:
        chat.close()
    # Stopped cleanly, every store closed: the interpreter's last garbage collection would walk every object Gradio,
    # LlamaIndex and the models made (~5 s on two busy cores) to free memory the process is about to give back.
    # Frozen, they are skipped; exit handlers still run.
    gc.freeze()


def run_until_stopped(page: gr.Blocks) -> None:
    """Block until Ctrl+C or SIGTERM, then close the page at once. Gradio's block_thread only stopped the web
    server, which then waited ~10 s for every open tab's heartbeat stream; closing the Blocks ends them."""
    stop = StopRequested()
    try:
        with stop_on_signals(stop):
            while page.is_running and not stop.wait(0.1):
                pass
    finally:
        page.close(verbose=False)
