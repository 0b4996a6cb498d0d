"""Chinese questions for "every note of a kind", asked of cmrc2018_trial's 1,104 Wikipedia passages as a vault.

semantic_dev's category questions are English; this set asks the same kind of question in a person's Chinese words
(会飞的动物有哪些, 坐火车能到的地方) of Chinese notes. A passage is relevant when it is of that kind by a rule
over its title and first sentence (Wikipedia's "X是…科…属的鸟类"), written 2026-12-05 and read over: every match
listed by `--list` is of the kind (one broad one stays: 内蒙古植物志 is a flora, not a plant; chemistry's concepts, a
school's alumni lists and a hospital are left out by the rules). The rules read the
corpus at run time from ../shared (its licence keeps it out of the repository).

Prints nDCG@10 through the real search path with the dense feedback off and on (`[retrieval] feedback_weight`).

usage: python bench/category_bench.py [--shared ../shared] [--list]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise, ready_home  # noqa: E402
from metrics import summarise  # noqa: E402

from rag_app.config import load_settings  # noqa: E402
from rag_app.search.retrieve import NoteFusionRetriever, SearchIndex  # noqa: E402

OUT = Path(__file__).parent / "out"
Rule = Callable[[str, str], bool]  # (title, text) → of the kind
KINDS: dict[str, Rule] = {
    "bird": lambda title, text: bool(re.search(r"鸭|鸡|雉|鹫|鸦|鹰|鹤|鸥|鹦鹉$|鸟$", title)) and "鸟" in text[:200]
    and "龙" not in title,
    "fish": lambda title, text: bool(re.search(r"鱼类|鱼科|鲈形目|鲤形目|鱼纲", text[:150])),
    "plant": lambda title, text: "植物" in text[:100] and bool(re.search(r"科|属", text[:150])),
    "station": lambda title, text: title.endswith("站") and "车站" in text[:150],
    "chemical": lambda title, text: bool(re.search(r"化合物|分子式|化学式", text[:200]))
    and not re.search(r"序列|规律|势$", title),
    "dinosaur": lambda title, text: "恐龙" in text[:200],
    "school": lambda title, text: bool(re.search(r"大学|学院|中学|书院", title))
    and not re.search(r"列表|事件|医院", title),
}
QUESTIONS = {
    "会飞的动物有哪些": "bird", "我记过哪些鸟": "bird", "海里的鱼": "fish", "水里游的动物": "fish",
    "花花草草": "plant", "草药和植物": "plant", "坐火车能到的地方": "station", "地铁站的资料": "station",
    "化学品": "chemical", "有毒的化学物质": "chemical", "古生物化石": "dinosaur", "史前爬行动物": "dinosaur",
    "上学的地方": "school", "学校": "school",
}


def relevant(shared: Path) -> dict[str, dict[str, int]]:
    """Per kind, the passages of it (their paths in the home)."""
    out: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
    with (shared / "eval" / "cmrc2018_trial" / "corpus.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            doc = json.loads(line)
            for kind, rule in KINDS.items():
                if rule(doc.get("title") or "", doc.get("text") or ""):
                    out[kind][f"{doc['_id']}.md"] = 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--list", action="store_true", help="print each kind's passages")
    args = parser.parse_args()
    shared = Path(args.shared)
    qrels = relevant(shared)
    if args.list:
        for kind, paths in qrels.items():
            print(kind, len(paths), " ".join(sorted(paths)))
    home = ready_home(OUT, materialise(shared, load_set(shared, "cmrc2018_trial"), OUT), "e5-small")
    print(f"{len(QUESTIONS)} questions, relevant passages per kind: "
          + ", ".join(f"{kind} {len(paths)}" for kind, paths in qrels.items()))
    for label, weight in (("feedback off", 0.0), ("feedback on", None)):
        settings = load_settings(home)
        if weight is not None:
            settings.retrieval = {**settings.retrieval, "feedback_weight": weight}
        index = SearchIndex(settings)
        runs = []
        for question, kind in QUESTIONS.items():
            found = NoteFusionRetriever(index, k=10).search(question)
            runs.append(([r["path"] for r in found.results], qrels[kind]))
        index.close()
        each = " ".join(f"{summarise([run])['ndcg@10']:.2f}" for run in runs)
        print(f"{label}: nDCG@10 {summarise(runs)['ndcg@10']:.3f} (per question: {each})")


if __name__ == "__main__":
    main()
