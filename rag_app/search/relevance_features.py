"""The evidence the relevance model reads (rag_app.search.relevance scores it): per result note, for the question
and each variant, how much of the query's IDF mass the note's best chunk holds and how far that stands above the
other candidates, its title's share, how much of the query the notes know at all, how far its BM25 score stands out,
what of the query's specifics (numbers, rarest word) it lacks, each dense channel's similarity against the query's
background and list, and whether the channels agree. Computed from the retrieval's own lists and BM25's postings
(rag_app.search.retrieve runs the search and calls `note_evidence`); the features live here, beside the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_app.index.keyword import PerIndex, is_question_word, tokenize
from rag_app.search.relevance import AGREE, RANK_ABSENT, channel_key, dense_family
from readers.records import decode_list

if TYPE_CHECKING:
    from rag_app.index.keyword import KeywordIndex
    from rag_app.search.retrieve import NoteFusionRetriever, SearchIndex

_NUMBER = re.compile(r"\d")  # 2022, 3月; not 第二部 (in "第二部是谁导演的" a place in a list, not an event)
SHARED_FACTOR = 2.0  # a word other notes hold too: capped at twice what holding a random word says (Breadth)
FAIR_FACTOR = 2.0  # a note holding at most this many times its fair share (1/notes) of the words is not capped
MIN_POOL = 30  # chunks a search must be able to return before a hit's standing out means anything (note_evidence)


@dataclass
class QueryTerms:
    """A query's BM25 tokens as the index sees them: the evidence behind BM25's coverage and the lexical-match term."""

    tokens: list[str]
    idfs: list[float | None]  # None: no chunk has the token
    dfs: list[int]
    chunks: int

    def weights(self) -> np.ndarray:
        """How much each token counts toward a chunk's share of the query: its IDF. A token no chunk has counts at
        the highest IDF seen (a query the notes only half cover never reaches a share of 1); a question word
        (哪一, 几个, 为何) counts nothing: no passage that answers a question says how it was asked."""
        known = [i for i in self.idfs if i is not None]
        ceiling = max(known) if known else 0.0
        out = np.asarray([ceiling if i is None else i for i in self.idfs], dtype=np.float64)
        out[[is_question_word(t) for t in self.tokens]] = 0.0
        return out


Contains = Callable[[list[str]], np.ndarray]


class Breadth:
    """What a word can tell of a note that holds it, given how much of the home's vocabulary that note holds: a cap
    on the word's IDF for that note (issue 30: the 5,000 commonest words as one note answered off-topic questions).

    A word's IDF is the evidence that a *chunk* holds it, as if any chunk were as likely to. A note that alone holds
    a share u of the words the home knows is the sole holder of a random known word with probability u, so a word
    only it holds is worth at most ln(1/u) nats for it. A word other notes hold too has its IDF lowered by them
    already; it is capped at SHARED_FACTOR x ln(1/s), s being the share of the home's words the note holds at all (a
    list of every word holds any two common words in one chunk: "speed" and "light"). A typical note's caps are above
    any IDF of its words: on the dev sets no figure moved (docs/retrieval.md). The commonest words pasted as a note
    into the sample vault hold a third of its vocabulary alone, so each question word only they hold is worth ~1
    nat, not 5. Only a note holding more than FAIR_FACTOR times its fair share (1/notes) is capped: in a home of
    one note that note holds every word, and its words say all there is (uncapped, a one-note home answered
    nothing). Computed once per keyword index from BM25's postings (a note's chunks are consecutive rows)."""

    def __init__(self, keyword: KeywordIndex):
        ids = keyword.ids
        self.row = keyword.row
        self.vocab = keyword.bm25.vocab_dict if ids else {}
        self.indptr = np.asarray(keyword.bm25.scores["indptr"]) if ids else np.zeros(1, dtype=np.int64)
        self.indices = np.asarray(keyword.bm25.scores["indices"]) if ids else np.zeros(0, dtype=np.int64)
        owners = [chunk_id.rpartition(":chunk:")[0] or chunk_id for chunk_id in ids]
        changes = np.fromiter((a != b for a, b in zip(owners[1:], owners[:-1], strict=True)), dtype=bool,
                              count=max(len(owners) - 1, 0))
        self.row_note = np.concatenate([np.zeros(min(len(owners), 1), dtype=np.int64), np.cumsum(changes)])
        notes = int(self.row_note[-1]) + 1 if len(owners) else 0
        self.holders = np.zeros(len(self.indptr) - 1, dtype=np.int64)  # notes holding each term
        self.alone_cap = np.full(notes, np.inf)
        self.shared_cap = np.full(notes, np.inf)
        if not len(self.indices):
            return
        owner_of = self.row_note[self.indices]
        term_of = np.repeat(np.arange(len(self.indptr) - 1), np.diff(self.indptr))
        first = np.ones(len(owner_of), dtype=bool)  # the first posting of each (term, note) pair
        first[1:] = (owner_of[1:] != owner_of[:-1]) | (term_of[1:] != term_of[:-1])
        self.holders = np.bincount(term_of[first], minlength=len(self.indptr) - 1)
        terms = int((self.holders > 0).sum())
        alone = np.bincount(owner_of[first & (self.holders[term_of] == 1)], minlength=notes)
        held = np.bincount(owner_of[first], minlength=notes)
        broad = notes / (terms * FAIR_FACTOR)  # a note's shares above FAIR_FACTOR x a fair share (1/notes) are broad
        self.alone_cap = np.where(alone * broad > 1, np.log(terms / np.maximum(alone, 1)), np.inf)
        self.shared_cap = np.where(held * broad > 1, SHARED_FACTOR * np.log(terms / np.maximum(held, 1)), np.inf)

    def caps(self, chunk_ids: list[str], tokens: list[str]) -> np.ndarray:
        """chunks x tokens: the most each query token can be worth in each chunk (no cap for a chunk the index does
        not hold)."""
        rows = np.asarray([self.row.get(c, -1) for c in chunk_ids], dtype=np.int64)
        alone, shared = np.full(len(rows), np.inf), np.full(len(rows), np.inf)
        held = rows >= 0
        alone[held] = self.alone_cap[self.row_note[rows[held]]]
        shared[held] = self.shared_cap[self.row_note[rows[held]]]
        only = np.asarray([self._alone(t) for t in tokens], dtype=bool)
        return np.where(only[None, :], alone[:, None], shared[:, None])

    def known(self, token: str) -> float:
        """The most a word can tell of the home knowing it: its only holder's cap (a word only a bag of words holds
        is hardly known), no cap for a word several notes hold."""
        if not self._alone(token):
            return np.inf
        column = self.vocab[token]
        return float(self.alone_cap[self.row_note[self.indices[self.indptr[column]]]])

    def _alone(self, token: str) -> bool:
        column = self.vocab.get(token)
        return column is not None and self.holders[column] == 1


breadth = PerIndex(Breadth)  # the keyword index's Breadth, made once per index


def note_evidence(index: SearchIndex, fusion: NoteFusionRetriever, note_ids: list[str],
                  pool: int) -> dict[str, list[tuple[str, dict[str, float]]]]:
    """Per note, for the question and then each variant: the relevance model's key (the channels that gave evidence;
    "" when none did) and the evidence it reads (rag_app.search.relevance), from the note's chunks among every channel's
    candidates. Lexical features come from BM25's postings, dense ones from the channel's own list (a note below its
    list scores at the list's floor) against the query's background.

    `pool` is how many chunks the search could return (the home, or what its filters allow). Below MIN_POOL a hit
    cannot stand out of a list or a background (three notes give three scores), so only the lexical evidence is
    read: a note with the query's words is still found to answer it; a match by meaning alone stays a lead."""
    chunks_of: dict[str, list[str]] = {n: [] for n in note_ids}
    meta_of: dict[str, dict[str, Any]] = {}
    note_by_chunk: dict[str, str] = {}
    for hits in fusion.results.values():
        for hit in hits:
            note = str(hit.node.metadata.get("note_id"))
            note_by_chunk[hit.node.node_id] = note
            if note in chunks_of and hit.node.node_id not in chunks_of[note]:
                chunks_of[note].append(hit.node.node_id)
                meta_of.setdefault(note, hit.node.metadata)
    models = dict(zip(("vector", "vector2"), index.settings.models, strict=False))
    title_tokens = {n: set(tokenize(f"{m.get('title') or ''} {' '.join(decode_list(m.get('tags')))}"))
                    for n, m in meta_of.items()}
    small = pool < MIN_POOL
    out: dict[str, list[tuple[str, dict[str, float]]]] = {n: [] for n in note_ids}
    for query in fusion.queries_run:
        lists = fusion._lists(query, fusion.results)
        features: dict[str, dict[str, float]] = {n: {} for n in note_ids}
        ran: list[str] = []
        for name, hits in lists.items():
            if (query, name) in fusion.skipped_runs or (name != "bm25" and (not hits or small)):
                continue
            if name == "bm25":
                lexical_features(index, fusion, query, chunks_of, title_tokens, features, small, note_by_chunk)
                ran.append(name)
            elif dense_features(index, query, models[name], hits, chunks_of, features, pool):
                ran.append(name)
        if not ran:  # kept in its place: the question's evidence comes first (relevance.combined)
            for note in note_ids:
                out[note].append(("", {}))
            continue
        tops = [{note_by_chunk.get(c) for c, _ in lists[name][:3]} for name in ran]
        key = channel_key("bm25" if name == "bm25" else dense_family(models[name]) for name in ran)
        ranks = {dense_family(models[name]): note_ranks(lists[name], note_by_chunk) for name in ran if name != "bm25"}
        for note in note_ids:
            features[note][AGREE] = sum(note in top for top in tops) / len(tops)
            for family, order in ranks.items():  # read by relevance.second_opinion, not by the model
                features[note][f"{family}_rank"] = float(order.get(note, RANK_ABSENT))
            out[note].append((key, features[note]))
    return out


def note_ranks(hits: list[tuple[str, float]], note_by_chunk: dict[str, str]) -> dict[str, int]:
    """Each note's place (0 = first) among the distinct notes of a channel's list, best chunk first."""
    order: dict[str, int] = {}
    for chunk_id, _ in hits:
        order.setdefault(note_by_chunk.get(chunk_id, chunk_id), len(order))
    return order


def lexical_features(index: SearchIndex, fusion: NoteFusionRetriever, query: str, chunks_of: dict[str, list[str]],
                     title_tokens: dict[str, set[str]], features: dict[str, dict[str, float]], small: bool,
                     note_by_chunk: dict[str, str]) -> None:
    """Per note: the share of the query's IDF mass its best chunk holds, how far that stands above the best other
    note among the query's candidates (several notes holding the query alike make any one of them less surely the
    answer), the share its title and tags hold, how much of the query the notes know at all, how far its BM25 score
    stands out of BM25's list, and what of the query's specifics its best chunk lacks. In a `small` pool a word no
    note has says nothing (a handful of notes lacks most words): shares are of the known words.

    Each word a note holds counts at its IDF, at most the note's cap (`Breadth`): a note that holds every word (a
    list of the commonest words, pasted as a note) holds a question's words by chance, not as an answer; a word only
    such a note holds is hardly known."""
    terms, contains = fusion._evidence(query)
    if terms is None:
        return
    weights = terms.weights()
    unknown = np.asarray([i is None for i in terms.idfs], dtype=bool)
    if small:
        weights = np.where(unknown, 0.0, weights)
    total = float(weights.sum())
    wide = breadth(index.keyword())
    known_mass = sum(min(w, wide.known(t)) for t, w, u in zip(terms.tokens, weights, unknown, strict=True) if not u)
    known = float(known_mass) / total if total > 0 else 0.0
    lists = fusion._lists(query, fusion.results)
    every = list(dict.fromkeys([c for chunks in chunks_of.values() for c in chunks]
                               + [c for hits in lists.values() for c, _ in hits]))
    matrix = contains(every) if every else np.zeros((0, len(weights)), dtype=bool)
    row = {chunk_id: i for i, chunk_id in enumerate(every)}
    worth = np.minimum(weights[None, :], wide.caps(every, terms.tokens)) * matrix  # chunks x tokens, in nats
    covered_all = worth.sum(axis=1)
    share = covered_all / total if total > 0 else np.zeros(len(every))
    best_of: dict[str, float] = {}
    for chunk_id, value in zip(every, share, strict=True):
        note = note_by_chunk.get(chunk_id, chunk_id)
        best_of[note] = max(best_of.get(note, 0.0), float(value))
    gaps = list_gaps([] if small else lists["bm25"], chunks_of)
    for note, chunks in chunks_of.items():
        rows = [row[c] for c in chunks]
        held = matrix[rows] if chunks else np.zeros((1, len(weights)), dtype=bool)
        covered = covered_all[rows] if chunks else np.zeros(1)
        lexical = float(covered.max()) / total if total > 0 else 0.0
        rival = max((v for other, v in best_of.items() if other != note), default=0.0)
        titled = sum(w for t, w in zip(terms.tokens, weights, strict=True) if t in title_tokens.get(note, ()))
        features[note].update(lexical=lexical, lexical_margin=lexical - rival, known=known,
                              title=float(titled) / total if total > 0 else 0.0, bm25_gap=gaps[note],
                              **specifics(terms.tokens, weights, held[int(covered.argmax())]))


def specifics(tokens: list[str], weights: np.ndarray, best: np.ndarray) -> dict[str, float]:
    """What a passage about another event lacks although it holds most of the query's words (`best`: which of the
    query's tokens the note's best chunk holds): the query's numbers (2022年, 3月) missing there, and its rarest
    content word missing there."""
    numbers = np.asarray([bool(_NUMBER.search(t)) for t in tokens], dtype=bool) & (weights > 0)
    return {"number_missed": float((numbers & ~best).sum() / numbers.sum()) if numbers.any() else 0.0,
            "rarest_missed": float(not best[int(weights.argmax())]) if weights.size and weights.max() > 0 else 0.0}


def list_gaps(hits: list[tuple[str, float]], chunks_of: dict[str, list[str]]) -> dict[str, float]:
    """How far each note's best score stands above its channel's list, in the list's standard deviations (a note
    below the list sits at its floor): an answer usually stands out; for a question nothing answers, nothing does."""
    if len(hits) < 3:
        return {note: 0.0 for note in chunks_of}
    values = np.asarray([score for _, score in hits], dtype=np.float64)
    mean, std = float(values.mean()), float(values.std()) or 1e-6
    scores = dict(hits)
    return {note: (max((scores[c] for c in chunks if c in scores), default=float(values[-1])) - mean) / std
            for note, chunks in chunks_of.items()}


def dense_features(index: SearchIndex, query: str, model: str, hits: list[tuple[str, float]],
                    chunks_of: dict[str, list[str]], features: dict[str, dict[str, float]], pool: int) -> bool:
    """z-score of the note's best similarity over the query's background, less the expected best of `pool` draws
    (sqrt(2 ln N)): an unrelated query's best hit among more chunks stands further out by chance alone; and how far
    it stands out of the channel's own list. False (nothing set) when the model has no background yet."""
    background = index.similarity_background(query, model)
    if background is None:
        return False
    mean, std = background
    family = dense_family(model)
    scores = dict(hits)
    floor = hits[-1][1]
    chance = float(np.sqrt(2 * np.log(max(min(pool, index.collection_size(model)), 2))))
    gaps = list_gaps(hits, chunks_of)
    for note, chunks in chunks_of.items():
        best = max((scores[c] for c in chunks if c in scores), default=floor)
        features[note][family] = (best - mean) / std - chance
        features[note][f"{family}_gap"] = gaps[note]
    return True
