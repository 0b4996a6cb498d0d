"""Specification of the LlamaIndex view of a Memos server: one Document per memo, token from the environment."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from readers.memos_client import MemosAuthError, MemosError, fetch_memos
from readers.memos_reader import MemosReader
from tests.doubles.memos_server import MemosDouble

TOKEN = "memos_pat_test"  # the token the double accepts by default


@dataclass
class Memos:
    """A head double with one memo of each kind."""

    double: MemosDouble
    private: str
    public: str
    archived: str
    comment: str

    def ids(self, *keys: str, source: str = "memos") -> list[str]:
        return sorted(f"memos:{source}/{key}" for key in keys)


@pytest.fixture
def memos(monkeypatch: pytest.MonkeyPatch) -> Iterator[Memos]:
    """A running double and an environment without tokens."""
    monkeypatch.delenv("CFLOW_API_TOKEN", raising=False)
    monkeypatch.delenv("MEMOS_TOKEN", raising=False)
    with MemosDouble("head") as double:
        private = double.add_memo("# 读书笔记\n\n私人想法 #读书", pinned=True)
        yield Memos(
            double=double,
            private=private,
            public=double.add_memo("Weekly review #review", visibility="PUBLIC"),
            archived=double.add_memo("Old plan", archived=True),
            comment=double.add_memo("A reply", parent=private),
        )


def test_load_data_returns_one_document_per_record(memos: Memos) -> None:
    """Document ids, text and metadata are those of the records `fetch_memos` produces."""
    documents = MemosReader(memos.double.url, token=TOKEN).load_data()
    records = fetch_memos(memos.double.url, TOKEN).records
    assert sorted(d.id_ for d in documents) == memos.ids(memos.private, memos.public, memos.comment)
    assert {d.id_: (d.text, d.metadata) for d in documents} == {r.id: (r.text, r.metadata) for r in records}
    private = next(d for d in documents if d.id_ == f"memos:memos/{memos.private}")
    assert (private.metadata["title"], private.metadata["url"]) == (
        "读书笔记",
        f"{memos.double.url}/memos/{memos.private}",
    )


@pytest.mark.parametrize("variable", ["CFLOW_API_TOKEN", "MEMOS_TOKEN"])
def test_the_token_comes_from_the_environment(memos: Memos, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """Without a token argument, CFLOW_API_TOKEN (or MEMOS_TOKEN) is used, so PRIVATE memos are read."""
    monkeypatch.setenv(variable, TOKEN)
    reader = MemosReader(memos.double.url)
    assert sorted(d.id_ for d in reader.load_data()) == memos.ids(memos.private, memos.public, memos.comment)
    assert reader.warnings == []
    assert {r["auth"] for r in memos.double.requests} == {f"Bearer {TOKEN}"}


def test_cflow_api_token_wins_over_memos_token(memos: Memos, monkeypatch: pytest.MonkeyPatch) -> None:
    """When both are set, CFLOW_API_TOKEN is the one sent."""
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_wrong")
    monkeypatch.setenv("MEMOS_TOKEN", TOKEN)
    with pytest.raises(MemosAuthError, match="CFLOW_API_TOKEN"):
        MemosReader(memos.double.url).load_data()
    assert {r["auth"] for r in memos.double.requests} == {"Bearer memos_pat_wrong"}


def test_a_token_argument_beats_the_environment(memos: Memos, monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit token is used as given, even an empty one (anonymous reading)."""
    monkeypatch.setenv("CFLOW_API_TOKEN", TOKEN)
    reader = MemosReader(memos.double.url, token="")
    assert [d.id_ for d in reader.load_data()] == memos.ids(memos.public)
    assert reader.warnings == ["no token set (CFLOW_API_TOKEN): only PUBLIC memos are visible"]


def test_options_reach_the_listing(memos: Memos) -> None:
    """include_archived, include_comments and source change what is read and how it is labelled."""
    reader = MemosReader(memos.double.url, token=TOKEN, include_archived=True, include_comments=False, source="cflow")
    documents = reader.load_data()
    assert sorted(d.id_ for d in documents) == memos.ids(memos.private, memos.public, memos.archived, source="cflow")
    assert {d.metadata["source"] for d in documents} == {"cflow"}


def test_an_incomplete_listing_raises_instead_of_returning_part(memos: Memos) -> None:
    """A malformed page fails the load: returning fewer documents would look like deletions."""
    memos.double.faults["truncate_page"] = 0
    with pytest.raises(MemosError, match="malformed JSON"):
        MemosReader(memos.double.url, token=TOKEN).load_data()


def test_a_reader_handed_what_the_index_knows_yields_only_new_and_changed_memos(memos: Memos) -> None:
    """Known hashes that still match yield nothing; an edited and a new memo do; a deleted one is listed as gone."""
    first = {d.id_: d.hash for d in MemosReader(memos.double.url, token=TOKEN).load_data()}
    memos.double.edit_memo(memos.public, "Weekly review, edited #review")
    memos.double.delete_memo(memos.comment)
    new = memos.double.add_memo("A new thought")
    reader = MemosReader(memos.double.url, token=TOKEN, known=first)
    assert sorted(d.id_ for d in reader.lazy_load_data()) == memos.ids(memos.public, new)
    assert reader.unchanged_ids == set(memos.ids(memos.private))
    assert reader.gone_ids == set(memos.ids(memos.comment))


