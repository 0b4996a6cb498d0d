"""Time to first search hit on a fresh 3,000-memo source with the default models (e5-small + use-m3).

At t=0 a `brain sync --memos URL` process starts on a fresh home; this process then runs `brain search "<exact phrase>"
--json` processes back to back until the memo holding that phrase is the first result, and polls the channels of
`Brain.status()` (in this process: the same call as `brain status --json`, without a start-up each second).

Prints: time to first hit; when BM25 and USE-m3 completed; the e5-small fill rate seen in the status channels against
the raw encode rate of e5-small on the same chunk texts. By default the sync is stopped with SIGTERM after a minute of
e5 fill and the time it takes to exit (code 130) is printed. With --full the stopped sync is resumed to the end, a
second home is indexed in one uninterrupted pass, and the two must hold the same chunk ids in every collection.

usage: python bench/first_search_bench.py [--memos 3000] [--e5-seconds 60] [--full] [--out bench/out/first_search]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sync_bench import raw_encode_rate  # noqa: E402

from rag_app.engine import Brain  # noqa: E402
from tests.doubles.memos_server import MemosDouble, seed_memos  # noqa: E402

TOKEN = "memos_pat_bench"
BRAIN = str(Path(sys.executable).parent / "brain")
PHRASE = "老周在静安寺旁的咖啡馆讲了 ledger-7731 迁移的回滚步骤"
E5, USE = "e5-small", "use-m3"


def target_memo(double: MemosDouble, keys: list[str], seed: int = 4) -> str:
    """A memo from the middle of the listing that is neither archived nor a comment gets the unique phrase."""
    rng = random.Random(seed)
    while True:
        key = keys[len(keys) // 2 + rng.randint(-200, 200)]
        memo = double.memo_json(key)
        if memo.get("state", "NORMAL") == "NORMAL" and not memo.get("parent"):
            double.edit_memo(key, f"{memo['content']}\n\n周四下午，{PHRASE}。")
            return key


class StatusLog:
    """Channels of `Brain.status()` every `interval` seconds, with their time since t=0, on a thread."""

    def __init__(self, home: Path, t0: float, interval: float = 1.0):
        self.brain = Brain(home)
        self.t0 = t0
        self.interval = interval
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StatusLog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                channels = self.brain.status()["channels"]
            except Exception:  # the manifest is being created: no channels yet
                continue
            if channels:
                self.samples.append((time.perf_counter() - self.t0, channels))

    def first(self, channel: str, test: Any) -> float | None:
        return next((t for t, c in list(self.samples) if channel in c and test(c[channel])), None)

    def latest(self, channel: str) -> dict[str, Any]:
        return next((c[channel] for _, c in reversed(list(self.samples)) if channel in c), {})


def search_until_hit(home: Path, note_suffix: str, t0: float, deadline: float, env: dict[str, str]) -> list[tuple]:
    """`brain search` processes back to back: (start, end, rank of the memo or None, exit code) each, until rank 1."""
    tries = []
    while time.perf_counter() - t0 < deadline:
        began = time.perf_counter() - t0
        done = subprocess.run([BRAIN, "--home", str(home), "search", PHRASE, "--json", "-k", "5"],
                              capture_output=True, text=True, env=env, cwd=REPO)
        ended = time.perf_counter() - t0
        rank = None
        if done.returncode == 0:
            ids = [r["note_id"] for r in json.loads(done.stdout)["results"]]
            rank = next((i + 1 for i, n in enumerate(ids) if n.endswith(note_suffix)), None)
        tries.append((began, ended, rank, done.returncode))
        if rank == 1:
            return tries
        time.sleep(0.2)
    return tries


def complete(channel: dict[str, Any]) -> bool:
    return channel["complete"] and channel["chunks"] > 0  # an empty home counts as complete


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def fill_rate(samples: list[tuple[float, dict[str, Any]]], model: str) -> tuple[float, int, float]:
    """Chunks/s from the first sample with some vectors of `model` (its load is before) to the first with the most."""
    points = [(t, c[model]["chunks"]) for t, c in samples if c.get(model, {}).get("chunks")]
    points = points[: 1 + next((i for i, (_, n) in enumerate(points) if n == points[-1][1]), 0)] if points else []
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return 0.0, 0, 0.0
    (t1, c1), (t2, c2) = points[0], points[-1]
    return (c2 - c1) / (t2 - t1), c2 - c1, t2 - t1


def collection_ids(home: Path) -> dict[str, set[str]]:
    """Chunk ids per Chroma collection, and the manifest's chunk ids, of one home."""
    import sqlite3

    from rag_app.index.store import collection_ids as ids_of
    from rag_app.index.store import open_chroma

    brain = Brain(home)
    client = open_chroma(brain.settings)
    out = {c.name: ids_of(client.get_collection(c.name)) for c in client.list_collections()}
    db = sqlite3.connect(str(home / "index.sqlite"))
    out["manifest chunks"] = {row[0] for row in db.execute("SELECT chunk_id FROM chunks")}
    db.close()
    return out


