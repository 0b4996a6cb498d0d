"""Remote embeddings: chunks/s against the OpenAI-compatible double with a fixed per-request delay, by concurrency.

Rows, for concurrency 1, 2, 4, 8:
- `ours`: the `openai:` model as the sync uses it (rag_app.index.embeddings: requests of `--batch` texts, a thread
  pool over the integration's sync call, retries);
- `async`: LlamaIndex's own async batch path (`OpenAILikeEmbedding(num_workers=c).aget_text_embedding_batch`), for
  comparison; note that it bounds nothing at num_workers=1: all requests go out at once;
- `sync`: a whole `brain sync` of a vault through the engine (chunking, Chroma, manifest, BM25), with `--sync-notes`.
The ceiling is concurrency × batch / delay.

usage: python bench/remote_embed_bench.py [--chunks 1024] [--delay 0.05] [--batch 16] [--sync-notes 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.doubles.embeddings_server import EmbeddingsDouble  # noqa: E402
from tests.doubles.memos_server import _EN, _ZH  # noqa: E402 - the double's own realistic sentences

CONCURRENCY = (1, 2, 4, 8)


def chunk_texts(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"笔记 {i}\n\n" + " ".join(rng.choice(_ZH + _EN) for _ in range(rng.randint(2, 6))) for i in range(count)]


def ours(url: str, texts: list[str], concurrency: int, batch: int) -> float:
    from rag_app.config import RemoteEmbedding
    from rag_app.index.embeddings import server_embedding

    model = server_embedding("bench", None, RemoteEmbedding(base_url=url, batch_size=batch, concurrency=concurrency))
    model.get_text_embedding_batch(texts[:1])  # connect and warm up
    started = time.perf_counter()
    vectors = model.get_text_embedding_batch(texts)
    assert len(vectors) == len(texts)
    return len(texts) / (time.perf_counter() - started)


def integration_async(url: str, texts: list[str], concurrency: int, batch: int) -> float:
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    async def run() -> float:
        model = OpenAILikeEmbedding(model_name="bench", api_base=url, api_key="unused", embed_batch_size=batch,
                                    num_workers=concurrency, max_retries=0)
        await model.aget_text_embedding_batch(texts[:1])
        started = time.perf_counter()
        vectors = await model.aget_text_embedding_batch(texts)
        rate = len(texts) / (time.perf_counter() - started)
        assert len(vectors) == len(texts)
        await model._get_aclient().close()  # inside its loop: a client closed after the loop is gone raises noise
        return rate

    return asyncio.run(run())


def whole_sync(url: str, notes: int, concurrency: int, batch: int, root: Path) -> float:
    """Chunks/s of one `Brain.sync` of a fresh vault into a fresh home (model load excluded: there is none)."""
    from bench.sync_bench import write_vault
    from rag_app.engine import Brain

    vault = root / "vault"
    if not vault.exists():
        write_vault(vault, notes)
    home = root / f"home-{concurrency}"
    home.mkdir()
    (home / "config.toml").write_text(f'[embedding]\nmodel = "openai:bench"\nbase_url = "{url}"\n'
                                      f"batch_size = {batch}\nconcurrency = {concurrency}\n", encoding="utf-8")
    started = time.perf_counter()
    report = Brain(home).sync(vaults=(str(vault),))
    seconds = time.perf_counter() - started
    if report.failed:
        sys.exit(f"sync failed: {report.sources[0].error}")
    return report.chunks_written / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1024)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds the double sleeps per request")
    parser.add_argument("--batch", type=int, default=16, help="texts per request")
    parser.add_argument("--sync-notes", type=int, default=300, help="notes of the whole-sync row (0: skip it)")
    args = parser.parse_args()
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    for var in ("EMBEDDING_BASE_URL", "EMBEDDING_API_KEY", "OPENAI_API_KEY"):
        os.environ.pop(var, None)
    texts = chunk_texts(args.chunks)
    rows: dict[str, list[float]] = {"ours": [], "async": [], "sync": []}
    with EmbeddingsDouble(delay=args.delay) as double, tempfile.TemporaryDirectory() as tmp:
        for concurrency in CONCURRENCY:
            rows["ours"].append(ours(double.url, texts, concurrency, args.batch))
            rows["async"].append(integration_async(double.url, texts, concurrency, args.batch))
            if args.sync_notes:
                rows["sync"].append(whole_sync(double.url, args.sync_notes, concurrency, args.batch, Path(tmp)))
    print(f"chunks/s against the double: {args.delay * 1000:g} ms per request, {args.batch} texts a request, "
          f"{args.chunks} chunks (sync: {args.sync_notes} notes)")
    print("| path | " + " | ".join(f"c={c}" for c in CONCURRENCY) + " |")
    print("|---|" + "---|" * len(CONCURRENCY))
    print("| ceiling (c × batch / delay) | " + " | ".join(f"{c * args.batch / args.delay:.0f}" for c in CONCURRENCY)
          + " |")
    labels = {"ours": "ours (thread pool, sync call)", "async": "LlamaIndex async batch path",
              "sync": "whole `brain sync` (engine)"}
    for name, values in rows.items():
        if values:
            print(f"| {labels[name]} | " + " | ".join(f"{v:.0f}" for v in values) + " |")


if __name__ == "__main__":
    main()
