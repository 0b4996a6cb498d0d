"""Specification of the Memos client against a real HTTP double of every API generation (no mocked transport)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from readers.memos_client import (
    Answer,
    MemosAuthError,
    MemosClient,
    MemosError,
    MiB,
    fetch_memos,
)
from readers.records import NoteRecord, SourceListing, decode_list
from tests.doubles.memos_server import AUTH_PATHS, OMIT, MemosDouble, Stream, encode_page_token

TOKEN = "memos_pat_test"  # the token the double accepts by default
NEW_MODES = ("v0.22", "v0.25", "head")
ALL_MODES = ("old", *NEW_MODES)
LIST_PATH = {"old": "/api/v1/memo", "v0.22": "/api/v1/memos", "v0.25": "/api/v1/memos", "head": "/api/v1/memos"}

Serve = Callable[..., MemosDouble]


def no_sleep(_seconds: float) -> None:
    """Retries happen at once."""


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start doubles on free ports; all are stopped after the test."""
    started: list[MemosDouble] = []

    def start(mode: str = "head", **kwargs: Any) -> MemosDouble:
        started.append(MemosDouble(mode, **kwargs).start())
        return started[-1]

    yield start
    for double in started:
        double.stop()


def make_client(double: MemosDouble, token: str | None = TOKEN, **options: Any) -> MemosClient:
    """A client with instant retries and a short timeout, unless the test says otherwise."""
    return MemosClient(double.url, token, **{"timeout": 2.0, "sleep": no_sleep, **options})


def fetch(
    double: MemosDouble,
    token: str | None = TOKEN,
    *,
    include_archived: bool = False,
    include_comments: bool = True,
    **options: Any,
) -> SourceListing:
    """One complete listing through `fetch_memos`, as the sync runs it."""
    with make_client(double, token, **options) as client:
        return fetch_memos(
            double.url,
            token,
            source="cflow",
            include_archived=include_archived,
            include_comments=include_comments,
            client=client,
        )


def by_id(listing: SourceListing) -> dict[str, NoteRecord]:
    return {record.id: record for record in listing.records}


def note_id(key: str) -> str:
    """The record id of a memo key returned by `add_memo` (old: numeric id; newer: uid)."""
    return f"memos:cflow/{key}"


def list_requests(double: MemosDouble) -> list[dict[str, Any]]:
    return [r for r in double.requests if r["path"] == LIST_PATH[double.mode]]


@dataclass
class Notebook:
    """A small, known set of memos on one double."""

    double: MemosDouble
    reading: str  # PRIVATE, pinned, nested CJK tags, an attachment, fixed times; has a comment and a backlink
    review: str  # PUBLIC, references `reading`
    protected: str  # PROTECTED
    archived: str  # PRIVATE, archived
    comment: str  # PUBLIC comment on `reading`

    def visible(self, *, comments: bool = True, archived: bool = False) -> list[str]:
        keys = [self.reading, self.review, self.protected] + [self.comment] * comments + [self.archived] * archived
        return sorted(map(note_id, keys))


def seed_notebook(double: MemosDouble) -> Notebook:
    reading = double.add_memo(
        "今天读完了《三体》。#读书 #科幻/硬科幻\n\n延续上周的想法。",
        pinned=True,
        created=1_702_195_200,
        updated=1_702_198_800,
        attachments=["cover.jpg"],
    )
    return Notebook(
        double=double,
        reading=reading,
        review=double.add_memo(
            "Weekly review: finish the reading list #review", visibility="PUBLIC", relations=[reading]
        ),
        protected=double.add_memo("Shared with the team", visibility="PROTECTED"),
        archived=double.add_memo("Old plan #archive", archived=True),
        comment=double.add_memo("好问题 #reply", visibility="PUBLIC", parent=reading),
    )


@pytest.fixture(params=ALL_MODES)
def notebook(request: pytest.FixtureRequest, serve: Serve) -> Notebook:
    """The notebook on a double of each API generation."""
    return seed_notebook(serve(request.param))


# ---- version detection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "generation", "version"),
    [
        ("old", "old", (0, 18, 2)),
        ("v0.22", "v0.22", (0, 22, 5)),
        ("v0.25", "new", (0, 25, 0)),
        ("head", "new", (0, 30, 0)),
    ],
)
def test_detect_names_the_api_generation_and_version(
    serve: Serve, mode: str, generation: str, version: tuple[int, ...]
) -> None:
    """Each server is recognised from its own profile endpoint."""
    with make_client(serve(mode)) as client:
        api = client.detect()
    assert (api.generation, api.version) == (generation, version)
    assert api.version_text == ".".join(map(str, version))


def test_detect_rejects_a_server_that_is_not_memos(serve: Serve) -> None:
    """No known endpoint answering is an error, not a guess."""
    double = serve("head")
    with MemosClient(f"{double.url}/not-memos", TOKEN, timeout=2.0, sleep=no_sleep) as client:
        with pytest.raises(MemosError, match="does not look like a Memos server"):
            client.detect()


