"""Fit and measure the relevance model (rag_app/search/relevance.py) on an answerability set built from the dev sets.

Answerable: each set's own queries (up to --limit). Unanswerable: queries of two unrelated sets asked of this set's
corpus, plus nonsense strings. Every query runs through the real search path (`rag_app.search.retrieve.search`) in each
configuration — default (BM25 + e5 + USE-m3), fast (BM25 + USE-m3, the fast mode's weights), e5-only (BM25 + e5)
and bm25 — and the evidence behind each result is cached under bench/out/relevance. Then:

- a logistic model per channel set is fitted on the top 5 results of every query (sets weighted equally) and
  written to rag_app/search/relevance_model.json (`--write`);
- figures are reported from 2-fold cross-validation by query (each query scored by the model fitted on the other
  half), per set and configuration: the issue's goals, AUROC, ECE, nDCG@10 and the time relevance adds; the
  baseline row is the rule this replaced (strength relative to the best hit: every top hit "strong").

usage: python bench/relevance_fit.py [--shared ../shared] [--limit 300] [--configs default,fast,e5-only,bm25]
                                     [--write] SET[:config,config...]...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise, ready_home, unfilled_channels  # noqa: E402
from metrics import ndcg_at  # noqa: E402

from rag_app.config import FAST_EMBEDDING, load_settings  # noqa: E402
from rag_app.search import relevance  # noqa: E402

OUT = Path(__file__).parent / "out"
FOREIGN = {  # whose queries are asked of this corpus as unanswerable (unrelated domains, both languages)
    "locomo_dev": ("rgb_zh_dev", "scifact_train"),
    "drcd_dev": ("locomo_dev", "rgb_zh_dev"),
    "rgb_zh_dev": ("drcd_dev", "locomo_dev"),
    "semantic_dev": ("locomo_dev", "rgb_zh_dev"),
    "cmrc2018_trial": ("locomo_dev", "rgb_zh_dev"),
}
FOREIGN_PER_SET = 100
NONSENSE = 40
TOP_FIT = 5
UNSEEN = ("minilm",)  # measured, never fitted on: how the model does with an embedding model it has not seen
VARIANTS = "+variants"  # a configuration with the Skill's agent variants (bench/agent_variants/): measured, not fitted
AGENT_VARIANTS = Path(__file__).parent / "agent_variants"
MAIN_CONFIGS = ("default", "fast", "e5-only", "bm25")  # what the cut-points are chosen on (vector-only is a debug mode)
L2 = 1.0


def nonsense(n: int, seed: int) -> list[str]:
    """Strings no notes answer: letter runs, random Han characters, word salad."""
    rng = random.Random(seed)
    han = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下"
           "过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都"
           "两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重"
           "新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月")
    words = ("purple", "engine", "velvet", "orbit", "pickle", "glacier", "tundra", "harp", "zinc", "marmalade",
             "quasar", "otter", "lantern", "basalt", "kazoo", "nebula", "walrus", "fjord", "cobalt", "meringue")
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(8, 16))))
        elif kind == 1:
            out.append("".join(rng.choice(han) for _ in range(rng.randint(4, 9))))
        else:
            out.append(" ".join(rng.sample(words, rng.randint(2, 4))))
    return out


def agent_variants(name: str) -> dict[str, list[str]]:
    """The variants an agent following the Skill wrote for a set's questions ({} when none were written)."""
    path = AGENT_VARIANTS / f"{name}.jsonl"
    if not path.exists():
        return {}
    return {row["id"]: row["variants"] for row in map(json.loads, path.open(encoding="utf-8"))}


def question_set(shared: Path, name: str, limit: int, with_variants: bool = False) -> list[dict]:
    """[{qid, text, answerable, origin, qrels, variants}]: this set's queries, then the unanswerable ones. With
    variants: only questions an agent wrote variants for (own and foreign sets; any set with a variants file is
    foreign to this one), each with its variants; nonsense strings keep none."""
    own = load_set(shared, name)
    own_variants = agent_variants(name) if with_variants else {}
    rows = [{"qid": q, "text": t, "answerable": True, "origin": name, "qrels": own.qrels[q],
             "variants": own_variants.get(q, [])}
            for q, t in list(own.queries.items())[:limit] if not with_variants or q in own_variants]
    others = (sorted(p.stem for p in AGENT_VARIANTS.glob("*.jsonl") if p.stem != name) if with_variants
              else FOREIGN[name])
    for other in others:
        foreign = load_set(shared, other)
        written = agent_variants(other) if with_variants else {}
        pool = sorted(written if with_variants else foreign.queries)
        picked = random.Random(other).sample(pool, min(FOREIGN_PER_SET, len(pool)))
        rows += [{"qid": f"{other}:{q}", "text": foreign.queries[q], "answerable": False, "origin": other,
                  "qrels": {}, "variants": written.get(q, [])} for q in picked]
    rows += [{"qid": f"nonsense:{i}", "text": t, "answerable": False, "origin": "nonsense", "qrels": {},
              "variants": []} for i, t in enumerate(nonsense(NONSENSE, seed=len(name)))]
    return rows


