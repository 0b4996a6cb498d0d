"""Sync benchmark: 3,000 memos from the Memos double + 3,000 vault notes, through the real `brain` command.

Prints: cold sync time and chunks/s; the raw encode rate of the same chunk texts with the same model (the ratio shows
the pipeline's overhead); the wall time of a whole no-change `brain sync` process; a 1%-changed sync.

usage: python bench/sync_bench.py [--memos 3000] [--notes 3000] [--model e5-small] [--out bench/out/sync]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.doubles.memos_server import _EN, _TAGS, _ZH  # noqa: E402 - the double's own realistic sentences

TOKEN = "memos_pat_bench"


def write_vault(root: Path, count: int, seed: int = 1) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for i in range(count):
        folder = root / rng.choice(["daily", "work", "reading", "生活", "tech"])
        folder.mkdir(parents=True, exist_ok=True)
        sentences = [rng.choice(_ZH + _EN) for _ in range(rng.randint(3, 12))]
        tags = " ".join(f"#{t}" for t in rng.sample(_TAGS, 2))
        body = f"---\ntitle: 笔记 {i}\ncreated: 2024-{1 + i % 12:02d}-{1 + i % 28:02d}\n---\n# 笔记 {i}\n\n"
        body += "\n\n".join(" ".join(sentences[j : j + 3]) for j in range(0, len(sentences), 3)) + f"\n\n{tags}\n"
        path = folder / f"note-{i:05d}.md"
        path.write_text(body, encoding="utf-8")
        paths.append(path)
    return paths


def brain(home: Path, *args: str, env: dict[str, str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "brain"), "--home", str(home), *args],
                          capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"brain {' '.join(args)} failed: {done.stderr}")
    return wall, json.loads(done.stdout) if "--json" in args else {}


def raw_encode_rate(home: Path, model: str, sample: int) -> tuple[float, int]:
    """Encode the same chunk texts the pipeline embedded (title + heading + text), with the model alone."""
    from rag_app.index.embeddings import load_embedding

    db = sqlite3.connect(str(home / "index.sqlite"))
    rows = db.execute("SELECT text, metadata FROM chunks").fetchall()
    rng = random.Random(0)
    rows = rng.sample(rows, min(sample, len(rows)))
    texts = []
    for text, metadata in rows:
        meta = json.loads(metadata)
        head = "\n".join(v for v in (meta.get("title"), meta.get("heading")) if v)
        texts.append(f"{head}\n\n{text}")
    embed = load_embedding(model)
    started = time.perf_counter()
    for i in range(0, len(texts), 10):
        embed.get_text_embedding_batch(texts[i : i + 10])
    return len(texts) / (time.perf_counter() - started), len(texts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memos", type=int, default=3000)
    parser.add_argument("--notes", type=int, default=3000)
    parser.add_argument("--model", default="e5-small")
    parser.add_argument("--sample", type=int, default=600, help="chunks for the raw encode rate")
    parser.add_argument("--second-model", default=None, help='"" to sync without the second dense channel')
    parser.add_argument("--out", default=str(REPO / "bench" / "out" / "sync"))
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    home, vault = out / "home", out / "vault"
    home.mkdir(parents=True)
    second = f'second_model = "{args.second_model}"\n' if args.second_model is not None else ""
    (home / "config.toml").write_text(f'[embedding]\nmodel = "{args.model}"\n{second}', encoding="utf-8")
    notes = write_vault(vault, args.notes)
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests/doubles/memos_server.py"), "--mode", "head", "--count", str(args.memos),
         "--port", "0", "--token", TOKEN], stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        env = {**os.environ, "CFLOW_API_TOKEN": TOKEN}
        source_args = ["--memos", url, "--vault", str(vault), "--json", "--no-progress"]
        cold_wall, cold = brain(home, "sync", *source_args, env=env)
        chunks = cold["chunks_written"]
        print(f"cold sync: {cold_wall:.1f} s wall, {chunks} chunks, {chunks / cold['seconds']:.1f} chunks/s "
              f"({sum(s['added'] for s in cold['sources'])} notes)")
        rate, sampled = raw_encode_rate(home, args.model, args.sample)
        pipeline_rate = chunks / cold["seconds"]
        print(f"raw encode ({args.model}, {sampled} of the same chunk texts): {rate:.1f} chunks/s; "
              f"pipeline/raw = {pipeline_rate / rate:.2f}")
        memo_only = ["--memos", url, "--json", "--no-progress"]
        walls = [brain(home, "sync", *memo_only, env=env)[0] for _ in range(3)]
        print(f"no-change sync, {args.memos} memos, whole process: best {min(walls):.2f} s, "
              f"median {sorted(walls)[1]:.2f} s")
        walls = [brain(home, "sync", *source_args, env=env)[0] for _ in range(3)]
        print(f"no-change sync, {args.memos} memos + {args.notes} notes, whole process: best {min(walls):.2f} s")
        changed = random.Random(2).sample(notes, max(1, len(notes) // 100))
        for path in changed:
            path.write_text(path.read_text(encoding="utf-8") + "\n补充：今天又想到一点。\n", encoding="utf-8")
        wall, report = brain(home, "sync", *source_args, env=env)
        print(f"1%-changed sync ({len(changed)} notes): {wall:.1f} s wall, {report['chunks_written']} chunks "
              f"re-embedded, model loaded: {report['model_loaded']}")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
