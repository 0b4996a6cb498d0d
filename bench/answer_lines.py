"""Does an answer without an LLM show the line that answers? Measured through `Brain.ask`: an extractive answer's
passages, and a "not sure" answer's possible matches' passages (counted in their own parenthesis).

Each pair of bench/answer_lines/*.tsv (`question<TAB>note path<TAB>a piece of the answering line`, then optionally
pieces of other lines of the note that answer it too, found on review) is asked of a home holding that vault; the
answer's passages (markdown emphasis removed, blanks collapsed) either show the line, show the right note without
it, or do not show the right note at all (the search's miss, counted apart). A pair whose passage shows one of its
other answering lines instead is counted in its own column ("another answering line"), not as shown.

usage: python bench/answer_lines.py HOME=bench/answer_lines/sample_vault.tsv [HOME=FILE ...] [--misses] [--timing]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_sets import synced_home  # noqa: E402

from rag_app.engine import Brain  # noqa: E402


def pairs(path: Path) -> list[tuple[str, str, str, list[str]]]:
    """(question, note, answering line, other lines that answer it too) per row."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            question, note, answer, *others = line.split("\t")
            rows.append((question.strip(), note.strip(), answer.strip(), [o.strip() for o in others if o.strip()]))
    return rows


def plain(markdown: str) -> str:
    return " ".join(re.sub(r"\*\*|__", "", markdown).split())


def passage_of(answer: str, n: int) -> str:
    """The passage printed under source [n] in an extractive answer (up to the next source's heading)."""
    parts = re.split(r"^(\*\*.*)\[(\d+)\]\s*$", answer, flags=re.MULTILINE)
    for k in range(1, len(parts) - 2, 3):
        if parts[k + 1] == str(n):
            return parts[k] + "\n" + parts[k + 2]  # the section shown above the passage counts as shown
    return ""


def measure(home: Path, file: Path, show_misses: bool,
            times: list[float] | None = None) -> tuple[int, int, int, int, int, int]:
    """The pairs' counts; with `times`, each warm `ask`'s milliseconds appended (the models loaded by one ask
    before)."""
    brain = Brain(home)
    shown = note_only = another = shown_unsure = note_unsure = 0
    rows = pairs(file)
    if times is not None and rows:
        brain.ask(rows[0][0])
    for question, note, answer, others in rows:
        started = time.perf_counter()
        response = brain.ask(question)
        if times is not None:
            times.append((time.perf_counter() - started) * 1000)
        cited = [c["n"] for c in response.citations  # a home may hold the vault one folder up (vault/…)
                 if (c.get("path") or "") == note or (c.get("path") or "").endswith("/" + note)]
        quoted = response.mode in ("extractive", "unsure")
        text = plain(passage_of(response.answer, cited[0])) if cited and quoted else ""
        unsure = bool(text) and response.mode == "unsure"
        if text and " ".join(answer.split()) in text:
            shown += 1
            shown_unsure += unsure
            continue
        note_only += bool(text)
        note_unsure += unsure
        another += any(" ".join(o.split()) in text for o in others)
        if show_misses:
            where = f"note shown, line not ({response.mode})" if text else f"note not shown ({response.mode})"
            print(f"  miss [{where}] {question} → {answer}\n    {text[:160]}")
    brain.close()
    return len(rows), shown, note_only, another, shown_unsure, note_unsure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="+", help="HOME=pairs.tsv")
    parser.add_argument("--misses", action="store_true", help="print each pair whose line is not shown")
    parser.add_argument("--timing", action="store_true", help="print each set's warm ask p50 / p90 in ms")
    args = parser.parse_args()
    for name in [k for k in os.environ if k.startswith("LLM_")]:
        del os.environ[name]  # extractive answers are what is measured
    specs = [(synced_home(home), Path(file)) for home, _, file in (s.partition("=") for s in args.specs)]
    totals = [0, 0, 0, 0, 0, 0]
    print("| pairs | asked | line shown (of which in a not-sure answer) | right note shown without the line (of which "
          "another answering line; in a not-sure answer) | line shown of the notes shown | right note not shown |")
    print("|---|---|---|---|---|---|")
    for home, file in specs:
        times: list[float] | None = [] if args.timing else None
        counts = measure(home, file, args.misses, times)
        totals = [t + v for t, v in zip(totals, counts, strict=True)]
        print(_row(file.stem, *counts), flush=True)
        if times:
            times.sort()
            print(f"  ask ms p50 / p90: {statistics.median(times):.0f} / {times[int(len(times) * 0.9)]:.0f}")
    print(_row("all", *totals))


def _row(name: str, asked: int, shown: int, note_only: int, another: int, shown_unsure: int,
         note_unsure: int) -> str:
    return (f"| {name} | {asked} | {shown} ({shown_unsure}) | {note_only} ({another}; {note_unsure}) | "
            f"{shown} of {shown + note_only} ({shown / max(shown + note_only, 1):.0%}) | {asked - shown - note_only} |")

if __name__ == "__main__":
    main()
