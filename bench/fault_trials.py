"""Fault trials: kill -9 a `brain sync` at a random moment and sync again; break a Memos server in random ways.

A trial converges when Chroma ids == manifest chunk ids == chunk rows == BM25 ids, the docstore holds exactly the
manifest's notes with their hashes, nothing is duplicated and every note is found by its title. A Memos fault must
leave every store exactly as it was, say so in one line, never show the token, retry a bounded number of times, and
the next clean sync must succeed. tests/rag_app/ingest/test_faults.py runs
the same trials a few times; this repeats them and prints a tally.

usage: python bench/fault_trials.py [--kills 10] [--memos 10] [--notes 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.doubles.memos_server import MemosDouble, seed_memos  # noqa: E402 - the repo's own Memos double

BRAIN = [sys.executable, "-m", "rag_app.shells.cli"]
TOKEN = "memos_pat_test"
FAST_CONFIG = '[embedding]\nmodel = "use-m3"\n'
SYLLABLES = ("ka", "zo", "mi", "tu", "rex", "vo", "li", "qua", "ne", "dro", "fi", "sul")


def brain_env(**extra: str) -> dict[str, str]:
    """The environment of a `brain` subprocess: no token or home leaking in from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if k not in ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "BRAIN_HOME",
                                                            "BRAIN_STORE_URL")}
    return env | {"ANONYMIZED_TELEMETRY": "False"} | extra


