"""How soon a sync stops on Ctrl-C while the slow default model fills a vault with one very long note.

A vault of `--notes` short notes plus one note of ~`--long-chunks` chunks (the case that once took 24–60 s: a
210-chunk note was one batch) is synced with e5-small; `--after` seconds into the fill (BM25 complete) the sync gets
SIGINT. Printed per trial: seconds from the signal to the exit, the exit code, and how many chunks the fill kept.

usage: python bench/stop_bench.py [--trials 3] [--notes 20] [--long-chunks 210] [--after 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BRAIN = str(Path(sys.executable).parent / "brain")


def status(home: Path) -> dict:
    out = subprocess.run([BRAIN, "--home", str(home), "--no-daemon", "status", "--json"], capture_output=True,
                         text=True, check=False).stdout
    return json.loads(out or "{}")


def trial(root: Path, notes: int, long_chunks: int, after: float) -> tuple[float, int, int]:
    vault, home = root / "vault", root / "home"
    vault.mkdir(parents=True)
    home.mkdir()
    for i in range(notes):
        (vault / f"n{i:02d}.md").write_text(f"# Note {i}\n\n" + "words about this and that. " * 12, encoding="utf-8")
    parts = "\n\n".join(f"## Part {i}\n\n" + f"paragraph {i} of the long note. " * 18 for i in range(long_chunks))
    (vault / "long.md").write_text("# A very long note\n\n" + parts, encoding="utf-8")
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\nsecond_model = ""\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "BRAIN_HOME"}
    sync = subprocess.Popen([BRAIN, "--home", str(home), "--no-daemon", "sync", "--vault", str(vault)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not status(home).get("channels", {}).get("bm25", {}).get("complete"):
        time.sleep(0.2)
    time.sleep(after)
    signalled = time.monotonic()
    sync.send_signal(signal.SIGINT)
    sync.communicate(timeout=600)
    stopped = time.monotonic() - signalled
    kept = status(home).get("channels", {}).get("e5-small", {}).get("chunks", 0)
    return stopped, sync.returncode, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--notes", type=int, default=20)
    parser.add_argument("--long-chunks", type=int, default=210)
    parser.add_argument("--after", type=float, default=8.0, help="seconds into the fill before the SIGINT")
    args = parser.parse_args()
    times = []
    for n in range(args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            stopped, code, kept = trial(Path(tmp), args.notes, args.long_chunks, args.after)
        times.append(stopped)
        print(f"trial {n + 1}: stopped {stopped:.2f} s after SIGINT, exit {code}, e5 chunks kept {kept}", flush=True)
    print(f"median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} trials")


if __name__ == "__main__":
    main()
