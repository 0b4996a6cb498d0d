"""Which notes a change to the chunker chunks differently: `chunk_markdown` of a git revision against the working tree,
over the dev sets' documents (../shared/eval), both real vaults (../shared/vaults) and the sample vault. Prints each
note whose chunks (text or heading path) differ, the count, and both chunkers' CPU time.

A chunker change that moves no dev-set chunk leaves every dev set's nDCG where it was; CHUNKER_VERSION decides
whether homes re-chunk every note (rag_app/ingest/chunking.py).

usage: python bench/chunk_compare.py [--rev main] [--shared ../shared]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_app.ingest import chunking  # noqa: E402
from readers.markdown_syntax import split_frontmatter  # noqa: E402

SETS = ("rgb_zh_dev", "locomo_dev", "cmrc2018_trial", "drcd_dev", "scifact_train")


def chunker_at(rev: str) -> object:
    """rag_app/ingest/chunking.py as it was at `rev`, imported under another name (with today's readers)."""
    source = subprocess.run(["git", "show", f"{rev}:rag_app/ingest/chunking.py"], capture_output=True, text=True,
                            cwd=REPO, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "chunking_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("chunking_before", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["chunking_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def notes(shared: Path) -> Iterator[tuple[str, str]]:
    for root in (shared / "vaults", REPO / "sample_vault"):
        for path in sorted(root.rglob("*.md")):
            yield str(path.relative_to(root.parent)), path.read_text(encoding="utf-8", errors="replace")
    for name in SETS:
        for line in (shared / "eval" / name / "corpus.jsonl").open(encoding="utf-8"):
            row = json.loads(line)
            yield f"{name}:{row['_id']}", str(row.get("text") or "") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rev", default="main")
    parser.add_argument("--shared", default=str(REPO.parent / "shared"))
    args = parser.parse_args()
    before = chunker_at(args.rev)
    count = differ = 0
    seconds = {"before": 0.0, "now": 0.0}
    print(f"chunk_compare {dt.date.today().isoformat()}: {args.rev} against the working tree")
    for name, text in notes(Path(args.shared)):
        body = split_frontmatter(text).body
        count += 1
        started = time.process_time()
        old = [(c.text, c.heading) for c in before.chunk_markdown(body)]  # type: ignore[attr-defined]
        seconds["before"] += time.process_time() - started
        started = time.process_time()
        new = [(c.text, c.heading) for c in chunking.chunk_markdown(body)]
        seconds["now"] += time.process_time() - started
        if old != new:
            differ += 1
            print(f"  differs: {name}")
    print(f"{differ} of {count:,} notes chunk differently; CPU {seconds['before']:.2f} s before, "
          f"{seconds['now']:.2f} s now")


if __name__ == "__main__":
    main()
