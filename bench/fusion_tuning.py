"""Offline fusion workbench: cache each channel's ranked chunks per query once, then score fusion settings in seconds.

Not the benchmark (that is retrieval_bench.py, through the real search path); this is the workbench behind the
defaults in RetrievalConfig. It scores the real fusion code (`rag_app.search.retrieve.fuse_query`) over cached
lists: BM25, e5 and the second dense channel of the default home, plus which query words each candidate contains.

usage: python bench/fusion_tuning.py [--model e5-small] [--set key=value ...] [--kinds] SET...
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
from metrics import summarise  # noqa: E402

from rag_app.config import FAST_EMBEDDING, Settings, load_settings  # noqa: E402
from rag_app.index.keyword import tokenize  # noqa: E402
from rag_app.search.query import RetrievalConfig  # noqa: E402
from rag_app.search.retrieve import KeywordRetriever, QueryTerms, SearchIndex, VectorRetriever, fuse_query  # noqa: E402

OUT = Path(__file__).parent / "out"
CACHE_VERSION = 2
CHANNELS = ("bm25", "vector", "vector2")


def channel_cache(shared: Path, name: str, model: str) -> dict:
    """Per query: each channel's top 50 (chunk id, score, note path), the query's tokens with their IDF and document
    frequency, and which tokens each candidate contains."""
    path = OUT / "cache" / f"{name}-{model}-v{CACHE_VERSION}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    eval_set = materialise(shared, load_set(shared, name), OUT)
    home = ready_home(OUT, eval_set, model)
    index = SearchIndex(load_settings(home))
    keyword = index.keyword()
    models = index.settings.models
    retrievers = [("bm25", KeywordRetriever(index, 50, None)), ("vector", VectorRetriever(index, 50, None))]
    if len(models) > 1:
        retrievers.append(("vector2", VectorRetriever(index, 50, None, models[1])))
    cache = {"queries": {}, "qrels": eval_set.qrels, "path_to_doc": eval_set.path_to_doc, "kinds": eval_set.kinds,
             "chunks": len(keyword.ids)}
    for query_id, text in eval_set.queries.items():
        row: dict = {"text": text}
        for channel, retriever in retrievers:
            row[channel] = [(n.node.node_id, float(n.score), n.node.metadata["path"])
                            for n in retriever.retrieve(text)]
        tokens = tokenize(text)
        candidates = sorted({h[0] for c in CHANNELS for h in row.get(c, [])})
        idfs, contains = keyword.term_matrix(tokens, candidates)
        row["terms"] = QueryTerms(tokens, idfs, [keyword.df(t) for t in tokens], len(keyword.ids))
        row["contains"] = {c: contains[i] for i, c in enumerate(candidates)}
        cache["queries"][query_id] = row
    index.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(cache))
    return cache


def fused_ranking(row: dict, config: RetrievalConfig, mode: str = "hybrid") -> list[tuple[str, str]]:
    """(chunk id, path) best first, as search() would rank them for this query (one query, no filters)."""
    paths = {cid: p for c in CHANNELS for cid, _, p in row.get(c, [])}
    if mode not in ("hybrid", "fast"):
        return [(cid, p) for cid, _, p in row.get(mode, [])]
    # fast: a home with USE-m3 only, whose one dense channel is the default home's second ("vector2")
    names = {"hybrid": {c: c for c in CHANNELS}, "fast": {"bm25": "bm25", "vector": "vector2"}}[mode]
    lists = {name: [(cid, s) for cid, s, _ in row[cached]] for name, cached in names.items() if cached in row}
    terms: QueryTerms = row["terms"]

    def contains(chunk_ids: list[str]) -> np.ndarray:
        empty = np.zeros(len(terms.tokens), dtype=bool)
        return np.asarray([row["contains"].get(c, empty) for c in chunk_ids]).reshape(len(chunk_ids), -1)

    fused = fuse_query(lists, terms, contains, config)
    return [(c, paths[c]) for c in sorted(fused, key=fused.get, reverse=True)]


def to_notes(ranked: list[tuple[str, str]], path_to_doc: dict[str, str], k: int = 10) -> list[str]:
    out: list[str] = []
    for _, path in ranked:
        doc = path_to_doc.get(path, path)
        if doc not in out:
            out.append(doc)
        if len(out) == k:
            break
    return out


def evaluate(cache: dict, config: RetrievalConfig, mode: str = "hybrid", by_kind: bool = False) -> dict:
    """nDCG@10 etc. over the set, or {kind: metrics} when by_kind."""
    runs: dict[str, list] = defaultdict(list)
    for query_id, row in cache["queries"].items():
        ranked = to_notes(fused_ranking(row, config, mode), cache["path_to_doc"])
        kind = cache["kinds"].get(query_id, "all") if by_kind else "all"
        runs[kind].append((ranked, cache["qrels"][query_id]))
    if not by_kind:
        return summarise(runs["all"])
    return {kind: {**summarise(r), "n": len(r)} for kind, r in sorted(runs.items())}


def parse_overrides(pairs: list[str]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    return out


def configured(overrides: dict, fast: bool = False) -> RetrievalConfig:
    """The defaults a search uses (of a USE-m3-only home when `fast`), with overrides."""
    models = {"embedding_model": FAST_EMBEDDING, "second_model": ""} if fast else {}
    config = RetrievalConfig.from_settings(Settings(home=OUT, **models))
    for key, value in overrides.items():
        if not hasattr(config, key):
            sys.exit(f"RetrievalConfig has no {key!r}")
        setattr(config, key, type(getattr(config, key))(value))
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--model", default="e5-small")
    parser.add_argument("--set", nargs="*", default=[], help="RetrievalConfig overrides, key=value")
    parser.add_argument("--kinds", action="store_true", help="also per query kind (locomo category, semantic kind)")
    parser.add_argument("--fast", action="store_true", help="also the fast mode (a USE-m3-only home: bm25 + USE)")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)
    config = configured(overrides)
    fast = configured(overrides, fast=True)
    fast_head = " fast | fast − best of its two |" * args.fast
    print(f"| set | bm25 | vector | vector2 | hybrid | hybrid − best single |{fast_head}")
    print(f"|---|---|---|---|---|---|{'---|---|' * args.fast}")
    for name in args.sets:
        cache = channel_cache(Path(args.shared), name, args.model)
        single = {m: evaluate(cache, config, m)["ndcg@10"] for m in CHANNELS}
        hybrid = evaluate(cache, config)["ndcg@10"]
        line = (f"| {name} | {single['bm25']:.3f} | {single['vector']:.3f} | {single['vector2']:.3f} | "
                f"**{hybrid:.3f}** | {hybrid - max(single.values()):+.3f} |")
        if args.fast:
            score = evaluate(cache, fast, "fast")["ndcg@10"]
            line += f" {score:.3f} | {score - max(single['bm25'], single['vector2']):+.3f} |"
        print(line, flush=True)
        if args.kinds and cache["kinds"]:
            for mode in (*CHANNELS, "hybrid"):
                for kind, m in evaluate(cache, config, mode, by_kind=True).items():
                    print(f"|   {name} {kind} (n={m['n']}) | {mode} | {m['ndcg@10']:.3f} |")


if __name__ == "__main__":
    main()
