"""Walk an Obsidian-style vault and parse each markdown file into a `NoteRecord` (no LlamaIndex import)."""

from __future__ import annotations

import codecs
import datetime as dt
import os
import re
import stat
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


def _looks_binary(raw: bytes) -> bool:
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
        is not walked again, so its notes keep their real paths and loops are cut. A folder that cannot be listed
        raises `VaultError`: a partial listing would make the sync delete the notes it hides.
        """
        if not self.root.is_dir():
            raise VaultError(f"vault folder not found or not a directory: {self.root}")
        found: list[Path] = []
        self._walk(self.root, os.path.realpath(self.root), set(), found, warnings)
        return found

    def _walk(self, folder: Path, real_root: str, visited: set[str], found: list[Path], warnings: list[str]) -> None:
        """Add the notes under `folder` to `found`; `visited` holds the real paths of folders already walked."""
        visited.add(os.path.realpath(folder))
        try:
            with os.scandir(folder) as entries:
                children = sorted(entries, key=lambda entry: entry.name)
        except OSError as exc:
            raise VaultError(f"cannot list the vault folder {folder} ({exc.strerror or exc})") from exc
        for entry in children:
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
                if is_dir:
                    if _inside(os.path.realpath(folder), real):
                        warnings.append(f"{self._rel(path)}: symlink to an enclosing folder (a loop); skipped")
                    elif real not in visited and not _walked_anyway(real, real_root):
                        self._walk(path, real_root, visited, found, warnings)
                    continue
            if is_dir:
                self._walk(path, real_root, visited, found, warnings)
            elif is_note:
                found.append(path)

    def scan(self) -> SourceListing:
        """One complete pass: a record per readable note; unreadable ones are kept, the rest skipped with a warning."""
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
                if info.st_size > self.max_bytes:
                    limit = f"{info.st_size} bytes is over the {self.max_bytes}-byte limit"
                    listing.warnings.append(f"{rel}: {limit}; skipped")
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
            if _looks_binary(raw):
                listing.warnings.append(f"{rel}: binary content in a .md file; skipped")
                listing.skipped += 1
                continue
            text, warning = decode_note(raw)
            if warning:
                listing.warnings.append(f"{rel}: {warning}")
            record, fm_warning = self.parse(rel, text, info.st_mtime)
            if fm_warning:
                listing.warnings.append(f"{rel}: {fm_warning}")
            listing.records.append(record)
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
