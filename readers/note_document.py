"""The Document both readers yield: LlamaIndex's own, with a hash that file times do not change."""

from __future__ import annotations

from llama_index.core.schema import Document

from readers.note_hash import content_hash_of


class NoteDocument(Document):
    """A `Document` whose `hash` covers the text and the metadata except `VOLATILE_KEYS` (a vault file's mtime).

    LlamaIndex's own hash covers all metadata, so touching a file would make an IngestionPipeline's docstore chunk
    and embed the note again. This hash equals the record's `content_hash`, which the index stores per note.
    """

    @property
    def hash(self) -> str:
        return content_hash_of(self.text, self.metadata)