@pytest.mark.parametrize("answer", [{"status": "ok", "items": []}, {"version": 3, "memos": "none"}, []])
def test_detect_rejects_a_json_server_that_answers_every_path(answer: Any) -> None:
    """A JSON API that says 200 to every GET is not a Memos server: a profile must name its version (a string),
    the old API's list must be an array; before, it was taken for the current API with no memos and remembered."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class AnyJson(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), AnyJson)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with MemosClient(f"http://127.0.0.1:{server.server_port}", TOKEN, timeout=2.0, sleep=no_sleep) as client:
            with pytest.raises(MemosError, match="does not look like a Memos server"):
                client.detect()
    finally:
        server.shutdown()
        server.server_close()


# ---- the listing ----------------------------------------------------------------------------


@pytest.mark.parametrize("include_comments", [True, False])
def test_listing_holds_every_visible_memo_once(notebook: Notebook, include_comments: bool) -> None:
    """PRIVATE, PROTECTED and PUBLIC memos (and comments when asked) are listed once each; archived ones are not."""
    listing = fetch(notebook.double, include_comments=include_comments)
    assert sorted(r.id for r in listing.records) == notebook.visible(comments=include_comments)
    assert (listing.skipped, listing.warnings) == (0, [])
    if not include_comments:
        assert not [r for r in notebook.double.requests if r["path"].endswith("/comments")]


@pytest.mark.parametrize("include_archived", [True, False])
def test_archived_memos_are_listed_only_on_request(notebook: Notebook, include_archived: bool) -> None:
    """Archived memos are left out by default; with include_archived they are listed and flagged."""
    records = by_id(fetch(notebook.double, include_archived=include_archived))
    assert sorted(records) == notebook.visible(archived=include_archived)
    flagged = [key for key, record in records.items() if record.metadata["archived"]]
    assert flagged == ([note_id(notebook.archived)] if include_archived else [])


@pytest.mark.parametrize(
    ("mode", "url_template"),
    [
        ("old", "{base}/m/{key}"),
        ("v0.22", "{base}/m/{key}"),
        ("v0.25", "{base}/memos/{key}"),
        ("head", "{base}/memos/{key}"),
    ],
)
def test_record_ids_and_web_urls_follow_the_server_version(serve: Serve, mode: str, url_template: str) -> None:
    """Ids are memos:<id> (old) or memos:<uid>; web links use the route of that version."""
    notes = seed_notebook(serve(mode))
    record = by_id(fetch(notes.double))[note_id(notes.reading)]
    assert record.metadata["memo_id"] == notes.reading
    assert record.metadata["url"] == url_template.format(base=notes.double.url, key=notes.reading)


def test_v022_uses_the_uid_not_the_numeric_name(serve: Serve) -> None:
    """On v0.22 the name is memos/<int>; the citation key is the separate uid."""
    notes = seed_notebook(serve("v0.22"))
    assert notes.double.memo_json(notes.reading)["name"] == "memos/1"
    records = by_id(fetch(notes.double))
    assert note_id(notes.reading) in records and "memos:1" not in records


@pytest.mark.parametrize(
    ("mode", "tags"),
    [
        ("old", ["读书", "科幻/硬科幻"]),  # parsed from content
        ("v0.22", ["读书", "科幻/硬科幻"]),  # property.tags
        ("v0.25", ["读书", "科幻/硬科幻"]),  # the tags field
        ("head", ["读书", "科幻", "科幻/硬科幻"]),  # HEAD adds ancestors of nested tags
    ],
)
def test_tags_come_from_the_server_or_the_content(serve: Serve, mode: str, tags: list[str]) -> None:
    """CJK and nested tags survive in every generation."""
    notes = seed_notebook(serve(mode))
    assert decode_list(by_id(fetch(notes.double))[note_id(notes.reading)].metadata["tags"]) == tags


def test_v022_property_tags_are_used(serve: Serve) -> None:
    """v0.22 keeps the server's tag list in property.tags (the top-level list is empty)."""
    double = serve("v0.22")
    key = double.add_memo("no inline tags here")
    double.raw_overrides[key] = {"property": {"tags": ["工作/会议"]}}
    assert decode_list(by_id(fetch(double))[note_id(key)].metadata["tags"]) == ["工作/会议"]


def test_server_tags_are_not_doubled_by_content_parsing(serve: Serve) -> None:
    """When the server sends tags, they are the tags: content parsing does not add near-duplicates."""
    double = serve("head")
    key = double.add_memo("Finished the draft. #done.")
    assert double.memo_json(key)["tags"] == ["done."]
    assert decode_list(by_id(fetch(double))[note_id(key)].metadata["tags"]) == ["done."]


def test_times_are_iso_strings_and_unix_seconds(notebook: Notebook) -> None:
    """Unix seconds (old) and RFC 3339 (newer) both become `created`/`updated` plus `_ts` ints."""
    metadata = by_id(fetch(notebook.double))[note_id(notebook.reading)].metadata
    assert (metadata["created"], metadata["created_ts"]) == ("2023-12-10T08:00:00Z", 1_702_195_200)
    assert (metadata["updated"], metadata["updated_ts"]) == ("2023-12-10T09:00:00Z", 1_702_198_800)


def test_visibility_pinned_and_attachments(notebook: Notebook) -> None:
    """Visibility and pinned are copied; attachments are listed by file name."""
    records = by_id(fetch(notebook.double))
    reading, review = records[note_id(notebook.reading)].metadata, records[note_id(notebook.review)].metadata
    assert (reading["visibility"], reading["pinned"], decode_list(reading["attachments"])) == (
        "PRIVATE",
        True,
        ["cover.jpg"],
    )
    assert (review["visibility"], review["pinned"], decode_list(review["attachments"])) == ("PUBLIC", False, [])
    assert records[note_id(notebook.protected)].metadata["visibility"] == "PROTECTED"


