"""Read one indexed note again from its source, so an agent can quote the current text rather than the indexed copy.

The caller gives a note id only; where to read comes from the index: a vault note's stored path under its source's
folder (never a path from the caller, never outside the vault, symlinks included), a memo's stored id on its
source's server (`GET /api/v1/memos/{uid}`, old servers `GET /api/v1/memo/{id}`).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rag_app.config import SourceSpec
from readers.records import NoteRecord

__all__ = ["SourceError", "read_note"]

_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")  # what a stored memo id may be to become one URL segment


class SourceError(Exception):
    """The note's source could not be read or written (unreachable, refused, a file that is not a note): one line
    that names what failed, never a token."""


def read_note(spec: SourceSpec, note_id: str, meta: dict[str, Any], token: str | None) -> NoteRecord | None:
    """The note as its source holds it now, parsed as a sync would; None when the source no longer has it."""
    if spec.kind == "vault":
        return _read_vault_note(spec, note_id, str(meta.get("path") or ""))
    return _read_memo(spec, note_id, str(meta.get("memo_id") or ""), token)


def _read_vault_note(spec: SourceSpec, note_id: str, rel: str) -> NoteRecord | None:
    from readers.vault_scanner import VaultScanner, decode_note, looks_binary

    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or p.startswith(".") for p in parts) or "\\" in rel:
        raise SourceError(f"the stored path of {note_id!r} is not a path inside its vault")
    scanner = VaultScanner(spec.path, name=spec.name)
    if not scanner.root.is_dir():
        raise SourceError(f"the vault folder of source {spec.name!r} is missing: {scanner.root}")
    real_root = os.path.realpath(scanner.root)
    path = scanner.root / Path(*parts)
    real = os.path.realpath(path)
    if os.path.commonpath([real, real_root]) != real_root:
        raise SourceError(f"{rel}: the file now points outside its vault; not read")
    try:
        info = os.stat(real)
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{rel}: not a regular file any more")
        if info.st_size > scanner.max_bytes:
            raise SourceError(f"{rel}: {info.st_size} bytes is over the {scanner.max_bytes}-byte limit")
        raw = Path(real).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"{rel}: cannot be read ({exc.strerror or exc})") from None
    if looks_binary(raw):
        raise SourceError(f"{rel}: binary content in a .md file")
    text, _ = decode_note(raw)
    record, _ = scanner.parse(rel, text, info.st_mtime)
    if record.id != note_id:
        raise SourceError(f"{rel}: the file no longer maps to {note_id!r}")
    return record


def _read_memo(spec: SourceSpec, note_id: str, memo_id: str, token: str | None) -> NoteRecord | None:
    from readers.memos_client import MemosClient, MemosError, fetch_memos, memo_to_record

    if not _UID.fullmatch(memo_id):
        raise SourceError(f"the stored memo id of {note_id!r} is not one this server could have made")
    try:
        with MemosClient(spec.url, token, **spec.memos_limits()) as client:
            api = client.detect()
            if api.generation == "v0.22":  # v0.22 fetches one memo by its number, which the index does not keep
                listing = fetch_memos(spec.url, None, source=spec.name, include_archived=True,
                                      include_comments=spec.include_comments, client=client)
                return next((r for r in listing.records if r.id == note_id), None)
            path = f"/api/v1/memo/{memo_id}" if api.generation == "old" else f"/api/v1/memos/{quote(memo_id)}"
            answer = client.request("GET", path)
            if answer.status_code == 404:
                return None
            if answer.status_code in (401, 403):
                raise SourceError(f"GET {path}: HTTP {answer.status_code}: the server did not let this token read "
                                  "the memo (is the source's token set?)")
            if answer.status_code >= 400:
                raise SourceError(f"GET {path}: HTTP {answer.status_code}")
            memo = client.parse_json(answer.content, f"GET {path}")
            if not isinstance(memo, dict):
                raise SourceError(f"GET {path}: expected a memo object")
            record = memo_to_record(memo, api, client.base_url, spec.name)
    except MemosError as exc:
        raise SourceError(str(exc)) from None
    if record is None or record.id != note_id:
        raise SourceError(f"the server answered {note_id!r} with another memo")
    return record
