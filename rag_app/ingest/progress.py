"""How a sync reports its progress, and how far each search channel has come (status and the page)."""

from __future__ import annotations

from typing import Any, Protocol

from rag_app.config import FAST_EMBEDDING, Settings
from rag_app.index.keyword_store import keyword_progress
from rag_app.index.manifest import Manifest


class Progress(Protocol):
    def start(self, total: int, description: str, unit: str = "chunk") -> None: ...
    def advance(self, count: int) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def start(self, total: int, description: str, unit: str = "chunk") -> None:
        pass

    def advance(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def fill_order(models: list[str]) -> list[str]:
    """Dense models in the order their vectors are filled: the fast USE-m3 first, so meaning-search arrives soonest."""
    return sorted(models, key=lambda m: m != FAST_EMBEDDING)


def channel_progress(settings: Settings, manifest: Manifest) -> dict[str, dict[str, Any]]:
    """How far each search channel has come: chunks it covers, complete or not, and (dense models) time left at the
    rate the last fill measured."""
    total, per_model = manifest.channel_counts()
    channels: dict[str, dict[str, Any]] = {"bm25": keyword_progress(settings, manifest, total)}
    for model in fill_order(settings.models):
        done = per_model.get(model, 0)
        rate = float(manifest.get_meta(f"fill_rate:{model}") or 0)
        left = total - done
        channels[model] = {"chunks": done, "complete": left == 0,
                           "seconds_left": 0 if left == 0 else round(left / rate) if rate else None}
    return channels


def time_left(seconds: float | None) -> str:
    """A channel's `seconds_left` as people say it (status line of the CLI and the page)."""
    if seconds is None:
        return "time left unknown"
    if seconds < 90:
        return f"~{max(1, round(seconds))} s left"
    if seconds < 5400:
        return f"~{round(seconds / 60)} min left"
    return f"~{seconds / 3600:.1f} h left"