def configuration(settings, config: str):
    """(settings, mode) of a configuration, over the same home."""
    if config == "fast":  # on a default home, its USE-m3 collection alone is a fast home
        return replace(settings, embedding_model=FAST_EMBEDDING, second_model=""), "hybrid"
    if config == "e5-only":
        return replace(settings, second_model=""), "hybrid"
    if config == "bm25":
        return settings, "bm25"
    if config == "vector":  # `brain search --mode vector`: e5 alone
        return settings, "vector"
    if config == "fast-vector":  # the same on a fast home: USE-m3 alone
        return replace(settings, embedding_model=FAST_EMBEDDING, second_model=""), "vector"
    return settings, "hybrid"


def home_model(name: str, config: str) -> str:
    """The home a configuration runs on: the default one (e5-small + USE-m3), or for fast and bm25 a USE-m3-only home
    when the set has no default home or its e5 vectors are still filling (its vectors and chunks are the same; e5 at
    ~10 chunks/s is the slow part).
    `minilm`: a home embedded with a model the relevance model never saw in fitting, standing for a remote or
    HuggingFace model (all-MiniLM-L6-v2, English; bench/out/homes/SET-minilm, made by hand with `hf:<dir>`)."""
    if config == "minilm":
        return "minilm"
    default = OUT / "homes" / f"{name}-e5-small"
    if config in ("fast", "bm25", "fast-vector") and (not (default / "index.sqlite").exists()
                                                      or unfilled_channels(default)):
        return FAST_EMBEDDING
    return "e5-small"


def collect(shared: Path, name: str, config: str, limit: int) -> list[dict]:
    """Run every question of the set through the real search path once; cached (delete the file to re-run)."""
    path = OUT / "relevance" / f"{name}-{config}-{limit}.json"
    if path.exists():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if not stale(cached):
            return cached
    from rag_app.search.retrieve import SearchIndex, search

    eval_set = materialise(shared, load_set(shared, name), OUT)
    base = config.removesuffix(VARIANTS)
    home = ready_home(OUT, eval_set, home_model(eval_set.home_name, base))
    settings, mode = configuration(load_settings(home), base)
    index = SearchIndex(settings)
    rows = []
    for n, question in enumerate(question_set(shared, name, limit, with_variants=config.endswith(VARIANTS))):
        response = search(index, question["text"], k=10, mode=mode, variants=question["variants"][:11] or None)
        rows.append({**question, "relevance_ms": response.timing["relevance_ms"], "ours_ms": response.timing["ours_ms"],
                     "results": [{"doc": eval_set.path_to_doc.get(r["path"], r["path"]), "score": r["score"],
                                  "evidence": response.evidence[r["note_id"]]} for r in response.results]})
        if n % 100 == 0:
            print(f"  {name} {config}: {n} questions", file=sys.stderr, flush=True)
    index.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    return rows


