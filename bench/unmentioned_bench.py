"""How often a question is told "no note mentions X" (rag_app.search.unmentioned), through the real search path.

bench/unmentioned/*.tsv hold `home key<TAB>question` rows written in a red-team pass (2026-12-05): plain.tsv, 60
questions naming things the notes do hold; variations.tsv, 136 of the same kind typed as people type (spellings,
accents, English inside Chinese, Title Case, capitals, emoji). Each question that fires is printed with the names
it gave, so a reader can tell a right firing (a name truly absent) from a wrong one.

usage: python bench/unmentioned_bench.py sv=HOME den=HOME sem=HOME [FILE.tsv ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag_app.config import load_settings  # noqa: E402
from rag_app.search.retrieve import SearchIndex, search  # noqa: E402

SETS = Path(__file__).parent / "unmentioned"


def main() -> None:
    homes = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
    files = [Path(arg) for arg in sys.argv[1:] if "=" not in arg] or sorted(SETS.glob("*.tsv"))
    indexes = {key: SearchIndex(load_settings(Path(home))) for key, home in homes.items()}
    for file in files:
        rows = [line.split("\t", 1) for line in file.read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
        asked = fired = 0
        for key, question in rows:
            if key not in indexes:
                continue
            asked += 1
            absent = search(indexes[key], question.replace("\\n", "\n"), k=10).coverage.get("unmentioned")
            if absent:
                fired += 1
                print(f"  [{key}] {question!r} → {absent}")
        print(f"{file.stem}: {fired} of {asked} questions told a name is unmentioned", flush=True)
    for index in indexes.values():
        index.close()


if __name__ == "__main__":
    main()
