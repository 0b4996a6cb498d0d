"""Ranking metrics over note-level results (graded relevance for nDCG)."""

from __future__ import annotations

import math


def ndcg_at(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    return len(set(ranked[:k]) & set(relevant)) / len(relevant) if relevant else 0.0


def hit_at(ranked: list[str], relevant: dict[str, int], k: int = 5) -> float:
    return 1.0 if set(ranked[:k]) & set(relevant) else 0.0


def mrr_at(ranked: list[str], relevant: dict[str, int], k: int = 10) -> float:
    for i, doc in enumerate(ranked[:k]):
        if doc in relevant:
            return 1.0 / (i + 1)
    return 0.0


def summarise(runs: list[tuple[list[str], dict[str, int]]]) -> dict[str, float]:
    n = len(runs) or 1
    return {
        "ndcg@10": sum(ndcg_at(r, q) for r, q in runs) / n,
        "recall@10": sum(recall_at(r, q) for r, q in runs) / n,
        "hit@5": sum(hit_at(r, q) for r, q in runs) / n,
        "mrr@10": sum(mrr_at(r, q) for r, q in runs) / n,
    }