def test_metadata_holds_only_chroma_scalars(notebook: Notebook) -> None:
    """Every metadata value is a str, int, float or bool, and names its source."""
    listing = fetch(notebook.double)
    for record in listing.records:
        assert {k: type(v) for k, v in record.metadata.items() if not isinstance(v, str | int | float | bool)} == {}
        assert (record.metadata["kind"], record.metadata["source"]) == ("memos", "cflow")


def test_links_hold_outgoing_references_only(notebook: Notebook) -> None:
    """A reference is a link from its source only; backlinks and comment relations are not links."""
    records = by_id(fetch(notebook.double))
    links = {key: decode_list(records[note_id(key)].metadata["links"]) for key in (notebook.review, notebook.reading)}
    assert links == {notebook.review: [note_id(notebook.reading)], notebook.reading: []}
    assert decode_list(records[note_id(notebook.comment)].metadata["links"]) == []


def test_comments_point_to_their_parent_note(notebook: Notebook) -> None:
    """A comment's `parent` is the record id of the memo it comments on; other memos have none."""
    records = by_id(fetch(notebook.double))
    assert records[note_id(notebook.comment)].metadata["parent"] == note_id(notebook.reading)
    assert "parent" not in records[note_id(notebook.reading)].metadata


def test_old_api_lists_comments_itself(serve: Serve) -> None:
    """The old list already holds comments: one request, no per-memo calls."""
    notes = seed_notebook(serve("old"))
    fetch(notes.double)
    assert [r["path"] for r in notes.double.requests if r["path"].startswith("/api/v1/memo")] == ["/api/v1/memo"]


@pytest.mark.parametrize("mode", NEW_MODES)
def test_new_api_asks_for_comments_only_where_relations_show_some(serve: Serve, mode: str) -> None:
    """Comments are fetched from /comments of the one memo that has COMMENT relations, nowhere else."""
    notes = seed_notebook(serve(mode))
    fetch(notes.double)
    comment_paths = [r["path"] for r in notes.double.requests if r["path"].endswith("/comments")]
    assert comment_paths == [f"/api/v1/{notes.double.memo_json(notes.reading)['name']}/comments"]


def test_old_v020_memo_names_do_not_hide_relations(serve: Serve) -> None:
    """From v0.20 old memos carry a `name`, but relations still use numeric ids."""
    notes = seed_notebook(serve("old"))
    for key in (notes.reading, notes.review, notes.comment):
        notes.double.raw_overrides[key] = {"name": f"uid-{key}"}
    records = by_id(fetch(notes.double))
    assert decode_list(records[note_id(notes.review)].metadata["links"]) == [note_id(notes.reading)]
    assert records[note_id(notes.comment)].metadata["parent"] == note_id(notes.reading)


def test_relations_of_unknown_type_are_not_links(serve: Serve) -> None:
    """Only REFERENCE relations become links."""
    double = serve("head")
    referenced, other = double.add_memo("referenced"), double.add_memo("other")
    source = double.add_memo("source")
    double.raw_overrides[source] = {
        "relations": [
            {"memo": {"name": f"memos/{source}"}, "relatedMemo": {"name": f"memos/{target}"}, "type": kind}
            for target, kind in ((referenced, "REFERENCE"), (other, "TYPE_UNSPECIFIED"))
        ]
    }
    assert decode_list(by_id(fetch(double))[note_id(source)].metadata["links"]) == [note_id(referenced)]


@pytest.mark.parametrize("include_archived", [True, False])
def test_v022_links_resolve_to_uids_of_listed_memos(serve: Serve, include_archived: bool) -> None:
    """v0.22 relations name memos/<int>; a link becomes the target's uid record id, or is dropped if not listed."""
    double = serve("v0.22")
    target = double.add_memo("archived target", archived=True)
    source = double.add_memo("source", relations=[target])
    links = decode_list(by_id(fetch(double, include_archived=include_archived))[note_id(source)].metadata["links"])
    assert links == ([note_id(target)] if include_archived else [])


# ---- paging ---------------------------------------------------------------------------------


def test_head_pages_through_2345_memos_in_capped_pages(serve: Serve) -> None:
    """Three pages of at most 1,000 (the server cap) return every memo exactly once."""
    double = serve("head")
    keys = [double.add_memo(f"memo {i} #bulk") for i in range(2345)]
    ids = [r.id for r in fetch(double).records]
    assert sorted(ids) == sorted(map(note_id, keys))
    assert [(r["query"]["pageSize"], "pageToken" in r["query"]) for r in list_requests(double)] == [
        ("1000", False),
        ("1000", True),
        ("1000", True),
    ]


@pytest.mark.parametrize("mode", ["v0.22", "v0.25"])
def test_default_page_size_of_ten_is_not_a_trap(serve: Serve, mode: str) -> None:
    """The client asks for 1,000 per page, so 25 memos come back in one page, not 10."""
    double = serve(mode)
    keys = [double.add_memo(f"memo {i}") for i in range(25)]
    assert sorted(r.id for r in fetch(double).records) == sorted(map(note_id, keys))
    assert [r["query"].get("pageSize") for r in list_requests(double)] == ["1000"]


