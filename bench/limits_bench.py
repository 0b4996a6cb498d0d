"""How soon each limit stops a hostile or oversized input, and at what memory: the figures that the tests assert only
as bounds (a bound a loaded CI machine cannot break; the tests say which). Same scenarios as the tests, imported
from them, so the two never drift apart.

- client: a Memos double sending small pages forever (0.05 s each) against `listing_deadline = 1` s; a body of
  128 KiB chunks, endless and 5 MiB, against `max_response_bytes = 1 MiB` (tests/readers/test_memos_client.py)
- sync: `brain sync` against each hostile server of tests/rag_app/ingest/test_hostile_memos.py, with the small limits
  the test sets, then with the default limits: seconds and peak RSS over a plain failing sync
- page: a 20,000-turn conversation opened on the chat page: seconds and peak traced memory (tests/test_app.py)

Prints one line per scenario and trial; the median per scenario at the end.

usage: python bench/limits_bench.py [--trials 3] [--only client,sync,defaults,page]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fault_trials import TOKEN  # noqa: E402
from readers.memos_client import MemosError, MiB  # noqa: E402
from tests.doubles.memos_server import MemosDouble, Stream, seed_memos  # noqa: E402
from tests.readers.test_memos_client import fetch  # noqa: E402

seconds_of: dict[str, list[float]] = defaultdict(list)


def report(name: str, seconds: float, extra: str = "") -> None:
    seconds_of[name].append(seconds)
    print(f"| {name} | {seconds:.2f} s | {extra} |", flush=True)


def timed_error(double: MemosDouble, **options: object) -> tuple[str, float]:
    started = time.monotonic()
    try:
        fetch(double, **options)
    except MemosError as exc:
        return str(exc), time.monotonic() - started
    raise SystemExit("the listing did not fail")


def client_limits() -> None:
    """test_endless_page_tokens_stop_at_the_listing_deadline, test_a_body_over_max_response_bytes_is_cut."""
    with MemosDouble("head") as double:
        double.add_memo("a memo the server also has")
        double.faults.update(endless_pages=2, delay=0.05)
        message, seconds = timed_error(double, listing_deadline=1.0)
        assert "(listing_deadline)" in message, message
        report("client: listing_deadline 1 s, endless slow pages", seconds, f"overshoot {seconds - 1.0:.2f} s")
    for label, count in (("endless", None), ("5 MiB", 40)):
        with MemosDouble("head") as double:
            double.add_memo("a memo the server also has")
            double.faults.update(stream=Stream(chunk=b" " * 131072, count=count))
            message, seconds = timed_error(double, max_response_bytes=MiB)
            assert "(max_response_bytes)" in message, message
            report(f"client: max_response_bytes 1 MiB, {label} body", seconds)


def sync_limits(defaults: bool) -> None:
    """test_a_hostile_server_fails_the_sync_in_bounded_memory_and_time (small limits) and
    test_the_default_limits_stop_a_hostile_server_within_seconds_and_mebibytes (none set)."""
    from rag_app.engine import Brain
    from tests.rag_app.ingest import test_hostile_memos as hostile

    cases = ({"endless-pages": ({"endless_pages": 1000}, {}), "endless-body": ({"stream": Stream()}, {})}
             if defaults else {name: (faults, limits) for name, (faults, limits, _) in hostile.HOSTILE.items()})
    with tempfile.TemporaryDirectory() as root, MemosDouble("head") as double:
        os.environ["CFLOW_API_TOKEN"] = TOKEN
        for var in ("BRAIN_HOME", "BRAIN_STORE_URL", "MEMOS_TOKEN"):
            os.environ.pop(var, None)
        seed_memos(double, 30)
        home = Path(root) / "home"
        hostile.set_limits(home, double.url, {})
        assert not Brain(home).sync(memos=(double.url,)).failed
        hostile._BASELINE.clear()
        baseline = hostile.baseline_rss_mb(home, double)
        for name, (faults, limits) in cases.items():
            double.faults.clear()
            double.faults.update(faults)
            run = hostile.run_limited(home, limits, "sync", "--memos", double.url, timeout=600)
            assert run.returncode == 1, run.stderr
            which = "defaults" if defaults else "small limits"
            report(f"sync ({which}): {name}", run.seconds, f"peak RSS +{run.peak_rss_mb - baseline:.0f} MB over a "
                   f"failing sync ({baseline:.0f} MB)")
        double.faults.clear()


_conversation: dict[str, object] = {}


def long_conversation() -> None:
    """test_a_long_conversation_shows_its_last_turns_and_loads_earlier_ones_on_request. The home (the sample vault
    and one real turn copied to 20,000) is built once per run; each trial opens a fresh copy of it."""
    from rag_app.engine import Brain
    from rag_app.shells import page as app
    from tests.conftest import SAMPLE_VAULT
    from tests.test_app import Tab, ask, repeat_turn

    if not _conversation:
        root = Path(tempfile.mkdtemp())
        home = root / "home"
        brain = Brain(home)
        brain.sync(vaults=(str(SAMPLE_VAULT),))
        brain.close()
        first = app.ChatPage(Brain(home), obsidian=True)
        _, session, _, _ = ask(first)[-1]
        first.close()
        repeat_turn(home, session, 20_000)
        _conversation.update(root=root, home=home, session=session)
    root, session = Path(str(_conversation["root"])), str(_conversation["session"])
    copy = root / f"copy-{len(seconds_of['page: open a 20,000-turn conversation'])}"
    shutil.copytree(Path(str(_conversation["home"])), copy)
    fresh = app.ChatPage(Brain(copy), obsidian=True)
    tracemalloc.start()
    started = time.monotonic()
    try:
        fresh.load(Tab("t", session))
        seconds, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        fresh.close()
    report("page: open a 20,000-turn conversation", seconds, f"peak traced {peak / 2**20:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", default="client,sync,defaults,page")
    args = parser.parse_args()
    parts = args.only.split(",")
    print(f"limits_bench {dt.date.today().isoformat()}, {args.trials} trial(s)")
    print("| scenario | seconds | memory |\n|---|---|---|")
    # Scenario by scenario, the page last: its models make this process large, and a `brain` child's peak RSS counts
    # what it shares with this process between fork and exec.
    for part, run in (("client", client_limits), ("sync", lambda: sync_limits(defaults=False)),
                      ("defaults", lambda: sync_limits(defaults=True)), ("page", long_conversation)):
        for _ in range(args.trials if part in parts else 0):
            run()
    if _conversation:
        shutil.rmtree(Path(str(_conversation["root"])), ignore_errors=True)
    print("\nmedians:")
    for name, values in seconds_of.items():
        print(f"  {name}: {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
