"""Offline fusion tuning: cache each channel's ranked chunks per query once, then score fusion variants in seconds.

Not the benchmark (that is retrieval_bench.py, through the real search path); this is the workbench behind the
defaults in RetrievalConfig. usage: python bench/fusion_tuning.py [--model e5-small] SET...
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise  # noqa: E402
from metrics import summarise  # noqa: E402

from rag_app.config import load_settings  # noqa: E402
from rag_app.keyword import tokenize  # noqa: E402
from rag_app.retrieve import KeywordRetriever, SearchIndex, VectorRetriever  # noqa: E402

OUT = Path(__file__).parent / "out"
Hits = list[tuple[str, float, str]]  # chunk id, score, note path


def channel_cache(shared: Path, name: str, model: str) -> dict:
    path = OUT / "cache" / f"{name}-{model}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    eval_set = materialise(shared, load_set(shared, name), OUT)
    home = OUT / "homes" / f"{eval_set.home_name}-{model}"
    if not (home / "index.sqlite").exists():
        sys.exit(f"{home} is missing: run python bench/prepare_eval.py --model {model} {name}")
    index = SearchIndex(load_settings(home))
    keyword = index.keyword()
    cache = {"queries": {}, "qrels": eval_set.qrels, "path_to_doc": eval_set.path_to_doc}
    for query_id, text in eval_set.queries.items():
        rows = {}
        retrievers = (("bm25", KeywordRetriever(index, 50, None)), ("vector", VectorRetriever(index, 50, None)))
        for channel, retriever in retrievers:
            nodes = retriever.retrieve(text)
            rows[channel] = [(n.node.node_id, float(n.score), n.node.metadata["path"]) for n in nodes]
        rows["shares"] = keyword.match_share(tokenize(text),
                                             sorted({h[0] for c in ("bm25", "vector") for h in rows[c]}))
        cache["queries"][query_id] = rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(cache))
    return cache


def to_notes(ranked: list[tuple[str, str]], path_to_doc: dict[str, str], k: int = 10) -> list[str]:
    out: list[str] = []
    for _, path in ranked:
        doc = path_to_doc.get(path, path)
        if doc not in out:
            out.append(doc)
        if len(out) == k:
            break
    return out


def rrf(lists: list[tuple[Hits, float]], k: int) -> list[tuple[str, str]]:
    fused: dict[str, float] = {}
    paths: dict[str, str] = {}
    for hits, weight in lists:
        for rank, (cid, _, path) in enumerate(hits):
            fused[cid] = fused.get(cid, 0) + weight / (k + rank + 1)
            paths[cid] = path
    return [(c, paths[c]) for c in sorted(fused, key=fused.get, reverse=True)]


def coverage(row: dict) -> float:
    """IDF-weighted share of the query's terms that the top BM25 chunk contains (as KeywordRetriever computes it)."""
    return row["shares"].get(row["bm25"][0][0], 0.0) if row["bm25"] else 0.0


def zconf(hits: Hits) -> float:
    if len(hits) < 3:
        return 1.0 if hits else 0.0
    s = np.array([h[1] for h in hits])
    return float((s[0] - s[1:].mean()) / (s[1:].std() or 1e-6))


VARIANTS: dict[str, Callable[[dict, dict], list[tuple[str, str]]]] = {}


def variant(name: str):
    def register(fn):
        VARIANTS[name] = fn
        return fn
    return register


@variant("bm25")
def _bm25(row, p):
    return [(c, path) for c, _, path in row["bm25"]]


@variant("vector")
def _vector(row, p):
    return [(c, path) for c, _, path in row["vector"]]


@variant("rrf60")
def _rrf(row, p):
    return rrf([(row["bm25"], 1.0), (row["vector"], 1.0)], 60)


@variant("cov^a")
def _cov(row, p):
    w = coverage(row) ** p["a"]
    return rrf([(row["bm25"], w * p["wb"]), (row["vector"], 1.0)], p["k"])


@variant("3ch")
def _three(row, p):
    w = coverage(row) ** p["a"]
    zb, zv = zconf(row["bm25"]), zconf(row["vector"])
    lists = [(row["bm25"], w * p["wb"] * min(2, max(0.2, zb / 3))), (row["vector"], min(2, max(0.2, zv / 3)))]
    if row.get("vector2"):
        lists.append((row["vector2"], p.get("w2", 1.0) * min(2, max(0.2, zconf(row["vector2"]) / 3))))
    return rrf(lists, p["k"])


