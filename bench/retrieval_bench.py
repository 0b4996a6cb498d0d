"""Retrieval benchmark over the BEIR-layout sets in ../shared/eval, through the real sync and search paths.

Run `python bench/prepare_eval.py SET...` first (it syncs each set's corpus, as a vault, into bench/out/homes).
Prints nDCG@10, recall@10, hit@5, MRR@10 for each mode (bm25, vector: the main model, vector2: the second model of a
home that has one, hybrid), per-query latency split into the query-embedding time (the model's own cost) and
everything else, and the share of queries whose gated channel was skipped (USE-m3: the second channel of a default
home, the only dense one of a fast home; skipped when it could carry under 1 % of the fused weight).

usage: python bench/retrieval_bench.py [--shared ../shared] [--model e5-small] [--modes bm25,vector,vector2,hybrid]
       SET...
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise, ready_home  # noqa: E402
from metrics import summarise  # noqa: E402

from rag_app.engine import Brain  # noqa: E402

OUT = Path(__file__).parent / "out"
GATED = {True: "vector2", False: "vector"}  # the USE-m3 channel: of a default home (two models), of a fast one


def run_set(shared: Path, name: str, model: str, modes: list[str], limit: int | None) -> list[str]:
    eval_set = materialise(shared, load_set(shared, name), OUT)
    brain = Brain(ready_home(OUT, eval_set, model))
    queries = list(eval_set.queries.items())[:limit]
    lines = []
    for mode in modes:
        if mode == "vector2" and len(brain.settings.models) < 2:
            continue  # a home with one model has no second channel
        runs, embed_ms, ours_ms, skipped, gated = [], [], [], 0, 0
        for query_id, text in queries:
            response = brain.search(text, k=10, mode=mode, expand=False)
            ranked = [eval_set.path_to_doc.get(r["path"], r["path"]) for r in response.results]
            runs.append((ranked, eval_set.qrels[query_id]))
            embed_ms.append(response.timing["embed_ms"])
            ours_ms.append(response.timing["ours_ms"])
            channels = response.coverage["channels"]
            gated += len(channels) > 1 and (GATED[len(brain.settings.models) > 1] in channels)
            skipped += any(c["skipped"] for c in channels.values())
        m = summarise(runs)
        p50 = statistics.median(ours_ms)
        p95 = sorted(ours_ms)[int(len(ours_ms) * 0.95) - 1]
        share = f"{100 * skipped / gated:.0f} %" if gated else "—"
        lines.append(f"| {name} | {model} | {mode} | {m['ndcg@10']:.3f} | {m['recall@10']:.3f} | {m['hit@5']:.3f} | "
                     f"{m['mrr@10']:.3f} | {statistics.median(embed_ms):.0f} | {p50:.1f} | {p95:.1f} | {share} |")
        print(lines[-1], flush=True)
    brain.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--model", default="e5-small")
    parser.add_argument("--modes", default="bm25,vector,vector2,hybrid")
    parser.add_argument("--limit", type=int, default=None, help="first N queries only")
    args = parser.parse_args()
    shared = Path(args.shared)
    if not (shared / "eval").is_dir():
        sys.exit(f"no eval sets under {shared}/eval (pass --shared)")
    print(f"retrieval_bench {dt.date.today().isoformat()}, load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| set | model | mode | nDCG@10 | recall@10 | hit@5 | MRR@10 | embed ms p50 | ours ms p50 | ours ms p95 | "
          "USE skipped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        run_set(shared, name, args.model, args.modes.split(","), args.limit)


if __name__ == "__main__":
    main()
