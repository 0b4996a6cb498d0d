"""CLI latency benchmark: whole `brain` processes, cold (in-process) and warm (a `brain watch` serving the home), and a
loop of CLI calls while the watcher syncs edits.

Copies VAULT into OUT (the loop edits the copy, never the original), builds OUT/home with `brain sync` (the default
models, or `--fast`: USE-m3 alone), then prints min / median / max wall and CPU seconds of whole processes (interpreter
start and imports included), each query run RUNS times:
- cold: `brain --no-daemon search Q --json` (what every call cost before the warm engine);
- warm: `brain search Q --json`, `brain ask Q --json` (no LLM: the passages), `brain status`, with `brain watch` on;
- the loop: LOOP calls of `brain search`; every 5th call first writes one of three notes in the vault copy again with a
  new word; each call made after the watcher reported the sync of a word (its `--json` line) must find that note first.
  Errors (exit code, stderr) and stale answers are counted.
With `--busy` one process spins on a core throughout ("one core busy"). The load average is printed first.

usage: python bench/cli_latency_bench.py VAULT --out DIR [--fast] [--runs 5] [--busy] [--loop 100] [--query Q]...
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BRAIN = Path(sys.executable).parent / "brain"
QUERIES = ("观影", "how do I deploy the service", "跑步 配速")


def env() -> dict[str, str]:
    """No LLM (asks answer with passages), no home from the environment: the same for server and clients."""
    drop = ("BRAIN_", "LLM_", "OPENAI_", "EMBEDDING_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)} | {"ANONYMIZED_TELEMETRY": "False"}


def run(home: Path, *args: str) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """(wall s, CPU s of the child, the finished process) of one whole `brain --home H ...` process."""
    started = time.perf_counter()
    process = subprocess.Popen([str(BRAIN), "--home", str(home), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO, env=env())
    out, err = process.communicate()
    wall = time.perf_counter() - started
    return wall, _reaped_cpu(), subprocess.CompletedProcess(process.args, process.returncode, out, err)


_cpu_seen = [0.0]


def _reaped_cpu() -> float:
    """CPU seconds of the child just reaped: the growth of the reaped children's total (the watcher and the spinner
    are still running, so they are not in it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    cpu, _cpu_seen[0] = total - _cpu_seen[0], total
    return cpu


def figures(name: str, samples: list[tuple[float, float]]) -> None:
    walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
    print(f"{name:<44} wall {min(walls):5.2f} / {statistics.median(walls):5.2f} / {max(walls):5.2f} s   "
          f"CPU {min(cpus):5.2f} / {statistics.median(cpus):5.2f} / {max(cpus):5.2f} s   (min / median / max, "
          f"n={len(samples)})")


