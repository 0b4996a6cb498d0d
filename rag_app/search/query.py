"""The request side of a search, kept free of heavy imports: validation, filters, retrieval settings."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from rag_app.config import FAST_EMBEDDING, RetrievalSection, Settings

MAX_QUERY_CHARS = 2000
VARIANT_LINE = re.compile(r"^\s*(?:[-*•]|\(?\d{1,2}[.、)）:：]|[（(]\d{1,2}[)）]|q\d+[:.]?)\s*", re.IGNORECASE)


class SearchError(ValueError):
    """The query or its filters cannot be searched; the message says why."""


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
