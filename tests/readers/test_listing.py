"""The listing half of the readers: the pass `brain sync` makes before it knows whether LlamaIndex is needed."""

from __future__ import annotations

import subprocess
import sys

from readers.listing import VaultLister
from readers.listing_reader import ListingReader
from readers.vault_reader import VaultReader
from tests.conftest import REPO


def test_listing_a_vault_imports_no_llama_index(make_vault) -> None:
    """Importing LlamaIndex costs 1.2-1.4 s; a sync that finds nothing changed must not pay it."""
    vault = make_vault({"a.md": "# A\n\nalpha", "b.md": "beta"})
    code = ("import sys; from readers.listing import VaultLister; "
            f"listing = VaultLister({str(vault)!r}).list(); "
            "print(len(listing.records), any(m.startswith('llama_index') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["2", "False"]


def test_a_reader_over_a_listing_yields_its_documents_without_listing_again(make_vault) -> None:
    """What sync does: list, then take the Documents of that very pass; the folder is not read a second time."""
    vault = make_vault({"a.md": "# A\n\nalpha", "b.md": "beta"})
    lister = VaultLister(vault, name="work")
    listing = lister.list()
    (vault / "c.md").write_text("written after the listing", encoding="utf-8")
    reader = VaultReader.from_lister(lister)
    assert isinstance(reader, ListingReader) and reader.lister is lister
    documents = list(reader.lazy_load_data(listing=listing))
    assert [d.id_ for d in documents] == ["vault:work/a.md", "vault:work/b.md"]
    assert reader.listing is listing and reader.signatures == listing.signatures
    assert [d.id_ for d in reader.load_data()] == ["vault:work/a.md", "vault:work/b.md", "vault:work/c.md"]
