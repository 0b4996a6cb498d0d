"""Home size: what each store of a home takes on disk after a full sync (issue 31: each text stored once).

Writes scale_bench's deterministic vault (frontmatter, 4 heading sections per note), syncs it with the fast model
into a fresh home and prints the bytes of every store (docstore, manifest, Chroma, BM25), then per note. The
figure to compare is the total at a given note count; the issue's 25,000 notes take ~25 min of fill here, so the
default is 2,500 and the per-note figure scales (every note is the same size by construction).

    nice -n 10 .venv/bin/python bench/home_size_bench.py --notes 2500 --out /tmp/brain-size [--code ../before]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_bench import write_vault  # noqa: E402


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def store_sizes(home: Path) -> dict[str, int]:
    """Bytes per store: each top-level file or folder of the home (SQLite WAL files counted with their database)."""
    sizes: dict[str, int] = {}
    for entry in sorted(home.iterdir()):
        name = entry.name.removesuffix("-wal").removesuffix("-shm")
        sizes[name] = sizes.get(name, 0) + tree_bytes(entry)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notes", type=int, default=2_500)
    parser.add_argument("--out", type=Path, default=Path("/tmp/brain-size"))
    parser.add_argument("--skip-sync", action="store_true", help="measure the home already under --out")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose brain syncs (another worktree: a before/after pair)")
    args = parser.parse_args()
    home, vault = args.out / "home", args.out / "vault"
    if not args.skip_sync:
        shutil.rmtree(args.out, ignore_errors=True)
        write_vault(vault, args.notes)
        home.mkdir(parents=True)
        (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\nsecond_model = ""\n', encoding="utf-8")
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "rag_app.shells.cli", "--home", str(home), "sync", "--vault", str(vault),
                        "--no-progress"], check=True, stdout=subprocess.DEVNULL, cwd=args.code)
        print(f"synced {args.notes} notes in {time.monotonic() - started:.0f} s")
    sizes = store_sizes(home)
    total = sum(sizes.values())
    notes_bytes = tree_bytes(vault) if vault.exists() else 0
    print(f"vault: {notes_bytes / 1e6:.1f} MB of note files")
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<24} {size / 1e6:8.1f} MB  {size / args.notes / 1e3:6.1f} kB/note")
    at_scale = total / args.notes * 25_000 / 1e6
    print(f"home total: {total / 1e6:.1f} MB, {total / args.notes / 1e3:.1f} kB/note, "
          f"{total / max(notes_bytes, 1):.1f}× the note files; at 25,000 notes ≈ {at_scale:.0f} MB")


if __name__ == "__main__":
    main()