@pytest.mark.parametrize("mode", NEW_MODES)
def test_next_page_tokens_are_followed_until_empty(serve: Serve, mode: str) -> None:
    """Small pages: each token is sent back as given, and the empty token of the last page ends the walk."""
    double = serve(mode)
    keys = [double.add_memo(f"memo {i}") for i in range(5)]
    assert sorted(r.id for r in fetch(double, page_size=2).records) == sorted(map(note_id, keys))
    assert [r["query"].get("pageToken") for r in list_requests(double)] == [
        None,
        encode_page_token(2, 2),
        encode_page_token(2, 4),
    ]


@pytest.mark.parametrize("mode", NEW_MODES)
def test_memo_written_during_the_walk_does_not_duplicate_another(serve: Serve, mode: str) -> None:
    """An insert shifts the offset pages, so one memo is served twice; it is listed once."""
    double = serve(mode)
    keys = [double.add_memo(f"memo {i}") for i in range(5)]
    double.faults["call_after_pages"] = {1: lambda: double.add_memo("written while the client pages")}
    ids = [r.id for r in fetch(double, page_size=2).records]
    assert len(list_requests(double)) == 3  # 6 memos served over 3 pages, one of them twice
    assert sorted(ids) == sorted(map(note_id, keys))


@pytest.mark.parametrize("mode", ["v0.25", "head"])
def test_memo_archived_between_the_two_walks_is_listed_once(serve: Serve, mode: str) -> None:
    """With include_archived the NORMAL and ARCHIVED lists are walked in turn; a memo in both is one record."""
    double = serve(mode)
    keys = [double.add_memo(f"memo {i}") for i in range(3)]
    double.faults["call_after_pages"] = {1: lambda: double.archive_memo(keys[0])}
    records = fetch(double, include_archived=True).records
    assert sorted(r.id for r in records) == sorted(map(note_id, keys))
    assert [r.id for r in records if r.metadata["archived"]] == [note_id(keys[0])]
    assert [r["query"].get("state") for r in list_requests(double)] == [None, "ARCHIVED"]


# ---- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_rejected_token_is_an_auth_error(serve: Serve, mode: str) -> None:
    """Old servers answer 401 everywhere; newer ones only on the who-am-I endpoint, since lists downgrade silently."""
    notes = seed_notebook(serve(mode))
    with pytest.raises(MemosAuthError, match="401") as caught:
        fetch(notes.double, token="memos_pat_wrong")
    assert "CFLOW_API_TOKEN" in str(caught.value)
    if mode == "old":
        assert "Invalid or expired access token" in str(caught.value)
    else:
        assert AUTH_PATHS[mode] in str(caught.value)
        assert (AUTH_PATHS[mode], 401) in [(r["path"], r["status"]) for r in notes.double.requests]


@pytest.mark.parametrize("mode", NEW_MODES)
def test_a_failing_who_am_i_endpoint_fails_the_listing(serve: Serve, mode: str) -> None:
    """A 5xx from the identity check is not read as 'anonymous': nothing is listed and the error names the call."""
    notes = seed_notebook(serve(mode))
    notes.double.faults["status_on_path"] = {AUTH_PATHS[mode]: 500}
    with pytest.raises(MemosError) as caught:
        fetch(notes.double, max_retries=1)
    assert type(caught.value) is MemosError
    assert f"{AUTH_PATHS[mode]}: HTTP 500" in str(caught.value)
    assert list_requests(notes.double) == []


@pytest.mark.parametrize(("mode", "complete"), [("v0.25", False), ("head", True)])
def test_an_unknown_caller_is_fatal_only_where_it_hides_private_memos(serve: Serve, mode: str, complete: bool) -> None:
    """v0.24–v0.25 need parent=users/{me} to list PRIVATE memos; HEAD lists them for any authenticated caller."""
    notes = seed_notebook(serve(mode))
    notes.double.faults["status_on_path"] = {AUTH_PATHS[mode]: 404}
    if complete:
        assert sorted(r.id for r in fetch(notes.double).records) == notes.visible()
    else:
        with pytest.raises(MemosError, match="the listing would be incomplete"):
            fetch(notes.double)
        assert list_requests(notes.double) == []


def test_old_server_without_token_says_a_token_is_needed(serve: Serve) -> None:
    """Old servers refuse to list anonymously (400 'Missing user'); that means: set a token."""
    notes = seed_notebook(serve("old"))
    with pytest.raises(MemosAuthError, match="set an access token in CFLOW_API_TOKEN"):
        fetch(notes.double, token=None)


def test_head_without_token_lists_public_memos_and_warns(serve: Serve) -> None:
    """Anonymous reading is allowed on public instances, with a warning that private memos are missing."""
    notes = seed_notebook(serve("head"))
    listing = fetch(notes.double, token=None)
    assert [r.id for r in listing.records] == [note_id(notes.review)]
    assert listing.warnings == ["no token set (CFLOW_API_TOKEN): only PUBLIC memos are visible"]
    assert {r["auth"] for r in notes.double.requests} == {None}


def test_private_head_instance_without_token_is_an_auth_error(serve: Serve) -> None:
    """A private instance answers the anonymous list with a text/plain 401."""
    notes = seed_notebook(serve("head", private_instance=True))
    with pytest.raises(MemosAuthError) as caught:
        fetch(notes.double, token=None)
    message = str(caught.value)
    assert "401 authentication required" in message and "requires an access token" in message
    assert "rejected" not in message  # no token was sent, so none was rejected


