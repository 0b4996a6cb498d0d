"""No-change vault sync benchmark: the wall time of whole `brain sync` processes over a real vault nothing changed in.

Indexes the vaults once into a home (fast model, no second channel; an existing home keeps its config and sources),
then runs `brain --home H sync` again and again and prints the wall and CPU time of whole processes (imports included).
Exits 0 with a message when a vault folder is absent (the real vaults live outside the repository).

usage: python bench/vault_nochange_bench.py VAULT [VAULT ...] [--home DIR] [--runs 10] [--model use-m3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BRAIN = Path(sys.executable).parent / "brain"


def timed_brain(home: Path, *args: str) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds, JSON report) of one whole `brain --home H ... --json` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([str(BRAIN), "--home", str(home), *args, "--json", "--no-progress"],
                          capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"brain {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("vaults", nargs="+", type=Path)
    parser.add_argument("--home", type=Path, default=None, help="default: bench/out/nochange/<vault names>")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--model", default="use-m3")
    args = parser.parse_args()
    missing = [str(v) for v in args.vaults if not v.is_dir()]
    if missing:
        print(f"skipped: vault folder not found: {', '.join(missing)}")
        return
    names = [v.resolve().parent.name if v.resolve().name == "vault" else v.resolve().name for v in args.vaults]
    home = args.home or REPO / "bench" / "out" / "nochange" / "+".join(names)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "config.toml").exists():  # a new home: these vaults as named sources (two may share a folder name)
        config = f'[embedding]\nmodel = "{args.model}"\nsecond_model = ""\n'
        for i, (name, vault) in enumerate(zip(names, args.vaults, strict=True)):
            config += f'\n[[sources]]\nname = "{name}-{i}"\nkind = "vault"\npath = "{vault.resolve()}"\n'
        (home / "config.toml").write_text(config, encoding="utf-8")
    wall, _, report = timed_brain(home, "sync")
    notes = sum(s["added"] + s["updated"] + s["unchanged"] for s in report["sources"])
    print(f"first sync in this run: {wall:.1f} s wall, {report['chunks_written']} chunks embedded, {notes} notes")
    walls, cpus = [], []
    for _ in range(args.runs):
        wall, cpu, report = timed_brain(home, "sync")
        if report["chunks_written"] or report["model_loaded"]:
            sys.exit(f"not a no-change sync: {report}")
        walls.append(wall)
        cpus.append(cpu)
    print(f"no-change sync, {notes} notes, whole process ({args.runs} runs): wall best {min(walls):.2f} s, "
          f"median {statistics.median(walls):.2f} s, worst {max(walls):.2f} s; "
          f"CPU (user+sys) median {statistics.median(cpus):.2f} s")


if __name__ == "__main__":
    main()
