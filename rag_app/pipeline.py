"""The LlamaIndex side of ingestion: the chunking transform and the IngestionPipeline that writes into Chroma."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.ingestion import DocstoreStrategy, IngestionPipeline
from llama_index.core.schema import BaseNode, MetadataMode, NodeRelationship, TextNode, TransformComponent

from rag_app.chunking import Chunk, chunk_id, chunk_markdown

# Metadata that goes into the embedding text (the title rides along into every chunk); paths, ids, dates stay out.
EMBED_KEYS = ("title", "heading")


class MarkdownChunker(TransformComponent):
    """Documents (whole notes) → TextNodes with ids `<note id>:chunk:<n>` and the note's metadata."""

    max_chars: int = 600
    overlap: int = 100

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[BaseNode]:
        out: list[BaseNode] = []
        for doc in nodes:
            out.extend(self.chunk_document(doc))
        return out

    def chunk_document(self, doc: BaseNode) -> list[TextNode]:
        text = doc.get_content(metadata_mode=MetadataMode.NONE)
        chunks = chunk_markdown(text, self.max_chars, self.overlap) or [Chunk(text.strip() or "(empty note)", "")]
        nodes = []
        for n, chunk in enumerate(chunks):
            metadata = {**doc.metadata, "heading": chunk.heading, "chunk": n, "note_id": doc.id_}
            hidden = [k for k in metadata if k not in EMBED_KEYS]
            node = TextNode(
                id_=chunk_id(doc.id_, n),
                text=chunk.text,
                metadata=metadata,
                excluded_embed_metadata_keys=hidden,
                excluded_llm_metadata_keys=hidden,
                metadata_template="{value}",
                metadata_separator="\n",
                text_template="{metadata_str}\n\n{content}",
            )
            node.relationships[NodeRelationship.SOURCE] = doc.as_related_node_info()
            nodes.append(node)
        return nodes


def build_pipeline(chunker: MarkdownChunker, embed_model: Any, vector_store: Any, docstore: Any) -> IngestionPipeline:
    """Chunk → embed → Chroma, with the docstore recording each note's hash.

    The caller passes only the notes the manifest says need embedding and clears them from the docstore first,
    so UPSERTS never skips a note and never deletes notes outside this run (UPSERTS_AND_DELETE would).
    """
    return IngestionPipeline(
        transformations=[chunker, embed_model],
        vector_store=vector_store,
        docstore=docstore,
        docstore_strategy=DocstoreStrategy.UPSERTS,
        disable_cache=True,
    )
