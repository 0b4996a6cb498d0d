"""Sync the eval sets into bench homes (slow: the default model embeds ~10 chunks/s). Re-running is incremental.

usage: python bench/prepare_eval.py [--shared ../shared] [--model e5-small] SET...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from eval_sets import load_set, materialise

OUT = Path(__file__).parent / "out"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--model", default="e5-small")
    args = parser.parse_args()
    shared = Path(args.shared)
    if not (shared / "eval").is_dir():
        sys.exit(f"no eval sets under {shared}/eval (pass --shared)")
    for name in args.sets:
        eval_set = materialise(shared, load_set(shared, name), OUT)
        home = OUT / "homes" / f"{eval_set.home_name}-{args.model}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(f'[embedding]\nmodel = "{args.model}"\n', encoding="utf-8")
        print(f"== {name} ({len(eval_set.path_to_doc)} docs) → {home}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "rag_app.shells.cli", "--home", str(home), "sync", "--vault",
             str(eval_set.vault_dir), "--no-progress"],
            check=True,
        )


if __name__ == "__main__":
    main()