def test_fetch_memos_trusts_the_token_of_a_given_client(serve: Serve) -> None:
    """A client that carries the token is enough: the identity is checked and no 'no token' warning appears."""
    notes = seed_notebook(serve("head"))
    with make_client(notes.double) as client:
        listing = fetch_memos(notes.double.url, None, source="cflow", client=client)
    assert (sorted(r.id for r in listing.records), listing.warnings) == (notes.visible(), [])
    assert AUTH_PATHS["head"] in [r["path"] for r in notes.double.requests]


def test_a_token_that_only_sees_public_memos_is_suspected(serve: Serve) -> None:
    """On old servers nothing says who the token belongs to, so an all-PUBLIC listing gets a warning."""
    double = serve("old")
    double.add_memo("public only", visibility="PUBLIC")
    assert [w.split(";")[0] for w in fetch(double).warnings] == [
        "only PUBLIC memos were returned although a token was set"
    ]


def test_whitespace_around_a_pasted_token_is_ignored(serve: Serve) -> None:
    """A token copied with a trailing newline still works (it would otherwise be an illegal header)."""
    notes = seed_notebook(serve("head"))
    assert sorted(r.id for r in fetch(notes.double, token=f" {TOKEN}\r\n").records) == notes.visible()
    assert {r["auth"] for r in notes.double.requests} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize("token", ["memos_pat_tökén", "memos pat"])
def test_a_token_that_cannot_be_a_header_is_refused_up_front(serve: Serve, token: str) -> None:
    """Spaces or non-ASCII characters inside a token are an auth error at once, without echoing the token."""
    double = serve("head")
    with pytest.raises(MemosAuthError, match="spaces or non-ASCII characters") as caught:
        make_client(double, token)
    assert token not in str(caught.value) and double.requests == []


SECRET = "memos_pat_s3cr3t-never-print-me"


def _failures(serve: Serve) -> Iterator[tuple[MemosClient, BaseException | SourceListing]]:
    """Errors and warnings produced while the client holds SECRET, valid or not."""
    for mode, server_token, faults in [
        ("old", "other", {}),
        ("v0.22", "other", {}),
        ("v0.25", "other", {}),
        ("head", "other", {}),
        ("head", SECRET, {"fail_after_pages": 0}),
        ("head", SECRET, {"truncate_page": 0}),
        ("old", SECRET, {"reset_page": 0}),
        ("head", SECRET, {"unauthorized_after_pages": 0}),
        ("old", SECRET, {}),  # all-PUBLIC listing: the downgrade warning
    ]:
        double = serve(mode, token=server_token)
        double.add_memo("a public memo", visibility="PUBLIC")
        double.faults.update(faults)
        client = make_client(double, SECRET, max_retries=1)
        try:
            yield client, fetch_memos(double.url, SECRET, client=client)
        except MemosError as exc:
            yield client, exc


def test_the_token_never_appears_in_errors_warnings_or_repr(serve: Serve) -> None:
    """Error messages, tracebacks, warnings and the client's repr all leave the token out."""
    seen: list[str] = []
    errors = 0
    for client, outcome in _failures(serve):
        if isinstance(outcome, SourceListing):
            seen += outcome.warnings
        else:
            errors += 1
            seen += [str(outcome), repr(outcome), "".join(traceback.format_exception(outcome))]
        seen.append(repr(client))
        client.close()
    assert errors == 8 and len(seen) == 8 * 3 + 1 + 9
    assert [text for text in seen if SECRET in text] == []
    assert "token=set" in seen[-1]


# ---- faults: nothing partial, one clear line ------------------------------------------------


def _fetch_error(double: MemosDouble, error: type[MemosError] = MemosError, **options: Any) -> str:
    """The message of the error (of exactly this type) a fetch must raise; it is one line naming the list."""
    with pytest.raises(MemosError) as caught:
        fetch(double, **options)
    message = str(caught.value)
    assert type(caught.value) is error
    assert "\n" not in message and LIST_PATH[double.mode] in message
    return message


@pytest.mark.parametrize(("mode", "good_pages"), [("old", 0), ("v0.22", 2), ("v0.25", 2), ("head", 2)])
def test_server_errors_fail_after_a_bounded_number_of_retries(serve: Serve, mode: str, good_pages: int) -> None:
    """A page that keeps failing with 500 is tried 1 + max_retries times, then the whole listing fails."""
    double = serve(mode)
    for i in range(6):
        double.add_memo(f"memo {i}")
    double.faults["fail_after_pages"] = good_pages
    sleeps: list[float] = []
    message = _fetch_error(double, max_retries=2, page_size=2, sleep=sleeps.append)
    assert "HTTP 500" in message
    if mode != "old":
        assert f"(page {good_pages + 1})" in message
    assert [r["status"] for r in list_requests(double)] == [200] * good_pages + [500] * 3
    assert sleeps == [0.5, 1.0]  # exponential backoff between the three attempts


@pytest.mark.parametrize("mode", ["old", "head"])
@pytest.mark.parametrize(("burst", "succeeds"), [(2, True), (3, False)])
def test_a_429_burst_is_waited_out_only_within_the_retry_budget(
    serve: Serve, mode: str, burst: int, succeeds: bool
) -> None:
    """Two retries ride out two 429s; a third 429 fails the listing with the status in the message."""
    notes = seed_notebook(serve(mode))
    notes.double.faults["burst_429"] = burst
    if succeeds:
        assert sorted(r.id for r in fetch(notes.double, max_retries=2).records) == notes.visible()
    else:
        message = _fetch_error(notes.double, max_retries=2)
        assert "HTTP 429" in message and "null" not in message
    assert len(list_requests(notes.double)) == 3


