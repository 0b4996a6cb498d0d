"""What importing LlamaIndex costs a fresh process: the figure readers/listing.py and readers/records.py quote (a sync
that finds nothing changed never pays it).

Each module is imported in a fresh `python -X importtime -c "import MODULE"`; the cost is the summed cumulative time
of its top-level imports, less that of `python -c pass` (the interpreter's own start-up imports). Prints the median,
min and max over `--runs` processes and the machine's load average, since a busy machine inflates every figure.

usage: python bench/import_cost.py [--runs 7] [MODULE ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = ("llama_index.core.schema", "readers.listing_reader",
           "llama_index.core.storage.docstore.keyval_docstore")


def import_seconds(code: str) -> float:
    """Summed cumulative import time of the top-level imports `code` makes (importtime's tree roots)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stderr
    total = 0
    for line in err.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            if name.startswith(" ") and not name.startswith("  "):
                total += int(cumulative)
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("modules", nargs="*", default=list(MODULES))
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"import_cost {dt.date.today().isoformat()}, {args.runs} runs each, load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    for module in args.modules:
        values = [import_seconds(f"import {module}") - import_seconds("pass") for _ in range(args.runs)]
        print(f"  {module}: median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
