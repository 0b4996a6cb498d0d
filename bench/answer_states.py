"""What the user is told, measured through the real search path: nDCG@10, how often a right top hit is labelled
strong / strong-or-related, how often a question whose right note is in the top 3 is told "not in your notes"
(`answer_state` not_found) or "not sure", and for questions the notes cannot answer, per kind (another set's
questions, nonsense, same-domain questions about absent subjects): strong, strong-or-related, not_found, unsure.

Question sets: a dev set of ../shared/eval (its own questions; other sets' questions and nonsense as unanswerable:
bench/relevance_fit.py) plus, where given, a topical file (bench/topical/*.tsv: `question<TAB>note path`, an empty
path for a same-domain question the notes do not answer); or a topical file alone over a vault's home.

A SET+topical.tsv spec also prints a row for each kind of answerable question alone (the set's, the topical
file's). With --as-agent every search is an agent's (the agent tools' filter: private notes left out).

usage: python bench/answer_states.py [--shared ../shared] [--configs default,fast] [--no-topics] [--as-agent]
                                     SET[+topical.tsv] ... | HOME=topical.tsv ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise, ready_home, synced_home  # noqa: E402
from metrics import ndcg_at  # noqa: E402
from relevance_fit import OUT, configuration, home_model, question_set  # noqa: E402

from rag_app.config import load_settings  # noqa: E402
from rag_app.search import relevance  # noqa: E402
from rag_app.search.query import SearchFilters  # noqa: E402
from rag_app.search.retrieve import SearchIndex, search  # noqa: E402

TOPICAL = Path(__file__).parent / "topical"


def topical_questions(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        text, _, note = line.partition("\t")
        if text.strip():
            rows.append({"qid": f"{path.stem}:{n}", "text": text.strip(), "answerable": bool(note.strip()),
                         "origin": "same-domain" if not note.strip() else path.stem,
                         "qrels": {note.strip(): 1} if note.strip() else {}})
    return rows


AGENT = SearchFilters(exclude_private=True)  # what the agent tools and MCP search with (engine.Brain._retriever)


def run(index: SearchIndex, questions: list[dict], doc_of, mode: str,
        filters: SearchFilters | None = None) -> list[dict]:
    out = []
    for q in questions:
        response = search(index, q["text"], k=10, mode=mode, filters=filters)
        out.append({**q, "state": response.answer_state, "ms": response.timing["total_ms"],
                    "linked": any(r.get("linked_from") for r in response.results),
                    "results": [{"doc": doc_of(r), "relevance": r["relevance"], "topic": r.get("topic"),
                                 "second_opinion": r.get("second_opinion", 0.0)} for r in response.results]})
    return out


def table_row(label: str, rows: list[dict]) -> str:
    answerable = [q for q in rows if q["answerable"]]
    right = [q for q in answerable if q["results"] and q["results"][0]["doc"] in q["qrels"]]
    top3 = [q for q in answerable if any(r["doc"] in q["qrels"] for r in q["results"][:3])]

    def share(items: list[dict], test) -> str:
        return f"{sum(map(test, items)) / len(items):.1%}" if items else "—"

    cells = [label, f"{len(answerable)}",
             f"{statistics.mean(ndcg_at([r['doc'] for r in q['results']], q['qrels']) for q in answerable):.3f}"
             if answerable else "—",
             f"{len(right)}/{len(answerable)}",
             share(right, lambda q: q["results"][0]["relevance"] >= relevance.STRONG),
             share(right, lambda q: q["results"][0]["relevance"] >= relevance.RELATED),
             share(top3, lambda q: q["state"] == "not_found"),
             share(top3, lambda q: q["state"] == "unsure")]
    unanswerable = {}
    for q in rows:
        if not q["answerable"]:
            unanswerable.setdefault(q["origin"], []).append(q)
    parts = []
    for origin, items in sorted(unanswerable.items()):
        parts.append(f"{origin} ({len(items)}): " + " / ".join((
            share(items, lambda q: any(r["relevance"] >= relevance.STRONG for r in q["results"])),
            share(items, lambda q: q["state"] == "found"),
            share(items, lambda q: q["state"] == "not_found"),
            share(items, lambda q: q["state"] == "unsure"))))
    cells.append("; ".join(parts))
    cells.append(f"{statistics.median(q['ms'] for q in rows):.0f}")
    return "| " + " | ".join(cells) + " |"


def linked_line(label: str, rows: list[dict]) -> str:
    """How many questions a found note's sentence sent on to a linked note (rag_app.search.pointers)."""
    return f"  {label}: {sum(q['linked'] for q in rows)} of {len(rows)} questions"


