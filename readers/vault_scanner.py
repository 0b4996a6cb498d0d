"""Walk an Obsidian-style vault and parse each markdown file into a `NoteRecord` (no LlamaIndex import)."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

from readers.markdown_syntax import (
    as_datetime,
    as_string_list,
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
    """The vault as a whole cannot be read (missing root, not a directory)."""


def vault_note_id(vault_name: str, rel_path: str) -> str:
    """Deterministic note id; the vault name keeps two vaults' `index.md` apart."""
    return f"vault:{vault_name}/{rel_path}"


def decode_note(raw: bytes) -> tuple[str, str]:
    """Decode file bytes: BOMs honoured, UTF-8 expected, anything else replaced with a warning."""
    if raw.startswith(b"\xef\xbb\xbf"):
        return raw[3:].decode("utf-8", errors="replace"), ""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return raw.decode("utf-16", errors="replace"), ""
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", errors="replace"), f"not valid UTF-8 (byte {exc.start}); undecodable bytes replaced"


def _looks_binary(raw: bytes) -> bool:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return False
    return b"\x00" in raw[:8192]


class VaultScanner:
    """Lists and parses the notes of one vault; per-file problems become warnings, never exceptions."""

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root).expanduser()
        self.name = name or self.root.resolve().name
        self.max_bytes = max_bytes

    def iter_paths(self, warnings: list[str]) -> list[Path]:
        """Markdown files under the root: dot-folders skipped, symlinks followed only inside the vault, loops cut."""
        if not self.root.is_dir():
            raise VaultError(f"vault folder not found or not a directory: {self.root}")
        real_root = self.root.resolve()
        seen_dirs: set[str] = set()
        found: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            real_dir = os.path.realpath(dirpath)
            if real_dir in seen_dirs:
                dirnames[:] = []
                continue
            seen_dirs.add(real_dir)
            kept = []
            for d in sorted(dirnames):
                if d.startswith("."):
                    continue
                real = os.path.realpath(os.path.join(dirpath, d))
                if not _inside(real, real_root):
                    warnings.append(f"{self._rel(Path(dirpath, d))}: symlink points outside the vault; skipped")
                    continue
                if real in seen_dirs:
                    warnings.append(f"{self._rel(Path(dirpath, d))}: symlink loop; skipped")
                    continue
                kept.append(d)
            dirnames[:] = kept
            for filename in sorted(filenames):
                if filename.startswith(".") or not filename.lower().endswith(".md"):
                    continue
                path = Path(dirpath, filename)
                if path.is_symlink() and not _inside(os.path.realpath(path), real_root):
                    warnings.append(f"{self._rel(path)}: symlink points outside the vault; skipped")
                    continue
                found.append(path)
        return found

    def scan(self) -> SourceListing:
        listing = SourceListing(records=[])
        for path in self.iter_paths(listing.warnings):
            rel = self._rel(path)
            note_id = vault_note_id(self.name, rel)
            try:
                size = path.stat().st_size
                if size > self.max_bytes:
                    listing.warnings.append(f"{rel}: {size} bytes is over the {self.max_bytes}-byte limit; skipped")
                    listing.skipped += 1
                    continue
                raw = path.read_bytes()
                mtime = path.stat().st_mtime
            except FileNotFoundError:
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
            record, fm_warning = self.parse(rel, text, mtime)
            if fm_warning:
                listing.warnings.append(f"{rel}: {fm_warning}")
            listing.records.append(record)
        return listing

    def parse(self, rel: str, text: str, mtime: float | None = None) -> tuple[NoteRecord, str]:
        """One file's text → record; returns the frontmatter warning, if any."""
        text = text.replace("\r\n", "\n").replace("\x00", "")
        fm = split_frontmatter(text)
        data, body = fm.data, fm.body
        stem = Path(rel).stem
        title = str(data.get("title") or "").strip() or first_h1(body) or stem
        tags = list(dict.fromkeys(as_string_list(data.get("tags") or data.get("tag")) + parse_tags(body)))
        links = list(dict.fromkeys(link.target for link in parse_wikilinks(body)))
        fm_links = [t for t in as_string_list(data.get("links") or data.get("related")) if t]
        metadata: dict[str, str | int | float | bool] = {
            "kind": "vault",
            "source": self.name,
            "title": title[:500],
            "path": rel,
            "tags": encode_list(tags),
            "aliases": encode_list(as_string_list(data.get("aliases") or data.get("alias"))),
            "links": encode_list(list(dict.fromkeys(links + [_strip_wikilink(t) for t in fm_links]))),
        }
        if data.get("id") is not None:
            metadata["fm_id"] = str(data["id"])
        created = as_datetime(data.get("created") or data.get("date"))
        if created is None:
            match = _DATE_IN_NAME.search(stem)
            created = as_datetime("-".join(match.groups())) if match else None
        metadata.update(date_fields("created", created))
        metadata.update(date_fields("updated", as_datetime(data.get("updated") or data.get("modified"))))
        volatile: dict[str, str | int | float | bool] = {}
        if mtime is not None:
            volatile.update(date_fields("mtime", dt.datetime.fromtimestamp(mtime, tz=dt.UTC)))
        return NoteRecord(id=vault_note_id(self.name, rel), text=body, metadata=metadata, volatile=volatile), fm.warning

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def _inside(real_path: str, real_root: Path) -> bool:
    return real_path == str(real_root) or real_path.startswith(str(real_root) + os.sep)


def _strip_wikilink(value: str) -> str:
    return value.strip().removeprefix("[[").removesuffix("]]").split("|")[0].split("#")[0].strip()