def timed(home: Path, runs: int, *args: str) -> list[tuple[float, float]]:
    samples = []
    for _ in range(runs):
        wall, cpu, done = run(home, *args)
        if done.returncode != 0:
            sys.exit(f"brain {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        samples.append((wall, cpu))
    return samples


class Watch:
    """`brain watch --json` on the home, its sync reports collected as they come."""

    def __init__(self, home: Path):
        self.process = subprocess.Popen([str(BRAIN), "--home", str(home), "watch", "--json"], cwd=REPO, env=env(),
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reports: list[tuple[float, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.reports.append((time.monotonic(), json.loads(line)))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def wait_warm(home: Path, timeout: float = 600) -> float:
    """Seconds until the warm engine answers and has loaded its models (brain.log says so)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        _, _, done = run(home, "status", "--json")
        log = (home / "brain.log").read_text(encoding="utf-8").split("warm engine: serving")[-1]
        if done.returncode == 0 and json.loads(done.stdout)["engine"]["mode"] == "warm" and "warm engine: warm" in log:
            return time.monotonic() - started
        time.sleep(0.5)
    sys.exit("the warm engine did not come up")


def loop(home: Path, vault: Path, watch: Watch, calls: int) -> None:
    """CLI calls while the watcher syncs edits: errors, and stale answers after the watcher reported a sync."""
    written: dict[str, tuple[str, float]] = {}  # word -> (file, when written)
    errors, stale, checked, walls = 0, 0, 0, []
    for n in range(calls):
        if n % 5 == 0:
            word = f"brainbench{n:04d}x"
            name = f"bench-edit-{(n // 5) % 3}.md"
            (vault / name).write_text(f"# Bench edit {n}\n\nThis note now says {word}.\n", encoding="utf-8")
            written[word] = (name, time.monotonic())
        latest = {}  # file -> its newest word whose write a reported sync followed
        for word, (name, when) in written.items():
            if any(at > when and report_touches(report) for at, report in watch.reports):
                if name not in latest or written[latest[name]][1] < when:
                    latest[name] = word
        query = max(latest.values(), key=lambda w: written[w][1]) if latest else QUERIES[n % len(QUERIES)]
        wall, _, done = run(home, "search", query, "--json", "-k", "3")
        walls.append(wall)
        if done.returncode != 0 or done.stderr:
            errors += 1
            print(f"  error on call {n}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
            continue
        if query in written:
            checked += 1
            results = json.loads(done.stdout)["results"]
            if not results or results[0].get("path") != written[query][0]:
                stale += 1
                print(f"  stale on call {n}: {query} → {[r.get('path') for r in results]}")
    syncs = sum(1 for _, report in watch.reports if report_touches(report))
    print(f"loop: {calls} calls, {len(written)} edits, {syncs} syncs reported, {checked} answers checked after a "
          f"reported sync: {errors} errors, {stale} stale; wall p50 {statistics.median(walls):.2f} s, "
          f"max {max(walls):.2f} s")


def report_touches(report: dict) -> bool:
    return any(s["added"] or s["updated"] for s in report.get("sources", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("vault", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="work folder (the vault copy and the home)")
    parser.add_argument("--fast", action="store_true", help="USE-m3 alone instead of the default e5-small + USE-m3")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", action="store_true", help="keep one core busy throughout")
    parser.add_argument("--loop", type=int, default=100, help="CLI calls while the watcher syncs edits (0: none)")
    parser.add_argument("--query", action="append", help="queries to time (default: 观影, an English one, 跑步 配速)")
    args = parser.parse_args()
    if not args.vault.is_dir():
        print(f"no vault at {args.vault}: nothing to measure")
        return
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores, {'one core busy' if args.busy else 'idle'}")
    vault, home = args.out / "vault", args.out / "home"
    if not home.is_dir():
        shutil.copytree(args.vault, vault, ignore=shutil.ignore_patterns(".*"))
        home.mkdir(parents=True)
        if args.fast:
            (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\nsecond_model = ""\n', encoding="utf-8")
        wall, _, done = run(home, "sync", "--vault", str(vault), "--json", "--no-progress")
        if done.returncode != 0:
            sys.exit(f"sync failed: {done.stderr[-500:]}")
        print(f"built {home}: {done.stdout.count(chr(10))} report lines, {wall:.0f} s")
    status = json.loads(run(home, "status", "--json")[2].stdout)
    print(f"home: {status['notes']} notes, {status['chunks']} chunks, models {status['dense_models']}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    queries = args.query or list(QUERIES)
    try:
        for query in queries:
            figures(f"cold search {query!r}", timed(home, args.runs, "--no-daemon", "search", query, "--json"))
        figures("cold status", timed(home, args.runs, "--no-daemon", "status"))
        watch = Watch(home)
        try:
            print(f"warm engine up and warmed in {wait_warm(home):.1f} s")
            for query in queries:
                figures(f"warm search {query!r}", timed(home, args.runs, "search", query, "--json"))
            for query in queries:
                figures(f"warm ask {query!r} (no LLM)", timed(home, args.runs, "ask", query, "--json"))
            figures("warm status", timed(home, args.runs, "status"))
            if args.loop:
                loop(home, vault, watch, args.loop)
        finally:
            watch.stop()
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main()
