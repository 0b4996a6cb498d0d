"""Conversations kept in the home (`sessions.sqlite`), shared by the CLI and the page, and the follow-up rules.

A follow-up ("第二部是谁导演的？") says nothing about its subject, so it is condensed into a standalone retrieval query:
with an LLM the LlamaIndex way (CondensePlusContextChatEngine's condense prompt over the history), without one by
carrying the subject of the last turn (the titles of the notes it cited and its own query's content words).

One short SQLite connection per call in WAL mode: safe from several threads and processes (the page, the CLI).

LlamaIndex (its chat messages and condense prompt) is imported inside the three functions that use it, not at the top:
the engine imports this module, and `brain status`, `brain sessions` and a sync never need LlamaIndex (1.2-1.4 s).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag_app.answers.answer import CITATION_MARK
from rag_app.index.keyword import query_words
from rag_app.index.manifest import enable_wal
from rag_app.index.store import StoreError
from rag_app.search.query import SearchError

MAX_NAME_CHARS = 80
TITLE_CHARS = 40  # a conversation started by its first question is named after it, shortened to this
SUBJECT_TERMS = 6  # carried from the last turn into a follow-up's query without an LLM
HISTORY_ANSWER_CHARS = 1500  # of each earlier answer sent back to the LLM
CONDENSE_TURNS = 4
HISTORY_TURNS = 50  # earlier turns a question is read with (4 condense it; the LLM's history budget rarely fits 50)
WAIT_SECONDS = 30.0  # how long a call waits for another process's write to the file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY, session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    question TEXT NOT NULL, answer TEXT NOT NULL, citations TEXT NOT NULL, coverage TEXT NOT NULL,
    mode TEXT NOT NULL, asked REAL NOT NULL, turn_id TEXT);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns(session_id, id);
"""
# A turn's id, given by whoever asks (the CLI gives each ask one): a turn is stored once per id, so an ask run again
# after a warm engine died having stored it (shells/warm_engine.py) does not store it twice.
_TURN_IDS = "CREATE UNIQUE INDEX IF NOT EXISTS turns_once ON turns(session_id, turn_id) WHERE turn_id IS NOT NULL"
MAX_TURN_ID_CHARS = 64
_TURN_ID = re.compile(r"[A-Za-z0-9._:-]+")


class SessionError(SearchError):
    """A session name that cannot be used (empty, too long, unprintable, already taken): bad input."""


class SessionNotFound(SessionError, LookupError):
    """No session with that name."""


class SessionStoreError(StoreError):
    """sessions.sqlite cannot be read or written (damaged, locked, a full disk): one line naming the file."""


def validate_name(name: object) -> str:
    """1–80 printable characters (blanks at either end dropped): a name shows in lists, titles and terminals."""
    if not isinstance(name, str):
        raise SessionError("a session name is text")
    name = name.strip()
    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise SessionError(f"a session name has 1 to {MAX_NAME_CHARS} printable characters, got {name[:90]!r}")
    return name


def validate_turn_id(turn_id: object) -> str:
    """1–64 letters, digits and . _ : - (a UUID, a random hex string, a caller's own key)."""
    if not isinstance(turn_id, str) or len(turn_id) > MAX_TURN_ID_CHARS or not _TURN_ID.fullmatch(turn_id):
        raise SessionError(f"a turn id has 1 to {MAX_TURN_ID_CHARS} letters, digits and . _ : -, "
                           f"got {str(turn_id)[:90]!r}")
    return turn_id


def iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class SessionStore:
    """Sessions and their turns in `<home>/sessions.sqlite`; the file appears with the first stored turn."""

    def __init__(self, path: Path):
        self.path = path

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection for one call; SQLite's errors as SessionStoreError, saying which file and what to do."""
        try:
            with contextlib.closing(self._connect()) as conn:
                yield conn
        except sqlite3.Error as exc:
            raise SessionStoreError(self.problem(exc)) from None

    def problem(self, exc: sqlite3.Error) -> str:
        """One line for an SQLite error on this file: damaged, locked or full, and what to do about it."""
        text = str(exc)
        if "locked" in text or "busy" in text:
            return (f"{self.path} is locked by another process (waited {WAIT_SECONDS:g} s); conversations are not "
                    "saved until it lets go")
        if "full" in text:
            return f"{self.path}: the disk is full; conversations are not saved until there is room"
        if isinstance(exc, sqlite3.OperationalError) and "malformed" not in text and "not a database" not in text:
            return f"{self.path} cannot be used ({text})"
        return (f"{self.path} is damaged ({text}); `brain doctor --repair` sets it aside and starts a new one "
                "(notes are not affected)")

    def check(self) -> str | None:
        """What is wrong with the file (for `brain doctor`), or None; a home without conversations is fine."""
        if not self.path.exists():
            return None
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=WAIT_SECONDS)
            with contextlib.closing(conn):
                result = [row[0] for row in conn.execute("PRAGMA quick_check")]
                conn.execute("SELECT COUNT(*) FROM turns").fetchone()
        except sqlite3.Error as exc:
            return self.problem(exc)
        if result != ["ok"]:
            return self.problem(sqlite3.DatabaseError("; ".join(result[:3])))
        return None

    def set_aside(self) -> Path:
        """Move a damaged file (and its -wal and -shm, which belong to it alone) to
        `sessions.sqlite.damaged-<time>`: kept for whoever wants to recover it; the next conversation starts anew."""
        aside = self.path.with_name(f"{self.path.name}.damaged-{dt.datetime.now():%Y%m%d-%H%M%S}")
        for suffix in ("-wal", "-shm", ""):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        return aside

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=WAIT_SECONDS, isolation_level=None)
        enable_wal(conn)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(_SCHEMA)
        if "turn_id" not in {row[1] for row in conn.execute("PRAGMA table_info(turns)")}:  # a file from before ids
            with contextlib.suppress(sqlite3.OperationalError):  # another process added it a moment ago
                conn.execute("ALTER TABLE turns ADD COLUMN turn_id TEXT")
        conn.execute(_TURN_IDS)
        return conn

    def _id(self, conn: sqlite3.Connection, name: str) -> int | None:
        row = conn.execute("SELECT id FROM sessions WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def turns(self, name: str, last: int | None = None, before: int | None = None) -> list[dict[str, Any]]:
        """The session's turns, oldest first: all of them, or the `last` ones before turn number `before` (default:
        the end). A long session is read a page at a time, never whole; [] for a session that does not exist yet."""
        name = validate_name(name)
        if not self.path.exists():
            return []
        with self._db() as conn:
            end = self._count(conn, name) if before is None else before
            start = 0 if last is None else max(0, end - last)
            rows = conn.execute(
                "SELECT t.question, t.answer, t.citations, t.coverage, t.mode, t.asked FROM turns t "
                "JOIN sessions s ON s.id = t.session_id WHERE s.name = ? ORDER BY t.id LIMIT ? OFFSET ?",
                (name, max(0, end - start), start)).fetchall()
        return [{"question": q, "answer": a, "citations": json.loads(c), "coverage": json.loads(cov), "mode": m,
                 "asked": iso(asked)} for q, a, c, cov, m, asked in rows]

    @staticmethod
    def _count(conn: sqlite3.Connection, name: str) -> int:
        return conn.execute("SELECT COUNT(*) FROM turns t JOIN sessions s ON s.id = t.session_id WHERE s.name = ?",
                            (name,)).fetchone()[0]

    def append(self, name: str, turn: dict[str, Any], turn_id: str | None = None) -> bool:
        """Store one turn, creating the session on its first; with a `turn_id` the session already holds, nothing
        (False): the same ask stored once, however often it is run. SessionError if that id holds another question."""
        name = validate_name(name)
        turn_id = validate_turn_id(turn_id) if turn_id is not None else None
        now = time.time()
        with self._db() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                session_id = self._id(conn, name)
                if session_id is None:
                    session_id = conn.execute("INSERT INTO sessions (name, created, updated) VALUES (?, ?, ?)",
                                              (name, now, now)).lastrowid
                elif turn_id is not None and self._turn_row(conn, session_id, turn_id, turn["question"]) is not None:
                    conn.execute("ROLLBACK")
                    return False
                conn.execute(
                    "INSERT INTO turns (session_id, question, answer, citations, coverage, mode, asked, turn_id) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, turn["question"], turn["answer"], json.dumps(turn["citations"], ensure_ascii=False),
                     json.dumps(turn["coverage"], ensure_ascii=False, default=str), turn["mode"], now, turn_id))
                conn.execute("UPDATE sessions SET updated = ? WHERE id = ?", (now, session_id))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return True

    def stored_turn(self, name: str, turn_id: str, question: str) -> dict[str, Any] | None:
        """The session's turn stored under `turn_id`, or None; SessionError if that turn asked another question (an id
        reused: its old answer would be taken for the answer to this one)."""
        name, turn_id = validate_name(name), validate_turn_id(turn_id)
        if not self.path.exists():
            return None
        with self._db() as conn:
            session_id = self._id(conn, name)
            row = self._turn_row(conn, session_id, turn_id, question) if session_id is not None else None
        if row is None:
            return None
        q, a, c, cov, m, asked = row
        return {"question": q, "answer": a, "citations": json.loads(c), "coverage": json.loads(cov), "mode": m,
                "asked": iso(asked)}

    @staticmethod
    def _turn_row(conn: sqlite3.Connection, session_id: int, turn_id: str, question: str) -> tuple[Any, ...] | None:
        row = conn.execute("SELECT question, answer, citations, coverage, mode, asked FROM turns "
                           "WHERE session_id = ? AND turn_id = ?", (session_id, turn_id)).fetchone()
        if row is not None and row[0] != question:
            raise SessionError(f"turn id {turn_id!r} is already the id of another question in this session "
                               f"({row[0][:60]!r}): give each ask an id of its own")
        return row

    def list(self) -> list[dict[str, Any]]:
        """Every session, most recently used first."""
        if not self.path.exists():
            return []
        with self._db() as conn:
            rows = conn.execute(
                "SELECT s.name, s.updated, (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id), "
                "(SELECT question FROM turns t WHERE t.session_id = s.id ORDER BY t.id DESC LIMIT 1) "
                "FROM sessions s ORDER BY s.updated DESC, s.id DESC").fetchall()
        return [{"name": name, "turns": turns, "last_question": last, "updated": iso(updated)}
                for name, updated, turns, last in rows]

    def get(self, name: str, last: int | None = None, before: int | None = None) -> dict[str, Any]:
        """{"name", "total", "first", "turns"}: the turns as `turns` picks them, `first` the number of the first."""
        name = validate_name(name)
        if not self.exists(name):
            raise SessionNotFound(f"no session named {name!r}")
        with self._db() as conn:
            total = self._count(conn, name)
        end = total if before is None else min(before, total)
        turns = self.turns(name, last, end)
        return {"name": name, "total": total, "first": end - len(turns), "turns": turns}

    def exists(self, name: str) -> bool:
        if not self.path.exists():
            return False
        with self._db() as conn:
            return self._id(conn, validate_name(name)) is not None

    def rename(self, old: str, new: str) -> None:
        old, new = validate_name(old), validate_name(new)
        with self._db() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self._id(conn, old) is None:
                    raise SessionNotFound(f"no session named {old!r}")
                if old != new and self._id(conn, new) is not None:
                    raise SessionError(f"a session named {new!r} already exists")
                conn.execute("UPDATE sessions SET name = ? WHERE name = ?", (new, old))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def delete(self, name: str) -> None:
        name = validate_name(name)
        with self._db() as conn:
            if conn.execute("DELETE FROM sessions WHERE name = ?", (name,)).rowcount == 0:
                raise SessionNotFound(f"no session named {name!r}")

    def new_name(self, now: dt.datetime | None = None) -> str:
        """A readable default ("2026-12-01 14:03"), numbered when a session of that minute exists."""
        base = (now or dt.datetime.now()).strftime("%Y-%m-%d %H:%M")
        name, n = base, 1
        while self.exists(name):
            n += 1
            name = f"{base} ({n})"
        return name

    def create(self, title: str) -> str:
        """A new, empty session named after `title` (its first question: one line, at most TITLE_CHARS), numbered
        when that name is taken; created at once, in one transaction, so two new chats never share a name."""
        base = " ".join(title.split()) or "Conversation"
        base = base if len(base) <= TITLE_CHARS else base[:TITLE_CHARS - 1].rstrip() + "…"
        base = "".join(char if char.isprintable() else " " for char in base)
        now = time.time()
        with self._db() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                name, n = validate_name(base), 1
                while self._id(conn, name) is not None:
                    n += 1
                    name = f"{base} ({n})"
                conn.execute("INSERT INTO sessions (name, created, updated) VALUES (?, ?, ?)", (name, now, now))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return name


