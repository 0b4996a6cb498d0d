"""LlamaIndex reader for Obsidian-style markdown vaults."""

from __future__ import annotations

import os

from llama_index.core.readers.base import BaseReader
from llama_index.core.schema import Document

from readers.vault_scanner import DEFAULT_MAX_BYTES, VaultScanner


class VaultReader(BaseReader):
    """Reads every `.md` note of a vault as one Document (`id_ = "vault:<vault name>/<relative path>"`).

    Problems with single files (bad UTF-8, broken frontmatter, binary, oversize) are collected in `warnings`.
    """

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self._scanner = VaultScanner(root, name=name, max_bytes=max_bytes)
        self.warnings: list[str] = []

    def load_data(self) -> list[Document]:
        listing = self._scanner.scan()
        self.warnings = listing.warnings
        return [record.to_document() for record in listing.records]
