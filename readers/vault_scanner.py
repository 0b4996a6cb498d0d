"""Walk an Obsidian-style vault and parse each markdown file into a `NoteRecord` (no LlamaIndex import)."""

from __future__ import annotations

import codecs
import datetime as dt
import errno
import functools
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from readers.markdown_syntax import (
    as_datetime,
    as_string_list,
    as_text_list,
    date_fields,
    first_h1,
    parse_tags,
    parse_wikilinks,
    split_frontmatter,
)
from readers.records import NoteRecord, SourceListing, encode_list

DEFAULT_MAX_BYTES = 2 * 1024 * 1024
MAX_FOLDER_DEPTH = 64
_DATE_IN_NAME = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


class VaultError(Exception):
    """The vault as a whole cannot be read (missing root, not a directory, a folder that cannot be listed)."""


def vault_note_id(vault_name: str, rel_path: str) -> str:
    """Deterministic note id; the vault name keeps two vaults' `index.md` apart."""
    return f"vault:{vault_name}/{rel_path}"


# UTF-32 before UTF-16: the UTF-32 LE mark starts with the UTF-16 LE one.
_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_note(raw: bytes) -> tuple[str, str]:
    """Decode file bytes: BOMs honoured, UTF-8 expected, anything undecodable replaced with a warning."""
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding), ""
    except UnicodeDecodeError as exc:
        label = encoding.removesuffix("-sig").upper()
        warning = f"not valid {label} (byte {exc.start}); undecodable bytes replaced"
        return raw.decode(encoding, errors="replace"), warning


@functools.cache
def _parser_stamp() -> str:
    """A digest of the code that turns a file's bytes into a record: any change to it invalidates every signature."""
    from readers import markdown_syntax, records

    sources = b"".join(Path(module.__file__ or "").read_bytes() for module in (markdown_syntax, records))
    return hashlib.blake2b(sources + Path(__file__).read_bytes(), digest_size=8).hexdigest()


def file_signature(raw: bytes) -> str:
    """What a vault note's record is made from, besides its path: its bytes and the parsing code."""
    return f"{_parser_stamp()}:{hashlib.blake2b(raw, digest_size=16).hexdigest()}"


def looks_binary(raw: bytes) -> bool:
    return not raw.startswith(tuple(bom for bom, _ in _BOMS)) and b"\x00" in raw[:8192]


