"""BEIR-layout eval sets from ../shared/eval turned into vaults, so benchmarks go through the real ingestion path.

The data is read from where it lies (its licences forbid copying it into the repo); vaults are written under bench/out.
Traditional Chinese variants are derived by conversion (zhconv, zh-tw): `SET@hant-q` asks the queries in Traditional
against the set's own (Simplified) notes; `SET@hant` converts notes and queries both (a vault of its own).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SEMANTIC_VAULT = "vaults/vault_en_vaultofknowledge/vault"


@dataclass
class EvalSet:
    name: str
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    corpus_path: Path
    vault_dir: Path | None = None
    path_to_doc: dict[str, str] = field(default_factory=dict)
    script: str = ""
    kinds: dict[str, str] = field(default_factory=dict)  # query id → kind (locomo category, semantic_dev kind)

    @property
    def home_name(self) -> str:
        """The synced home this set searches: query-only variants share their base set's home."""
        return self.name.partition("@")[0] if self.script == "hant-q" else self.name


def _traditional(text: str) -> str:
    import zhconv

    return zhconv.convert(text, "zh-tw")


def load_set(shared: Path, name: str) -> EvalSet:
    base, _, script = name.partition("@")
    if script not in ("", "hant", "hant-q"):
        raise ValueError(f"unknown variant @{script} (use @hant or @hant-q)")
    root = shared / "eval" / base
    queries, kinds = {}, {}
    for line in (root / "queries.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        queries[str(row["_id"])] = _traditional(str(row["text"])) if script else str(row["text"])
        if "kind" in row or "category" in row:
            kinds[str(row["_id"])] = str(row.get("kind") or f"category {row['category']}")
    qrels: dict[str, dict[str, int]] = {}
    for n, line in enumerate((root / "qrels.tsv").open(encoding="utf-8")):
        parts = line.rstrip("\n").split("\t")
        if n == 0 or len(parts) < 3 or int(parts[2]) <= 0:
            continue
        qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries = {q: t for q, t in queries.items() if q in qrels}
    return EvalSet(name, queries, qrels, root / "corpus.jsonl", script=script,
                   kinds={q: k for q, k in kinds.items() if q in queries})


def _safe(doc_id: str) -> str:
    return re.sub(r"[^\w.\-]+", "_", doc_id)[:120]


def materialise(shared: Path, eval_set: EvalSet, out: Path) -> EvalSet:
    """Write one note per corpus document (or point at the real vault for semantic_dev)."""
    if eval_set.name == "semantic_dev":
        eval_set.vault_dir = shared / SEMANTIC_VAULT
        for line in eval_set.corpus_path.open(encoding="utf-8"):
            doc_id = json.loads(line)["_id"]
            eval_set.path_to_doc[doc_id] = doc_id
        return eval_set
    vault = out / "vaults" / eval_set.home_name
    vault.mkdir(parents=True, exist_ok=True)
    for line in eval_set.corpus_path.open(encoding="utf-8"):
        row = json.loads(line)
        doc_id = str(row["_id"])
        rel = f"{_safe(doc_id)}.md"
        eval_set.path_to_doc[rel] = doc_id
        title = str(row.get("title") or "").replace("\n", " ").strip()
        body = str(row.get("text") or "")
        if eval_set.script == "hant":
            title, body = _traditional(title), _traditional(body)
        front = f"---\ntitle: {json.dumps(title, ensure_ascii=False)}\n---\n" if title else ""
        target = vault / rel
        content = front + body + "\n"
        if not target.exists() or target.read_text(encoding="utf-8") != content:
            target.write_text(content, encoding="utf-8")
    eval_set.vault_dir = vault
    return eval_set


def unfilled_channels(home: Path) -> list[str]:
    """The home's search channels still filling vectors (a sync reports before its vectors are in)."""
    from rag_app.engine import Brain

    brain = Brain(home)
    try:
        return [c for c, v in brain.status()["channels"].items() if not v["complete"]]
    finally:
        brain.close()


def synced_home(path: str) -> Path:
    """A HOME of a HOME=FILE spec, or exit: a path that holds no synced home would open as a new, empty one and
    measure zeros."""
    home = Path(path)
    if not (home / "index.sqlite").exists():
        sys.exit(f"{home} holds no synced home (no index.sqlite): sync a vault into it first "
                 f"(brain --home {home} sync)")
    return home


def ready_home(out: Path, eval_set: EvalSet, model: str) -> Path:
    """The set's bench home, or exit: missing, or still filling vectors (the engine searches only complete channels,
    so measuring now would quietly score fewer channels)."""
    home = out / "homes" / f"{eval_set.home_name}-{model}"
    if not (home / "index.sqlite").exists():
        sys.exit(f"{home} is missing: run python bench/prepare_eval.py --model {model} {eval_set.name}")
    unfilled = unfilled_channels(home)
    if unfilled:
        sys.exit(f"{home}: {', '.join(unfilled)} still filling (brain --home {home} status); try again when done")
    return home
