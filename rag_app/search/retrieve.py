"""Hybrid retrieval: BM25 (jieba) + vector (Chroma) fused by a QueryFusionRetriever subclass, then dedup, per-note
collapse, excerpts and citations. The one place that ranks.

QueryFusionRetriever's own reciprocal-rank fusion dedups on node *content* (identical text in two notes collapses
into one, losing a citation), fixes k=60 and ignores channel weights; the subclass fuses on chunk ids, with the
constant and weights from the config, and can weight each channel by how confident it is for this query.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.llms import MockLLM
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.retrievers.fusion_retriever import FUSION_MODES
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from rag_app.config import DEFAULT_EMBEDDING, Settings
from rag_app.index.keyword import HAN_RUN, KeywordIndex, query_words, to_simplified, tokenize
from rag_app.index.keyword_store import keyword_stamp, open_keyword_index
from rag_app.index.manifest import Manifest
from rag_app.index.store import StoreUnreachable, unreachable
from rag_app.index.topics import TOPIC_MODEL, TopicIndex
from rag_app.search import relevance
from rag_app.search.cross_language import (
    chinese_gloss,
    content_words,
    distinctive_words,
    english_gloss,
    english_lexicon,
    english_words,
    language_of,
)
from rag_app.search.graph import LinkResolver
from rag_app.search.pointers import MAX_POINTED, POINTER_TOP, pointers, question_weights
from rag_app.search.query import (
    RetrievalConfig,
    SearchError,
    SearchFilters,
    check_variants,
    clean_query,
    parse_variants,
    stop_if_cancelled,
)
from rag_app.search.relevance_features import Contains, QueryTerms, note_evidence
from rag_app.search.time_phrases import extract_time_range
from rag_app.search.unmentioned import Mentions, nonwords, unmentioned
from readers.markdown_syntax import is_chinese
from readers.records import decode_list

EXCERPT_CHARS = 300
READ_CHARS = 400  # of a passage the main model reads while an answer waits (passage_similarities): a heading and ~200
# characters of text fit; a code block's one long line is cut, not read for seconds
log = logging.getLogger("cflow_brain.retrieve")
BACKGROUND_SAMPLE = 512  # chunks whose similarity to a query is its background (fixed per index generation)
BACKGROUND_SLICES = 8  # read as this many evenly spaced runs of the collection
GATED_SKIP = 0.01
# The topic channel (NoteFusionRetriever._by_topic), chosen on the sample vault and semantic_dev (docs/retrieval.md)
TOPIC_FLOOR = 0.3  # the best topic's cosine must reach this ...
TOPIC_GAP = 0.15  # ... and stand this far above the TOPIC_SPREAD-th note's best
TOPIC_SPREAD = 5
TOPIC_CHANNEL = 3  # notes the channel ranks
TOPIC_WEIGHT = 2.0
TOPIC_RRF_K = 10
CONFIDENCE_CAP = 2.0


@dataclass
class _Timing:
    embed_ms: float = 0.0


NODE_CACHE_MAX = 5_000  # nodes kept between searches (~3.5 KB each)
# A question is also searched as its gloss in the notes' language (rag_app.search.cross_language) when the home knows
# at most TRANSLATE_KNOWN of its content words: a Chinese question in a home of English notes (under TRANSLATE_HAN of
# its words Chinese), an English one in a home mostly of Chinese notes (TRANSLATE_ZH_HAN of its words Chinese or more)
TRANSLATE_HAN = 0.2
TRANSLATE_ZH_HAN = 0.5
TRANSLATE_KNOWN = 0.5
TRANSLATION_WORDS = 3  # distinctive words a gloss needs for its rating to count (`_heard`)
QUERY_VECTOR_CACHE = 512  # query embeddings kept (an agent's variants, a repeated question), oldest dropped first


class SearchIndex:
    """What a search reads, opened once per process and reused (warm searches pay no start-up)."""

    def __init__(self, settings: Settings, dense: bool = True):
        self.settings = settings
        self.dense = dense  # False: no dense model has reached every note yet, so hybrid search is BM25 alone
        self.config = RetrievalConfig.from_settings(settings)
        self.manifest = Manifest(settings.manifest_path)
        self._keyword: KeywordIndex | None = None
        self._keyword_stamp = ""
        self._client: Any = None
        self._collections: dict[str, Any] = {}
        self._embeds: dict[str, Any] = {}
        self._sizes: dict[tuple[str, str], int] = {}
        self._node_cache: dict[str, TextNode] = {}
        self._node_stamp = ""
        self._facts: list[NoteFacts] | None = None
        self._facts_stamp = ""
        self._query_vectors: dict[tuple[str, str], list[float]] = {}
        self._backgrounds: dict[tuple[str, str], np.ndarray | None] = {}
        self._topics: TopicIndex | None = None
        self._topics_stamp = ""
        self._resolver: tuple[str, LinkResolver] | None = None
        self.timing = _Timing()

    def close(self) -> None:
        self.manifest.close()

    @property
    def stamp(self) -> str:
        return keyword_stamp(self.manifest)

    def keyword(self) -> KeywordIndex:
        """The saved BM25 index when current; otherwise rebuilt in memory from cached tokens (a sync is running)."""
        stamp = self.stamp
        if self._keyword is None or self._keyword_stamp != stamp:
            self._keyword = open_keyword_index(self.settings, self.manifest)
            self._keyword_stamp = stamp
        return self._keyword

    def collection(self, model: str | None = None) -> Any:
        """The Chroma collection of a dense model (the main one by default), or None before its first sync.
        StoreUnreachable when a Chroma server cannot be reached (a search then goes on by keyword, and says so)."""
        model = model or self.settings.embedding_model
        if model not in self._collections:
            from rag_app.index.store import LiveCollection, collection_name, open_chroma

            try:
                if self._client is None:
                    self._client = open_chroma(self.settings)
                self._collections[model] = LiveCollection(self._client, collection_name(model))
            except Exception as exc:  # no collection yet (nothing synced with this model), or no server
                if unreachable(exc):
                    raise StoreUnreachable(self.settings) from exc
                return None
        return self._collections[model]

    def _reached(self, model: str) -> bool:
        """Whether a model's collection exists; True when the server cannot be asked (the topics are in the manifest:
        they need no Chroma)."""
        try:
            return self.collection(model) is not None
        except StoreUnreachable:
            return True

    def collection_size(self, model: str | None = None) -> int:
        """Chunks in a model's collection, counted once per index generation (a count costs milliseconds)."""
        key = (model or self.settings.embedding_model, self.stamp)
        if key not in self._sizes:
            collection = self.collection(model)
            self._sizes = {k: v for k, v in self._sizes.items() if k[1] == self.stamp}
            self._sizes[key] = collection.count() if collection is not None else 0
        return self._sizes[key]

    def embed_query(self, text: str, model: str | None = None) -> list[float]:
        model = model or self.settings.embedding_model
        key = (model, text)
        if key not in self._query_vectors:
            if model not in self._embeds:
                from rag_app.index.embeddings import load_embedding

                self._embeds[model] = load_embedding(model, self.settings)
            started = time.perf_counter()
            if len(self._query_vectors) >= QUERY_VECTOR_CACHE:  # bounded: a page or MCP server runs for days
                self._query_vectors.pop(next(iter(self._query_vectors)))
            self._query_vectors[key] = self._embeds[model].get_query_embedding(text)
            self.timing.embed_ms += (time.perf_counter() - started) * 1000
        return self._query_vectors[key]

    def background(self, model: str) -> np.ndarray | None:
        """A fixed sample of a model's chunk vectors, the same for every search until the index changes: a query's
        similarities to it are its background, against which a hit's similarity means the same in every query."""
        key = (model, self.stamp)
        if key not in self._backgrounds:
            try:
                collection, size = self.collection(model), self.collection_size(model)
            except StoreUnreachable:  # the server went away mid-search: relevance does without, tried again next time
                return None
            rows: list[Any] = []
            if collection is not None and size > 1:
                # evenly spaced slices of the collection's own order: no id lookups, which another process's sync
                # can race ("Error finding id"); a failed read is tried again at the next search
                step = BACKGROUND_SAMPLE // BACKGROUND_SLICES
                try:
                    for offset in sorted({i * size // BACKGROUND_SLICES for i in range(BACKGROUND_SLICES)}):
                        rows.extend(collection.get(offset=offset, limit=step, include=["embeddings"])["embeddings"])
                except Exception:  # noqa: BLE001 - Chroma raises its own internal errors: relevance does without
                    log.warning("background sample of %s unreadable for now", model, exc_info=True)
                    return None
            self._backgrounds = {k: v for k, v in self._backgrounds.items() if k[1] == key[1]}
            self._backgrounds[key] = _unit(np.asarray(rows, dtype=np.float32)) if len(rows) > 1 else None
        return self._backgrounds[key]

    def similarity_background(self, text: str, model: str) -> tuple[float, float] | None:
        """Mean and standard deviation of a query's similarity to the background sample (both scripts of a
        Traditional query, the better of the two per chunk, as the vector channel scores it)."""
        sample = self.background(model)
        if sample is None:
            return None
        texts = [text] + ([folded] if (folded := to_simplified(text)) != text else [])
        queries = _unit(np.asarray([self.embed_query(t, model) for t in texts], dtype=np.float32))
        sims = (sample @ queries.T).max(axis=1)  # cosines, as the channel scores hits (a server's vectors may not be
        # unit length)
        return float(sims.mean()), float(sims.std()) or 1e-6

    def topics(self) -> TopicIndex | None:
        """The notes' topics (rag_app.index.topics), read once per index generation; None when the home has no
        fast model (USE-m3) to embed a question with, or no note yet."""
        if TOPIC_MODEL not in self.settings.models or not self._reached(TOPIC_MODEL):
            return None
        stamp = self.stamp
        if self._topics is None or self._topics_stamp != stamp:
            embed = self._embeds.get(TOPIC_MODEL)
            self._topics = TopicIndex.load(self.manifest, embed.get_text_embedding_batch if embed else None)
            self._topics_stamp = stamp
        return self._topics if len(self._topics) else None

    def topic_similarity(self, text: str, notes: set[str] | None = None, top: int | None = None,
                         include: Iterable[str] = ()) -> dict[str, tuple[float, str]]:
        """Per note (those in `notes` when given; the `top` best and those of `include` when `top` is given), best
        first: its best topic's cosine to the query and that topic; a Traditional query is compared as written and
        folded to Simplified, the better per topic."""
        if TOPIC_MODEL not in self.settings.models:
            return {}
        texts = [text] + ([folded] if (folded := to_simplified(text)) != text else [])
        vectors = [self.embed_query(t, TOPIC_MODEL) for t in texts]  # loads the model: an older home's topics need it
        topics = self.topics()
        return topics.best(vectors, notes, top, include) if topics is not None else {}

    def line_similarities(self, question: str, lines: list[str]) -> list[float] | None:
        """Cosines of lines to a question by the fast model (rag_app.answers.answer_lines), or None when the home has
        none: the main model is too slow to read every line of a note per answer (e5: ~1 s for 24 lines)."""
        if TOPIC_MODEL not in self.settings.models:
            return None
        return self._cosines(question, TOPIC_MODEL, lines)

    def translation(self, question: str, into_english: bool | None = None,
                    words: list[str] | None = None) -> str | None:
        """The question in the other language (rag_app.search.cross_language): its English gloss (by default for a
        Chinese question) or its Chinese one, each word's sense chosen by what this home holds; None when nothing
        glosses. `words`: the question's content words (Chinese) or English words when the caller has them."""
        keyword = self.keyword()
        if is_chinese(question) if into_english is None else into_english:
            return english_gloss(question, known=lambda sense: _known_share(keyword, sense), words=words)
        return chinese_gloss(question, uses=keyword.df, words=words)

    def passage_similarities(self, question: str, passages: list[str]) -> list[float] | None:
        """Cosines of a few candidate passages to a question by the main model when it is the default e5, which reads
        a question against a passage far better than against one line; each passage cut to READ_CHARS (a code
        block's one 100 KB line took 73 s). None for another main model (USE-m3 chose worse than the line scores
        alone; a remote one would cost a request) or when this search did not load e5 (its collection still
        filling): loading it would take seconds."""
        if self.settings.models[0] != DEFAULT_EMBEDDING or DEFAULT_EMBEDDING not in self._embeds or not passages:
            return None
        return self._cosines(question, DEFAULT_EMBEDDING, [text[:READ_CHARS] for text in passages], now=True)

    def _cosines(self, question: str, model: str, texts: list[str], now: bool = False) -> list[float]:
        """Cosines of texts to a question by a model (loaded by embedding the question); `now`: a few texts someone
        waits for, on one thread where the model can (E5SmallEmbedding.passages_now), as a query is."""
        query = _unit(np.asarray([self.embed_query(question, model)], dtype=np.float32))[0]
        embed = self._embeds[model]
        read = getattr(embed, "passages_now", embed.get_text_embedding_batch) if now else embed.get_text_embedding_batch
        return (_unit(np.asarray(read(texts), dtype=np.float32)) @ query).tolist()

    def link_resolver(self) -> LinkResolver:
        """Obsidian's link resolution over every note (rag_app.search.graph), whose metadata it holds: read once per
        index generation, when a search follows a link or the engine builds the link graph."""
        stamp = self.stamp
        if self._resolver is None or self._resolver[0] != stamp:
            self._resolver = (stamp, LinkResolver(self.manifest.note_metadata()))
        return self._resolver[1]

    def facts(self) -> list[NoteFacts]:
        """What filters look at, once per note (not per chunk: 100k chunks' metadata held 350 MB), reloaded when the
        index changed."""
        stamp = self.stamp
        if self._facts is None or self._facts_stamp != stamp:
            self._facts = [NoteFacts.of(json.loads(meta), tuple(json.loads(chunk_ids)))
                           for chunk_ids, meta in self.manifest.note_filter_rows()]
            self._facts_stamp = stamp
        return self._facts

    def allowed(self, filters: SearchFilters) -> set[str] | None:
        """Chunk ids that pass the filters, or None when no filter is set."""
        if not filters.active:
            return None
        return {chunk_id for note in self.facts() if _passes(note, filters) for chunk_id in note.chunk_ids}

    def nearest_notes(self, note_id: str, k: int) -> list[str]:
        """Notes closest in meaning to this one (mean of its chunk vectors), itself excluded. A row another process is
        writing (`brain watch` syncing) can come back without its metadata: it is skipped, as a note not yet there."""
        collection = self.collection()
        entry = self.manifest.entries_for([note_id]).get(note_id)
        if collection is None or entry is None or not entry.chunk_ids:
            return []
        got = collection.get(ids=entry.chunk_ids, include=["embeddings"])
        if not len(got["ids"]):
            return []
        centre = np.asarray(got["embeddings"], dtype=np.float32).mean(axis=0)
        n = min(collection.count(), k * 4 + len(entry.chunk_ids))
        if n <= 0:  # emptied since the get: a collection being swapped (doctor --compact)
            return []
        hits = collection.query(query_embeddings=[centre.tolist()], n_results=n, include=["metadatas"])
        out: list[str] = []
        for meta in hits["metadatas"][0]:
            if not meta:
                continue
            other = str(meta.get("note_id") or meta.get("document_id"))
            if other != note_id and other not in out:
                out.append(other)
        return out[:k]

    def nodes(self, scored: list[tuple[str, float]]) -> list[NodeWithScore]:
        """Scored chunk ids → nodes; a node is built once per index generation (pydantic models are costly to make)."""
        if self._node_stamp != self.stamp or len(self._node_cache) > NODE_CACHE_MAX:  # bounded: a page runs for days
            self._node_cache, self._node_stamp = {}, self.stamp
        missing = [c for c, _ in scored if c not in self._node_cache]
        for chunk_id, (_, text, meta) in self.manifest.chunks_by_id(missing).items():
            self._node_cache[chunk_id] = TextNode(id_=chunk_id, text=text, metadata=meta)
        return [NodeWithScore(node=self._node_cache[c], score=score) for c, score in scored if c in self._node_cache]


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


@dataclass(frozen=True, slots=True)
class NoteFacts:
    """The few fields of a note that filters test, and its chunks."""

    kind: str
    private: bool
    source: str
    tags: frozenset[str]
    path: str
    day: dt.date | None
    chunk_ids: tuple[str, ...]

    @staticmethod
    def of(meta: dict[str, Any], chunk_ids: tuple[str, ...]) -> NoteFacts:
        kind = str(meta.get("kind") or "")
        return NoteFacts(kind, kind == "memos" and meta.get("visibility") == "PRIVATE", str(meta.get("source") or ""),
                         frozenset(t.lower() for t in decode_list(meta.get("tags"))), str(meta.get("path") or ""),
                         _note_date(meta), chunk_ids)


def _note_date(meta: dict[str, Any]) -> dt.date | None:
    for key in ("created_ts", "updated_ts", "mtime_ts"):
        if isinstance(meta.get(key), int):
            return dt.datetime.fromtimestamp(meta[key], tz=dt.UTC).date()
    return None


def _passes(note: NoteFacts, filters: SearchFilters) -> bool:
    if filters.exclude_private and note.private:
        return False
    if filters.sources and note.source not in filters.sources and note.kind not in filters.sources:
        return False
    if filters.tags:
        wanted = {t.lower().lstrip("#") for t in filters.tags}
        if not any(t in note.tags or any(x.startswith(t + "/") for x in note.tags) for t in wanted):
            return False
    if filters.path_prefix and not note.path.startswith(filters.path_prefix):
        return False
    if filters.since or filters.until:
        day = note.day
        if day is None or (filters.since and day < filters.since) or (filters.until and day > filters.until):
            return False
    return True


class KeywordRetriever(BaseRetriever):
    """BM25 over jieba/English tokens of title, heading, tags and text; also what the fusion needs to know about
    the query's words (their IDF, and which candidates contain them)."""

    def __init__(self, index: SearchIndex, top_k: int, allowed: set[str] | None):
        super().__init__()
        self.index, self.top_k, self.allowed = index, top_k, allowed
        self.terms: dict[str, QueryTerms] = {}
        self._rows: np.ndarray | None = None  # the index rows of `allowed`, once

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        tokens = self.query_terms(query_bundle.query_str).tokens
        return self.index.nodes(self._search(tokens))

    def query_terms(self, query: str) -> QueryTerms:
        """The query's tokens with their IDF and document frequency in this index. With a filter, a word no chunk it
        allows holds is unknown (IDF None, document frequency 0), as in a home without the notes it hides: an
        agent's relevance figures must not tell whether a private memo holds a word. The IDF of a word it allows is
        the index's, as the relevance model was fitted on."""
        if query not in self.terms:
            keyword = self.index.keyword()
            tokens = tokenize(query)
            idfs, dfs = [keyword.idf(t) for t in tokens], [keyword.df(t) for t in tokens]
            if self.allowed is not None:
                if self._rows is None:
                    self._rows = keyword.rows_of(self.allowed)
                dfs = [keyword.df(t, self._rows) if df else 0 for t, df in zip(tokens, dfs, strict=True)]
                idfs = [idf if df else None for idf, df in zip(idfs, dfs, strict=True)]
            self.terms[query] = QueryTerms(tokens, idfs, dfs, len(keyword.ids))
        return self.terms[query]

    def contains(self, query: str, chunk_ids: list[str]) -> np.ndarray:
        """Which of the query's tokens each chunk contains (chunks × tokens, boolean), from the posting lists."""
        return self.index.keyword().term_matrix(self.query_terms(query).tokens, chunk_ids)[1]

    def _search(self, tokens: list[str]) -> list[tuple[str, float]]:
        keyword = self.index.keyword()
        mask = None
        if self.allowed is not None:
            mask = np.zeros(len(keyword.ids), dtype=np.float32)
            for chunk_id in self.allowed:
                row = keyword.row.get(chunk_id)
                if row is not None:
                    mask[row] = 1.0
            if not mask.any():
                return []
        return keyword.search(tokens, self.top_k, mask)


class VectorRetriever(BaseRetriever):
    """Cosine similarity in the Chroma collection; with filters, exact scoring over the allowed chunks when few."""

    EXACT_LIMIT = 5000

    def __init__(self, index: SearchIndex, top_k: int, allowed: set[str] | None, model: str | None = None):
        super().__init__()
        self.index, self.top_k, self.allowed, self.model = index, top_k, allowed, model
        self.down: str | None = None  # why the store could not be read in this search, if it could not

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        try:
            return self._similar(query_bundle)
        except Exception as exc:  # a Chroma server gone: this channel says so and finds nothing; anything else raises
            if not unreachable(exc):
                raise
            self.down = str(exc if isinstance(exc, StoreUnreachable) else StoreUnreachable(self.index.settings))
            log.warning("vector channel down: %s", self.down)
            return []

    def _similar(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if not self._searchable():
            return []
        return self._nearest([self.index.embed_query(text, self.model) for text in self._texts(query_bundle.query_str)])

    def feedback(self, query: str, chunk_ids: list[str], weight: float) -> list[NodeWithScore]:
        """The channel asked again, each query vector moved toward the mean of `chunk_ids`' vectors (`weight`: that
        mean's share; Rocchio's pseudo-relevance feedback): a paraphrase whose first hits are right finds their
        neighbours, the notes of the same kind ("every note about …"). [] when the store cannot give the vectors."""
        try:
            if not self._searchable() or not chunk_ids:
                return []
            got = self.index.collection(self.model).get(ids=chunk_ids, include=["embeddings"])
            if not len(got["ids"]):
                return []
            centre = _unit(np.asarray(got["embeddings"], dtype=np.float32)).mean(axis=0)
            vectors = [np.asarray(self.index.embed_query(text, self.model), dtype=np.float32) + weight * centre
                       for text in self._texts(query)]
            return self._nearest(_unit(np.asarray(vectors)).tolist())
        except Exception as exc:  # noqa: BLE001 - a store gone meanwhile: the first answer stands
            if not unreachable(exc):
                raise
            return []

    def _searchable(self) -> bool:
        return (self.index.collection(self.model) is not None and self.index.collection_size(self.model) > 0
                and (self.allowed is None or bool(self.allowed)))

    @staticmethod
    def _texts(query: str) -> list[str]:
        folded = to_simplified(query)
        return [query] if folded == query else [query, folded]  # Traditional: notes may be in either script

    def _nearest(self, vectors: list[list[float]]) -> list[NodeWithScore]:
        """The chunks nearest any of the vectors, best first (with filters, exact over the allowed chunks when few)."""
        collection = self.index.collection(self.model)
        size = self.index.collection_size(self.model)
        best: dict[str, float] = {}
        if self.allowed is not None and len(self.allowed) <= self.EXACT_LIMIT:
            got = collection.get(ids=sorted(self.allowed), include=["embeddings"])
            if not len(got["ids"]):
                return []
            sims = (np.asarray(got["embeddings"], dtype=np.float32) @ np.asarray(vectors, dtype=np.float32).T).max(1)
            best = {got["ids"][i]: float(sims[i]) for i in np.argsort(-sims)[: self.top_k]}
        else:
            n = min(self.top_k * (4 if self.allowed is not None else 1), size)
            if n <= 0:  # empty for a moment: `doctor --compact` swapping the collection under this reader
                return []
            got = collection.query(query_embeddings=vectors, n_results=n, include=["distances"])
            for ids, distances in zip(got["ids"], got["distances"], strict=True):
                for chunk_id, distance in zip(ids, distances, strict=True):
                    if self.allowed is None or chunk_id in self.allowed:
                        best[chunk_id] = max(best.get(chunk_id, -1.0), 1.0 - float(distance))
        ranked = sorted(best.items(), key=lambda pair: pair[1], reverse=True)
        return self.index.nodes(ranked[: self.top_k])


Lists = dict[str, list[tuple[str, float]]]


def gated_channel(config: RetrievalConfig) -> str:
    """The USE-m3 channel, whose say grows as BM25 coverage falls: the second channel, or the only one in fast mode."""
    return "vector" if config.fast_only else "vector2"


def base_weight(name: str, config: RetrievalConfig) -> float:
    if name == gated_channel(config):
        return config.second_weight
    return {"bm25": config.bm25_weight, "vector": config.vector_weight, "vector2": config.second_weight}[name]


def shares(terms: QueryTerms | None, contains: Contains, chunk_ids: list[str]) -> dict[str, float]:
    """Per chunk, the weighted share of the query's tokens it contains (0..1)."""
    weights = terms.weights() if terms is not None else np.zeros(0)
    total = float(weights.sum())
    if not chunk_ids or total <= 0:
        return {c: 0.0 for c in chunk_ids}
    got = contains(chunk_ids).astype(np.float64) @ weights / total
    return {c: float(g) for c, g in zip(chunk_ids, got, strict=True)}


def bm25_coverage(lists: Lists, terms: QueryTerms | None, contains: Contains) -> float | None:
    """How much of the query BM25's best chunk covers (None without a BM25 channel): low means BM25 matched only
    common or partial words, and its ranking says little."""
    if "bm25" not in lists:
        return None
    hits = lists["bm25"]
    return shares(terms, contains, [hits[0][0]])[hits[0][0]] if hits else 0.0


def channel_weight(name: str, scores: list[float] | None, coverage: float | None, config: RetrievalConfig) -> float:
    """A channel's RRF weight for one query (before normalising by the channels' summed base weights);
    `scores=None` gives its highest possible (confidence at its cap)."""
    weight = base_weight(name, config)
    if config.fusion != "adaptive":
        return weight
    weight *= CONFIDENCE_CAP if scores is None else confidence(scores)
    if name == "bm25" and coverage is not None:
        weight *= coverage**config.coverage_power
    elif name == gated_channel(config) and coverage is not None:
        weight *= (1.0 - coverage) ** config.second_gate
    elif name == "vector" and coverage is not None:
        # e5 is strong where the words match and weak where BM25 finds nothing (cross-language, paraphrase: USE's
        # ground), so its say shrinks with BM25's coverage, to `vector_floor` of it at none
        weight *= config.vector_floor + (1.0 - config.vector_floor) * coverage**0.5
    return weight


def confidence(scores: list[float]) -> float:
    """How far the best score stands above the rest of the list, in standard deviations (clipped)."""
    if len(scores) < 3:
        return 1.0 if scores else 0.0
    values = np.asarray(scores, dtype=np.float64)
    rest = values[1:]
    return float(np.clip((values[0] - rest.mean()) / (rest.std() or 1e-6) / 3.0, 0.2, CONFIDENCE_CAP))


def gated_out(lists: Lists, terms: QueryTerms | None, contains: Contains, config: RetrievalConfig) -> bool:
    """Whether the gated channel would carry under GATED_SKIP (1 %) of the fused weight even at its highest
    confidence, judged by the other channels' lists alone (its own, if given, are left out). Below that gate it
    carries no weight at all (`fuse_query`), so whether it runs cannot change the ranking, and the search skips it."""
    gated = gated_channel(config)
    others = {n: hits for n, hits in lists.items() if n != gated}
    coverage = bm25_coverage(others, terms, contains)
    if config.fusion != "adaptive" or coverage is None:
        return False
    weight = sum(channel_weight(n, [s for _, s in hits], coverage, config) for n, hits in others.items())
    return channel_weight(gated, None, coverage, config) < GATED_SKIP * weight


def fuse_query(lists: Lists, terms: QueryTerms | None, contains: Contains, config: RetrievalConfig,
               candidates: list[str] | None = None, weights_out: dict[str, float] | None = None) -> dict[str, float]:
    """One query's fused score per chunk: each channel's reciprocal ranks, weighted per query (adaptive), plus the
    lexical-match term for every candidate (all chunks any channel found, or `candidates`). The gated channel
    counts only above its gate (`gated_out`): below it, its list is ignored, so a search that skipped it ranks
    exactly as one that ran it (a near-tie its small weight would have flipped stays as it is)."""
    total = sum(base_weight(n, config) for n in lists) or 1.0
    gated = gated_channel(config)
    if lists.get(gated) and gated_out(lists, terms, contains, config):
        lists = {**lists, gated: []}
    coverage = bm25_coverage(lists, terms, contains)
    fused: dict[str, float] = {}
    for name, hits in lists.items():
        weight = channel_weight(name, [s for _, s in hits], coverage, config) / total
        if weights_out is not None:
            weights_out[name] = weight
        for rank, (chunk_id, _) in enumerate(hits):
            fused[chunk_id] = fused.get(chunk_id, 0.0) + weight / (config.rrf_k + rank + 1)
    if config.fusion != "adaptive" or not coverage or len(lists) < 2:
        return fused
    if config.lexical_weight:
        # BM25's *rank* is a weak signal among same-topic notes that all contain the query's words (it then orders
        # by term counts and length); whether a note has the words at all is a strong one. Scaled by how well the
        # best chunk covers the query, so a query the notes never phrase that way is left to the dense channels.
        scale = config.lexical_weight / total * coverage / (config.rrf_k + 1)
        for chunk_id, share in shares(terms, contains, candidates or list(fused)).items():
            fused[chunk_id] = fused.get(chunk_id, 0.0) + scale * share
    if config.lead_idf and coverage >= config.lead_coverage:
        keep_lead(fused, lists["bm25"][0][0], terms, contains, config.lead_idf)
    return fused


def keep_lead(fused: dict[str, float], top: str, terms: QueryTerms | None, contains: Contains, min_idf: float) -> None:
    """BM25's best chunk goes first when every chunk fused above it lacks query words it has, worth `min_idf` of
    IDF or more (net of words they have and it lacks): a reading-comprehension question names its paragraph's rare
    words, and a neighbour the dense channels prefer that lacks one is the wrong paragraph (drcd_dev). Neighbours
    with the same words, or lacking only a common one (rgb_zh_dev's "时间"), are left to the dense channels."""
    above = [c for c, v in fused.items() if v > fused.get(top, 0.0)]
    if terms is None or top not in fused or not above:
        return
    has = contains([top, *above]).astype(np.float64) * terms.weights()
    if np.all((has[0] - has[1:]).sum(axis=1) >= min_idf):
        fused[top] = max(fused[c] for c in above) * (1 + 1e-6) + 1e-9


class NoteFusionRetriever(QueryFusionRetriever):
    """The engine's hybrid search as a LlamaIndex retriever: `retrieve(query)` yields one `NodeWithScore` per note,
    best first (at most `similarity_top_k` = k), and `search(query)` the full `SearchResponse` (coverage, timing) it
    is built from. `Brain.as_retriever()` returns one; `Brain.search()` runs through one.

    Each node is a note: its id is the note id, its text the note's best matched passages (up to three chunks, joined
    by "\n…\n"), its score the fused score (it orders the list; it means nothing across queries), and its metadata
    the search result: note_id, title, source, kind, path (vault) or url and memo_id (memos), `relevance` (0–1,
    calibrated: the probability that the note answers) and `strength` (strong, related, weak), in the default
    configuration `second_opinion` (the fast model's probability, when the fast channel ranks the note high),
    `excerpt`, `chunks` (the matched passages: chunk_id, heading, score, text), tags, created, updated, duplicates.
    Only title, path or url, tags and dates are shown to an LLM (`excluded_llm_metadata_keys`).

    Per search it picks its channels (BM25, the main dense model, the second one; `mode` narrows them), applies the
    filters (and a time phrase in the query: "上个月的读书笔记"), fuses chunks, collapses them to notes, and rates
    each note's relevance.

    What it keeps of QueryFusionRetriever: the shape of a retrieval (the question plus query variants, each run
    through every channel, then fused), and query generation with the LLM through the parent's own prompt path:
    `query_gen_prompt` (see `get_prompts()`; `update_prompts({"query_gen_prompt": ...})` replaces it) is formatted
    and sent by the parent's `_get_queries`, `num_queries` (`[retrieval] num_queries`, with an LLM) sets how many.
    What it replaces, and why: `_get_queries` wraps the parent's to take a caller's own variants instead of asking the
    LLM, strip numbering ("1、", "(2)") from the lines the LLM wrote, and go on without variants when the LLM fails;
    `_run_sync_queries` skips the second dense channel when it could not matter (the gate); the fusion
    (`_reciprocal_rerank_fusion`) is keyed on chunk ids, not text, so identical text in two notes keeps both
    citations, with per-query adaptive weights (`fuse_query`); `_aretrieve` runs the same synchronous path on a worker
    thread (the parent's async path would skip the gate). The parent's `retriever_weights` are not taken: channel
    weights come from `[retrieval]` (bm25_weight, vector_weight, second_weight) and are adapted per query.

    `index` is a SearchIndex, or a callable returning the current one (the Brain's, which changes as models complete).
    One search at a time per retriever (`lock`, the Brain's when it made it): the state of the last search
    (`queries_run`, `channel_hits`, ...) is read from the object afterwards.
    """

    def __init__(self, index: SearchIndex | Callable[[], SearchIndex], k: int = 8, *, mode: str = "hybrid",
                 filters: SearchFilters | None = None, llm: Any = None, variants: list[str] | None = None,
                 today: dt.date | None = None, lock: threading.RLock | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 100:
            raise SearchError(f"k must be between 1 and 100, got {k}")
        if mode not in MODES:
            raise SearchError(f"mode must be {', '.join(MODES[:-1])} or {MODES[-1]}, got {mode!r}")
        self._index_of = index if callable(index) else (lambda: index)
        self.filters = filters or SearchFilters()
        self.search_mode = mode
        self.variants = check_variants(variants)
        self.today = today
        self._search_lock = lock or threading.RLock()
        self.last: SearchResponse | None = None  # the last search's full response (coverage, timing)
        self.has_llm = llm is not None
        self.translation: str | None = None  # the last search's question in the notes' language (`_translation`)
        # the channels are chosen per search (mode, filters, which models are complete), hence none here, and no
        # retriever_weights: the parent would only normalise them, and its relative-score fusion is not used
        super().__init__([], llm=llm or MockLLM(), query_gen_prompt=QUERY_GEN_PROMPT,
                         mode=FUSION_MODES.RECIPROCAL_RANK, similarity_top_k=k, num_queries=1, use_async=False,
                         retriever_weights=[])
        self._start([], [], RetrievalConfig())

    def _start(self, channels: list[BaseRetriever], names: list[str], config: RetrievalConfig) -> None:
        """A fusion's state, fresh for each search."""
        self._retrievers, self.names, self.config = channels, names, config
        self.gated = gated_channel(config)
        self.num_queries = 1 + len(self.variants) if self.variants else (config.num_queries if self.has_llm else 1)
        self.queries_run: list[str] = []
        self.results: dict[tuple[str, int], list[NodeWithScore]] = {}
        self.skipped_runs: set[tuple[str, str]] = set()
        self.channel_hits: dict[str, int] = {n: 0 for n in names}
        self.channel_weights: dict[str, list[float]] = {n: [] for n in names}
        self.channel_skipped: dict[str, int] = {n: 0 for n in names}
        self.feedback: dict[tuple[str, int], list[NodeWithScore]] = {}  # dense runs asked again (`_feed_back`)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [note_node(result) for result in self.search(query_bundle.query_str).results]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)

    def search(self, query: str) -> SearchResponse:
        """Top-k notes for a query, each with its best chunks, an excerpt, where it came from and its relevance."""
        with self._search_lock:
            self.last = self._search(self._index_of(), clean_query(query))
            return self.last

    def _search(self, index: SearchIndex, query: str) -> SearchResponse:
        started = time.perf_counter()
        index.timing = _Timing()
        self._down: list[str] = []
        mode = "bm25" if self.search_mode == "hybrid" and not index.dense else self.search_mode
        filters = self.filters
        text, time_range = extract_time_range(query, self.today)
        ignored_phrase = None
        unfiltered = filters
        if time_range and not (filters.since or filters.until):
            filters = SearchFilters(filters.sources, filters.tags, filters.path_prefix, time_range.since,
                                    time_range.until, filters.exclude_private)
        else:
            text, time_range = query, None
        allowed = index.allowed(filters)
        if time_range and not allowed:
            # "1998年谁夺冠" names a year without asking for notes written then: no note is dated in that range, so the
            # phrase stays part of the question instead of filtering everything away.
            ignored_phrase, text, time_range, filters = time_range.phrase, query, None, unfiltered
            allowed = index.allowed(filters)
        config = index.config
        channels: list[tuple[str, BaseRetriever]] = []
        if mode in ("hybrid", "bm25"):
            channels.append(("bm25", KeywordRetriever(index, config.candidates, allowed)))
        if mode in ("hybrid", "vector"):
            channels.append(("vector", VectorRetriever(index, config.candidates, allowed)))
        models = index.settings.models
        if mode in ("hybrid", "vector2") and len(models) > 1 and self._has_collection(index, models[1]):
            channels.append(("vector2", VectorRetriever(index, config.candidates, allowed, models[1])))
        self.translation = self._translation(index, text, mode, channels)
        fused = self.fuse(text, channels, config, [self.translation] if self.translation else [])
        down = [r.down for _, r in channels if isinstance(r, VectorRetriever) and r.down] + self._down
        k = self.similarity_top_k
        results = collapse(index, fused, k, config.chunks_per_note, text)
        rated = time.perf_counter()
        pool = len(allowed) if allowed is not None else len(index.keyword().ids)
        evidence = note_evidence(index, self, [r["note_id"] for r in results], pool)
        translated = self.queries_run.index(self.translation) if self.translation in self.queries_run else None
        heard = translated is not None and self._heard(index.keyword(), self.translation)
        for result in results:
            rate(result, evidence[result["note_id"]], translated, heard)
        topics_used = False
        notes = {c.rpartition(":chunk:")[0] or c for c in allowed} if allowed is not None else None
        if mode == "hybrid" and (not results or results[0]["relevance"] < relevance.STRONG):
            # words did not settle it: what the notes are about may (a topical question); skipped otherwise, so a
            # lookup the words answer never loads the fast model for it
            topics_used = self._by_topic(index, text, results, notes, evidence, pool)
        self._follow_links(index, text, results, allowed, evidence, pool, (translated, heard))
        absent = self._unmentioned(index, text, allowed, notes, results)
        if absent:  # an absent subject: whatever else matched is a lead, not an answer
            for result in results:
                result["relevance"] = min(result["relevance"], relevance.RELATED - 0.01)
                result["unmentioned"] = absent
        if down:  # the dense evidence was never gathered: what BM25 alone found is at most related
            for result in results:
                result["relevance"] = min(result["relevance"], relevance.STRONG - 0.01)
        for result in results:
            result["strength"] = relevance.strength(result["relevance"])
        results = relevance.reading_order(results)
        rate_ms = (time.perf_counter() - rated) * 1000
        total_ms = (time.perf_counter() - started) * 1000
        coverage = {
            "mode": mode,
            "channels": {name: {"hits": self.channel_hits[name], "weights": self.channel_weights[name],
                                "skipped": self.channel_skipped[name]} for name, _ in channels},
            "queries": self.queries_run or [text],
            "expanded": len(self.queries_run) > 1,
            "translation": self.translation,
            "translation_language": language_of(self.translation) if self.translation else None,
            "filters": filters.to_dict(),
            "time_phrase": time_range.to_dict() if time_range else None,
            "time_phrase_ignored": ignored_phrase,
            "notes_considered": len({n.node.metadata.get("note_id") for n in fused}),
            "topics": topics_used,
        }
        if down:
            coverage["store_down"] = down[0]
        if absent:
            coverage["unmentioned"] = absent
        if allowed is not None and not allowed and any(filters.to_dict().values()):
            coverage["no_note_matches_filters"] = True  # a typo'd tag is not "not in your notes": nothing was searched
        state = relevance.answer_state(results)
        return SearchResponse(query, results, coverage,
                              {"total_ms": total_ms, "embed_ms": index.timing.embed_ms,
                               "ours_ms": total_ms - index.timing.embed_ms, "relevance_ms": rate_ms},
                              state == "not_found", evidence, state)

    def _has_collection(self, index: SearchIndex, model: str) -> bool:
        """Whether a dense model has a collection to search; a store that cannot be reached is noted (`_down`)."""
        try:
            return index.collection(model) is not None
        except StoreUnreachable as exc:
            self._down.append(str(exc))
            return False

    def _by_topic(self, index: SearchIndex, text: str, results: list[dict[str, Any]], notes: set[str] | None,
                  evidence: dict[str, list[tuple[str, dict[str, float]]]], pool: int) -> bool:
        """What each result is about, from its title, tags and headings (rag_app.index.topics): each result gets its
        closest `topic`. When one note's topic stands clearly above the rest (at least TOPIC_FLOOR, and TOPIC_GAP
        above the TOPIC_SPREAD-th note's best: a gibberish string is close to many short titles at once, a topical
        question to one), the three closest notes join the ranking as a channel of their own (reciprocal rank,
        weight TOPIC_WEIGHT), and that note's topic makes it "related" when close enough (relevance.topical).
        False when the home has no topics (no fast model)."""
        best = index.topic_similarity(text, notes, max(TOPIC_SPREAD, TOPIC_CHANNEL), [r["note_id"] for r in results])
        if not best:
            return False
        ranked = list(best.items())
        fifth = ranked[min(TOPIC_SPREAD, len(ranked)) - 1][1][0]
        standout = ranked[0][0] if ranked[0][1][0] >= TOPIC_FLOOR and ranked[0][1][0] - fifth >= TOPIC_GAP else None
        if standout is not None:
            k = self.similarity_top_k
            score = {r["note_id"]: 1.0 / (TOPIC_RRF_K + n) for n, r in enumerate(results, 1)}
            for n, (note, _) in enumerate(ranked[:TOPIC_CHANNEL], 1):
                score[note] = score.get(note, 0.0) + TOPIC_WEIGHT / (TOPIC_RRF_K + n)
            known = {r["note_id"] for r in results}
            joining = [note for note, _ in ranked[:TOPIC_CHANNEL] if note not in known]
            if joining:
                results.extend(_passage_results(index, {note: best[note][1] for note in joining}, text))
                added = note_evidence(index, self, joining, pool)
                evidence.update(added)
                for result in results[-len(joining):]:
                    rate(result, added[result["note_id"]])
            results.sort(key=lambda r: score[r["note_id"]], reverse=True)
            del results[k:]
            for result in results:
                result["score"] = round(score[result["note_id"]], 6)
        for result in results:
            similarity, topic = best.get(result["note_id"], (0.0, ""))
            if topic:
                result["topic"] = {"text": topic, "similarity": round(similarity, 3),
                                   "stands_out": result["note_id"] == standout}
            if result["note_id"] == standout:
                result["relevance"] = max(result["relevance"], relevance.topical(similarity))
        return True

    def _follow_links(self, index: SearchIndex, text: str, results: list[dict[str, Any]], allowed: set[str] | None,
                      evidence: dict[str, list[tuple[str, dict[str, float]]]], pool: int,
                      translation: tuple[int | None, bool]) -> None:
        """A note a related-or-better result's matching sentence links to (rag_app.search.pointers) goes just above
        that result, at least as relevant as it (the sentence says the question's subject is there), with
        `linked_from` saying which sentence sent it. Not followed: a link to a note the filters hide (resolved as if
        it were not there), or lacking a word of the question the sentence lacks too; one that would push its
        result out of the k shown; from a note that was itself brought in or moved this way, or back to one that
        sent (one hop, no cycles). The answer state never changes: every source is already related or better."""
        pointing = results[:POINTER_TOP]  # positions move as targets come in: the pointers name these
        eligible = [r["relevance"] >= relevance.RELATED for r in pointing]  # before any is raised by a link
        visible = None if allowed is None else (lambda note: _passes_filters(index, note, allowed))
        weights = question_weights(text, index.keyword().idf)
        brought: set[str] = set()
        senders: set[str] = set()
        resolver = index.link_resolver()
        for pointer in pointers(pointing, weights, lambda name, linking: resolver.resolve(name, linking, visible)):
            source, target_id = pointing[pointer.source], pointer.target
            if (len(brought) >= MAX_POINTED or not eligible[pointer.source] or source["note_id"] in brought
                    or target_id in brought | senders or any(target_id in r["duplicates"] for r in results)
                    or results.index(source) + 1 >= self.similarity_top_k
                    or not _holds(index, target_id, pointer.lacking)):
                continue
            ids = [r["note_id"] for r in results]
            if target_id in ids:
                if ids.index(target_id) < ids.index(source["note_id"]):
                    continue
                target = results.pop(ids.index(target_id))
            else:
                joined = _passage_results(index, {target_id: pointer.heading}, text)
                if not joined:
                    continue
                target = joined[0]
                evidence.update(note_evidence(index, self, [target_id], pool))
                rate(target, evidence[target_id], *translation)
            target["relevance"] = max(target["relevance"], source["relevance"])
            target["score"] = source["score"]
            target["linked_from"] = {"note_id": source["note_id"], "title": source["title"],
                                     "sentence": pointer.sentence}
            results.insert(results.index(source), target)
            brought.add(target_id)
            senders.add(source["note_id"])
        del results[self.similarity_top_k:]

    def _translation(self, index: SearchIndex, text: str, mode: str,
                     channels: list[tuple[str, BaseRetriever]]) -> str | None:
        """The question in the notes' language (rag_app.search.cross_language) when the caller gave no variants and
        the home knows at most TRANSLATE_KNOWN of the question's content words: a Chinese question in a home written
        in English (under TRANSLATE_HAN of its words are Chinese), an English one in a home written mostly in Chinese
        (TRANSLATE_ZH_HAN or more)."""
        if self.variants or mode != "hybrid" or not channels or channels[0][0] != "bm25":
            return None
        keyword = index.keyword()
        if keyword.han_share < TRANSLATE_HAN:
            words = content_words(text)
            if not words or sum(_known_share(keyword, w) > 0 for w in words) > TRANSLATE_KNOWN * len(words):
                return None
            return index.translation(text, True, words)
        if keyword.han_share >= TRANSLATE_ZH_HAN:
            stems = english_words(text)
            if not stems or sum(keyword.df(w) > 0 for w in stems) > TRANSLATE_KNOWN * len(stems):
                return None
            return index.translation(text, False, stems)
        return None

    def _unmentioned(self, index: SearchIndex, text: str, allowed: set[str] | None, notes: set[str] | None,
                     results: list[dict[str, Any]]) -> list[str]:
        """The names the question asks about that no note the search may show mentions (rag_app.search.unmentioned),
        or its words when none can be read (`nonwords`), when each query the caller gave (the question, its variants)
        says so. A name is not checked for an English question whose leads are notes in Chinese: those write Chengdu
        as 成都; a word no dictionary knows is written the same in any note."""
        keyword = index.keyword()
        mentions = Mentions(keyword, allowed, notes, lambda: index.link_resolver().named)
        english = keyword.han_share < TRANSLATE_HAN
        absent = unmentioned(text, mentions, english)
        if absent and not HAN_RUN.search(text) and any(
                is_chinese(" ".join(c["text"] for c in r.get("chunks") or [])) for r in results[:3]):
            absent = []
        if absent and all(unmentioned(v, mentions, english) for v in self.variants or []):
            return absent
        absent = nonwords(text, mentions, english_lexicon)
        return absent if all(nonwords(v, mentions, english_lexicon) for v in self.variants or []) else []

    @staticmethod
    def _heard(keyword: KeywordIndex, gloss: str) -> bool:
        """Whether a gloss's rating may speak for a note (relevance.rate): it holds at least TRANSLATION_WORDS words
        distinctive in the home (cross_language.distinctive_words; an English word counted by its stems)."""
        def uses(word: str) -> int:
            return keyword.df(word) if HAN_RUN.search(word) else max(map(keyword.df, tokenize(word)), default=0)

        return distinctive_words(gloss, uses, len(keyword.ids)) >= TRANSLATION_WORDS

    def fuse(self, text: str, channels: list[tuple[str, BaseRetriever]],
             config: RetrievalConfig, extra: list[str] | None = None) -> list[NodeWithScore]:
        """Chunks fused over the channels, best first (up to `config.candidates`): QueryFusionRetriever's retrieval
        (the question, then its variants, then `extra` queries; each through every channel; fused), with this
        class's hooks."""
        with self._search_lock:
            self._start([r for _, r in channels], [n for n, _ in channels], config)
            queries = [QueryBundle(text)]
            if self.num_queries > 1:
                queries.extend(self._get_queries(text))
            queries.extend(QueryBundle(q) for q in extra or [] if q not in {b.query_str for b in queries})
            return self._reciprocal_rerank_fusion(self._run_sync_queries(queries))[: config.candidates]

    def _run_sync_queries(self, queries: list[QueryBundle]) -> dict[tuple[str, int], list[NodeWithScore]]:
        """As QueryFusionRetriever's, except that the gated channel (run after the others) is not run when, even at
        its highest confidence, it would carry under 1 % of the fused weight: below that gate the fusion gives it no
        weight (`fuse_query`), so the ranking is the same as if it had run, and a cold search of a query whose words
        are in the notes does not load the second model at all."""
        results: dict[tuple[str, int], list[NodeWithScore]] = {}
        order = sorted(range(len(self._retrievers)), key=lambda i: self.names[i] == self.gated)
        for query in queries:
            text = query.query_str
            for i in order:
                retriever = self._retrievers[i]
                if self.names[i] == self.gated and gated_out(self._lists(text, results), *self._evidence(text),
                                                             self.config):
                    self.channel_skipped[self.names[i]] += 1
                    self.skipped_runs.add((text, self.names[i]))
                    results[(text, i)] = []
                    continue
                stop_if_cancelled()  # each run may embed a query: a caller gone meanwhile stops the search here
                results[(text, i)] = retriever.retrieve(query)
            self._feed_back(text, results)
        return results

    def _feed_back(self, text: str, results: dict[tuple[str, int], list[NodeWithScore]]) -> None:
        """Each dense channel that found something asked again toward the query's first `feedback_chunks` fused
        chunks (VectorRetriever.feedback), their weight `feedback_weight` x (1 − BM25 coverage): a query whose words
        the notes hold is left as it is, and so is one in the other language than the notes' or a translation (on
        cmrc_en's English questions about Chinese notes, nDCG fell 0.820 → 0.792). The new lists rank
        (`_reciprocal_rerank_fusion`); the first ones stay the relevance evidence (its similarities are to the
        question as asked)."""
        weight = self.config.feedback_weight
        if not weight or self.config.fusion != "adaptive" or text == self.translation:
            return
        dense = [(i, channel) for i, channel in enumerate(self._retrievers)
                 if isinstance(channel, VectorRetriever) and results.get((text, i))]
        if not dense or is_chinese(text) != (dense[0][1].index.keyword().han_share >= TRANSLATE_HAN):
            return  # a question in the other language than the notes': its first hits are often wrong, and drift
        lists = self._lists(text, results)
        terms, contains = self._evidence(text)
        weight *= 1.0 - (bm25_coverage(lists, terms, contains) or 0.0)
        if weight <= 0:
            return
        fused = fuse_query(lists, terms, contains, self.config)
        top = sorted(fused, key=fused.__getitem__, reverse=True)[: self.config.feedback_chunks]
        for i, channel in dense:
            stop_if_cancelled()
            again = channel.feedback(text, top, weight)
            if again:
                self.feedback[(text, i)] = again

    def _lists(self, query: str, results: dict[tuple[str, int], list[NodeWithScore]]) -> Lists:
        return {self.names[i]: [(h.node.node_id, float(h.score or 0.0)) for h in hits]
                for (q, i), hits in results.items() if q == query}

    def _evidence(self, query: str) -> tuple[QueryTerms | None, Contains]:
        """The query's terms and a chunk → contained-terms lookup, from the BM25 channel (none without it)."""
        if "bm25" not in self.names:
            return None, lambda chunk_ids: np.zeros((len(chunk_ids), 0), dtype=bool)
        keyword: KeywordRetriever = self._retrievers[self.names.index("bm25")]  # type: ignore[assignment]
        return keyword.query_terms(query), lambda chunk_ids: keyword.contains(query, chunk_ids)

    def _get_queries(self, original_query: str) -> list[QueryBundle]:
        """The caller's variants, else the parent's: `query_gen_prompt` sent to the LLM, one variant per line (with
        any numbering stripped); no variants when the LLM fails (it is optional here: search still answers)."""
        if self.variants:
            return [QueryBundle(v) for v in self.variants]
        try:
            written = super()._get_queries(original_query)
        except Exception:  # noqa: BLE001 - unreachable, refused, malformed: the question alone is searched
            log.info("query variants unavailable", exc_info=True)
            return []
        lines = "\n".join(q.query_str for q in written)
        return [QueryBundle(v) for v in parse_variants(lines, self.num_queries - 1) if v != original_query]

    def _reciprocal_rerank_fusion(self, results: dict[tuple[str, int], list[NodeWithScore]]) -> list[NodeWithScore]:
        self.results = results
        nodes: dict[str, NodeWithScore] = {}
        for (query, i), hits in results.items():
            if query not in self.queries_run:
                self.queries_run.append(query)
            self.channel_hits[self.names[i]] += len(hits)
            for hit in [*hits, *self.feedback.get((query, i), [])]:
                nodes.setdefault(hit.node.node_id, hit)
        candidates = list(nodes)
        ranking = {**results, **self.feedback}
        fused: dict[str, float] = {}
        for query in self.queries_run:
            weights: dict[str, float] = {}
            scores = fuse_query(self._lists(query, ranking), *self._evidence(query), self.config,
                                candidates=candidates, weights_out=weights)
            for chunk_id, score in scores.items():
                fused[chunk_id] = fused.get(chunk_id, 0.0) + score
            for name, weight in weights.items():
                self.channel_weights[name].append(round(weight, 3))
        ranked = sorted(fused, key=lambda c: fused[c], reverse=True)
        return [NodeWithScore(node=nodes[c].node, score=fused[c]) for c in ranked]


MODES = ("hybrid", "bm25", "vector", "vector2")
QUERY_GEN_PROMPT = (
    "You help search a person's notes, written in Chinese and English. Write {num_queries} alternative search "
    "queries for the question below: rephrase it, use synonyms, and include at least one in the other language "
    "(Chinese ↔ English). One query per line, no numbering, no commentary.\n"
    "Question: {query}\nQueries:\n"
)
LLM_METADATA = ("title", "path", "url", "tags", "created", "updated")  # what an LLM sees of a note besides its text


def _known_share(keyword: KeywordIndex, text: str) -> float:
    """The share of a text's tokens (stop words aside) that some chunk of the home holds."""
    tokens = tokenize(text)
    return sum(keyword.idf(t) is not None for t in tokens) / len(tokens) if tokens else 0.0


def _passage_results(index: SearchIndex, headings: dict[str, str], query: str) -> list[dict[str, Any]]:
    """Results for notes found by other means than their chunks (a topic, a link): per note of `headings`, the
    passage under the heading named for it, else its first."""
    rows: dict[str, list[tuple[int, str, str]]] = {}
    for chunk_id, note_id, _, meta in index.manifest.chunks_for_notes(list(headings)):
        heading = str(meta.get("heading") or "").rsplit(" › ", 1)[-1]
        rows.setdefault(note_id, []).append((int(meta.get("chunk", 0)), heading.lower(), chunk_id))
    out = []
    terms = [w.lower() for w in query_words(query, both_scripts=True)]
    for note_id, wanted in headings.items():
        chunks = sorted(rows.get(note_id, []))
        if not chunks:
            continue
        chunk_id = next((c for _, h, c in chunks if h and h == wanted.lower()), chunks[0][2])
        out.append(_result(note_id, index.nodes([(chunk_id, 0.0)]), terms))
    return out


def _holds(index: SearchIndex, note_id: str, words: Iterable[str]) -> bool:
    """Whether some chunk of a note holds each of the words."""
    words = list(words)
    if not words:
        return True
    entry = index.manifest.entries_for([note_id]).get(note_id)
    return entry is not None and bool(index.keyword().term_matrix(words, list(entry.chunk_ids))[1].any(axis=0).all())


def _passes_filters(index: SearchIndex, note_id: str, allowed: set[str]) -> bool:
    entry = index.manifest.entries_for([note_id]).get(note_id)
    return entry is not None and any(c in allowed for c in entry.chunk_ids)


def rate(result: dict[str, Any], runs: list[tuple[str, dict[str, float]]], translated: int | None = None,
         heard: bool = True) -> None:
    """A result's `relevance` from its evidence, and in the default configuration the fast model's `second_opinion`
    when the fast channel ranks the note among its first (relevance.second_opinion; absent when 0). `translated`:
    the run that is the question's translation, whose say is `translation_opinion` (relevance.translation), when
    `heard`."""
    own, second, opinion = relevance.rate(runs, translated, heard)
    result["relevance"] = round(own, 4)
    if second > 0:
        result["second_opinion"] = round(second, 4)
    if opinion > 0:
        result["translation_opinion"] = round(opinion, 4)


def note_node(result: dict[str, Any]) -> NodeWithScore:
    """A search result as a LlamaIndex node: the note id, its matched passages as text, the result as metadata."""
    text = "\n…\n".join(chunk["text"] for chunk in result["chunks"])
    hidden = [key for key in result if key not in LLM_METADATA]
    node = TextNode(id_=result["note_id"], text=text, metadata=dict(result), excluded_llm_metadata_keys=hidden,
                    excluded_embed_metadata_keys=list(result))
    return NodeWithScore(node=node, score=result["score"])


@dataclass
class SearchResponse:
    """`answer_state`: found (a result is strong or related), unsure (none is, but a lead is close: the notes may cover
    it) or not_found (nothing is close: "not in your notes"; results stay as leads); `not_found` is the last.
    `evidence`: per result note, the relevance model's key and features for each query run (for the fitting bench)."""

    query: str
    results: list[dict[str, Any]]
    coverage: dict[str, Any]
    timing: dict[str, float] = field(default_factory=dict)
    not_found: bool = False
    evidence: dict[str, list[tuple[str, dict[str, float]]]] = field(default_factory=dict)
    answer_state: str = "found"

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "answer_state": self.answer_state, "not_found": self.not_found,
                "results": self.results, "coverage": self.coverage}


def search(
    index: SearchIndex,
    query: str,
    k: int = 8,
    filters: SearchFilters | None = None,
    mode: str = "hybrid",
    variants: list[str] | None = None,
    llm: Any = None,
    today: dt.date | None = None,
) -> SearchResponse:
    """Top-k notes for a query over an open index (see NoteFusionRetriever.search)."""
    return NoteFusionRetriever(index, k, mode=mode, filters=filters, llm=llm, variants=variants,
                               today=today).search(query)


def collapse(index: SearchIndex, fused: list[NodeWithScore], k: int, per_note: int, query: str) -> list[dict[str, Any]]:
    """Fused chunks → notes (best chunk first); identical notes collapse into one result that lists the others."""
    by_note: dict[str, list[NodeWithScore]] = {}
    for hit in fused:
        by_note.setdefault(str(hit.node.metadata.get("note_id")), []).append(hit)
    order = sorted(by_note, key=lambda n: by_note[n][0].score or 0.0, reverse=True)
    texts = index.manifest.chunks_of_notes(order[: k * 2])
    seen_hash: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    terms = [w.lower() for w in query_words(query, both_scripts=True)]
    for note_id in order:
        if len(results) >= k:
            break
        body = "\x00".join(texts.get(note_id, []))
        digest = hashlib.sha256(body.encode()).hexdigest() if body else note_id
        if digest in seen_hash:
            seen_hash[digest]["duplicates"].append(note_id)
            continue
        hits = by_note[note_id][:per_note]
        result = _result(note_id, hits, terms)
        seen_hash[digest] = result
        results.append(result)
    return results


def _result(note_id: str, hits: list[NodeWithScore], terms: list[str]) -> dict[str, Any]:
    meta = hits[0].node.metadata
    result: dict[str, Any] = {
        "note_id": note_id,
        "source": meta.get("source"),
        "kind": meta.get("kind"),
        "title": meta.get("title"),
        "score": round(float(hits[0].score or 0.0), 6),
    }
    if meta.get("kind") == "memos":
        result.update(memo_id=meta.get("memo_id"), url=meta.get("url"), visibility=meta.get("visibility"))
    else:
        result["path"] = meta.get("path")
    result.update(
        excerpt=excerpt(hits[0].node.get_content(), terms),
        chunks=[{"chunk_id": h.node.node_id, "heading": h.node.metadata.get("heading") or "",
                 "score": round(float(h.score or 0.0), 6), "text": h.node.get_content()} for h in hits],
        tags=decode_list(meta.get("tags")),
        created=meta.get("created"),
        updated=meta.get("updated") or meta.get("mtime"),
        duplicates=[],
    )
    return result


def excerpt(text: str, terms: list[str], limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of the chunk, centred on the first query term found (else its start)."""
    flat = re.sub(r"\s+", " ", text).strip()
    if len(flat) <= limit:
        return flat
    lowered = flat.lower()
    positions = [p for p in (lowered.find(t) for t in terms) if p >= 0]
    start = max(0, min(positions) - limit // 3) if positions else 0
    start = min(start, len(flat) - limit)
    piece = flat[start : start + limit - 2]
    return ("…" if start > 0 else "") + piece + ("…" if start + len(piece) < len(flat) else "")
