"""Secrets never reach a log, the manifest or a tool: the token and anything bearer-looking are redacted, escaped
forms included, and a text is redacted whole before it is cut."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from readers.redaction import redact_secrets, redacted_line

SECRET = "memos_pat_s3cr3t-never-print-me"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"bad token {SECRET}", "bad token [redacted]"),
        ('{"Authorization": ["Bearer abc.def-ghi"]}', '{"Authorization": ["Bearer [redacted]"]}'),
        ("header authorization: Basic dXNlcjpwYXNz, retry", "header authorization: Basic [redacted], retry"),
        ("got bearer%20xyz123 in the query", "got bearer%20[redacted] in the query"),
        (f"json {SECRET.replace('-', '-')!r} and url {SECRET}%2F", "json '[redacted]' and url [redacted]%2F"),
        ("nothing secret: page 2 of 3", "nothing secret: page 2 of 3"),
    ],
)
def test_redact_secrets_removes_the_token_and_anything_bearer_looking(text: str, expected: str) -> None:
    """The given secrets go in every form a server could echo; Bearer and Authorization values go even unknown."""
    assert redact_secrets(text, [SECRET, ""]) == expected


def test_redact_secrets_finds_escaped_forms_of_a_secret() -> None:
    token = 'pat/with"quote'
    for echoed in (token, json.dumps(token)[1:-1], json.dumps(token)[1:-1].replace("/", "\\/"), quote(token)):
        assert redact_secrets(f"x {echoed} y", [token]) == "x [redacted] y"


def test_a_text_cut_inside_a_secret_loses_the_secrets_head_of_8_characters_or_more() -> None:
    """Issue 22 item 4: whoever cut the text (a server, a limit), a long head of the token at its end goes too."""
    assert redact_secrets(f"refused: {SECRET[:-1]}", [SECRET]) == "refused: [redacted]"
    assert redact_secrets(f"refused: {SECRET[:8]}", [SECRET]) == "refused: [redacted]"
    assert redact_secrets(f"refused: {SECRET[:7]}", [SECRET]) == f"refused: {SECRET[:7]}"  # too short to tell
    assert redact_secrets(f"{SECRET[:10]} then more", [SECRET]) == f"{SECRET[:10]} then more"  # not cut there


def test_a_line_is_redacted_whole_before_it_is_cut() -> None:
    text = "x" * 190 + f"  {SECRET} was refused"
    assert redacted_line(text, [SECRET]) == "x" * 190 + " [redacted]"[:10]
    assert SECRET[:8] not in redacted_line(text, [SECRET], 195)
