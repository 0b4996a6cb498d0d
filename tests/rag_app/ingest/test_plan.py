"""The plan: a complete listing of one source against what the index holds says what to offer the docstore, what to
chunk whatever it holds, and what to delete. Whether an offered note changed is the docstore's decision, not the plan's
(test_sync_docstore.py)."""

from __future__ import annotations

import pytest

from rag_app.index.manifest import ManifestEntry
from rag_app.ingest.plan import make_plan
from readers.records import NoteRecord

CHUNKER = "md-v3:600:100"


def entry(record: NoteRecord, chunker: str = CHUNKER, model: str = "e5-small+use-m3") -> ManifestEntry:
    return ManifestEntry(record.id, "notes", record.content_hash, model, chunker, [f"{record.id}:chunk:0"])


A, B, C = (NoteRecord(f"vault:notes/{n}.md", f"text of {n}", {"title": n}) for n in "abc")


def test_listed_notes_are_offered_new_ones_forced_and_missing_ones_deleted():
    edited = NoteRecord(B.id, "new text", {"title": "b"})
    plan = make_plan({B.id: entry(B), C.id: entry(C)}, [A, edited], set(), CHUNKER)
    assert [r.id for r in plan.offered] == [A.id, B.id]
    assert (plan.new, plan.forced, plan.deleted, plan.unchanged) == ({A.id}, {A.id}, [C.id], 0)


def test_the_plan_does_not_compare_hashes_an_unedited_record_is_still_offered():
    """The docstore decides: a record the index holds under the same hash is offered, not planned away."""
    plan = make_plan({A.id: entry(A)}, [A], set(), CHUNKER)
    assert ([r.id for r in plan.offered], plan.forced, plan.new) == ([A.id], set(), set())


def test_a_note_that_exists_but_could_not_be_read_is_kept_not_deleted():
    plan = make_plan({A.id: entry(A), C.id: entry(C)}, [], {C.id}, CHUNKER, unchanged_ids={A.id})
    assert (plan.deleted, plan.unchanged, plan.offered) == ([], 1, [])


def test_a_new_chunker_forces_every_listed_note():
    plan = make_plan({A.id: entry(A, chunker="md-v3:300:50")}, [A], set(), CHUNKER)
    assert plan.forced == {A.id} and plan.new == set()


def test_a_note_listed_twice_is_offered_once():
    assert [r.id for r in make_plan({}, [A, A], set(), CHUNKER).offered] == [A.id]


def test_unchanged_ids_without_records_must_be_current():
    assert make_plan({A.id: entry(A)}, [], set(), CHUNKER, unchanged_ids={A.id}).unchanged == 1
    with pytest.raises(ValueError, match="listed as unchanged"):
        make_plan({A.id: entry(A, chunker="old")}, [], set(), CHUNKER, unchanged_ids={A.id})