def make_home(path: Path, extra_config: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(FAST_CONFIG + extra_config, encoding="utf-8")
    return path


def write_notes(vault: Path, count: int, seed: int = 0) -> dict[str, str]:
    """`count` short notes of 2–3 chunks; every title is a made-up word, so BM25 finds exactly its note.

    Returns note id → title.
    """
    rng = random.Random(seed)
    vault.mkdir(parents=True, exist_ok=True)
    titles: dict[str, str] = {}
    for i in range(count):
        title = "".join(rng.choice(SYLLABLES) for _ in range(4)) + f"{i:03d}"
        sections = [f"## Part {n}\n\n" + " ".join(rng.choice(SYLLABLES) * 2 for _ in range(30))
                    for n in range(rng.randint(2, 3))]
        (vault / f"n{i:03d}.md").write_text(f"# {title}\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")
        titles[f"vault:{vault.name}/n{i:03d}.md"] = title
    return titles


def run_brain(home: Path, *args: str, store_url: str = "", env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
    prefix = ["--store-url", store_url] if store_url else []
    return subprocess.run([*BRAIN, "--home", str(home), *prefix, *args], capture_output=True, text=True, cwd=REPO,
                          env=brain_env(**(env or {})), timeout=timeout)


def start_sync(home: Path, vault: Path, store_url: str = "") -> subprocess.Popen[str]:
    prefix = ["--store-url", store_url] if store_url else []
    return subprocess.Popen([*BRAIN, "--home", str(home), *prefix, "sync", "--vault", str(vault), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=brain_env())


def wait_for_lock(home: Path, proc: subprocess.Popen[str], timeout: float = 60) -> bool:
    """True once `proc` holds the sync lock (its pid is in sync.lock); False if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if (home / "sync.lock").read_text().strip() == str(proc.pid):
                return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


def manifest_notes(home: Path) -> int:
    if not (home / "index.sqlite").exists():
        return 0
    db = sqlite3.connect(str(home / "index.sqlite"))
    try:
        return db.execute("SELECT COUNT(*) FROM notes").fetchone()[0]
    except sqlite3.OperationalError:  # killed before the schema was written
        return 0
    finally:
        db.close()


def snapshot(home: Path, store_url: str = "") -> dict[str, Any]:
    """Everything a sync writes, read straight from each store: Chroma ids, notes rows, chunk rows, bm25/ids.json."""
    from rag_app.config import load_settings
    from rag_app.index.store import open_chroma

    client = open_chroma(load_settings(home, store_url=store_url or None))
    vectors = [i for collection in client.list_collections() for i in collection.get(include=[])["ids"]]
    db = sqlite3.connect(str(home / "index.sqlite"))
    try:
        notes = {r[0]: r[1:] for r in db.execute("SELECT note_id, source, hash, model, chunker, chunk_ids FROM notes")}
        rows = sorted(db.execute("SELECT chunk_id, note_id, text FROM chunks").fetchall())
    finally:
        db.close()
    bm25 = home / "bm25" / "ids.json"
    return {"vectors": sorted(vectors), "notes": notes, "chunks": rows,
            "bm25": bm25.read_text(encoding="utf-8") if bm25.exists() else None, "docstore": docstore_hashes(home)}


def docstore_hashes(home: Path) -> dict[str, str]:
    """note id → hash as the home's docstore holds them (index/docstore.py: one kv table, hashes in
    `notes/metadata`)."""
    from rag_app.index.docstore import DOCSTORE_FILE, NAMESPACE

    if not (home / DOCSTORE_FILE).exists():
        return {}
    db = sqlite3.connect(str(home / DOCSTORE_FILE))
    try:
        rows = db.execute("SELECT key, value FROM kv WHERE collection = ?", (f"{NAMESPACE}/metadata",)).fetchall()
    finally:
        db.close()
    return {key: json.loads(value)["doc_hash"] for key, value in rows}


def convergence_problems(home: Path, titles: dict[str, str] | None = None, store_url: str = "") -> list[str]:
    """What keeps the stores from agreeing, checked without the doctor; with `titles`, also one search per note."""
    state = snapshot(home, store_url)
    manifest_ids = [c for row in state["notes"].values() for c in json.loads(row[4])]
    bm25_ids = json.loads(state["bm25"])["ids"] if state["bm25"] else []
    problems = []
    for name, ids in (("vectors", state["vectors"]), ("manifest", manifest_ids), ("bm25", bm25_ids),
                      ("chunk rows", [r[0] for r in state["chunks"]])):
        if len(ids) != len(set(ids)):
            problems.append(f"duplicate {name} ids: {len(ids) - len(set(ids))}")
        if set(ids) != set(manifest_ids):
            diff = sorted(set(ids) ^ set(manifest_ids))
            problems.append(f"{name} ids differ from the manifest's: {len(diff)}, e.g. {diff[:3]}")
    indexed = {note_id: row[1] for note_id, row in state["notes"].items()}
    if state["docstore"] != indexed:
        diff = sorted(set(state["docstore"].items()) ^ set(indexed.items()))
        problems.append(f"docstore differs from the manifest's notes and hashes: {len(diff)}, e.g. {diff[:2]}")
    if titles:
        from rag_app.engine import Brain

        brain = Brain(home, store_url=store_url or None)
        try:
            for note_id, title in titles.items():
                found = [r["note_id"] for r in brain.search(title, k=5, mode="bm25", expand=False).results]
                if found.count(note_id) != 1 or found[0] != note_id:
                    problems.append(f"search {title!r}: expected {note_id} once and first, got {found[:3]}")
        finally:
            brain.close()
    return problems


@dataclass
class KillResult:
    delay: float
    killed: bool  # False when the sync had finished before the signal
    notes_at_kill: int
    problems: list[str]


def kill_trial(home: Path, vault: Path, titles: dict[str, str], rng: random.Random, max_delay: float = 6.0,
               mid_write: bool = False) -> KillResult:
    """Start a sync, kill -9 it a random time after it took the lock, sync again: the stores must converge.

    `mid_write`: the random delay starts when the first batch is committed, so the kill lands among the writes
    (model loading takes most of a small sync, and a kill there tests little).
    """
    proc = start_sync(home, vault)
    if not wait_for_lock(home, proc):
        proc.kill()
        return KillResult(0.0, False, 0, [f"the sync never took the lock: {proc.communicate()[1][-300:]}"])
    while mid_write and proc.poll() is None and manifest_notes(home) == 0:
        time.sleep(0.02)
    delay = rng.uniform(0.0, max_delay)
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    notes_at_kill = manifest_notes(home)
    again = run_brain(home, "sync", "--vault", str(vault), "--json")
    if again.returncode != 0:
        return KillResult(delay, killed, notes_at_kill, [f"sync after kill exited {again.returncode}: "
                                                         f"{again.stderr[-300:]}"])
    return KillResult(delay, killed, notes_at_kill, convergence_problems(home, titles))


@dataclass(frozen=True)
class MemosFault:
    """One way a Memos server breaks. `faults(pages_served)` gives the double's fault settings; `list_requests` is
    how many list requests the sync may send (None: not fixed, e.g. it succeeds and walks every page)."""

    name: str
    faults: Callable[[int], dict[str, Any]]
    fails: bool
    error: str
    list_requests: int | None


# The client in these trials: timeout 0.5 s, 2 retries (3 attempts), 10 memos per page.
MEMOS_SPEC = "timeout = 0.5\nmax_retries = 2\npage_size = 10\n"
MEMOS_FAULTS = (
    MemosFault("500 after 2 pages", lambda served: {"fail_after_pages": served + 2}, True, "HTTP 500", 2 + 3),
    MemosFault("timeout", lambda served: {"delay": 1.2}, True, "timed out after 3 attempts", 3),
    MemosFault("connection reset mid-body", lambda served: {"reset_page": 1}, True, "connection failed", 1 + 3),
    MemosFault("truncated JSON", lambda served: {"truncate_page": 1}, True, "malformed JSON", 2),
    MemosFault("short 429 burst", lambda served: {"burst_429": 2}, False, "", None),
    MemosFault("long 429 burst", lambda served: {"burst_429": 50}, True, "HTTP 429", 3),
    MemosFault("401 after the first page", lambda served: {"unauthorized_after_pages": served + 1}, True, "401", 2),
    MemosFault("page token that never ends", lambda served: {"repeat_token": True}, True, "page token", 2),
)


def memos_home(path: Path, url: str) -> Path:
    """A home whose config names the double with the trial's client knobs (`sync --memos URL` reuses them)."""
    return make_home(path, f'[[sources]]\nkind = "memos"\nname = "memos"\nurl = "{url}"\n{MEMOS_SPEC}')


def list_requests(double: MemosDouble, since: int = 0) -> list[dict[str, Any]]:
    return [r for r in double.requests[since:] if r["path"] == "/api/v1/memos"]


def change_memos(double: MemosDouble, keys: list[str], rng: random.Random) -> None:
    """Add, edit and delete a memo, so that a partial listing would look like changes and deletions."""
    keys.append(double.add_memo(f"memo added at {time.time():.0f} #trial", visibility="PRIVATE"))
    double.edit_memo(rng.choice(keys), f"edited {rng.random():.6f} #trial")
    double.delete_memo(keys[rng.randrange(len(keys) - 1)])
    keys[:] = [key for key in keys if _exists(double, key)]  # a deleted memo takes its comments with it


def _exists(double: MemosDouble, key: str) -> bool:
    try:
        double.memo_json(key)
    except KeyError:
        return False
    return True


def memos_fault_trial(home: Path, double: MemosDouble, keys: list[str], fault: MemosFault,
                      rng: random.Random) -> list[str]:
    """Change the memos, inject `fault`, sync; then clear it and sync again. Returns what went wrong."""
    from rag_app.engine import Brain

    before = snapshot(home)
    change_memos(double, keys, rng)
    served = sum(1 for r in list_requests(double) if r["status"] == 200)
    first = len(double.requests)
    double.faults.update(fault.faults(served))
    started = time.monotonic()
    try:
        report = Brain(home).sync(memos=(double.url,))
    finally:
        elapsed = time.monotonic() - started
        time.sleep(double.faults.get("delay", 0))  # a delayed answer is logged when the server wakes up
        double.faults.clear()
    problems = []
    source = report.sources[0]
    if fault.fails:
        if not source.failed or fault.error not in (source.error or "") or "\n" in (source.error or ""):
            problems.append(f"expected one line with {fault.error!r}, got failed={source.failed} {source.error!r}")
        if snapshot(home) != before:
            problems.append("a failed sync changed the stores")
    elif source.failed:
        problems.append(f"expected success, got {source.error!r}")
    if TOKEN in json.dumps(report.to_dict()):
        problems.append("the token appears in the report")
    sent = len(list_requests(double, first))
    if fault.list_requests is not None and sent != fault.list_requests:
        problems.append(f"{sent} list requests, expected {fault.list_requests}")
    if elapsed > 10:
        problems.append(f"took {elapsed:.1f} s: retries are not bounded in time")
    recovered = Brain(home).sync(memos=(double.url,))
    if recovered.failed:
        problems.append(f"the clean sync after the fault failed: {recovered.sources[0].error}")
    return problems + convergence_problems(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="kill -9 trials")
    parser.add_argument("--memos", type=int, default=10, help="random Memos fault trials")
    parser.add_argument("--notes", type=int, default=60, help="vault notes per kill trial")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.environ["CFLOW_API_TOKEN"] = TOKEN
    failures: list[str] = []
    converged = 0
    with tempfile.TemporaryDirectory(prefix="fault-trials-") as tmp:
        root = Path(tmp)
        for n in range(args.kills):
            vault = root / f"vault{n}"
            titles = write_notes(vault, args.notes, seed=n)
            mid_write = n % 2 == 1
            result = kill_trial(make_home(root / f"home{n}"), vault, titles, rng, max_delay=2.0 if mid_write else 6.0,
                                mid_write=mid_write)
            state = f"killed with {result.notes_at_kill} notes committed" if result.killed else "finished before kill"
            print(f"kill {n + 1}/{args.kills}: after {result.delay:.2f} s, {state}: "
                  f"{'converged' if not result.problems else result.problems}", flush=True)
            converged += not result.problems
            failures += [f"kill {n + 1}: {p}" for p in result.problems]
        with MemosDouble(mode="head") as double:
            keys = seed_memos(double, 40)
            home = memos_home(root / "memos-home", double.url)
            from rag_app.engine import Brain

            Brain(home).sync(memos=(double.url,))
            for n in range(args.memos):
                fault = rng.choice(MEMOS_FAULTS)
                problems = memos_fault_trial(home, double, keys, fault, rng)
                print(f"memos {n + 1}/{args.memos}: {fault.name}: {'ok' if not problems else problems}", flush=True)
                converged += not problems
                failures += [f"memos {n + 1} ({fault.name}): {p}" for p in problems]
    trials = args.kills + args.memos
    print(json.dumps({"trials": trials, "converged": converged, "failures": failures}, ensure_ascii=False, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