def test_a_503_on_one_page_is_retried(serve: Serve) -> None:
    """A transient 503 costs one retry of that page only."""
    double = serve("head")
    keys = [double.add_memo(f"memo {i}") for i in range(5)]
    double.faults["status_on_page"] = {1: 503}
    assert sorted(r.id for r in fetch(double, page_size=2).records) == sorted(map(note_id, keys))
    assert [r["status"] for r in list_requests(double)] == [200, 503, 200, 200]


@pytest.mark.parametrize("mode", ["old", "head"])
def test_a_server_slower_than_the_timeout_fails_after_bounded_attempts(serve: Serve, mode: str) -> None:
    """Each attempt waits `timeout` seconds at most; after 1 + max_retries attempts the listing fails."""
    double = serve(mode)
    double.add_memo("slow")
    double.faults["delay"] = 0.5
    sleeps: list[float] = []
    message = _fetch_error(double, timeout=0.1, max_retries=1, sleep=sleeps.append)
    assert "timed out after 2 attempts" in message
    assert sleeps == [0.5]


@pytest.mark.parametrize("mode", ["old", "head"])
def test_a_connection_reset_mid_body_fails_the_listing(serve: Serve, mode: str) -> None:
    """A body cut off by a reset is retried, then reported as a failed connection."""
    double = serve(mode)
    double.add_memo("x" * 5_000)
    double.faults["reset_page"] = 0
    sleeps: list[float] = []
    message = _fetch_error(double, max_retries=2, sleep=sleeps.append)
    assert "connection failed" in message and "after 3 attempts" in message
    assert len(sleeps) == 2


@pytest.mark.parametrize("mode", ALL_MODES)
def test_truncated_json_is_reported_as_malformed(serve: Serve, mode: str) -> None:
    """A 200 with half a JSON body (even cut inside a CJK character) is an error, not an empty page."""
    double = serve(mode)
    double.add_memo("今天读完了《三体》" * 20)
    double.faults["truncate_page"] = 0
    assert "malformed JSON" in _fetch_error(double)


def test_a_401_after_the_first_page_is_an_auth_error(serve: Serve) -> None:
    """A token revoked mid-walk fails the listing as an auth problem, naming the page."""
    double = serve("head")
    for i in range(5):
        double.add_memo(f"memo {i}")
    double.faults["unauthorized_after_pages"] = 1
    message = _fetch_error(double, MemosAuthError, page_size=2)
    assert "(page 2)" in message and "401" in message


@pytest.mark.parametrize("mode", NEW_MODES)
def test_a_repeating_page_token_stops_the_walk(serve: Serve, mode: str) -> None:
    """A server that hands out the same token again would loop forever: the client stops and says so."""
    double = serve(mode)
    for i in range(5):
        double.add_memo(f"memo {i}")
    double.faults["repeat_token"] = True
    message = _fetch_error(double, page_size=2)
    assert f"page token {encode_page_token(2, 2)!r} twice" in message
    assert len(list_requests(double)) == 2


@pytest.mark.parametrize("mode", ["old", "head"])
def test_a_plain_text_error_body_still_names_the_status(serve: Serve, mode: str) -> None:
    """A non-JSON error body (a proxy page, say) is quoted after the status."""
    double = serve(mode)
    double.add_memo("x")
    double.faults.update(fail_after_pages=0, non_json_error=True)
    assert "HTTP 500 Internal Server Error" in _fetch_error(double, max_retries=0)


# ---- memo edge data -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("content", [None, OMIT])
def test_null_or_missing_content_is_an_empty_memo(serve: Serve, mode: str, content: object) -> None:
    """A memo without content is kept, with empty text and a placeholder title."""
    double = serve(mode)
    key = double.add_memo("will be hidden")
    double.raw_overrides[key] = {"content": content}
    record = by_id(fetch(double))[note_id(key)]
    assert (record.text, record.title, decode_list(record.metadata["tags"])) == ("", "(empty memo)", [])


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("visibility", ["VISIBILITY_UNSPECIFIED", "", None, "SECRET"])
def test_unknown_visibility_is_treated_as_private(serve: Serve, mode: str, visibility: str | None) -> None:
    """Anything but PUBLIC/PROTECTED/PRIVATE is PRIVATE, the safe assumption."""
    double = serve(mode)
    key = double.add_memo("odd visibility", visibility="PUBLIC")
    double.raw_overrides[key] = {"visibility": visibility}
    assert by_id(fetch(double))[note_id(key)].metadata["visibility"] == "PRIVATE"


@pytest.mark.parametrize(("mode", "field"), [("old", "rowStatus"), ("v0.22", "rowStatus"), ("head", "state")])
def test_unknown_state_is_kept_and_not_archived(serve: Serve, mode: str, field: str) -> None:
    """A state the client does not know is not taken for ARCHIVED: the memo stays in the index."""
    double = serve(mode)
    key = double.add_memo("odd state")
    double.raw_overrides[key] = {field: "STATE_UNSPECIFIED"}
    assert by_id(fetch(double))[note_id(key)].metadata["archived"] is False


