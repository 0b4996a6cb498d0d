"""Agent-mode benchmark: the Skill's flow through the real tools, against the bare question.

For each question of a dev set, `bench/agent_variants/<set>.jsonl` holds the variants an agent following the Skill
would write without seeing the notes (lines {"id", "variants"}). Two runs per question, both through BrainTools
(the code behind MCP and the FunctionTools):

- bare: search_notes(query=question, k=10);
- agent: search_notes(query=question, queries=variants, k=10), then get_note for the strong hits, at most 3.

Reported: nDCG@10, recall@10 and what the agent read per question: characters of every tool reply, and tokens
estimated as characters ÷ 1.5 for Chinese and ÷ 4 for other text (no tokenizer ships offline here).

usage: python bench/agent_mode.py [--shared ../shared] [--model use-m3] SET...   (prepare_eval.py first)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import load_set, materialise, ready_home  # noqa: E402
from metrics import summarise  # noqa: E402

from rag_app.engine import Brain  # noqa: E402
from readers.markdown_syntax import HAN  # noqa: E402
from tools.function_tools import BrainTools  # noqa: E402

OUT = Path(__file__).parent / "out"
VARIANTS = Path(__file__).parent / "agent_variants"
K = 10
READS = 3  # the Skill: get_note for the few strong hits


def tokens(text: str) -> float:
    """An estimate without a tokenizer: Chinese characters ÷ 1.5, the rest ÷ 4."""
    han = len(HAN.findall(text))
    return han / 1.5 + (len(text) - han) / 4


def search(tools: BrainTools, arguments: dict) -> tuple[list[dict], str]:
    reply = tools.call("search_notes", arguments)
    if reply.is_error:
        raise SystemExit(f"search_notes refused {arguments}: {reply.text}")
    return json.loads(reply.text)["results"], reply.text


def run_set(shared: Path, name: str, model: str) -> list[str]:
    eval_set = materialise(shared, load_set(shared, name), OUT)
    variants = {row["id"]: row["variants"] for row in map(json.loads, (VARIANTS / f"{name}.jsonl").open())}
    tools = BrainTools(Brain(ready_home(OUT, eval_set, model)))
    bare_runs, agent_runs, spent_chars, spent_tokens = [], [], [], []

    def ranked(results: list[dict]) -> list[str]:
        return [eval_set.path_to_doc.get(r.get("path", ""), r.get("path", "")) for r in results]

    for query_id, question in eval_set.queries.items():
        relevant = eval_set.qrels[query_id]
        bare, _ = search(tools, {"query": question, "k": K})
        bare_runs.append((ranked(bare), relevant))
        found, text = search(tools, {"query": question, "queries": variants[query_id][:12], "k": K})
        agent_runs.append((ranked(found), relevant))
        read = [tools.call("get_note", {"note_id": r["note_id"]}).text
                for r in found if r["strength"] == "strong"][:READS]
        spent = text + "".join(read)
        spent_chars.append(len(spent))
        spent_tokens.append(tokens(spent))
    lines = []
    for mode, runs in (("bare question", bare_runs), ("agent variants + reads", agent_runs)):
        m = summarise(runs)
        cost = (f"{statistics.mean(spent_chars):,.0f} | {statistics.mean(spent_tokens):,.0f} | "
                f"{max(spent_tokens):,.0f}") if mode.startswith("agent") else "— | — | —"
        lines.append(f"| {name} | {model} | {mode} | {m['ndcg@10']:.3f} | {m['recall@10']:.3f} | {cost} |")
        print(lines[-1], flush=True)
    tools.brain.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--model", default="use-m3")
    args = parser.parse_args()
    print("| set | model | run | nDCG@10 | recall@10 | chars/question | tokens/question (est.) | max tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        run_set(Path(args.shared), name, args.model)


if __name__ == "__main__":
    main()
