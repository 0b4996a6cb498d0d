"""Offline workbench for the dense channels' pseudo-relevance feedback (`feedback_chunks`, `feedback_weight` in
[retrieval]; rag_app.search.retrieve.VectorRetriever.feedback): each dense list asked again with the query vector
moved toward the mean of the query's first fused chunks, weighted by (1 − BM25 coverage), then fused as the search
fuses. Over bench/fusion_tuning.py's cached lists, plus every chunk vector of the set's default home and the queries'
vectors (cached in bench/out/cache/feedback-SET.pkl). Prints nDCG@10 per setting (default and fast modes) and, for
the shipped setting, per query kind and how many questions gained or lost.

Not the benchmark: the real search path also leaves out a question in the other language than the notes' and a
translation (measured there with bench/answer_states.py).

usage: python bench/feedback_tuning.py [--shared ../shared] SET...
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise, ready_home  # noqa: E402
from fusion_tuning import OUT, channel_cache, configured, fused_ranking, to_notes  # noqa: E402
from metrics import summarise  # noqa: E402

from rag_app.config import load_settings  # noqa: E402
from rag_app.search.retrieve import SearchIndex, bm25_coverage  # noqa: E402

SETTINGS = ((2, 0.5), (3, 0.3), (3, 0.5), (3, 0.7), (4, 0.5), (5, 0.5))  # (feedback_chunks, feedback_weight)


def vectors(shared: Path, name: str, cache: dict) -> dict[str, tuple[list[str], np.ndarray, dict[str, np.ndarray]]]:
    """Per model of the default home: its chunk ids, their unit vectors, and each query's vector."""
    path = OUT / "cache" / f"feedback-{name}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    home = ready_home(OUT, materialise(shared, load_set(shared, name), OUT), "e5-small")
    index = SearchIndex(load_settings(home))
    out = {}
    for model in index.settings.models:
        got = index.collection(model).get(include=["embeddings"])
        rows = np.asarray(got["embeddings"], dtype=np.float32)
        queries = {qid: np.asarray(index.embed_query(row["text"], model), dtype=np.float32)
                   for qid, row in cache["queries"].items()}
        out[model] = (list(got["ids"]), rows / np.linalg.norm(rows, axis=1, keepdims=True), queries)
    index.close()
    path.write_bytes(pickle.dumps(out))
    return out


def coverage(row: dict) -> float:
    terms = row["terms"]
    empty = np.zeros(len(terms.tokens), dtype=bool)

    def contains(chunk_ids: list[str]) -> np.ndarray:
        return np.asarray([row["contains"].get(c, empty) for c in chunk_ids]).reshape(len(chunk_ids), -1)

    return bm25_coverage({"bm25": [(c, s) for c, s, _ in row["bm25"]]}, terms, contains) or 0.0


def fed_back(cache: dict, dense: dict, config, mode: str, chunks: int, weight: float) -> dict:
    """The cache with each dense list replaced by its feedback list."""
    channel_of = dict(zip(dense, ("vector", "vector2"), strict=False))
    positions = {model: {c: i for i, c in enumerate(ids)} for model, (ids, _, _) in dense.items()}
    queries = {}
    for qid, row in cache["queries"].items():
        top = [c for c, _ in fused_ranking(row, config, mode)[:chunks]]
        share = weight * (1.0 - coverage(row))
        again = dict(row)
        for model, (ids, rows, query_vectors) in dense.items():
            channel = channel_of[model]
            if mode == "fast" and channel != "vector2":
                continue
            picked = [positions[model][c] for c in top if c in positions[model]]
            vector = query_vectors[qid] + (share * rows[picked].mean(axis=0) if picked else 0.0)
            scores = rows @ (vector / np.linalg.norm(vector))
            again[channel] = [(ids[i], float(scores[i]), ids[i].rpartition(":chunk:")[0].split("/", 1)[1])
                              for i in np.argsort(-scores)[:50]]
        queries[qid] = again
    return {**cache, "queries": queries}


def per_question(cache: dict, config, mode: str) -> dict[str, float]:
    return {qid: summarise([(to_notes(fused_ranking(row, config, mode), cache["path_to_doc"]),
                             cache["qrels"][qid])])["ndcg@10"] for qid, row in cache["queries"].items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    args = parser.parse_args()
    shipped = configured({})
    for name in args.sets:
        cache = channel_cache(Path(args.shared), name, "e5-small")
        dense = vectors(Path(args.shared), name, cache)
        for label, mode in (("default", "hybrid"), ("fast", "fast")):
            config = configured({}, fast=mode == "fast")
            base = per_question(cache, config, mode)
            cells = [f"off {np.mean(list(base.values())):.3f}"]
            for chunks, weight in SETTINGS:
                score = np.mean(list(per_question(fed_back(cache, dense, config, mode, chunks, weight), config,
                                                  mode).values()))
                cells.append(f"{chunks}×{weight} {score:.3f}")
            print(f"{name} / {label}: " + " | ".join(cells), flush=True)
        after = per_question(fed_back(cache, dense, shipped, "hybrid", shipped.feedback_chunks,
                                      shipped.feedback_weight), shipped, "hybrid")
        before = per_question(cache, shipped, "hybrid")
        gains = np.asarray([after[q] - before[q] for q in before])
        by_kind: dict[str, list[float]] = defaultdict(list)
        for qid, gain in zip(before, gains, strict=True):
            by_kind[cache["kinds"].get(qid, "all")].append(float(gain))
        kinds = ", ".join(f"{kind} ({len(g)}) {np.mean(g):+.3f}" for kind, g in sorted(by_kind.items()))
        print(f"  shipped ({shipped.feedback_chunks}×{shipped.feedback_weight}), default: "
              f"{int((gains > 1e-3).sum())} questions gained, {int((gains < -1e-3).sum())} lost; {kinds}")


if __name__ == "__main__":
    main()
