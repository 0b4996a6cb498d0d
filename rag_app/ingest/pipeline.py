"""The LlamaIndex side of ingestion: the chunking transform and the IngestionPipeline that writes into Chroma."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    RelatedNodeInfo,
    TextNode,
    TransformComponent,
)
from llama_index.core.vector_stores.types import BasePydanticVectorStore, VectorStoreQuery, VectorStoreQueryResult

from rag_app.ingest.chunking import Chunk, chunk_id, chunk_markdown

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
        return [chunk_node(chunk_id(doc.id_, n), doc.id_, chunk.text,
                           {**doc.metadata, "heading": chunk.heading, "chunk": n, "note_id": doc.id_})
                for n, chunk in enumerate(chunks)]


def chunk_node(node_id: str, note_id: str, text: str, metadata: dict[str, Any]) -> TextNode:
    """A chunk as LlamaIndex sees it: only the title and heading ride along into the text that is embedded."""
    hidden = [k for k in metadata if k not in EMBED_KEYS]
    node = TextNode(id_=node_id, text=text, metadata=metadata, excluded_embed_metadata_keys=hidden,
                    excluded_llm_metadata_keys=hidden, metadata_template="{value}", metadata_separator="\n",
                    text_template="{metadata_str}\n\n{content}")
    node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=note_id)
    return node


class NoVectorsYet(BasePydanticVectorStore):
    """The chunking pipeline's vector store: it holds nothing. LlamaIndex applies docstore upserts only with a vector
    store attached; without one it falls back to dropping any document whose hash it has seen under any id, so
    identical text in two notes would index only one of them. A real Chroma store here would make chunking (the step
    that makes notes searchable by keyword at once) fail whenever Chroma is unreachable; a changed note's old vectors
    are forgotten by the sync itself (kept a while by content hash, `Manifest.retain_vectors`), and its new ones are
    written by the fill (`embedding_pipeline`)."""

    stores_text: bool = False

    @property
    def client(self) -> None:
        return None

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        raise RuntimeError("the chunking pipeline writes no vectors: embedding_pipeline does")

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        return None

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        raise RuntimeError("the chunking pipeline's store holds no vectors")


def chunking_pipeline(max_chars: int, overlap: int, docstore: Any = None) -> IngestionPipeline:
    """Notes → chunk nodes, no model and no Chroma: the first step of a sync, which makes notes searchable by BM25 at
    once. With a docstore (index/docstore.py) the pipeline upserts: a Document whose hash the docstore already holds
    is not chunked again, a changed one replaces its stored version (see `NoVectorsYet`)."""
    from llama_index.core.ingestion import DocstoreStrategy

    chunker = MarkdownChunker(max_chars=max_chars, overlap=overlap)
    if docstore is None:
        return IngestionPipeline(transformations=[chunker], disable_cache=True)
    return IngestionPipeline(transformations=[chunker], docstore=docstore, vector_store=NoVectorsYet(),
                             docstore_strategy=DocstoreStrategy.UPSERTS, disable_cache=True)


def embedding_pipeline(embed_model: Any) -> IngestionPipeline:
    """Chunk nodes → one dense model's vectors (run once per model, the fastest first, in slices a stop can end).

    No vector store here: the fill writes a batch's vectors to its Chroma collection at once, when every slice of
    the batch has them (a write per slice cost 11 s each for a note with 20,000 tags in its metadata). No docstore
    either: what a note's chunks lack is per model (`Manifest.notes_lacking`), which a docstore has no place for;
    the chunking pipeline's docstore has already decided which notes are new or changed."""
    return IngestionPipeline(transformations=[embed_model], disable_cache=True)


def embed_hash(node: BaseNode) -> str:
    """The hash of exactly what a model embeds of a chunk (title, heading, text): equal hashes, equal vectors."""
    return hashlib.sha256(node.get_content(metadata_mode=MetadataMode.EMBED).encode("utf-8")).hexdigest()


def nodes_from_rows(rows: list[tuple[str, str, str, dict[str, Any]]]) -> list[TextNode]:
    """Stored chunks (chunk id, note id, text, metadata) as the nodes the chunker made them."""
    return [chunk_node(node_id, note_id, text, metadata) for node_id, note_id, text, metadata in rows]
