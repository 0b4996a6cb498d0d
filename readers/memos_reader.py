"""LlamaIndex reader for Memos / CFlow servers."""

from __future__ import annotations

from llama_index.core.readers.base import BaseReader
from llama_index.core.schema import Document

from readers.memos_client import fetch_memos, token_from_env


class MemosReader(BaseReader):
    """Reads every memo the token can see as one Document (`id_ = "memos:<uid or id>"`), with its web URL.

    Archived memos are left out unless `include_archived`; the listing is complete or the call raises `MemosError`.
    """

    def __init__(self, base_url: str, token: str | None = None, include_archived: bool = False,
                 include_comments: bool = True, source: str = "memos"):
        self.base_url = base_url
        self._token = token if token is not None else token_from_env()
        self.include_archived = include_archived
        self.include_comments = include_comments
        self.source = source
        self.warnings: list[str] = []

    def load_data(self) -> list[Document]:
        listing = fetch_memos(self.base_url, self._token, source=self.source,
                              include_archived=self.include_archived, include_comments=self.include_comments)
        self.warnings = listing.warnings
        return [record.to_document() for record in listing.records]
