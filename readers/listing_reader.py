"""What the vault and Memos readers share: one complete pass over the source before anything is yielded, and what
that pass saw besides the Documents (the ids that are gone, unchanged or kept, warnings, file signatures)."""

from __future__ import annotations

from collections.abc import Iterator

from llama_index.core.readers.base import BaseReader
from llama_index.core.schema import Document

from readers.records import SourceListing


class ListingReader(BaseReader):
    """A BaseReader over `_list()`, a complete listing: a source that cannot be listed whole raises before the first
    Document, so a partial listing never looks like deletions."""

    listing: SourceListing

    def _list(self) -> SourceListing:
        raise NotImplementedError

    def lazy_load_data(self) -> Iterator[Document]:
        """New and changed notes (every note when nothing is `known`), once the whole source has been listed."""
        self.listing = self._list()
        for record in self.listing.records:
            yield record.to_document()

    def load_data(self) -> list[Document]:
        return list(self.lazy_load_data())

    @property
    def warnings(self) -> list[str]:
        return self.listing.warnings

    @property
    def gone_ids(self) -> set[str]:
        return self.listing.gone_ids

    @property
    def unchanged_ids(self) -> set[str]:
        return self.listing.unchanged_ids

    @property
    def kept_ids(self) -> set[str]:
        return self.listing.kept_ids

    @property
    def signatures(self) -> dict[str, str]:
        """note id → signature of the bytes each note read this time was parsed from (none for notes with a warning)."""
        return self.listing.signatures