def test_a_known_memo_without_a_hash_is_read_again(memos: Memos) -> None:
    reader = MemosReader(memos.double.url, token=TOKEN, known=dict.fromkeys(memos.ids(memos.private), ""))
    assert f"memos:memos/{memos.private}" in {d.id_ for d in reader.load_data()}
    assert reader.unchanged_ids == set()


def test_an_oversized_memo_is_kept_not_gone(memos: Memos) -> None:
    """A memo over max_memo_bytes is not read; a reader that knew it lists it as kept, so its copy stays."""
    memos.double.edit_memo(memos.public, "long " * 100)
    known = dict.fromkeys(memos.ids(memos.public), "an older hash")
    reader = MemosReader(memos.double.url, token=TOKEN, known=known, max_memo_bytes=100)
    assert f"memos:memos/{memos.public}" not in {d.id_ for d in reader.load_data()}
    assert (reader.kept_ids, reader.gone_ids) == (set(memos.ids(memos.public)), set())
    assert any("max_memo_bytes" in warning for warning in reader.warnings)


def test_limits_reach_the_client(memos: Memos) -> None:
    """The client's limits are reader keywords: a listing over max_memos fails whole, naming the limit."""
    with pytest.raises(MemosError, match="max_memos"):
        MemosReader(memos.double.url, token=TOKEN, max_memos=1).load_data()


def test_the_token_never_shows_in_the_reader(memos: Memos) -> None:
    assert TOKEN not in repr(MemosReader(memos.double.url, token=TOKEN))


def _parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the memos `memo_to_record` parses from now on."""
    from readers import memos_client

    names: list[str] = []
    original = memos_client.memo_to_record
    monkeypatch.setattr(memos_client, "memo_to_record",
                        lambda memo, *args, **kwargs: names.append(str(memo.get("name"))) or original(memo, *args,
                                                                                                           **kwargs))
    return names


def test_a_memo_whose_answer_still_matches_its_signature_is_not_parsed(memos: Memos, monkeypatch) -> None:
    """With the signatures of an earlier pass, unchanged memos are listed by id without parsing; an edited one is
    parsed and yielded, and it gets a new signature."""
    first = MemosReader(memos.double.url, token=TOKEN)
    hashes = {d.id_: d.hash for d in first.load_data()}
    assert set(first.signatures) == set(hashes)
    memos.double.edit_memo(memos.public, "Weekly review, edited #review")
    parsed = _parsed(monkeypatch)
    reader = MemosReader(memos.double.url, token=TOKEN, known=hashes, signatures=first.signatures)
    assert [d.id_ for d in reader.load_data()] == memos.ids(memos.public)
    assert parsed == [f"memos/{memos.public}"]
    assert reader.unchanged_ids == set(memos.ids(memos.private, memos.comment))
    assert set(reader.signatures) == set(memos.ids(memos.public))
    assert reader.signatures[memos.ids(memos.public)[0]] != first.signatures[memos.ids(memos.public)[0]]


def test_a_signature_holds_only_for_the_same_server_and_source(memos: Memos, monkeypatch) -> None:
    """The record of a memo also depends on the source name (its id) and the server (its URL): another one parses."""
    first = MemosReader(memos.double.url, token=TOKEN)
    hashes = {d.id_: d.hash for d in first.load_data()}
    renamed = {note_id.replace("memos:memos/", "memos:work/"): value for note_id, value in first.signatures.items()}
    parsed = _parsed(monkeypatch)
    reader = MemosReader(memos.double.url, token=TOKEN, source="work", signatures=renamed,
                         known={i.replace("memos:memos/", "memos:work/"): h for i, h in hashes.items()})
    documents = reader.load_data()
    assert len(parsed) == 3 and {d.metadata["source"] for d in documents} == {"work"}


def test_an_oversized_memo_is_warned_about_at_every_pass(memos: Memos) -> None:
    """Its signature is never recorded, so a pass with the earlier signatures still keeps it with a warning."""
    memos.double.edit_memo(memos.public, "long " * 100)
    first = MemosReader(memos.double.url, token=TOKEN, max_memo_bytes=100)
    hashes = {d.id_: d.hash for d in first.load_data()}
    assert memos.ids(memos.public)[0] not in first.signatures
    known = {**hashes, memos.ids(memos.public)[0]: "an older hash"}
    again = MemosReader(memos.double.url, token=TOKEN, max_memo_bytes=100, known=known, signatures=first.signatures)
    assert again.load_data() == [] and again.kept_ids == set(memos.ids(memos.public))
    assert any("max_memo_bytes" in warning for warning in again.warnings)


def test_a_memo_over_a_lowered_max_memo_bytes_is_warned_about_though_its_signature_matches(memos: Memos) -> None:
    """The limit decides whether a memo is read: a pass under a lower limit than the one its signature was recorded
    under keeps the indexed copy and says so, as for any oversized memo."""
    memos.double.edit_memo(memos.public, "long " * 100)
    first = MemosReader(memos.double.url, token=TOKEN)
    hashes = {d.id_: d.hash for d in first.load_data()}
    assert memos.ids(memos.public)[0] in first.signatures
    again = MemosReader(memos.double.url, token=TOKEN, max_memo_bytes=100, known=hashes, signatures=first.signatures)
    assert again.load_data() == [] and again.kept_ids == set(memos.ids(memos.public))
    assert any("max_memo_bytes" in warning for warning in again.warnings)