class VaultScanner:
    """Lists and parses the notes of one vault; per-file problems become warnings, never exceptions."""

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root).expanduser()
        self.name = name or self.root.resolve().name
        self.max_bytes = max_bytes

    def iter_paths(self, warnings: list[str]) -> list[Path]:
        """Markdown files under the root, in name order; dot-folders and dot-files skipped.

        Symlinks are followed only to targets inside the vault. A symlinked folder that the plain walk reaches anyway
        is not walked again, so its notes keep their real paths and loops are cut. A folder nested deeper than
        `MAX_FOLDER_DEPTH` is skipped with a warning (an explicit stack, so no depth can overflow Python's). A folder
        that cannot be listed raises `VaultError`: a partial listing would make the sync delete the notes it hides.
        """
        if not self.root.is_dir():
            raise VaultError(f"vault folder not found or not a directory: {self.root}")
        real_root = os.path.realpath(self.root)
        visited = {real_root}
        found: list[Path] = []
        stack = [(self.root, iter(self._list(self.root, warnings)))]
        while stack:
            folder, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            if entry.name.startswith("."):
                continue
            path = Path(folder, entry.name)
            is_note = entry.name.lower().endswith(".md")
            is_dir = _is_dir(entry)
            if entry.is_symlink():
                real = os.path.realpath(path)
                if not _inside(real, real_root):
                    if is_note or is_dir:
                        warnings.append(f"{self._rel(path)}: symlink points outside the vault; skipped")
                    continue
                if is_dir and _inside(os.path.realpath(folder), real):
                    warnings.append(f"{self._rel(path)}: symlink to an enclosing folder (a loop); skipped")
                    continue
                if is_dir and (real in visited or _walked_anyway(real, real_root)):
                    continue
            if is_dir:
                if len(stack) > MAX_FOLDER_DEPTH:
                    warnings.append(f"{self._rel(path)}: folder nested deeper than {MAX_FOLDER_DEPTH} levels; skipped")
                    continue
                visited.add(os.path.realpath(path))
                stack.append((path, iter(self._list(path, warnings))))
            elif is_note:
                found.append(path)
        return found

    def _list(self, folder: Path, warnings: list[str]) -> list[os.DirEntry[str]]:
        """A folder's entries in name order. A path too long for the system to open is skipped with a warning (no
        note under it could ever be read); any other failure fails the vault."""
        try:
            with os.scandir(folder) as entries:
                return sorted(entries, key=lambda entry: entry.name)
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                warnings.append(f"{self._rel(folder)}: path too long for the system to open; skipped")
                return []
            raise VaultError(f"cannot list the vault folder {folder} ({exc.strerror or exc})") from exc

    def scan(self, known: Mapping[str, str] | None = None) -> SourceListing:
        """One complete pass: a record per readable note; unreadable ones are kept, the rest skipped with a warning.

        `known` maps the note ids the index holds to the `file_signature` of the bytes last indexed ("" for a note
        that must be parsed again): a note whose bytes still match is listed in `unchanged_ids` without being decoded
        or parsed (a no-change sync of thousands of notes stays fast), and known notes no longer in the vault are
        listed in `gone_ids`. A record depends on nothing but its path (the id), its bytes and the parsing code, which
        the signature covers; links are resolved against other notes only at search time.
        """
        known = known or {}
        listing = SourceListing(records=[])
        for path in self.iter_paths(listing.warnings):
            rel = self._rel(path)
            note_id = vault_note_id(self.name, rel)
            try:
                info = path.stat()
                if not stat.S_ISREG(info.st_mode):
                    listing.warnings.append(f"{rel}: not a regular file; skipped")
                    listing.skipped += 1
                    continue
                if info.st_size > self.max_bytes:  # exists but is not read: like an unreadable file, it stays
                    limit = f"{info.st_size} bytes is over the {self.max_bytes}-byte limit"
                    listing.warnings.append(f"{rel}: {limit}; not read, its indexed copy is kept")
                    listing.kept_ids.add(note_id)
                    listing.skipped += 1
                    continue
                raw = path.read_bytes()
            except FileNotFoundError:
                if path.is_symlink():
                    listing.warnings.append(f"{rel}: broken symlink; skipped")
                    listing.skipped += 1
                continue
            except OSError as exc:
                listing.warnings.append(f"{rel}: cannot be read ({exc.strerror or exc}); its indexed copy is kept")
                listing.kept_ids.add(note_id)
                listing.skipped += 1
                continue
            signature = file_signature(raw)
            if known.get(note_id) == signature:
                listing.unchanged_ids.add(note_id)
                continue
            if looks_binary(raw):
                listing.warnings.append(f"{rel}: binary content in a .md file; skipped")
                listing.skipped += 1
                continue
            text, warning = decode_note(raw)
            if warning:
                listing.warnings.append(f"{rel}: {warning}")
            record, fm_warning = self.parse(rel, text, info.st_mtime)
            if fm_warning:
                listing.warnings.append(f"{rel}: {fm_warning}")
            if not warning and not fm_warning:  # a note with a warning is parsed (and warned about) every time
                listing.signatures[note_id] = signature
            listing.records.append(record)
        listing.settle(known)
        return listing

    def parse(self, rel: str, text: str, mtime: float | None = None) -> tuple[NoteRecord, str]:
        """One file's text → record; returns the frontmatter warning, if any."""
        text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
        fm = split_frontmatter(text)
        data, body = fm.data, fm.body
        stem = Path(rel).stem
        title = str(data.get("title") or "").strip() or first_h1(body) or stem
        tags = _unique_ignoring_case(as_string_list(data.get("tags") or data.get("tag")) + parse_tags(body))
        fm_links = [_strip_wikilink(t) for key in ("links", "related") for t in as_text_list(data.get(key))]
        links = [link.target for link in parse_wikilinks(body)] + [t for t in fm_links if t]
        metadata: dict[str, str | int | float | bool] = {
            "kind": "vault",
            "source": self.name,
            "title": title[:500],
            "path": rel,
            "tags": encode_list(tags),
            "aliases": encode_list(as_text_list(data.get("aliases") or data.get("alias"))),
            "links": encode_list(list(dict.fromkeys(links))),
        }
        if data.get("id") is not None:
            metadata["fm_id"] = str(data["id"])
        created = _first_date(data, "created", "date")
        if created is None:
            match = _DATE_IN_NAME.search(stem)
            created = as_datetime("-".join(match.groups())) if match else None
        metadata.update(date_fields("created", created))
        metadata.update(date_fields("updated", _first_date(data, "updated", "modified")))
        volatile: dict[str, str | int | float | bool] = {}
        if mtime is not None:
            volatile.update(date_fields("mtime", dt.datetime.fromtimestamp(mtime, tz=dt.UTC)))
        return NoteRecord(id=vault_note_id(self.name, rel), text=body, metadata=metadata, volatile=volatile), fm.warning

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def _inside(real_path: str, real_root: str) -> bool:
    return os.path.commonpath([real_path, real_root]) == real_root


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """Whether the entry is a folder (following symlinks); an entry that cannot be resolved is not."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _walked_anyway(real_dir: str, real_root: str) -> bool:
    """Whether the plain walk (no symlinks, no dot-folders) reaches this in-vault folder by itself."""
    return not any(part.startswith(".") for part in Path(os.path.relpath(real_dir, real_root)).parts)


def _unique_ignoring_case(values: list[str]) -> list[str]:
    """Tags compare case-insensitively, as in Obsidian; the first spelling wins."""
    seen: dict[str, str] = {}
    for value in values:
        seen.setdefault(value.casefold(), value)
    return list(seen.values())


def _first_date(data: dict[str, Any], *keys: str) -> dt.datetime | None:
    """The first of these frontmatter keys that holds a readable date."""
    return next((moment for key in keys if (moment := as_datetime(data.get(key))) is not None), None)


def _strip_wikilink(value: str) -> str:
    return value.strip().removeprefix("[[").removesuffix("]]").split("|")[0].split("#")[0].strip()
