"""Scale benchmark: ~100k chunks with the fast model (use-m3 alone, `second_model = ""`).

Generates a deterministic vault of mixed Chinese/English notes (default 25,000 notes of 4 heading sections each, so
about 4 chunks per note), then prints:
- the first `brain sync` (a whole process) wall time and chunks/s;
- warm search p50/p95 over 100 varied queries in one long-lived process (`Brain.search`, hybrid), with the embed and
  "ours" split the engine reports, then that process's RSS after 100 `Brain.ask` too (what the chat page does per
  question; no LLM configured: extractive answers);
- cold `brain search` wall time ×5 (whole processes);
- the RSS of a real `brain serve` process after 100 questions through its HTTP API (gradio_client, the page's chat
  endpoint), unless --no-serve.
Goals: warm p95 ≤ 150 ms, RSS ≤ 1 GB. `--profile` adds a cProfile of the warm searches (top functions by own time).

On a busy machine the first sync's vector fill can take hours: `--fill-seconds S` stops it with SIGTERM after S seconds
of fill (BM25 covers every chunk by then) and measures that index; `--skip-sync` measures an existing home again (after
a later `brain sync` resumed the fill, say).

usage: python bench/scale_bench.py [--notes 25000] [--out /tmp/brain-scale] [--fill-seconds S] [--skip-sync]
                                   [--profile] [--no-serve]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from itertools import accumulate
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from latency_bench import percentile  # noqa: E402
from sync_bench import raw_encode_rate  # noqa: E402

from rag_app.engine import Brain  # noqa: E402
from tests.doubles.memos_server import _EN, _TAGS, _ZH  # noqa: E402

BRAIN = str(Path(sys.executable).parent / "brain")
HAN = ("的一是在人有我他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天"
       "而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些"
       "与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相"
       "次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立"
       "马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共"
       "风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跑步读书"
       "电影音乐旅行咖啡会议项目计划复盘代码模型数据笔记")
SYLLABLES = ("ka", "lo", "mi", "ten", "sor", "vel", "dra", "qui", "ne", "pa", "ru", "sta", "for", "gen", "lin", "mar",
             "tor", "ex", "ion", "al", "ber", "cy", "den", "fy", "gal", "hop", "ish", "jun", "ment", "ous")
ENGLISH = ("project meeting review plan release data model search index note idea book movie music travel coffee "
           "budget design backend frontend server client cache query vector memory latency deadline team weekly "
           "quarterly summary draft bug fix test deploy rollback migrate schema paper chapter reading running "
           "health sleep garden recipe dinner family weekend trip city train flight hotel museum").split()


def vocabulary(rng: random.Random) -> tuple[list[str], list[str]]:
    """Chinese two- and three-character words and English words (real and made-up), most frequent first."""
    zh = list(dict.fromkeys("".join(rng.choice(HAN) for _ in range(rng.choice((2, 2, 2, 3)))) for _ in range(9000)))
    made_up = {"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(6000)}
    en = ENGLISH + sorted(made_up - set(ENGLISH), key=lambda w: rng.random())
    return zh[:6000], en


class TextMaker:
    """Zipf-distributed words: a few common, a long tail of rare ones, like real notes."""

    def __init__(self, seed: int = 7):
        self.rng = random.Random(seed)
        self.zh, self.en = vocabulary(self.rng)
        self.zh_cum = list(accumulate(1 / (r + 1) for r in range(len(self.zh))))
        self.en_cum = list(accumulate(1 / (r + 1) for r in range(len(self.en))))

    def sentence(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.08:
            return rng.choice(_ZH + _EN)
        if roll < 0.55:
            words = rng.choices(self.zh, cum_weights=self.zh_cum, k=rng.randint(6, 16))
            if rng.random() < 0.3:
                words.insert(rng.randrange(len(words)), f" {rng.choice(self.en[:300])} ")
            return "".join(words) + rng.choice("。。。！？；")
        words = rng.choices(self.en, cum_weights=self.en_cum, k=rng.randint(6, 16))
        return " ".join(words).capitalize() + rng.choice("...!?")

    def section(self, low: int = 260, high: int = 480) -> str:
        target = self.rng.randint(low, high)
        parts: list[str] = []
        while sum(len(p) + 1 for p in parts) < target:
            parts.append(self.sentence())
        text = " ".join(parts)
        cut = text.find(" ", high) if len(text) > high else -1
        return text[:cut] if cut > 0 else text[:high + 40]

    def query(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.35:
            return "".join(rng.choices(self.zh[20:2000], k=rng.randint(1, 3)))
        if roll < 0.7:
            return " ".join(rng.choices(self.en[10:2000], k=rng.randint(1, 4)))
        if roll < 0.85:
            phrase = rng.choice(_ZH + _EN)
            start = rng.randrange(max(1, len(phrase) - 12))
            return phrase[start : start + rng.randint(4, 20)].strip()
        return f"{rng.choice(self.zh[:500])} {rng.choice(self.en[:500])}"


def write_vault(root: Path, notes: int, sections: int = 4, seed: int = 7) -> None:
    maker = TextMaker(seed)
    folders = ["daily", "work", "reading", "生活", "tech", "projects/2023", "projects/2024"]
    for i in range(notes):
        folder = root / folders[i % len(folders)] / f"{i // 1000:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        tags = ", ".join(maker.rng.sample(_TAGS, 2))
        body = [f"---\ntitle: 笔记 {i} {maker.rng.choice(maker.en[:200])}\ntags: [{tags}]\n"
                f"created: 20{22 + i % 3}-{1 + i % 12:02d}-{1 + i % 28:02d}\n---\n"]
        for s in range(sections):
            heading = maker.rng.choice(maker.zh[:300]) if s % 2 else maker.rng.choice(maker.en[:300]).title()
            body.append(f"## {heading} {s + 1}\n\n{maker.section()}\n")
        (folder / f"note-{i:05d}.md").write_text("\n".join(body), encoding="utf-8")


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) in MB from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def measure(home: Path, count: int, profile: bool) -> None:
    """In this (fresh) process: warm searches, then asks; RSS along the way. Prints JSON lines for the parent."""
    from rag_app.engine import Brain

    maker = TextMaker(11)
    queries = [maker.query() for _ in range(count)]
    started = time.perf_counter()
    brain = Brain(home)
    brain.search("warm up 开始", 10, expand=False)
    print(json.dumps({"first_search_s": time.perf_counter() - started, "rss_after_first": rss_mb()[0]}), flush=True)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    walls, cpu, embed, ours, results = [], [], [], [], 0
    for query in queries:
        began, began_cpu = time.perf_counter(), time.process_time()
        response = brain.search(query, 10, expand=False)
        walls.append((time.perf_counter() - began) * 1000)
        cpu.append((time.process_time() - began_cpu) * 1000)
        embed.append(response.timing.get("embed_ms", 0.0))
        ours.append(response.timing.get("ours_ms", 0.0))
        results += bool(response.results)
    if profiler is not None:
        import pstats

        profiler.disable()
        stats = pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime")
        stats.print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)
    after_search = rss_mb()[0]
    for query in queries:
        brain.ask(query, 6)
    current, peak = rss_mb()
    print(json.dumps({"walls": walls, "cpu": cpu, "embed": embed, "ours": ours, "with_results": results,
                      "rss_after_search": after_search, "rss_after_ask": current, "rss_peak": peak}), flush=True)


def vector_rss(count: int, dim: int = 512) -> None:
    """RSS that `count` vectors cost in Chroma as the app configures it (cosine HNSW, ef_search 400), without a model:
    random unit vectors in a scratch store, then opened and queried by a fresh reader process."""
    import tempfile

    import chromadb
    import numpy as np
    from chromadb.config import Settings as ChromaSettings

    from rag_app.index.store import SEARCH_EF

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="vector-rss-") as path:
        client = chromadb.PersistentClient(path=path, settings=ChromaSettings(anonymized_telemetry=False))
        collection = client.create_collection("vectors", metadata={"hnsw:space": "cosine"})
        collection.modify(configuration={"hnsw": {"ef_search": SEARCH_EF}})
        began = time.perf_counter()
        for start in range(0, count, 5000):
            rows = rng.standard_normal((min(5000, count - start), dim)).astype(np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            collection.add(ids=[f"c{start + i}" for i in range(len(rows))], embeddings=rows,
                           metadatas=[{"note_id": f"n{(start + i) // 4}"} for i in range(len(rows))])
        print(f"Chroma alone: {count} × {dim} random vectors added in {time.perf_counter() - began:.0f} s")
        reader = subprocess.run([sys.executable, __file__, "--vector-read", path], capture_output=True, text=True)
        print(reader.stdout.strip() or reader.stderr.strip()[-500:])


def vector_read(path: str, dim: int = 512, queries: int = 100) -> None:
    """A fresh process: open the scratch store, query it, print its RSS."""
    import chromadb
    import numpy as np
    from chromadb.config import Settings as ChromaSettings

    before = rss_mb()[0]
    client = chromadb.PersistentClient(path=path, settings=ChromaSettings(anonymized_telemetry=False))
    collection = client.get_collection("vectors")
    opened = rss_mb()[0]
    rng = np.random.default_rng(1)
    walls = []
    for _ in range(queries):
        query = rng.standard_normal(dim).astype(np.float32)
        began = time.perf_counter()
        collection.query(query_embeddings=[(query / np.linalg.norm(query)).tolist()], n_results=40)
        walls.append((time.perf_counter() - began) * 1000)
    print(f"reader process RSS: {before:.0f} MB with chromadb imported, {opened:.0f} MB opened, {rss_mb()[0]:.0f} MB "
          f"after {queries} queries (+{rss_mb()[0] - before:.0f} MB); query p50 {statistics.median(walls):.1f} ms, "
          f"p95 {percentile(walls, 0.95):.1f} ms")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_rss(home: Path, count: int) -> None:
    """A real `brain serve`; `count` questions through the page's chat endpoint; its RSS from /proc."""
    from gradio_client import Client

    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen([BRAIN, "--home", str(home), "serve", "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    try:
        line = server.stdout.readline()
        if "http" not in line:
            print(f"brain serve did not start: {line.strip()!r}")
            return
        idle = rss_mb(server.pid)[0]
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        maker = TextMaker(13)
        began = time.perf_counter()
        for _ in range(count):
            client.predict(message=maker.query(), tags="", since="", until="", api_name="/chat")
        seconds = time.perf_counter() - began
        current, peak = rss_mb(server.pid)
        print(f"`brain serve` RSS: {idle:.0f} MB started, {current:.0f} MB after {count} questions through its HTTP "
              f"API (peak {peak:.0f} MB); {seconds / count * 1000:.0f} ms per question round trip")
    finally:
        server.terminate()
        server.wait(timeout=60)


def first_sync(home: Path, sources: list[str], fill_seconds: float | None) -> None:
    """A whole `brain sync` process; with `fill_seconds`, stopped by SIGTERM after that long filling vectors."""
    began = time.perf_counter()
    with open(home.parent / "sync.stdout", "w") as out, open(home.parent / "sync.stderr", "w") as err:
        sync = subprocess.Popen([BRAIN, "--home", str(home), "sync", *sources, "--json", "--no-progress"],
                                stdout=out, stderr=err, cwd=REPO)
    brain, filling_since, stopped = Brain(home), None, None
    while sync.poll() is None:
        time.sleep(2)
        if fill_seconds is None or not (home / "index.sqlite").exists():
            continue
        channels = brain.status()["channels"]
        if filling_since is None and channels.get("bm25", {}).get("complete") and channels["bm25"]["chunks"]:
            filling_since = time.perf_counter()
            print(f"BM25 complete ({channels['bm25']['chunks']} chunks) {filling_since - began:.0f} s after start")
        if filling_since is not None and time.perf_counter() - filling_since > fill_seconds:
            sync.send_signal(signal.SIGTERM)
            stopped = time.perf_counter()
            sync.wait()
            print(f"stopped by SIGTERM after {fill_seconds:.0f} s of vector fill: exit {sync.returncode} in "
                  f"{time.perf_counter() - stopped:.1f} s")
    wall = (stopped or time.perf_counter()) - began
    if sync.returncode not in (0, 130):
        sys.exit(f"brain sync failed ({sync.returncode}): {(home.parent / 'sync.stderr').read_text()[-500:]}")
    report = json.loads((home.parent / "sync.stdout").read_text())
    chunks, vectors = report["chunks_written"], sum(report["vectors"].values())
    print(f"first sync{' (stopped)' if stopped else ''}: {wall:.0f} s wall, {chunks} chunks written, {vectors} vectors "
          f"({vectors / max(wall, 1e-3):.1f}/s overall), {sum(s['added'] for s in report['sources'])} notes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notes", type=int, default=25_000)
    parser.add_argument("--sections", type=int, default=4)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("/tmp/brain-scale"))
    parser.add_argument("--skip-sync", action="store_true", help="measure an existing home under --out")
    parser.add_argument("--profile", action="store_true", help="cProfile the warm searches (to stderr)")
    parser.add_argument("--no-serve", action="store_true", help="skip the `brain serve` RSS")
    parser.add_argument("--fill-seconds", type=float, default=None,
                        help="stop the first sync (SIGTERM) after this long filling vectors; measure what is there")
    parser.add_argument("--sample", type=int, default=300, help="chunks for the raw encode rate")
    parser.add_argument("--vector-rss", type=int, metavar="N",
                        help="only: the RSS N random vectors cost in Chroma (the part a partial fill leaves out)")
    parser.add_argument("--vector-read", help=argparse.SUPPRESS)  # the reader process of --vector-rss
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child process of the warm phase
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.queries, args.profile)
        return
    if args.vector_read:
        vector_read(args.vector_read)
        return
    if args.vector_rss:
        vector_rss(args.vector_rss)
        return
    home, vault = args.out / "home", args.out / f"vault-{args.notes}x{args.sections}"
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other work slows every figure)")
    if not args.skip_sync:
        if not vault.exists():
            began = time.perf_counter()
            write_vault(vault, args.notes, args.sections)
            print(f"vault: {args.notes} notes written in {time.perf_counter() - began:.0f} s ({vault})")
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\nsecond_model = ""\n', encoding="utf-8")
        first_sync(home, ["--vault", str(vault)], args.fill_seconds)
    channels = Brain(home).status()["channels"]
    print("index measured: " + ", ".join(f"{name} {c['chunks']} chunks{'' if c['complete'] else ' (partial)'}"
                                         for name, c in channels.items()))
    if not args.skip_sync:
        rate, sampled = raw_encode_rate(home, "use-m3", args.sample)
        print(f"raw encode use-m3 ({sampled} of the same chunk texts, batches of 10, this process alone): "
              f"{rate:.1f} chunks/s")
    child = subprocess.run([sys.executable, __file__, "--measure", str(home), "--queries", str(args.queries)]
                           + (["--profile"] if args.profile else []), capture_output=True, text=True, cwd=REPO)
    if child.returncode != 0:
        sys.exit(f"warm phase failed: {child.stderr.strip()[-800:]}")
    first, warm = (json.loads(line) for line in child.stdout.splitlines() if line.startswith("{"))
    if args.profile:
        (args.out / "warm_profile.txt").write_text(child.stderr, encoding="utf-8")
        print(f"profile of the warm searches: {args.out / 'warm_profile.txt'}")
    walls = warm["walls"]
    print(f"warm process: first search {first['first_search_s']:.1f} s after start (opening the index), "
          f"RSS {first['rss_after_first']:.0f} MB")
    print(f"warm search, {len(walls)} varied queries (hybrid, k=10, {warm['with_results']} with results): "
          f"p50 {statistics.median(walls):.0f} ms, p95 {percentile(walls, 0.95):.0f} ms, max {max(walls):.0f} ms; "
          f"embed p50 {statistics.median(warm['embed']):.0f} ms, ours p50 {statistics.median(warm['ours']):.0f} ms, "
          f"ours p95 {percentile(warm['ours'], 0.95):.0f} ms; CPU time (all threads) p50 "
          f"{statistics.median(warm['cpu']):.0f} ms, p95 {percentile(warm['cpu'], 0.95):.0f} ms")
    print(f"RSS of that process: {warm['rss_after_search']:.0f} MB after {len(walls)} searches, "
          f"{warm['rss_after_ask']:.0f} MB after {len(walls)} asks too (peak {warm['rss_peak']:.0f} MB)")
    cold = []
    for query in ("电影清单", "quarterly review", "跑步 配速", "weekly backend latency", "咖啡会议"):
        began = time.perf_counter()
        subprocess.run([BRAIN, "--home", str(home), "search", query, "--json"], check=True, capture_output=True,
                       cwd=REPO)
        cold.append(time.perf_counter() - began)
    print(f"cold `brain search` ×{len(cold)} (whole process): median {statistics.median(cold):.2f} s, "
          f"best {min(cold):.2f} s, worst {max(cold):.2f} s")
    if not args.no_serve:
        serve_rss(home, args.queries)


if __name__ == "__main__":
    main()
