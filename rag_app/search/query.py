"""The request side of a search, kept free of heavy imports: validation, filters, retrieval settings."""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rag_app.config import FAST_EMBEDDING, RetrievalSection, Settings

MAX_QUERY_CHARS = 2000
MAX_QUERIES = 12  # texts one search runs: the question and up to 11 variants (an agent's round; every shell's cap)
VARIANT_LINE = re.compile(r"^\s*(?:[-*•]|\(?\d{1,2}[.、)）:：]|[（(]\d{1,2}[)）]|q\d+[:.]?)\s*", re.IGNORECASE)


class SearchError(ValueError):
    """The query or its filters cannot be searched; the message says why."""


class SearchCancelled(Exception):
    """The caller of a search went away (a warm engine's client was killed or pressed Ctrl-C): the rest of the search
    is not computed, so that the next caller does not wait behind it."""


_caller = threading.local()


@contextmanager
def cancelled_when(gone: Callable[[], bool]) -> Iterator[None]:
    """Searches on this thread stop (SearchCancelled) at their next step once `gone()` is true."""
    before = getattr(_caller, "gone", None)
    _caller.gone = gone
    try:
        yield
    finally:
        _caller.gone = before


def stop_if_cancelled() -> None:
    """A step boundary of a search (between its queries and channels): SearchCancelled once the caller is gone."""
    gone = getattr(_caller, "gone", None)
    if gone is not None and gone():
        raise SearchCancelled("the caller went away")


def check_variants(variants: list[str] | None) -> list[str]:
    """A caller's own query variants, at most MAX_QUERIES - 1 (with the question, MAX_QUERIES texts): each one is a
    search through every channel, so thousands of them would hold the index for minutes."""
    variants = list(variants or [])
    if len(variants) > MAX_QUERIES - 1:
        raise SearchError(f"at most {MAX_QUERIES - 1} query variants per search (with the question, {MAX_QUERIES} "
                          f"queries), got {len(variants)}")
    return [clean_query(v) for v in variants]


class RetrievalConfig(RetrievalSection):
    """The fusion's settings for one home: [retrieval] as written, over defaults that depend on its models."""

    @staticmethod
    def from_settings(settings: Settings) -> RetrievalConfig:
        config = RetrievalConfig()
        if settings.models == [FAST_EMBEDDING]:
            # USE-m3 alone is weak on plain lookups: it becomes the gated channel and BM25 leads (tuned on the dev sets)
            config.fast_only = True
            config.bm25_weight, config.second_weight, config.second_gate, config.lexical_weight = 0.5, 2.0, 4.0, 1.0
        elif len(settings.models) == 1:
            config.vector_floor = 1.0  # the floor hands e5's say to the second channel: without one, e5 keeps it
        for key, value in settings.retrieval.items():  # validated when config.toml was read
            setattr(config, key, value)
        return config


@dataclass
class SearchFilters:
    sources: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    path_prefix: str = ""
    since: dt.date | None = None
    until: dt.date | None = None
    exclude_private: bool = False

    @property
    def active(self) -> bool:
        return bool(self.sources or self.tags or self.path_prefix or self.since or self.until or self.exclude_private)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": list(self.sources),
            "tags": list(self.tags),
            "path_prefix": self.path_prefix or None,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
        }


def clean_query(query: str) -> str:
    """Reject what cannot be searched; trim what is merely too long (a pasted page)."""
    if not isinstance(query, str):
        raise SearchError("the query must be text")
    query = query.replace("\x00", " ").strip()
    if not query:
        raise SearchError("the query is empty")
    return query[:MAX_QUERY_CHARS]


def parse_variants(text: str, limit: int) -> list[str]:
    """Query variants from an LLM reply: one per line, numbering like "1." "1、" "(1)" "-" stripped."""
    out: list[str] = []
    for line in text.strip().strip("`").splitlines():
        line = VARIANT_LINE.sub("", line).strip().strip('"“”')
        if line and not line.endswith((":", "：")) and line not in out:
            out.append(line)
    return out[:limit]