def sync_json(home: Path, url: str, env: dict[str, str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([BRAIN, "--home", str(home), "sync", "--memos", url, "--json", "--no-progress"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"brain sync failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memos", type=int, default=3000)
    parser.add_argument("--e5-seconds", type=float, default=60.0, help="e5 fill measured before the SIGTERM")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up on the first hit after this")
    parser.add_argument("--sample", type=int, default=200, help="chunks for the raw encode rate")
    parser.add_argument("--full", action="store_true",
                        help="resume the stopped sync to the end and compare with a one-pass index")
    parser.add_argument("--out", default=str(REPO / "bench" / "out" / "first_search"))
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    home = out / "home"
    home.mkdir(parents=True)
    env = {**os.environ, "CFLOW_API_TOKEN": TOKEN}
    double = MemosDouble("head", token=TOKEN)
    keys = seed_memos(double, args.memos)
    target = target_memo(double, keys)
    double.start()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other work slows every figure)")
    print(f"{args.memos} memos from the double; exact phrase {PHRASE!r} in memo {target}")
    sync = None
    try:
        t0 = time.perf_counter()
        with open(out / "sync.stdout", "w") as stdout, open(out / "sync.stderr", "w") as stderr:
            sync = subprocess.Popen([BRAIN, "--home", str(home), "sync", "--memos", double.url, "--json",
                                     "--no-progress"], stdout=stdout, stderr=stderr, env=env, cwd=REPO)
        status = StatusLog(home, t0).start()
        tries = search_until_hit(home, "/" + target, t0, args.deadline, env)
        hit = tries[-1] if tries and tries[-1][2] == 1 else None
        if hit is None:
            print(f"no first hit within {args.deadline:.0f} s ({len(tries)} searches)")
        else:
            print(f"time to first hit: {hit[1]:.1f} s after `brain sync` started (that search process ran "
                  f"{hit[0]:.1f}-{hit[1]:.1f} s; {len(tries)} search processes in all)")
        deadline = t0 + args.deadline
        while status.first(USE, complete) is None and sync.poll() is None:
            if time.perf_counter() > deadline:
                break
            time.sleep(0.5)
        use_done, bm25_done = status.first(USE, complete), status.first("bm25", complete)
        print(f"BM25 complete at {seconds(bm25_done)}; USE-m3 complete at {seconds(use_done)} "
              f"({status.latest('bm25').get('chunks')} chunks; status polled every second)")
        while sync.poll() is None and (use_done or 0) + args.e5_seconds > time.perf_counter() - t0:
            time.sleep(0.5)
        stopped_at = None
        if sync.poll() is None:
            sync.send_signal(signal.SIGTERM)
            stopped_at = time.perf_counter()
            code = sync.wait(timeout=120)
            print(f"SIGTERM after {stopped_at - t0:.1f} s: exited {code} in {time.perf_counter() - stopped_at:.2f} s")
        else:
            print(f"sync ended by itself at {time.perf_counter() - t0:.1f} s, exit {sync.returncode}")
        status.stop()
        e5_start = status.first(E5, lambda c: c["chunks"] > 0)
        rate, chunks, span = fill_rate(status.samples, E5)
        e5_left, total = status.latest(E5), status.latest("bm25").get("chunks")
        print(f"e5-small fill (status channels): {rate:.1f} chunks/s ({chunks} chunks in {span:.0f} s; first "
              f"vectors at {seconds(e5_start)}); {e5_left.get('chunks')} of {total} chunks done, "
              f"status said {e5_left.get('seconds_left')} s left")
        use_rate, use_chunks, use_span = fill_rate(status.samples, USE)
        print(f"use-m3 fill (status channels): {use_rate:.1f} chunks/s ({use_chunks} chunks in {use_span:.0f} s)")
        raw, sampled = raw_encode_rate(home, E5, args.sample)
        print(f"raw encode e5-small ({sampled} of the same chunk texts, batches of 10, this process alone): "
              f"{raw:.1f} chunks/s; fill/raw = {rate / raw:.2f}")
        if args.full:
            full(home, out, double.url, env)
    finally:
        if sync is not None and sync.poll() is None:
            sync.kill()
        double.stop()


def full(home: Path, out: Path, url: str, env: dict[str, str]) -> None:
    """Resume the stopped sync to the end, index a second home in one pass, compare chunk ids per collection."""
    before = Brain(home).status()["channels"]
    wall, report = sync_json(home, url, env)
    print(f"resumed sync: {wall:.0f} s wall, vectors added {report['vectors']} (lacking before: "
          + ", ".join(f"{m} {before['bm25']['chunks'] - before[m]['chunks']}" for m in (USE, E5)) + ")")
    one_pass = out / "one_pass"
    one_pass.mkdir()
    wall, report = sync_json(one_pass, url, env)
    print(f"one-pass sync of a second home: {wall:.0f} s wall, vectors {report['vectors']}")
    progressive, single = collection_ids(home), collection_ids(one_pass)
    for name in sorted(set(progressive) | set(single)):
        a, b = progressive.get(name, set()), single.get(name, set())
        verdict = "equal" if a == b else f"DIFFER (only progressive {len(a - b)}, only one-pass {len(b - a)})"
        print(f"  {name}: {len(a)} vs {len(b)} ids: {verdict}")


if __name__ == "__main__":
    main()
