"""`brain watch` benchmark: edit-to-searchable latency of vault notes, p50/p95 over 20 edits.

A `brain watch --json --vault V` process watches a vault in a temp dir (300 generated notes with frontmatter, or a copy
of `--vault PATH`). Each edit appends a sentence with a new made-up word to one note; this process then searches for
that word with an in-process `Brain` (`mode="bm25"`, the channel that covers a note first; no CLI start-up in the
figure) every 50 ms until the edited note is the first result. Also printed: when the watcher's JSON line for that
sync arrived, and how long the first sync took. `--cli` polls with `brain search` processes instead (each ~1 s).

usage: python bench/watch_bench.py [--vault PATH] [--notes 300] [--edits 20] [--spacing 2] [--model use-m3] [--cli]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from latency_bench import percentile  # noqa: E402
from sync_bench import write_vault  # noqa: E402

from rag_app.engine import Brain  # noqa: E402

BRAIN = str(Path(sys.executable).parent / "brain")


def watcher_lines(process: subprocess.Popen, lines: queue.Queue) -> None:
    """Each JSON line of the watcher, with the time it arrived."""
    for line in process.stdout:
        if line.startswith("{"):
            lines.put((time.perf_counter(), json.loads(line)))


def found_first(brain: Brain | None, home: Path, word: str, note: Path, vault: Path) -> bool:
    """Whether `note` is the first BM25 result for `word`."""
    relative = note.relative_to(vault).as_posix()
    if brain is None:
        done = subprocess.run([BRAIN, "--home", str(home), "search", word, "--mode", "bm25", "--json", "-k", "3"],
                              capture_output=True, text=True, cwd=REPO)
        results = json.loads(done.stdout)["results"] if done.returncode == 0 else []
    else:
        results = brain.search(word, 3, mode="bm25", expand=False).to_dict()["results"]
    return bool(results) and str(results[0].get("path", "")).endswith(relative)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vault", type=Path, help="copy this vault (e.g. ../shared/vaults/<one>) instead of notes")
    parser.add_argument("--notes", type=int, default=300, help="generated notes when no --vault is given")
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--spacing", type=float, default=2.0, help="seconds between one edit found and the next")
    parser.add_argument("--timeout", type=float, default=60.0, help="an edit not found by then counts as missed")
    parser.add_argument("--model", default="use-m3")
    parser.add_argument("--cli", action="store_true", help="poll with `brain search` processes")
    args = parser.parse_args()
    if args.vault is not None and not args.vault.is_dir():
        print(f"skipped: vault folder not found: {args.vault}")
        return
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other work slows every figure)")
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as tmp:
        home, vault = Path(tmp) / "home", Path(tmp) / "vault"
        home.mkdir()
        (home / "config.toml").write_text(f'[embedding]\nmodel = "{args.model}"\nsecond_model = ""\n',
                                          encoding="utf-8")
        if args.vault is not None:
            shutil.copytree(args.vault, vault, ignore=shutil.ignore_patterns(".*"))
        else:
            write_vault(vault, args.notes)
        notes = sorted(vault.rglob("*.md"))
        print(f"vault: {len(notes)} notes ({args.vault or 'generated, with frontmatter'}), model {args.model}")
        run(args, home, vault, notes)


def run(args: argparse.Namespace, home: Path, vault: Path, notes: list[Path]) -> None:
    lines: queue.Queue = queue.Queue()
    started = time.perf_counter()
    watcher = subprocess.Popen([BRAIN, "--home", str(home), "watch", "--json", "--vault", str(vault)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    threading.Thread(target=watcher_lines, args=(watcher, lines), daemon=True).start()
    try:
        first_at, first = lines.get(timeout=3600)
        print(f"first sync by the watcher: {first_at - started:.1f} s ({first['chunks_written']} chunks, "
              f"vectors {first['vectors']})")
        brain = None if args.cli else Brain(home)
        if brain is not None:
            brain.search("warm up", 3, mode="bm25", expand=False)
        rng = random.Random(5)
        searchable, reported, missed = [], [], 0
        for i, note in enumerate(rng.sample(notes, min(args.edits, len(notes)))):
            time.sleep(args.spacing)
            word = "zq" + "".join(rng.choice(string.ascii_lowercase) for _ in range(10))
            text = note.read_text(encoding="utf-8")
            edited_at = time.perf_counter()
            note.write_text(f"{text.rstrip()}\n\nEdit {i}: the {word} was seen again.\n", encoding="utf-8")
            while not found_first(brain, home, word, note, vault):
                if time.perf_counter() - edited_at > args.timeout:
                    missed += 1
                    break
                time.sleep(0.05)
            else:
                searchable.append(time.perf_counter() - edited_at)
            while True:  # the watcher's line for this edit (a line from before the edit is skipped)
                try:
                    at, line = lines.get(timeout=args.timeout)
                except queue.Empty:
                    break
                if at >= edited_at and line.get("trigger") == "files":
                    reported.append(at - edited_at)
                    break
        how = "`brain search` processes" if args.cli else "in-process Brain.search, 50 ms apart"
        print(f"edit-to-searchable over {len(searchable)} edits ({how}, mode bm25): "
              f"p50 {statistics.median(searchable):.2f} s, p95 {percentile(searchable, 0.95):.2f} s, "
              f"max {max(searchable):.2f} s; missed (>{args.timeout:.0f} s): {missed}")
        if reported:
            print(f"edit-to-watcher-line (sync done, vectors included): p50 {statistics.median(reported):.2f} s, "
                  f"p95 {percentile(reported, 0.95):.2f} s over {len(reported)} lines")
    finally:
        watcher.send_signal(signal.SIGTERM)
        stopping = time.perf_counter()
        code = watcher.wait(timeout=60)
        print(f"watcher stopped by SIGTERM: exit {code} in {time.perf_counter() - stopping:.2f} s")


if __name__ == "__main__":
    main()