@pytest.mark.parametrize("mode", ALL_MODES)
def test_content_over_8_kib_is_kept_whole(serve: Serve, mode: str) -> None:
    """Long memos are not cut."""
    double = serve(mode)
    content = "长文" * 2_000 + "\n\n#long"
    key = double.add_memo(content)
    record = by_id(fetch(double))[note_id(key)]
    assert len(record.text.encode()) > 8 * 1024 and record.text == content
    assert decode_list(record.metadata["tags"]) == ["long"]


@pytest.mark.parametrize(("mode", "field"), [("old", "id"), ("head", "name")])
def test_a_memo_without_identity_is_skipped_with_a_warning(serve: Serve, mode: str, field: str) -> None:
    """Without an id there is no stable record id: the memo is counted and reported, the rest are kept."""
    double = serve(mode)
    kept = double.add_memo("kept")
    anonymous = double.add_memo("no identity")
    double.raw_overrides[anonymous] = {field: OMIT}
    listing = fetch(double)
    assert [r.id for r in listing.records] == [note_id(kept)]
    assert listing.skipped == 1 and listing.warnings[0].startswith("memo without id or name skipped")


def test_null_message_fields_are_tolerated(serve: Serve) -> None:
    """v0.30.0 sends unset message fields as null: the memo still converts, tags fall back to the content."""
    double = serve("head")
    key = double.add_memo("# Title\n\nbody #fallback")
    double.raw_overrides[key] = dict.fromkeys(("property", "relations", "attachments", "tags", "location"))
    metadata = by_id(fetch(double))[note_id(key)].metadata
    assert (metadata["title"], decode_list(metadata["tags"]), metadata["links"]) == ("Title", ["fallback"], "[]")


# ---- hostile servers: every limit holds, with one line naming it -----------------------------


@pytest.mark.parametrize("mode", ["old", "head"])
def test_an_error_body_echoing_the_token_is_redacted(serve: Serve, mode: str) -> None:
    """A 400 quoting the Authorization header (and the bare token) becomes an error without either."""
    double = serve(mode, token=SECRET)
    double.add_memo("x")
    double.faults["echo_auth"] = 400
    message = _fetch_error(double, token=SECRET)
    assert "HTTP 400 malformed request header Authorization: Bearer [redacted] (token [redacted])" in message
    assert SECRET not in message and "s3cr3t" not in message


def test_an_echo_cut_at_200_characters_leaves_no_prefix_of_the_token(serve: Serve) -> None:
    """The server's text is cut to 200 characters only after the token is taken out."""
    with make_client(serve("head"), SECRET) as client:
        answer = Answer(400, httpx.Headers(), ("x" * 190 + SECRET).encode(), "Bad Request")
        assert "s3cr3t" not in client._says(answer)


def _hostile(serve: Serve, **faults: Any) -> MemosDouble:
    double = serve("head")
    double.add_memo("a memo the server also has")
    double.faults.update(faults)
    return double


def _timed_error(double: MemosDouble, **options: Any) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(MemosError) as caught:
        fetch(double, **options)
    message = str(caught.value)
    assert type(caught.value) is MemosError and "\n" not in message
    return message, time.monotonic() - started


def test_endless_page_tokens_stop_at_max_memos(serve: Serve) -> None:
    """1,000 new memos and a new token on every page: the listing stops once it passes max_memos."""
    double = _hostile(serve, endless_pages=1000)
    message, _ = _timed_error(double, max_memos=5_000)
    assert "the listing passed 5000 memos (max_memos); if the server really holds that many, raise max_memos" in message
    assert len(list_requests(double)) == 6


def test_endless_page_tokens_stop_at_the_listing_deadline(serve: Serve) -> None:
    """Small pages forever stay under max_memos for a long time; the listing's own clock stops them."""
    double = _hostile(serve, endless_pages=2, delay=0.05)
    message, seconds = _timed_error(double, listing_deadline=1.0)
    assert "the listing took longer than 1 s (listing_deadline)" in message
    # Never early; the upper bound only says it ended (unstopped, these pages run ~100,000 × 0.05 s until max_memos)
    # and is wide for a loaded CI machine: the overshoot itself is printed by `bench/limits_bench.py --only client`.
    assert 1.0 <= seconds < 60


@pytest.mark.parametrize("count", [None, 40], ids=["never-ending", "5-mib"])
def test_a_body_over_max_response_bytes_is_cut(serve: Serve, count: int | None) -> None:
    """Streaming stops past the limit, whether the body ends later or never; nothing retries it."""
    double = _hostile(serve, stream=Stream(chunk=b" " * 131072, count=count))
    message, seconds = _timed_error(double, max_response_bytes=MiB)
    assert f"the answer is larger than {MiB} bytes (max_response_bytes)" in message
    # The message and the single request are the proof; the bound only says it ended (an endless body never would)
    # and is wide for a loaded CI machine: the seconds are printed by `bench/limits_bench.py --only client`.
    assert len(list_requests(double)) == 1 and seconds < 60


def test_a_declared_length_over_the_limit_is_refused_before_reading(serve: Serve) -> None:
    headers = (("Content-Type", "application/json"), ("Content-Length", str(10 * MiB)))
    double = _hostile(serve, stream=Stream(headers=headers, count=1))
    assert "(max_response_bytes)" in _timed_error(double, max_response_bytes=MiB)[0]