_CITATION_MARK = re.compile(r"\s?" + CITATION_MARK)


def without_citations(text: str) -> str:
    """An earlier answer's [n] point at that turn's sources, not the next one's: they are dropped from history."""
    return _CITATION_MARK.sub("", text)


def subject_of(turn: dict[str, Any]) -> list[str]:
    """What a turn was about: the titles of the notes its answer cited (the LLM's [n], else its strong sources), then
    the content words of the query it searched."""
    citations = turn.get("citations") or []
    cited = set((turn.get("coverage") or {}).get("cited") or [])
    chosen = [c for c in citations if c.get("n") in cited] if cited else [
        c for c in citations if c.get("strength") == "strong"]
    titles = [str(c["title"]) for c in chosen[:2] if c.get("title")]
    searched = (turn.get("coverage") or {}).get("condensed_query") or turn.get("question") or ""
    return list({t.lower(): t for t in reversed([*titles, *query_words(searched)])}.values())[::-1][:SUBJECT_TERMS]


# A question that points back at the conversation: 那/这/它…, a trailing 呢, an ordinal (第二部, 第3本), English
# pronouns and "what about". Such a question needs the last turn's subject even when it matches a note by itself.
_REFERS_BACK = re.compile(
    r"^(?:那|那么|这|这个|那个|这些|那些|它|它们|他|她|他们|她们|其)|呢[？?]?\s*$|第[一二三四五六七八九十两\d]+[部本个篇条次集季章]"
    r"|(?i:\b(?:it|its|they|them|their|that one|this one|those|these|what about|how about|and the)\b)")


