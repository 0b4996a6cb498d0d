"""The link graph of a home as the note view reads it, and what it costs: links, broken links and orphans
(rag_app.search.graph), the time to read every note's metadata into the link resolver (what a search that follows a
link pays once per index generation, rag_app.search.pointers) and the time to build the graph from it (Dendron's
`[[label|note]]` links read again from their notes' text).

usage: python bench/link_graph_bench.py HOME [HOME ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag_app.engine import Brain  # noqa: E402


def main() -> None:
    print("| home | notes | links | broken links | orphans | resolver (s) | graph (s) |")
    print("|---|---|---|---|---|---|---|")
    for home in sys.argv[1:]:
        brain = Brain(Path(home))
        index = brain.searcher()
        started = time.perf_counter()
        index.link_resolver()
        resolved = time.perf_counter()
        stats = brain.graph().stats()
        built = time.perf_counter()
        print(f"| {Path(home).name} | {stats['notes']} | {stats['links']} | {stats['broken_links']} | "
              f"{stats['orphans']} | {resolved - started:.2f} | {built - resolved:.2f} |", flush=True)
        brain.close()


if __name__ == "__main__":
    main()
