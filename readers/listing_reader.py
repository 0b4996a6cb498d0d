"""What the vault and Memos readers share: a lister (readers/listing.py: the listing half, no LlamaIndex) whose one
complete pass over the source becomes Documents, and what that pass saw besides (ids gone, unchanged or kept,
warnings, file signatures). The listers build this reader (`SourceLister.reader`), so it knows them only as `Lister`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

from llama_index.core.readers.base import BaseReader
from llama_index.core.schema import Document

from readers.records import SourceListing

Reader = TypeVar("Reader", bound="ListingReader")


class Lister(Protocol):
    """What a reader needs of its lister (a `SourceLister`): what the index knows, and one complete pass."""

    known: dict[str, str]

    def list(self) -> SourceListing: ...


class ListingReader(BaseReader):
    """A BaseReader over a `SourceLister`: a source that cannot be listed whole raises before the first Document, so
    a partial listing never looks like deletions."""

    lister: Lister
    listing: SourceListing

    def __init__(self, lister: Lister):
        self.lister = lister
        self.listing = SourceListing(records=[])

    @classmethod
    def from_lister(cls: type[Reader], lister: Lister) -> Reader:
        """This reader over a lister built already (what `brain sync` does: it lists before importing LlamaIndex)."""
        reader = cls.__new__(cls)
        ListingReader.__init__(reader, lister)
        return reader

    @property
    def known(self) -> dict[str, str]:
        return self.lister.known

    def lazy_load_data(self, *args: Any, listing: SourceListing | None = None, **kwargs: Any) -> Iterator[Document]:
        """New and changed notes (every note when nothing is `known`), once the whole source has been listed.

        `listing`: a pass this reader's lister made already; its Documents are yielded without listing again."""
        self.listing = listing if listing is not None else self.lister.list()
        for record in self.listing.records:
            yield record.to_document()

    def load_data(self, *args: Any, **kwargs: Any) -> list[Document]:
        return list(self.lazy_load_data(*args, **kwargs))

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
        """note id → signature of what each note read this time was parsed from (a vault file's bytes, a memo's answer;
        none for notes with a warning): hand them back next time (`known` for a vault, `signatures` for Memos)."""
        return self.listing.signatures
