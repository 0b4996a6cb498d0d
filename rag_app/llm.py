"""The optional OpenAI-compatible LLM (query variants, answers). No configuration → None, never a call out."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class LLMConfig:
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    context_window: int = 32768
    timeout: float = 120.0
    max_retries: int = 2

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    def __repr__(self) -> str:
        return f"LLMConfig(base_url={self.base_url!r}, model={self.model!r}, api_key={'set' if self.api_key else ''})"


def llm_config(section: dict[str, Any] | None = None) -> LLMConfig:
    """The [llm] config section, overridden by LLM_BASE_URL / LLM_MODEL / LLM_API_KEY (or OPENAI_API_KEY)."""
    section = section or {}
    base_url = os.environ.get("LLM_BASE_URL") or str(section.get("base_url") or "")
    if base_url and not base_url.rstrip("/").endswith("/v1"):
        base_url = base_url.rstrip("/") + "/v1"
    return LLMConfig(
        base_url=base_url,
        model=os.environ.get("LLM_MODEL") or str(section.get("model") or ""),
        api_key=os.environ.get("LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "",
        context_window=int(section.get("context_window", 32768)),
        timeout=float(section.get("timeout", 120.0)),
        max_retries=int(section.get("max_retries", 2)),
    )


def load_llm(config: LLMConfig) -> Any | None:
    """`OpenAILike`, so that model names OpenAI's own class rejects (qwen2.5, deepseek-chat) work."""
    if not config.configured:
        return None
    from llama_index.llms.openai_like import OpenAILike

    return OpenAILike(
        model=config.model,
        api_base=config.base_url,
        api_key=config.api_key or "not-needed",
        is_chat_model=True,
        context_window=config.context_window,
        timeout=config.timeout,
        max_retries=config.max_retries,
    )
