"""How likely a search result answers the query: a calibrated `relevance` in [0, 1], the `strength` label and the
"not in your notes" state derived from it, the same on every shell.

The fused score ranks well but means nothing across queries (an off-topic best hit scores like a real one), so
relevance is computed from evidence that does: how much of the query's IDF mass the note contains (and its title)
and how far that stands above the other candidate notes, whether its best chunk lacks the query's numbers or rarest
word (a passage on another event often holds every other word), how much of the query the notes know at all, each
dense channel's similarity against the query's own background (a z-score over a fixed sample of chunks, less the
expected best of that many draws) and whether the channels agree.
A logistic model per set of channels that ran turns that into a probability; `bench/relevance_fit.py` fits it on the
dev sets (answerable queries and other sets' queries asked of each corpus) and writes `relevance_model.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_app.config import FAST_EMBEDDING

MODEL_FILE = Path(__file__).with_name("relevance_model.json")
STRONG = 0.3  # relevance cut-points, fixed for every home and shell (chosen on the dev sets: docs/retrieval.md)
RELATED = 0.1
# A topical match (rag_app.index.topics): the cosine of the question to a note's title, tag or heading. Chosen on the
# sample vault's and the dev sets' topical questions (docs/retrieval.md, "Topical questions").
TOPIC_RELATED = 0.45  # a note whose topic is this close (and stands out: retrieve._by_topic) is about the question
TOPIC_FULL = 0.75  # ... and this close, the most a topic alone says: just under "strong"
TOPIC_UNSURE = 0.35  # no result is related, but a lead's topic is this close: "not sure", not "not in your notes"
LEAD = 0.02  # ... or a lead's own relevance reaches this
# The default configuration's second opinion (issue 28): the fast model ("bm25+use") rating the same evidence. A
# paraphrase or another language's question finds its note by meaning alone, where the default model, fitted mostly on
# question-answering sets, trusts the fast channel least (its `use` weight is negative). Chosen on semantic_dev's
# default rows and checked on every question-answering set (docs/retrieval.md, "Topical questions").
FAST_LEAD = 0.08  # a top-3 lead the fast channel ranks among its first DENSE_TOP, rated this by the fast model: unsure
DENSE_TOP = 3  # ... and a note both dense channels rank among their first this many, rated RELATED or more by the
# fast model, is "related" (at most: never "strong" on the second opinion alone)
# A Chinese question's English gloss (rag_app.search.cross_language), for a note the question's own reading also
# ranks high: the fast model rating the gloss's run this high makes the note a lead (`unsure`). Chosen on semantic_dev's
# default rows against rgb_zh's and the same-domain questions (docs/retrieval.md, "A Chinese question about English
# notes").
TRANSLATION_LEAD = 0.15
RANK_ABSENT = 99  # a note's place in a channel's list that does not hold it (`e5_rank`, `use_rank` evidence)
STATES = ("found", "unsure", "not_found")
AGREE = "agree"
FEATURES = ("lexical", "lexical_margin", "title", "known", "bm25_gap", "number_missed", "rarest_missed", "e5", "e5_gap",
            "use", "use_gap", AGREE)  # what a model reads


def channel_key(channels: Iterable[str]) -> str:
    """The model a set of channels uses: "bm25", "e5", "use" joined in that order (any dense model other than USE-m3
    counts as "e5": a remote or HuggingFace model uses e5's coefficients, its z-scores being comparable)."""
    order = {"bm25": 0, "e5": 1, "use": 2}
    return "+".join(sorted(set(channels), key=order.__getitem__))


def dense_family(model: str) -> str:
    return "use" if model == FAST_EMBEDDING else "e5"


@lru_cache(maxsize=1)
def _models() -> dict[str, dict[str, float]]:
    return json.loads(MODEL_FILE.read_text(encoding="utf-8"))["models"]


def probability(key: str, features: Mapping[str, float],
                models: Mapping[str, Mapping[str, float]] | None = None) -> float:
    """P(this note answers the query) under the model for these channels (`models`: the shipped file by default);
    a channel set without a model falls back to the largest set that has one and is contained in this one (features
    of the missing channels are ignored)."""
    models = _models() if models is None else models
    weights = models.get(key)
    if weights is None:
        parts = set(key.split("+"))
        fitting = [k for k in models if set(k.split("+")) <= parts]
        if not fitting:
            return 0.0
        weights = models[max(fitting, key=lambda k: len(k.split("+")))]
    z = weights.get("bias", 0.0) + sum(w * features.get(name, 0.0) for name, w in weights.items() if name != "bias")
    return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))


def second_opinion(key: str, features: Mapping[str, float]) -> float:
    """The fast model's probability for a note the default configuration rated (0 in any other configuration, or
    when the fast channel does not rank the note among its first DENSE_TOP): the same evidence, read by the model
    fitted where the fast channel is the only dense one."""
    parts = key.split("+")
    if "e5" not in parts or "use" not in parts or features.get("use_rank", RANK_ABSENT) >= DENSE_TOP:
        return 0.0
    return probability("+".join(p for p in parts if p != "e5"), features)


