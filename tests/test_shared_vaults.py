"""Opt-in (`make test-slow`): ingest the two real vaults in ../shared/vaults and report counts and skips."""

from __future__ import annotations

import pytest

from rag_app.engine import Brain
from tests.conftest import SHARED

VAULTS = sorted((SHARED / "vaults").glob("*/vault")) if (SHARED / "vaults").is_dir() else []


@pytest.mark.slow
@pytest.mark.skipif(not VAULTS, reason="../shared/vaults not present")
@pytest.mark.parametrize("vault", VAULTS, ids=lambda p: p.parent.name)
def test_real_vault_ingests_completely(home, vault):
    md_files = [p for p in vault.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(vault).parts)]
    report = Brain(home).sync(vaults=(str(vault),))
    source = report.sources[0]
    print(f"\n{vault.parent.name}: {len(md_files)} .md files, {source.added} notes, {report.chunks_written} chunks, "
          f"{source.skipped} skipped, {len(source.warnings)} warnings, {report.seconds:.0f} s")
    for warning in source.warnings[:20]:
        print("  -", warning)
    assert not source.failed
    assert source.added + source.skipped >= len(md_files) * 0.99
    status = Brain(home).status()
    assert status["notes"] == source.added
    again = Brain(home).sync(vaults=(str(vault),))
    assert again.chunks_written == 0 and again.sources[0].unchanged == source.added