def test_the_listing_byte_budget_spans_pages(serve: Serve) -> None:
    double = _hostile(serve, endless_pages=1000)
    message, _ = _timed_error(double, max_listing_bytes=2 * MiB)
    assert f"the listing passed {2 * MiB} bytes (max_listing_bytes)" in message


def test_a_brotli_body_is_refused(serve: Serve) -> None:
    """Brotli can inflate one network chunk without bound, and it was never asked for."""
    double = _hostile(serve, stream=Stream(headers=(("Content-Encoding", "br"),), count=1))
    assert "unsupported content encoding 'br'" in _timed_error(double)[0]
    assert double.requests[-1]["path"] == "/api/v1/memos"


def test_a_body_that_inflates_when_parsed_is_refused(serve: Serve) -> None:
    """`[{},{},…]` parses to ~20x its size; the value budget stops it before json.loads."""
    double = _hostile(serve, body_filter=lambda _body: b'{"memos":[' + b"{}," * 100_000 + b'{}]}')
    assert "JSON values (max_response_bytes / 32)" in _timed_error(double, max_response_bytes=MiB)[0]


def test_json_nested_too_deeply_is_malformed(serve: Serve) -> None:
    double = _hostile(serve, body_filter=lambda _body: b"[" * 100_000 + b"]" * 100_000)
    assert "malformed JSON (nested too deeply)" in _timed_error(double)[0]


@pytest.mark.parametrize("drip_headers", [False, True], ids=["body", "headers"])
def test_a_dripping_answer_stops_at_the_request_deadline(serve: Serve, drip_headers: bool) -> None:
    """One byte every 0.1 s keeps a 5 s read timeout from ever firing; the per-request deadline does not reset."""
    double = _hostile(serve, stream=Stream(chunk=b" ", interval=0.1, drip_headers=drip_headers))
    message, seconds = _timed_error(double, timeout=5.0, request_deadline=1.0, max_retries=1)
    assert "no complete answer within 1 s (request_deadline) after 2 attempts" in message
    assert 2.0 <= seconds < 4.0


def test_the_client_still_uses_the_proxy_the_environment_names(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guarded transport keeps httpx's behaviour: HTTP_PROXY is honoured (the double answers as the proxy)."""
    notes = seed_notebook(serve("head"))
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", notes.double.url)
    with MemosClient("http://memos.invalid", TOKEN, timeout=2.0, sleep=no_sleep) as client:
        listing = fetch_memos("http://memos.invalid", None, source="cflow", client=client)
    assert len(listing.records) == len(notes.visible())


@pytest.mark.parametrize("mode", ["old", "head"])
def test_an_oversized_memo_is_skipped_and_its_indexed_copy_kept(serve: Serve, mode: str) -> None:
    """Like a vault file over the limit, with a warning naming its URL; the record id goes to kept_ids."""
    double = serve(mode)
    small = double.add_memo("short")
    big = double.add_memo("still small")
    before = fetch(double)
    big_id = next(r.id for r in before.records if r.text == "still small")
    url = by_id(before)[big_id].metadata["url"]
    double.edit_memo(big, "长" * 2_000)  # 6,000 bytes in UTF-8, 2,000 characters
    listing = fetch(double, max_memo_bytes=5_000)
    assert [r.text for r in listing.records] == ["short"] and small
    assert listing.kept_ids == {big_id} and listing.skipped == 1
    assert listing.warnings == [f"{url}: 6000 bytes is over the 5000-byte limit (max_memo_bytes); skipped, its "
                                "indexed copy is kept"]


@pytest.mark.parametrize("mode", ["old", "head"])
def test_a_lone_surrogate_is_replaced_and_the_other_memos_index(serve: Serve, mode: str) -> None:
    double = serve(mode)
    double.add_memo("a good memo")
    bad = double.add_memo("will be bent")
    double.raw_overrides[bad] = {"content": "before \ud800 after"}
    listing = fetch(double)
    assert sorted(r.text for r in listing.records) == ["a good memo", "before \ufffd after"]
    name = double.memo_json(bad).get("name") or double.memo_json(bad)["id"]
    assert [w for w in listing.warnings if "U+FFFD" in w] == [
        f"GET {LIST_PATH[mode]} (page 1): memo {name}: invalid text replaced with U+FFFD"
    ]
    for record in listing.records:
        record.content_hash  # noqa: B018 - encodable as UTF-8, as the manifest and Chroma need


def test_invalid_utf8_bytes_are_replaced_too(serve: Serve) -> None:
    double = serve("head")
    double.add_memo("a good memo")
    double.add_memo("bad MARK bytes")
    double.faults["body_filter"] = lambda body: body.replace(b"MARK", b"\xff\xfe")
    texts = sorted(r.text for r in fetch(double).records)
    assert texts == ["a good memo", "bad \ufffd\ufffd bytes"]


def test_a_server_on_plain_http_costs_no_certificate_store(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the CA bundle takes 0.1-0.3 s of a sync; only https (the server, a redirect, a proxy) needs it."""
    import ssl

    loads: list[object] = []
    original = ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations",
                        lambda context, *args, **kwargs: loads.append(args) or original(context, *args, **kwargs))
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    notes = seed_notebook(serve("head"))
    assert len(fetch(notes.double).records) == len(notes.visible())
    assert loads == []
    MemosClient("https://memos.example.com", TOKEN).close()
    assert loads