def lead_sweep(label: str, rows: list[dict], leads=(0.01, 0.02, 0.03, 0.05, 0.1)) -> str:
    """The same rows' answer states had LEAD been another value: not_found with a right top 3 / unanswerable
    not_found per kind (the trade the cut makes)."""
    answerable = [q for q in rows if q["answerable"]]
    top3 = [q for q in answerable if any(r["doc"] in q["qrels"] for r in q["results"][:3])]
    kinds = sorted({q["origin"] for q in rows if not q["answerable"]})
    parts = []
    for lead in leads:
        with mock.patch.object(relevance, "LEAD", lead):
            def nf(q: dict) -> bool:
                return relevance.answer_state(q["results"]) == "not_found"
            cells = [f"{sum(map(nf, top3)) / (len(top3) or 1):.0%}"] + [
                f"{sum(map(nf, items)) / len(items):.0%}"
                for items in ([q for q in rows if not q["answerable"] and q["origin"] == k] for k in kinds)]
        parts.append(f"LEAD {lead}: " + " / ".join(cells))
    return f"  {label} (not_found: right top 3 / {' / '.join(kinds)}): " + "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--configs", default="default,fast")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--no-topics", action="store_true", help="measure without the topic step (the baseline)")
    parser.add_argument("--dump", help="also write every question's results to this JSON file (for cut-point work)")
    parser.add_argument("--as-agent", action="store_true", help="search as the agent tools do (private notes out)")
    args = parser.parse_args()
    shared = Path(args.shared)
    filters = AGENT if args.as_agent else None
    for spec in args.specs:
        if "=" in spec:
            synced_home(spec.partition("=")[0])
    if args.no_topics:
        mock.patch("rag_app.search.retrieve.SearchIndex.topic_similarity", lambda *a, **k: {}).start()
    print("| set / configuration | answerable | nDCG@10 | right top hit | right top strong | right top strong or "
          "related | not_found with a right top 3 | unsure with a right top 3 | unanswerable by kind: any strong / "
          "found / not_found / unsure | ms p50 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    sweeps: list[str] = []
    linked: list[str] = []
    dumped: dict[str, list[dict]] = {}
    for spec in args.specs:
        if "=" in spec:  # a vault's home and its topical file
            home, _, file = spec.partition("=")
            settings = load_settings(Path(home))  # checked by synced_home above
            questions = topical_questions(Path(file))
            for config in args.configs.split(","):
                config_settings, mode = configuration(settings, config)
                index = SearchIndex(config_settings)
                rows = run(index, questions, lambda r: r.get("path") or r["note_id"], mode, filters)
                dumped[f"{Path(file).stem} / {config}"] = rows
                print(table_row(f"{Path(file).stem} / {config}", rows), flush=True)
                sweeps.append(lead_sweep(f"{Path(file).stem} / {config}", rows))
                linked.append(linked_line(f"{Path(file).stem} / {config}", rows))
                index.close()
            continue
        name, _, extra = spec.partition("+")
        eval_set = materialise(shared, load_set(shared, name), OUT)
        questions = question_set(shared, name, args.limit) + (topical_questions(TOPICAL / extra) if extra else [])
        for config in args.configs.split(","):
            model = home_model(eval_set.home_name, config)
            if config == "fast" and not (OUT / "homes" / f"{eval_set.home_name}-{model}" / "index.sqlite").exists():
                model = "use-m3"
            home = ready_home(OUT, eval_set, model)
            config_settings, mode = configuration(load_settings(home), config)
            index = SearchIndex(config_settings)
            docs = eval_set.path_to_doc
            rows = run(index, questions, lambda r, docs=docs: docs.get(r.get("path"), r.get("path")), mode, filters)
            dumped[f"{name} / {config}"] = rows
            print(table_row(f"{name} / {config}", rows), flush=True)
            kinds = list(dict.fromkeys(q["origin"] for q in rows if q["answerable"]))
            for kind in kinds if len(kinds) > 1 else ():
                print(table_row(f"{name} / {config} / {kind} only",
                                [q for q in rows if q["answerable"] and q["origin"] == kind]), flush=True)
            sweeps.append(lead_sweep(f"{name} / {config}", rows))
            linked.append(linked_line(f"{name} / {config}", rows))
            index.close()
    print("\n".join(["", "LEAD sweep:"] + sweeps))
    print("\n".join(["", "A found note's sentence sent the search on to a linked note:"] + linked))
    if args.dump:
        Path(args.dump).write_text(json.dumps(dumped, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