@variant("lexical")
def _lexical(row, p):
    """The default fusion (NoteFusionRetriever, adaptive): confidence- and coverage-weighted RRF plus the
    lexical-match term (each candidate's IDF share of the query, scaled by the best chunk's coverage)."""
    cov = coverage(row)
    lists = [(row["bm25"], p["wb"] * cov * _clip(zconf(row["bm25"]))),
             (row["vector"], p["wv"] * _clip(zconf(row["vector"])))]
    if row.get("vector2"):
        lists.append((row["vector2"], p["w2"] * (1 - cov) ** p["g"] * _clip(zconf(row["vector2"]))))
    fused: dict[str, float] = {}
    paths: dict[str, str] = {}
    for hits, weight in lists:
        for rank, (cid, _, path) in enumerate(hits):
            fused[cid] = fused.get(cid, 0) + weight / (p["k"] + rank + 1)
            paths[cid] = path
    for cid in fused:
        fused[cid] += p["lam"] * cov * row["shares"].get(cid, 0.0) / (p["k"] + 1)
    return [(c, paths[c]) for c in sorted(fused, key=fused.get, reverse=True)]


def _clip(z: float) -> float:
    return min(2.0, max(0.2, z / 3))


@variant("cov^a+z")
def _covz(row, p):
    w = coverage(row) ** p["a"]
    zb, zv = zconf(row["bm25"]), zconf(row["vector"])
    return rrf([(row["bm25"], w * p["wb"] * min(2, max(0.2, zb / 3))), (row["vector"], min(2, max(0.2, zv / 3)))],
               p["k"])


def evaluate(cache: dict, fn, params: dict) -> float:
    runs = []
    for query_id, row in cache["queries"].items():
        runs.append((to_notes(fn(row, params), cache["path_to_doc"]), cache["qrels"][query_id]))
    return summarise(runs)["ndcg@10"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--model", default="e5-small")
    parser.add_argument("--second", default="", help="a second dense model's home to fuse as a third channel")
    args = parser.parse_args()
    caches = {name: channel_cache(Path(args.shared), name, args.model) for name in args.sets}
    if args.second:
        for name, cache in caches.items():
            other = channel_cache(Path(args.shared), name, args.second)
            for query_id, row in cache["queries"].items():
                row["vector2"] = other["queries"][query_id]["vector"]
                row["shares"] = {**other["queries"][query_id]["shares"], **row["shares"]}
        print("vector2 alone", " ".join(f"{evaluate(c, lambda r, p: [(x[0], x[2]) for x in r['vector2']], {}):.3f}"
                                         for c in caches.values()))
        for w2 in (0.5, 0.75, 1.0):
            params = {"a": 1, "wb": 1.5, "k": 10, "w2": w2}
            print("3ch", params, " ".join(f"{evaluate(c, VARIANTS['3ch'], params):.3f}" for c in caches.values()))
        for lam in (0.0, 1.0, 1.5, 2.0):
            params = {"wb": 0.25, "wv": 1.0, "w2": 3.0, "g": 4, "k": 7, "lam": lam}
            scores = [evaluate(c, VARIANTS["lexical"], params) for c in caches.values()]
            print("lexical", params, " ".join(f"{v:.3f}" for v in scores))
    grid = [{"a": a, "wb": wb, "k": k} for a in (1, 2, 3, 4) for wb in (0.5, 1.0, 1.5) for k in (10, 30, 60)]
    print("variant params " + " ".join(args.sets))
    for name in ("bm25", "vector", "rrf60"):
        print(name, "-", " ".join(f"{evaluate(c, VARIANTS[name], {}):.3f}" for c in caches.values()))
    for name in ("cov^a", "cov^a+z"):
        scored = []
        for params in grid:
            values = [evaluate(c, VARIANTS[name], params) for c in caches.values()]
            scored.append((min(v - max(evaluate(c, VARIANTS['bm25'], {}), evaluate(c, VARIANTS['vector'], {}))
                               for v, c in zip(values, caches.values(), strict=True)), params, values))
        scored.sort(key=lambda s: s[0], reverse=True)
        for margin, params, values in scored[:5]:
            print(name, params, " ".join(f"{v:.3f}" for v in values), f"min margin {margin:+.3f}")


if __name__ == "__main__":
    main()