def stale(questions: list[dict]) -> bool:
    """A cache written before a lexical feature the model reads existed (it is re-run)."""
    lexical = set(relevance.FEATURES) - {"e5", "e5_gap", "use", "use_gap", relevance.AGREE}
    for question in questions:
        for result in question["results"]:
            for _, features in result["evidence"]:
                if "lexical" in features:
                    return not lexical <= set(features)
    return False


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = L2) -> np.ndarray:
    """Weighted L2-regularised logistic regression by Newton's method (column 0 is the bias, not penalised)."""
    beta = np.zeros(x.shape[1])
    penalty = np.full(x.shape[1], l2)
    penalty[0] = 0.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-np.clip(x @ beta, -40, 40)))
        gradient = x.T @ (w * (p - y)) + penalty * beta
        hessian = (x * (w * p * (1 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta


def training_rows(runs: dict[tuple[str, str], list[dict]], keep) -> dict[str, list[tuple[dict, int, float]]]:
    """Per model key: (features, label, weight) of the top results of the kept questions; each set and configuration
    weighs 1 (the unseen model's runs are left out)."""
    by_key: dict[str, list[tuple[dict, int, float]]] = {}
    for (_, config), questions in runs.items():
        if config in UNSEEN or config.endswith(VARIANTS):
            continue
        picked = [q for q in questions if keep(q)]
        rows = [(r, q) for q in picked for r in q["results"][:TOP_FIT]]
        for r, q in rows:
            for key, features in r["evidence"]:
                if not key:  # a run no channel gave evidence in
                    continue
                kept = {f: v for f, v in features.items() if f in relevance.FEATURES}
                by_key.setdefault(key, []).append((kept, int(r["doc"] in q["qrels"]), 1.0 / len(rows)))
    return by_key


def fit(runs: dict[tuple[str, str], list[dict]], keep=lambda q: True) -> dict[str, dict[str, float]]:
    models = {}
    for key, rows in training_rows(runs, keep).items():
        names = sorted({f for features, _, _ in rows for f in features})
        x = np.asarray([[1.0] + [features.get(f, 0.0) for f in names] for features, _, _ in rows])
        y = np.asarray([label for _, label, _ in rows], dtype=float)
        w = np.asarray([weight for _, _, weight in rows])
        if y.min() == y.max():
            continue
        beta = fit_logistic(x, y, w * len(rows) / w.sum())
        models[key] = {"bias": round(float(beta[0]), 4)} | {f: round(float(b), 4) for f, b in zip(names, beta[1:],
                                                                                                     strict=True)}
    return models


def score(question: dict, models: dict[str, dict[str, float]]) -> list[float]:
    """Each result's relevance under `models`, combined over the query runs as the product does."""
    return [relevance.combined([relevance.probability(k, f, models) for k, f in r["evidence"]])
            for r in question["results"]]


def fold(question: dict) -> int:
    return hashlib.sha256(question["qid"].encode()).digest()[0] % 2


def auroc(positive: list[float], negative: list[float]) -> float:
    if not positive or not negative:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def ece(pairs: list[tuple[float, int]], bins: int = 10) -> float:
    total = len(pairs) or 1
    error = 0.0
    for b in range(bins):
        inside = [(p, y) for p, y in pairs if b / bins <= p < (b + 1) / bins or (b == bins - 1 and p == 1.0)]
        if inside:
            error += len(inside) / total * abs(statistics.mean(p for p, _ in inside) - statistics.mean(y for _, y in
                                                                                                        inside))
    return error


def shares(questions: list[dict], rel: dict[str, list[float]] | None, strong: float = relevance.STRONG,
           related: float = relevance.RELATED) -> dict[str, float]:
    """The issue's four shares for one set and configuration; `rel=None` scores the rule this replaced (strength
    relative to the best hit of the call)."""
    def labels(q: dict) -> list[str]:
        if rel is None:
            best = q["results"][0]["score"] if q["results"] else 0.0
            return ["strong" if r["score"] >= 0.8 * best else "related" if r["score"] >= 0.5 * best else "weak"
                    for r in q["results"]]
        return ["strong" if p >= strong else "related" if p >= related else "weak" for p in rel[q["qid"]]]

    def nf(q: dict) -> bool:
        return all(label == "weak" for label in labels(q))

    answerable = [q for q in questions if q["answerable"]]
    unanswerable = [q for q in questions if not q["answerable"]]
    right = [q for q in answerable if q["results"] and q["results"][0]["doc"] in q["qrels"]]
    in_top3 = [q for q in answerable if any(r["doc"] in q["qrels"] for r in q["results"][:3])]
    return {"u_strong": sum("strong" in labels(q) for q in unanswerable) / len(unanswerable),
            "u_nf": sum(nf(q) for q in unanswerable) / len(unanswerable),
            "a_strong": sum(labels(q)[0] == "strong" for q in right) / (len(right) or 1),
            "a_nf": sum(nf(q) for q in in_top3) / (len(in_top3) or 1)}


def misses(name: str, got: dict[str, float]) -> int:
    """How many of the issue's goals a row misses (paraphrase-only semantic_dev: strong ≥ 70 %, else 85 %)."""
    return ((got["u_strong"] > 0.05) + (got["u_nf"] < 0.90) + (got["a_nf"] > 0.05)
            + (got["a_strong"] < (0.70 if name == "semantic_dev" else 0.85)))


def sweep(runs: dict[tuple[str, str], list[dict]], rels: dict[tuple[str, str], dict[str, list[float]]]) -> None:
    """Cut-point pairs ranked by goals missed over every set and configuration (the shipped pair is chosen here)."""
    main = [key for key in runs if key[1] in MAIN_CONFIGS]
    rows = []
    for strong in np.arange(0.05, 0.91, 0.05):
        for related in np.arange(0.02, strong + 1e-9, 0.02):
            missed = sum(misses(name, shares(runs[(name, config)], rels[(name, config)], strong, related))
                         for name, config in main)
            rows.append((missed, -strong, round(float(strong), 2), round(float(related), 2)))
    print(f"\ncut-points (strong, related) by goals missed over {len(main)} rows ({', '.join(MAIN_CONFIGS)}):",
          ", ".join(f"({s}, {r}): {m}" for m, _, s, r in sorted(rows)[:8]))


def feasible(runs: dict[tuple[str, str], list[dict]], rels: dict[tuple[str, str], dict[str, list[float]]]) -> None:
    """Per main row, the strong cut-points for which some related cut-point meets all four of its goals: rows whose
    ranges do not overlap cannot all be met by one fixed pair, whatever the pair (the sweep's grid)."""
    grid = [(round(float(s), 2), round(float(r), 2)) for s in np.arange(0.05, 0.91, 0.05)
            for r in np.arange(0.02, s + 1e-9, 0.02)]
    print("\nstrong cut-points meeting each row's four goals (with some related cut-point):")
    for name, config in (key for key in runs if key[1] in MAIN_CONFIGS):
        met = sorted({s for s, r in grid if not misses(name, shares(runs[(name, config)], rels[(name, config)], s, r))})
        print(f"  {name} {config}: {f'{met[0]}-{met[-1]}' if met else 'none'}")


def report(name: str, config: str, questions: list[dict], rel: dict[str, list[float]] | None) -> str:
    answerable = [q for q in questions if q["answerable"]]
    unanswerable = [q for q in questions if not q["answerable"]]
    got = shares(questions, rel)

    def top(q: dict) -> float:
        if not q["results"]:
            return 0.0
        return q["results"][0]["score"] if rel is None else rel[q["qid"]][0]

    right = [q for q in answerable if q["results"] and q["results"][0]["doc"] in q["qrels"]]
    roc = auroc([top(q) for q in right], [top(q) for q in unanswerable])
    calibration = float("nan") if rel is None else ece(
        [(top(q), int(q["results"][0]["doc"] in q["qrels"])) for q in questions if q["results"]])
    fused = statistics.mean(ndcg_at([r["doc"] for r in q["results"]], q["qrels"]) for q in answerable)
    reranked = float("nan") if rel is None else statistics.mean(
        ndcg_at([r["doc"] for _, r in sorted(zip(rel[q["qid"]], q["results"], strict=True), key=lambda p: -p[0])],
                q["qrels"]) for q in answerable)
    ms = statistics.median(q["relevance_ms"] for q in questions)
    who = "baseline (relative)" if rel is None else config
    return (f"| {name} | {who} | {len(answerable)}/{len(unanswerable)} | {got['u_strong']:.1%} | {got['u_nf']:.1%} | "
            f"{got['a_strong']:.1%} | {got['a_nf']:.1%} | {roc:.3f} | {calibration:.3f} | {fused:.3f} | "
            f"{reranked:.3f} | {'' if rel is None else f'{ms:.1f}'} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--limit", type=int, default=300, help="answerable queries per set")
    parser.add_argument("--configs", default="default,fast,e5-only,bm25")
    parser.add_argument("--write", action="store_true", help="write the model fitted on everything")
    args = parser.parse_args()
    shared = Path(args.shared)
    if not (shared / "eval").is_dir():
        sys.exit(f"no eval sets under {shared}/eval (pass --shared)")
    configs = args.configs.split(",")
    runs = {}
    for spec in args.sets:  # SET or SET:fast,bm25 (a set measured in some configurations only)
        name, _, only = spec.partition(":")
        for config in only.split(",") if only else configs:
            runs[(name, config)] = collect(shared, name, config, args.limit)
    held_out = {half: fit(runs, keep=lambda q, h=half: fold(q) != h) for half in (0, 1)}
    print("| set | configuration | questions (answerable/not) | unanswerable with a strong hit (≤ 5 %) | "
          "unanswerable not_found (≥ 90 %) | right top hit labelled strong (≥ 85 %) | not_found with a relevant "
          "top 3 (≤ 5 %) | AUROC top hit | ECE top hit | nDCG@10 | nDCG@10 by relevance | relevance ms p50 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rels = {}
    for (name, config), questions in runs.items():
        rels[(name, config)] = {q["qid"]: score(q, held_out[fold(q)]) for q in questions}
        if config == next(c for n, c in runs if n == name):
            print(report(name, config, questions, None))
        print(report(name, config, questions, rels[(name, config)]), flush=True)
    sweep(runs, rels)
    feasible(runs, rels)
    if args.write:
        models = fit(runs)
        relevance.MODEL_FILE.write_text(json.dumps({
            "about": f"fitted by bench/relevance_fit.py on {', '.join(args.sets)} (configs: {', '.join(configs)} "
                     "unless named); features: rag_app/search/relevance_features.py note_evidence",
            "models": models}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {relevance.MODEL_FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