def refers_back(question: str) -> bool:
    """Whether a question leans on what came before (see _REFERS_BACK)."""
    return bool(_REFERS_BACK.search(question.strip()))


def subject_notes(turn: dict[str, Any]) -> set[str]:
    """The notes a turn answered from: those its answer cited, else its strong and related sources."""
    citations = turn.get("citations") or []
    cited = set((turn.get("coverage") or {}).get("cited") or [])
    return {str(c["note_id"]) for c in citations
            if (c.get("n") in cited if cited else c.get("strength") in ("strong", "related"))}


def stands_alone(question: str, own: list[dict[str, Any]], own_state: str, last_turn: dict[str, Any],
                 lead: float) -> bool:
    """Whether a question starts a new subject: it does not point back (那…, 第二部, it), the notes give it leads of
    its own (`own`: its top results searched alone; `own_state` not "not_found"), and neither its first lead nor its
    most relevant one (at relevance ≥ `lead`) is a note the last turn answered from. 番茄要选什么样的 after a turn on
    coffee leads to 番茄炒蛋: a new subject, searched as asked. 要多少钱 after a turn on Kyoto leads to the Kyoto note,
    and 导演是谁 to the film list: follow-ups, given the subject."""
    if refers_back(question) or own_state == "not_found":
        return False
    leads = [r for r in own if float(r.get("relevance") or 0.0) >= lead]
    if not leads:
        return False  # no lead of its own beyond a title's likeness: read it as a follow-up
    first = {leads[0]["note_id"], max(leads, key=lambda r: float(r["relevance"]))["note_id"]}
    return not first & subject_notes(last_turn)


def condense_without_llm(question: str, history: list[dict[str, Any]], stands_alone: bool = False) -> str:
    """The follow-up, then the subject of the last turn it does not already name; a question that `stands_alone`
    (see `stands_alone`) starts a new subject and is searched as asked: 猫咪日常 after a turn on yearly goals is about
    cats, not goals."""
    if not history or stands_alone:
        return question
    carried = [t for t in subject_of(history[-1]) if t.lower() not in question.lower()]
    return " ".join([question, *carried]).strip()


def history_text(history: list[dict[str, Any]], turns: int = CONDENSE_TURNS) -> str:
    """The last turns as LlamaIndex writes chat history ("user: ...", "assistant: ..."), answers shortened."""
    from llama_index.core.base.llms.generic_utils import messages_to_history_str

    return messages_to_history_str(history_messages(history[-turns:], budget=turns * (HISTORY_ANSWER_CHARS + 500)))


def condense_prompt(question: str, history: list[dict[str, Any]]) -> str:
    """CondensePlusContextChatEngine's own condense prompt, filled with this conversation."""
    from llama_index.core.chat_engine.condense_plus_context import DEFAULT_CONDENSE_PROMPT_TEMPLATE

    return DEFAULT_CONDENSE_PROMPT_TEMPLATE.format(chat_history=history_text(history), question=question)


def standalone_from_reply(reply: str) -> str:
    """The first line of the model's reply, without a "Standalone question:" label or quotes; at most 500 chars."""
    for line in reply.splitlines():
        line = re.sub(r"^\s*(standalone question|question|独立问题|问题)\s*[:：]\s*", "", line, flags=re.I).strip()
        line = line.strip("\"'“”「」")
        if line:
            return line[:500]
    return ""


def history_messages(history: list[dict[str, Any]], budget: int) -> list[Any]:
    """Earlier turns as chat messages (user question, assistant answer), the newest kept first within `budget`
    characters (answers shortened to fit), returned oldest first."""
    from llama_index.core.llms import ChatMessage, MessageRole

    kept: list[Any] = []
    used = 0
    for turn in reversed(history):
        room = min(HISTORY_ANSWER_CHARS, budget - used - len(turn["question"]))
        if room < 100:
            break
        answer = without_citations(turn["answer"])[:room]
        size = len(turn["question"]) + len(answer)
        kept[:0] = [ChatMessage(role=MessageRole.USER, content=turn["question"]),
                    ChatMessage(role=MessageRole.ASSISTANT, content=answer)]
        used += size
    return kept
