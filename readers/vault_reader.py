"""LlamaIndex reader for Obsidian-style markdown vaults."""

from __future__ import annotations

import os
from collections.abc import Mapping

from readers.listing import VaultLister
from readers.listing_reader import ListingReader
from readers.vault_scanner import DEFAULT_MAX_BYTES


class VaultReader(ListingReader):
    """Reads the `.md` notes of a vault as Documents, one per note: all of them, or only what changed.

    Each Document has `id_ = "vault:<vault name>/<path relative to the vault>"`, the note body (frontmatter removed)
    as text, and this metadata (lists are JSON strings, as Chroma accepts only scalars):
    `kind` ("vault"), `source` (the vault name), `title` (frontmatter title, else the first `# heading`, else the file
    name), `path`, `tags` (frontmatter and inline `#tags`), `aliases`, `links` (`[[wikilink]]` targets and frontmatter
    `links`/`related`), `fm_id` (a frontmatter `id`, when set), `created`/`created_ts` and `updated`/`updated_ts`
    (frontmatter dates; a date in the file name for `created`), `mtime`/`mtime_ts` (the file's modification time).
    Documents are `NoteDocument`s: their `hash` leaves the file time out, so a touched file is not embedded again.

    Args:
        path: the vault folder. Dot-folders (`.obsidian`, `.trash`) and dot-files are skipped; symlinks are followed
            only inside the vault.
        name: the vault's name in note ids (default: the folder name), which keeps two vaults' `index.md` apart.
        max_bytes: files larger than this are not read (listed in `kept_ids`, with a warning).
        known: what an index already holds, note id → the `file_signature` of the bytes it indexed ("" when the
            note must be read again). A file whose bytes still match yields no Document (its id goes to
            `unchanged_ids`); known notes the vault no longer has are listed in `gone_ids`.

    The listing itself is `VaultLister` (no LlamaIndex import): `brain sync` lists with it, then takes the Documents
    of that same pass from `lister.reader().lazy_load_data(listing=...)` when something changed.

    A folder that cannot be listed raises `VaultError` before anything is yielded: a partial listing would look like
    deletions. Problems with single files (bad UTF-8, broken frontmatter, binary, oversize, unreadable) never raise;
    they are collected in `warnings`.

    Example:
        >>> from readers.vault_reader import VaultReader
        >>> documents = VaultReader("~/Obsidian/Work").load_data()
        >>> reader = VaultReader("~/Obsidian/Work", known=signatures)   # signatures from an earlier pass
        >>> changed = list(reader.lazy_load_data())
        >>> reader.gone_ids, reader.signatures                           # what to delete, what to remember
    """

    lister: VaultLister

    def __init__(self, path: str | os.PathLike[str], name: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 known: Mapping[str, str] | None = None):
        super().__init__(VaultLister(path, name=name, max_bytes=max_bytes, known=known))

    @property
    def name(self) -> str:
        return self.lister.scanner.name
