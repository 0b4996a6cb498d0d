"""Capture: save a new note an agent or person wants to keep, into the one source `[capture]` names.

A vault source gets a new markdown file in its capture folder (frontmatter title, tags, created), created with
O_EXCL under folder handles opened without following symlinks: it never overwrites a file and never lands outside
that folder. A Memos source gets a new PRIVATE memo through the API, sent the token that source may use.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from rag_app.config import SourceSpec
from rag_app.index.private import shared_mode
from rag_app.ingest.fresh import SourceError

__all__ = ["MAX_CAPTURE_BYTES", "CaptureError", "CapturedNote", "NewNote", "new_note", "write_memo",
           "write_vault_note"]

MAX_CAPTURE_BYTES = 100 * 1024
MAX_TITLE_CHARS = 200
MAX_TAGS = 20
MAX_TAG_CHARS = 100
NAME_CHARS = 60  # the title's share of a file name (CJK: 180 bytes, within every file system's 255)
MEMO_ANSWER_BYTES = 4 * 1024 * 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u2028\u2029]")  # text keeps tabs and line breaks
_TAG = re.compile(r"[^\s#,\x00-\x1f\x7f]+")  # a tag Memos and Obsidian both read back as one (no blanks, '#' or ',')
_UNSAFE_NAME = re.compile(r"[^\w\- ]+")
_RULE = re.compile(r"(?:[-*_=]\s*){3,}")  # a thematic break, a setext underline or a frontmatter fence


class CaptureError(ValueError):
    """Input a capture refuses (empty, too long, control characters, bad tags): the message says what to fix."""


@dataclass(frozen=True)
class NewNote:
    """A checked capture: the text as given, a one-line title, tags without '#'."""

    text: str
    title: str
    tags: tuple[str, ...] = ()
    created: dt.datetime = field(default_factory=lambda: dt.datetime.now().astimezone().replace(microsecond=0))


@dataclass(frozen=True)
class CapturedNote:
    """Where a capture went: the note id a search will return, and the file or memo."""

    note_id: str
    source: str
    kind: str
    path: str = ""
    url: str = ""
    visibility: str = ""


def new_note(text: object, title: object = None, tags: object = None) -> NewNote:
    """Check a capture's input; the title defaults to the text's first line."""
    if not isinstance(text, str):
        raise CaptureError(f"text must be a string, not {type(text).__name__}")
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise CaptureError("text is empty: give the note's content")
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_CAPTURE_BYTES:
        raise CaptureError(f"text is too long: {size} bytes, at most {MAX_CAPTURE_BYTES} (100 KB)")
    if _CONTROL.search(text) or re.search(r"[\ud800-\udfff]", text):
        raise CaptureError("text contains control characters; send plain text (tabs and line breaks are fine)")
    if title is None or (isinstance(title, str) and not title.strip()):
        title = _default_title(text)
    elif not isinstance(title, str):
        raise CaptureError(f"title must be a string, not {type(title).__name__}")
    elif not title.isprintable() or re.search(r"[\ud800-\udfff]", title):
        raise CaptureError("title contains control characters (line breaks included): give one line of text")
    elif len(title.strip()) > MAX_TITLE_CHARS:
        raise CaptureError(f"title is too long: {len(title.strip())} characters, at most {MAX_TITLE_CHARS}")
    return NewNote(text, title.strip() or "note", _tags(tags))


def _default_title(text: str) -> str:
    """The frontmatter's title, else the first line of text after the frontmatter: a `---` fence or a rule is no
    title (Markdown pasted with its frontmatter would otherwise be saved as '---')."""
    from readers.markdown_syntax import split_frontmatter

    front = split_frontmatter(text)
    given = front.data.get("title")
    given = " ".join(given.split()) if isinstance(given, str) else ""
    if given and given.isprintable():
        return given[:80]
    for line in front.body.split("\n"):
        words = line.strip().lstrip("#").strip()
        if words and not _RULE.fullmatch(words):
            return words[:80]
    return "note"


def _tags(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise CaptureError("tags must be a list of strings")
    if len(value) > MAX_TAGS:
        raise CaptureError(f"tags holds {len(value)} items, at most {MAX_TAGS}")
    tags = [t.strip().removeprefix("#") for t in value if t.strip()]
    bad = [t for t in tags if not _TAG.fullmatch(t) or len(t) > MAX_TAG_CHARS]
    if bad:
        raise CaptureError(f"tag {bad[0][:40]!r} is not one tag: no blanks, '#', ',' or control characters, "
                           f"at most {MAX_TAG_CHARS} characters (write 'reading/books' for a nested tag)")
    return tuple(dict.fromkeys(tags))


def write_vault_note(spec: SourceSpec, folder: str, note: NewNote) -> CapturedNote:
    """A new markdown file in `folder` of the vault; folders are made as needed, none of them may be a symlink."""
    import yaml

    from readers.vault_scanner import vault_note_id

    root = os.path.realpath(os.path.expanduser(spec.path))
    if not os.path.isdir(root):
        raise SourceError(f"the vault folder of source {spec.name!r} is missing: {spec.path}")
    front = {"title": note.title, "tags": list(note.tags), "created": note.created.isoformat()}
    content = "---\n" + yaml.safe_dump(front, allow_unicode=True, sort_keys=False) + "---\n\n" + note.text + "\n"
    parts = folder.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            child = _enter(fd, part, folder)
            os.close(fd)
            fd = child
        name = _create_unique(fd, _file_stem(note), content.encode("utf-8"))
    finally:
        os.close(fd)
    rel = "/".join([*parts, name])
    return CapturedNote(vault_note_id(spec.name, rel), spec.name, "vault", path=rel)


def _enter(parent: int, part: str, folder: str) -> int:
    """The folder `part` under the open folder `parent` (made if missing, with the mode the user's umask gives, not
    the home's private one), opened without following a symlink."""
    made = True
    try:
        os.mkdir(part, 0o755, dir_fd=parent)
    except FileExistsError:
        made = False
    except OSError as exc:
        raise SourceError(f"cannot make the capture folder {folder!r} ({exc.strerror or exc})") from None
    try:
        child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError:
        raise SourceError(f"the capture folder {folder!r} must be a real folder inside the vault (a symlink or a "
                          "file is in the way); nothing was written") from None
    if made:
        os.fchmod(child, shared_mode(0o755))
    return child


def _file_stem(note: NewNote) -> str:
    """`YYYY-MM-DD HHMMSS <title>`: readable, sorted by time, safe on every file system (no dot-file, no '/')."""
    title = unicodedata.normalize("NFC", note.title)
    slug = " ".join(_UNSAFE_NAME.sub(" ", title).split())[:NAME_CHARS].strip(" -") or "note"
    return f"{note.created:%Y-%m-%d %H%M%S} {slug}"


def _create_unique(folder: int, stem: str, data: bytes) -> str:
    """Create `<stem>.md`, else `<stem> 2.md`, ...: O_EXCL never opens an existing file or symlink."""
    for n in range(1, 1000):
        name = f"{stem}.md" if n == 1 else f"{stem} {n}.md"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        except FileExistsError:
            continue
        except OSError as exc:
            raise SourceError(f"cannot create {name!r} in the capture folder ({exc.strerror or exc})") from None
        try:
            os.fchmod(fd, shared_mode(0o644))  # a note of the vault, as the user's editor would make it
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except OSError as exc:
            os.unlink(name, dir_fd=folder)
            raise SourceError(f"cannot write {name!r} ({exc.strerror or exc})") from None
        return name
    raise SourceError(f"999 notes named {stem!r} already exist in the capture folder")


def memo_content(note: NewNote) -> str:
    """A memo has no title or tag fields: the title becomes its first heading, tags a closing `#tag` line."""
    lines = [note.text]
    if not note.text.startswith("#") and note.title not in note.text.split("\n", 1)[0]:
        lines.insert(0, f"# {note.title}\n")
    if note.tags:
        lines.append("\n" + " ".join(f"#{t}" for t in note.tags))
    return "\n".join(lines)


def write_memo(spec: SourceSpec, token: str | None, note: NewNote) -> CapturedNote:
    """A new PRIVATE memo on the source's server (current API `POST /api/v1/memos`, old `POST /api/v1/memo`).

    Sent once, never retried (a retry could create it twice), without following redirects (the token stays with
    the server it belongs to), and answered within the source's request_deadline like every read (a server that
    drips its answer must not hold an agent's call)."""
    from readers.memos_client import MemosClient, MemosError, memo_to_record
    from readers.redaction import redacted_line

    if not token:
        raise SourceError(f"capturing into the Memos source {spec.name!r} needs its token (CFLOW_API_TOKEN, or the "
                          "variable its token_env names)")
    limits = spec.memos_limits()
    limits["max_response_bytes"] = min(limits.get("max_response_bytes", MEMO_ANSWER_BYTES), MEMO_ANSWER_BYTES)
    try:
        with MemosClient(spec.url, token, **limits) as client:
            api = client.detect()
            path = "/api/v1/memo" if api.generation == "old" else "/api/v1/memos"
            try:
                answer = client.send_once("POST", path, {"content": memo_content(note), "visibility": "PRIVATE"})
            except MemosError as exc:
                raise SourceError(f"{exc}; the memo may not have been saved") from None
    except MemosError as exc:
        raise SourceError(str(exc)) from None
    status = answer.status_code
    if status in (401, 403):
        raise SourceError(f"POST {path}: HTTP {status}: the server refused the token (is it this server's?)")
    if not 200 <= status < 300:
        raise SourceError(f"POST {path}: HTTP {status} {redacted_line(answer.text, [token])}")
    try:
        memo = json.loads(answer.text)
    except (ValueError, RecursionError):
        memo = None
    record = memo_to_record(memo, api, client.base_url, spec.name) if isinstance(memo, dict) else None
    if record is None:
        raise SourceError(f"POST {path}: the server saved the memo but sent no memo back; the next sync finds it")
    meta: dict[str, Any] = record.metadata
    return CapturedNote(record.id, spec.name, "memos", url=str(meta.get("url") or ""),
                        visibility=str(meta.get("visibility") or ""))