def rated(key: str, features: Mapping[str, float]) -> tuple[float, float]:
    """A note's relevance for one query run, and the second opinion it carries (`second_opinion`). When both dense
    channels rank the note among their first DENSE_TOP and the fast model says RELATED or more, the relevance is at
    least that, just under STRONG: two models agreeing on a note by meaning say it is about the question."""
    own = probability(key, features)
    second = second_opinion(key, features)
    if second >= RELATED and features.get("e5_rank", RANK_ABSENT) < DENSE_TOP:
        own = max(own, min(second, STRONG - 0.01))
    return own, second


def rate(runs: list[tuple[str, Mapping[str, float]]], translated: int | None = None,
         heard: bool = True) -> tuple[float, float, float]:
    """A note's relevance, second opinion and translation opinion over the question's run and its variants'
    (`rated`, then `combined`). `translated`: the run of the question's word-by-word translation
    (rag_app.search.cross_language), which `translation` judges when `heard` (a gloss of few distinctive
    words is not: it ranks, it does not rate), never one more variant (0 without one)."""
    pairs = [rated(key, features) for key, features in runs]
    opinion = 0.0
    if translated is not None and 0 < translated < len(pairs):
        own, second = pairs.pop(translated)
        if heard:
            gained, opinion = translation(runs[0][1], own, second)
            pairs[0] = (max(pairs[0][0], gained), pairs[0][1])
    return combined([own for own, _ in pairs]), combined([second for _, second in pairs]), opinion


def translation(question: Mapping[str, float], own: float, second: float) -> tuple[float, float]:
    """What a note's rating under the question's word-by-word translation says: (relevance, translation opinion).
    A gloss is a bag of dictionary senses (安倍晋三 → "Abe the Jin Dynasties three") that matches some English note
    for most news questions, so it counts only where the question's own reading agrees (a dense channel ranks the
    note among its first DENSE_TOP for the question as written), and only when it is sure: a rating of STRONG makes
    the note "related", never "strong" alone; and the fast model's rating of it (its second opinion of that run) is a
    lead from TRANSLATION_LEAD."""
    if min(question.get("use_rank", RANK_ABSENT), question.get("e5_rank", RANK_ABSENT)) >= DENSE_TOP:
        return 0.0, 0.0
    return (min(own, STRONG - 0.01) if own >= STRONG else 0.0), second


def combined(runs: list[float]) -> float:
    """A note's relevance over the question (`runs[0]`) and its variants: the question's own, or the second best of
    all runs when that is higher. The best of a dozen variants alone is a multiple comparison (one of them matches an
    unrelated note by chance: 6-8 % of unanswerable questions got a strong hit on the dev sets); two runs agreeing
    rarely do, while the note a question's variants are about is found by several."""
    if len(runs) < 2:
        return runs[0] if runs else 0.0
    return max(runs[0], sorted(runs)[-2])


def strength(relevance: float) -> str:
    """strong (likely answers), related (may help), weak (a lead only): fixed cut-points on relevance."""
    return "strong" if relevance >= STRONG else "related" if relevance >= RELATED else "weak"


def reading_order(results: list[dict]) -> list[dict]:
    """Results in the order a person should read them: strong, then related, then weak, each tier in fused-rank
    order (a lone related note under five weak ones is the one to open first; measured in docs/retrieval.md)."""
    tier = {"strong": 0, "related": 1, "weak": 2}
    return sorted(results, key=lambda r: tier[r["strength"]])


def topical(similarity: float) -> float:
    """The relevance a topical match alone gives (0 below TOPIC_RELATED): "related" (about what you asked), never
    "strong" (that the note answers it takes the note's own words or meaning: the model above)."""
    if similarity < TOPIC_RELATED:
        return 0.0
    share = min(1.0, (similarity - TOPIC_RELATED) / (TOPIC_FULL - TOPIC_RELATED))
    return round(RELATED + share * (STRONG - 0.01 - RELATED), 4)


def answer_state(results: list[Mapping[str, Any]]) -> str:
    """found: a result is strong or related. unsure: none is, but one of the first three leads is close to the
    question (its relevance reaches LEAD, its `second_opinion` FAST_LEAD, its `translation_opinion` TRANSLATION_LEAD,
    or its topic stands out at TOPIC_UNSURE or closer): the notes may cover it, said as uncertainty.
    not_found: nothing in the notes is close (nonsense, another language's or domain's subject, an absent topic), or
    the question names a thing no note mentions (`unmentioned`: rag_app.search.unmentioned)."""
    if any(r.get("unmentioned") for r in results):
        return "not_found"
    if any(r.get("relevance", 0.0) >= RELATED for r in results):
        return "found"
    for result in results[:3]:
        topic = result.get("topic") or {}
        if (result.get("relevance", 0.0) >= LEAD or result.get("second_opinion", 0.0) >= FAST_LEAD
                or result.get("translation_opinion", 0.0) >= TRANSLATION_LEAD
                or (topic.get("stands_out") and topic["similarity"] >= TOPIC_UNSURE)):
            return "unsure"
    return "not_found"


def not_found(results: list[Mapping[str, Any]]) -> bool:
    """Nothing in the notes is close to the question ("not in your notes"; results stay, as leads)."""
    return answer_state(results) == "not_found"
