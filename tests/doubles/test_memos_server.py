"""Self-test of the Memos test double: the quirks readers depend on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.doubles.memos_server import MemosDouble, decode_page_token, encode_page_token

TOKEN = "memos_pat_test"


def _get(url: str, token: str | None = TOKEN) -> tuple[int, str, bytes]:
    """GET ``url``; return (status, content type, body) for success and HTTP errors alike."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


@pytest.fixture
def head() -> Iterator[MemosDouble]:
    with MemosDouble("head") as double:
        yield double


def test_page_token_encoding() -> None:
    assert encode_page_token(2, 2) == "CAIQAg=="
    assert encode_page_token(50, 50) == "CDIQMg=="
    assert decode_page_token("CDIQMg==") == (50, 50)


def test_head_walk_tokens_and_empty_last_token(head: MemosDouble) -> None:
    keys = {head.add_memo(f"memo {i} #t") for i in range(5)}
    status, _, body = _get(f"{head.url}/api/v1/memos?pageSize=2")
    page = json.loads(body)
    assert status == 200 and page["nextPageToken"] == "CAIQAg=="
    names = [m["name"] for m in page["memos"]]
    while page["nextPageToken"]:
        page = json.loads(_get(f"{head.url}/api/v1/memos?pageToken={quote(page['nextPageToken'])}")[2])
        names += [m["name"] for m in page["memos"]]
    assert "nextPageToken" in page and page["nextPageToken"] == ""
    assert {n.removeprefix("memos/") for n in names} == keys
    status, _, body = _get(f"{head.url}/api/v1/memos?pageToken=%%%")
    assert status == 400 and json.loads(body)["code"] == 3


@pytest.mark.parametrize(("mode", "expected"), [("v0.22", 10), ("head", 50)])
def test_default_page_size(mode: str, expected: int) -> None:
    with MemosDouble(mode) as double:
        for i in range(expected + 3):
            double.add_memo(f"memo {i}")
        page = json.loads(_get(f"{double.url}/api/v1/memos")[2])
    assert len(page["memos"]) == expected
    assert page["nextPageToken"] == encode_page_token(expected, expected)


def test_old_bare_array_includes_archived_and_comments() -> None:
    with MemosDouble("old") as double:
        parent = double.add_memo("normal #a")
        double.add_memo("archived", archived=True)
        double.add_memo("a comment", parent=parent)
        status, _, body = _get(f"{double.url}/api/v1/memo")
        memos = json.loads(body)
        assert status == 200 and isinstance(memos, list) and len(memos) == 3
        assert {m["rowStatus"] for m in memos} == {"NORMAL", "ARCHIVED"}
        assert {"memoId": 3, "relatedMemoId": 1, "type": "COMMENT"} in memos[0]["relationList"]
        assert len(json.loads(_get(f"{double.url}/api/v1/memo?rowStatus=NORMAL")[2])) == 2
        assert _get(f"{double.url}/api/v1/memo", token=None)[::2] == (400, b'{"message":"Missing user to find memo"}\n')
        assert _get(f"{double.url}/api/v1/memo", token="bad")[0] == 401


def test_bad_token_is_silently_anonymous(head: MemosDouble) -> None:
    head.add_memo("private")
    public = head.add_memo("public", visibility="PUBLIC")
    status, _, body = _get(f"{head.url}/api/v1/memos", token="not-the-token")
    assert status == 200
    assert [m["name"] for m in json.loads(body)["memos"]] == [f"memos/{public}"]
    with MemosDouble("v0.22") as old_gateway:
        status, _, body = _get(f"{old_gateway.url}/api/v1/memos", token="not-the-token")
    assert status == 400 and "filter is required" in json.loads(body)["message"]


def test_private_instance_answers_text_plain_401() -> None:
    with MemosDouble("head", private_instance=True) as double:
        double.add_memo("public", visibility="PUBLIC")
        status, content_type, body = _get(f"{double.url}/api/v1/memos", token="bad")
        assert status == 401 and content_type.startswith("text/plain")
        assert body == b'{"code": 16, "message": "authentication required"}\n'
        assert _get(f"{double.url}/api/v1/instance/profile", token=None)[0] == 200


def test_truncated_page_is_invalid_json(head: MemosDouble) -> None:
    head.add_memo("x" * 200)
    head.faults["truncate_page"] = 0
    status, _, body = _get(f"{head.url}/api/v1/memos")
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


def test_status_on_page_fires_once_and_requests_are_logged(head: MemosDouble) -> None:
    head.add_memo("x")
    head.faults["status_on_page"] = {0: 503}
    assert _get(f"{head.url}/api/v1/memos")[0] == 503
    assert _get(f"{head.url}/api/v1/memos")[0] == 200
    assert [(r["path"], r["status"], r["auth"]) for r in head.requests] == [
        ("/api/v1/memos", 503, f"Bearer {TOKEN}"),
        ("/api/v1/memos", 200, f"Bearer {TOKEN}"),
    ]
