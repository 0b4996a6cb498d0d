"""Secrets out of anything that may reach a log, the manifest, a tool or the screen: error bodies echo request
headers, and a text cut for display can end inside a token."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from urllib.parse import quote

REDACTED = "[redacted]"
_CUT_SECRET_CHARS = 8  # a text ending in this much of a secret's start was cut inside it: that head is redacted too
_CREDENTIAL = r"[^\s\"'<>,;()\[\]{}]+"  # never starts at an earlier "[redacted]": redacting twice changes nothing
_SCHEME = r"(?:bearer|basic|token|digest)(?:\s+|%20|\+)"
_SECRET_PATTERNS = (
    re.compile(rf"(?i)(\b(?:proxy-)?authorization\b[\"']?\s*[:=][\s\[\"']*(?:{_SCHEME})?)(?!{_SCHEME}){_CREDENTIAL}"),
    re.compile(rf"(?i)(\bbearer(?:\s+|%20|\+)){_CREDENTIAL}"),
)

def redact_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the given secrets (also JSON- or URL-escaped) and without any bearer or Authorization value.

    Servers echo request headers in error bodies; whatever reaches a log, the manifest or a tool must not carry them.
    """
    for secret in {s.strip() for s in secrets if s and s.strip()}:
        forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret)[1:-1].replace("/", "\\/"), quote(secret)}
        for form in forms:
            text = text.replace(form, REDACTED)
        text = _without_cut_secret(text, forms)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(rf"\1{REDACTED}", text)
    return text


def redacted_line(text: str, secrets: Iterable[str] = (), limit: int = 200) -> str:
    """`text` on one line of at most `limit` characters, redacted whole before it is cut: a cut first can fall inside
    a token and leave most of it to a log."""
    return redact_secrets(" ".join(text.split()), secrets)[:limit]


def _without_cut_secret(text: str, forms: Iterable[str]) -> str:
    """A text that ends in a secret's first characters (something cut it inside the secret) ends in [redacted]."""
    for form in forms:
        for size in range(len(form) - 1, _CUT_SECRET_CHARS - 1, -1):
            if text.endswith(form[:size]):
                return text[:-size] + REDACTED
    return text


def one_line(exc: BaseException, token_env: str = "") -> str:
    """An error as one short line for the report, the manifest and the log: never a token or a bearer header, even
    when a server echoed one back (every secret the environment holds for a source or a model is removed)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_secrets(text, secrets_in_environment(token_env))[:500]


SECRET_ENV_VARS = ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "EMBEDDING_API_KEY", "OPENAI_API_KEY", "LLM_API_KEY")


def secrets_in_environment(token_env: str = "") -> list[str]:
    """Every secret the environment holds for a source or a model (at least 8 characters: shorter is no secret)."""
    names = {*SECRET_ENV_VARS, token_env} | {n for n in os.environ if n.endswith(("_TOKEN", "_API_KEY", "_SECRET"))}
    return [os.environ[n] for n in names if len(os.environ.get(n, "").strip()) >= 8]
