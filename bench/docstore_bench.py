"""Docstore benchmark: the SQLite KVDocumentStore (rag_app.index.docstore) against LlamaIndex's DuckDB docstore.

Writes N note Documents (deterministic mixed Chinese/English text, ~1.7 kB each: a 4-chunk note of the 100k-chunk
scale vault) the way a sync does (batches of 500: `set_document_hashes` + `add_documents`), then measures what a sync
asks of it: file size, the time to open it, key lookups of the hashes of 1 % of the notes (an edit), of all of them
(every note listed, e.g. after a parser change), one replaced batch, and `get_all_document_hashes` (what LlamaIndex's
own DUPLICATES_ONLY/UPSERTS_AND_DELETE would read). Each store is measured in a fresh process.

usage: python bench/docstore_bench.py [--notes 25000] [--out /tmp/docstore-bench] [--only sqlite|duckdb]
       (the DuckDB docstore comes with `pip install -e '.[bench]'`)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BATCH = 500
WORDS_EN = ("garden compost river memory sleep project deploy review budget travel music reading "
            "tomato winter summer lesson habit server notes plan").split()
WORDS_ZH = list("读书笔记电影清单周报计划旅行音乐睡眠习惯项目部署复盘预算花园河流记忆")


def note_text(rng: random.Random) -> str:
    sections = []
    for n in range(4):
        words = [rng.choice(WORDS_EN) if rng.random() < 0.6 else "".join(rng.choices(WORDS_ZH, k=2))
                 for _ in range(rng.randint(50, 90))]
        sections.append(f"## Section {n}\n\n" + " ".join(words))
    return "\n\n".join(sections)


def documents(count: int, seed: int = 1) -> list:
    from readers.records import NoteRecord

    rng = random.Random(seed)
    out = []
    for i in range(count):
        metadata = {"kind": "vault", "source": "bench", "title": f"Note {i}", "path": f"n/{i}.md",
                    "tags": '["bench"]', "links": "[]", "created": "2024-01-01T00:00:00Z", "created_ts": 1704067200}
        out.append(NoteRecord(f"vault:bench/n/{i}.md", note_text(rng), metadata,
                              volatile={"mtime_ts": 1704067200}).to_document())
    return out


def open_store(kind: str, path: Path):
    if kind == "sqlite":
        from llama_index.core.storage.docstore.keyval_docstore import KVDocumentStore

        from rag_app.index.docstore import SQLiteKVStore

        return KVDocumentStore(SQLiteKVStore(path / "docstore.sqlite"), namespace="notes")
    from llama_index.storage.docstore.duckdb import DuckDBDocumentStore
    from llama_index.storage.kvstore.duckdb import DuckDBKVStore

    class OfflineDuckDBKVStore(DuckDBKVStore):
        """Its `_initialize_table` calls `install_extension("json")`, which downloads and fails offline although
        DuckDB's wheel has JSON built in: the same table, loading the extension only."""

        @classmethod
        def _initialize_table(cls, conn, table_name):  # noqa: ANN001, ANN206 - LlamaIndex's signature
            conn.load_extension("json")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table_name} (key VARCHAR, collection VARCHAR, value JSON, "
                         f"PRIMARY KEY (key, collection)); "
                         f"CREATE INDEX IF NOT EXISTS collection_idx ON {table_name} (collection);")
            return conn.table(table_name)

    kvstore = OfflineDuckDBKVStore(database_name="docstore.duckdb", persist_dir=str(path))
    return DuckDBDocumentStore(kvstore, namespace="notes")


def close(store) -> None:  # noqa: ANN001
    """Close the database, so its size on disk is measured without a write-ahead log."""
    kvstore = store._kvstore
    if hasattr(kvstore, "close"):
        kvstore.close()
    else:
        kvstore.client.close()
        kvstore._shared_conn.close()


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def measure(kind: str, notes: int, out: Path) -> dict:
    """One store, in this process: write, reopen, look up."""
    import llama_index.core  # noqa: F401 - imported before the clock starts, as in a sync that has work

    where = out / kind
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    docs = documents(notes)
    figures: dict = {"store": kind, "notes": notes}
    store = open_store(kind, where)
    started = time.perf_counter()
    for start in range(0, len(docs), BATCH):
        batch = docs[start : start + BATCH]
        store.set_document_hashes({d.id_: d.hash for d in batch})
        store.add_documents(batch)
    figures["write_s"] = time.perf_counter() - started
    close(store)
    figures["size_mb"] = size_of(where) / 1e6
    started = time.perf_counter()
    store = open_store(kind, where)
    figures["open_s"] = time.perf_counter() - started
    ids = [d.id_ for d in docs]
    rng = random.Random(2)
    some = rng.sample(ids, max(1, notes // 100))
    started = time.perf_counter()
    assert all(store.get_document_hash(i) for i in some)
    figures["lookup_1pct_s"] = time.perf_counter() - started
    started = time.perf_counter()
    found = sum(1 for i in ids if store.get_document_hash(i))
    figures["lookup_all_s"] = time.perf_counter() - started
    assert found == notes, (found, notes)
    started = time.perf_counter()
    hashes = store.get_all_document_hashes()
    figures["get_all_hashes_s"] = time.perf_counter() - started
    assert len(hashes) == notes
    changed = documents(BATCH, seed=3)
    for old, new in zip(docs[:BATCH], changed, strict=True):
        new.id_ = old.id_
    started = time.perf_counter()
    store.set_document_hashes({d.id_: d.hash for d in changed})
    store.add_documents(changed)
    figures["replace_batch_s"] = time.perf_counter() - started
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notes", type=int, default=25_000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/docstore-bench"))
    parser.add_argument("--only", choices=["sqlite", "duckdb"])
    parser.add_argument("--child", choices=["sqlite", "duckdb"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.notes, args.out)))
        return
    print(f"load average {os.getloadavg()[0]:.1f}; {args.notes:,} notes")
    for kind in [args.only] if args.only else ["sqlite", "duckdb"]:
        done = subprocess.run([sys.executable, __file__, "--child", kind, "--notes", str(args.notes),
                               "--out", str(args.out)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{kind}: failed: {done.stderr.strip()[-400:]}")
            continue
        f = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{kind:7} size {f['size_mb']:.1f} MB, write {f['write_s']:.1f} s, open {f['open_s']:.3f} s, "
              f"hash lookups 1 % {f['lookup_1pct_s']:.3f} s / all {f['lookup_all_s']:.2f} s, "
              f"get_all_document_hashes {f['get_all_hashes_s']:.2f} s, replace {BATCH} {f['replace_batch_s']:.2f} s")


if __name__ == "__main__":
    main()
