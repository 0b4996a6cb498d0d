"""The listing half of the readers: one complete pass over a source, with no LlamaIndex import.

`brain sync` runs a lister first; only when the listing holds something new or changed does it import LlamaIndex
(2.0-3.3 s: `bench/import_cost.py`, 2026-12-03, load 8 on 2 cores) and take the Documents from the reader's
`lazy_load_data(listing=...)` over that same pass. A sync that finds nothing changed stays within a second, and a
source is never listed twice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from readers.records import SourceListing
from readers.vault_scanner import DEFAULT_MAX_BYTES, VaultScanner

if TYPE_CHECKING:
    pass


class SourceLister:
    """One source and what an index already knows of it (`known`: note id → vault file signature or memo content
    hash, "" for a note to read again). `list()` reads the whole source or raises: never a partial listing."""

    def __init__(self, known: Mapping[str, str] | None = None):
        self.known = dict(known or {})

    def list(self) -> SourceListing:
        raise NotImplementedError


class VaultLister(SourceLister):
    """The `.md` notes of a vault (see `VaultReader` for the arguments and the records' metadata)."""

    def __init__(self, path: str | os.PathLike[str], name: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 known: Mapping[str, str] | None = None):
        super().__init__(known)
        self.scanner = VaultScanner(path, name=name, max_bytes=max_bytes)

    def list(self) -> SourceListing:
        return self.scanner.scan(self.known)


class MemosLister(SourceLister):
    """The memos a token can see on a Memos server (see `MemosReader` for the arguments and the records' metadata).
    `token` is used as given: None or "" reads anonymously."""

    def __init__(self, base_url: str, token: str | None, include_archived: bool = False,
                 include_comments: bool = True, source: str = "memos", known: Mapping[str, str] | None = None,
                 signatures: Mapping[str, str] | None = None, **limits: Any):
        super().__init__(known)
        self.signatures = dict(signatures or {})
        self.base_url = base_url
        self._token = token
        self.include_archived = include_archived
        self.include_comments = include_comments
        self.source = source
        self.limits = limits

    def __repr__(self) -> str:
        return f"MemosLister({self.base_url!r}, token={'set' if self._token else 'none'}, source={self.source!r})"

    @property
    def has_token(self) -> bool:
        return bool(self._token)

    def list(self) -> SourceListing:
        # Imported here, not at the top: the Memos client imports httpx (~0.2 s), which a sync of vaults never needs.
        from readers.memos_client import MemosClient, fetch_memos

        with MemosClient(self.base_url, self._token, **self.limits) as client:
            return fetch_memos(self.base_url, None, source=self.source, include_archived=self.include_archived,
                               include_comments=self.include_comments, client=client, known=self.known,
                               signatures=self.signatures)
