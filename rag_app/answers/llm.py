"""The optional OpenAI-compatible LLM (query variants, answers). No configuration → None, never a call out.

Half a configuration (a URL without a model, or the reverse) is not "no LLM": `missing` names what to add. The
client libraries' own log lines (tenacity's "Retrying ...", httpx, openai) go to the brain's log, never the terminal.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from readers.redaction import redacted_line

THIRD_PARTY_LOGGERS = ("llama_index.llms.openai", "llama_index.llms.openai_like", "openai", "httpx", "httpcore")
ERROR_CHARS = 200


@dataclass
class LLMConfig:
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    context_window: int = 32768
    timeout: float = 120.0
    max_retries: int = 2
    variants_timeout: float = 20.0

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    @property
    def missing(self) -> list[str]:
        """What a half-done configuration lacks (nothing when neither part is set: the LLM is simply off)."""
        if bool(self.base_url) == bool(self.model):
            return []
        return ["LLM_MODEL"] if self.base_url else ["LLM_BASE_URL"]

    def state(self) -> dict[str, Any]:
        """For status lines and the page: configured or not, what is missing, which model where (no secrets)."""
        return {"configured": self.configured, "missing": self.missing, "model": self.model or None,
                "base_url": public_url(self.base_url) or None}

    def __repr__(self) -> str:
        return f"LLMConfig(base_url={self.base_url!r}, model={self.model!r}, api_key={'set' if self.api_key else ''})"


def unreachable(base_url: str, timeout: float = 1.0) -> str | None:
    """Why nothing answers at the LLM's host and port ("connection refused"), else None. A TCP connection only: no
    request is sent, so a page can check it on every load."""
    parts = urlsplit(base_url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "its URL has no valid port"
    if not parts.hostname:
        return "its URL has no host"
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        return f"cannot connect to {public_url(base_url)} ({exc.strerror or type(exc).__name__})"
    return None


def public_url(url: str) -> str:
    """A URL without user and password: a key written into LLM_BASE_URL never reaches output."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def missing_message(missing: list[str]) -> str:
    """One sentence saying how to finish a half-done LLM configuration."""
    where = {"LLM_MODEL": "LLM_MODEL (or model under [llm] in config.toml)",
             "LLM_BASE_URL": "LLM_BASE_URL (or base_url under [llm] in config.toml)"}
    other = {"LLM_MODEL": "LLM_BASE_URL", "LLM_BASE_URL": "LLM_MODEL"}
    return "; ".join(f"LLM not configured: {other[m]} is set but {where[m]} is missing" for m in missing)


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
        variants_timeout=float(section.get("variants_timeout", 20.0)),
    )


def variants_config(config: LLMConfig) -> LLMConfig:
    """The LLM that writes search variants: one try, bounded by `variants_timeout`. Search answers without variants
    when it is slow or down, so it must never wait as long as an answer may (120 s and retries)."""
    return replace(config, timeout=min(config.timeout, config.variants_timeout), max_retries=0)


def load_llm(config: LLMConfig) -> Any | None:
    """`OpenAILike`, so that model names OpenAI's own class rejects (qwen2.5, deepseek-chat) work."""
    if not config.configured:
        return None
    from llama_index.llms.openai_like import OpenAILike  # here: LlamaIndex and openai, only when an LLM is configured

    route_client_logs()
    return OpenAILike(
        model=config.model,
        api_base=config.base_url,
        api_key=config.api_key or "not-needed",
        is_chat_model=True,
        context_window=config.context_window,
        timeout=config.timeout,
        max_retries=config.max_retries,
    )


class _ToBrainLog(logging.Handler):
    """Re-emits a client library's record on `cflow_brain.llm` at INFO: it lands in brain.log where the shell logs
    there, and below Python's last-resort threshold (WARNING) everywhere else, so never on a terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger("cflow_brain.llm")
        if target.isEnabledFor(logging.INFO):
            target.info("%s: %s", record.name, record.getMessage())


def route_client_logs() -> None:
    for name in THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _ToBrainLog) for h in logger.handlers):
            logger.addHandler(_ToBrainLog())
        logger.propagate = False


def error_reason(exc: BaseException, secret: str = "") -> str:
    """One line saying why a call failed, with its root cause ("Connection error. ([Errno 111] Connection
    refused)"), at most 200 characters, the API key never in it."""
    parts = [str(exc) or type(exc).__name__]
    cause = exc.__cause__ or exc.__context__
    seen = 0
    while cause is not None and seen < 5:
        text = str(cause)
        if text and text not in parts[-1]:
            parts.append(text)
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    reason = parts[0] + (f" ({parts[-1]})" if len(parts) > 1 else "")
    return redacted_line(reason, [secret] if secret else [], ERROR_CHARS)


LLM_RETRY_SECONDS = 30.0  # after a failed LLM call, answers are passages at once for this long, then it is tried again


class LLMLink:
    """A home's LLM as Brain holds it: loaded on first use (None when not configured), and its last failure: after a
    failed call its calls are skipped for LLM_RETRY_SECONDS (answers are passages at once), then it is tried again."""

    def __init__(self, section: dict[str, Any]):
        """`section`: the home's [llm] settings (the environment's LLM_* variables override them)."""
        self.section = section
        self._llm: Any = None
        self._variants_llm: Any = None
        self._llm_failed: tuple[float, str] | None = None  # when and why the LLM last failed (cleared by a success)

    def failed(self, reason: str) -> None:
        """A call failed for `reason` (one line, no secrets): the next LLM_RETRY_SECONDS of questions skip it."""
        self._llm_failed = (time.monotonic(), reason)

    def succeeded(self) -> None:
        self._llm_failed = None

    def llm(self) -> Any | None:
        if self._llm is None:
            self._llm = load_llm(llm_config(self.section)) or False
        return self._llm or None

    def variants_llm(self) -> Any | None:
        """The LLM that writes a question's search variants, with a short timeout and no retries."""
        if self._variants_llm is None:
            self._variants_llm = load_llm(variants_config(llm_config(self.section))) or False
        return self._variants_llm or None

    def llm_state(self, probe: bool = False) -> dict[str, Any]:
        """{"configured", "missing", "model", "base_url", "error"}: "missing" names what a half-done configuration
        lacks; "error" why the LLM cannot be used now (its last call failed, or with `probe`, its address refuses a
        connection), else None."""
        config = llm_config(self.section)
        error = self.llm_failure()
        if error is None and probe and config.configured:
            error = unreachable(config.base_url)
            if error is not None:
                self._llm_failed = (time.monotonic(), error)
        return config.state() | {"error": error}

    def llm_failure(self) -> str | None:
        """Why the LLM failed within the last LLM_RETRY_SECONDS (its calls are skipped meanwhile), else None."""
        failed = self._llm_failed
        if failed is None or time.monotonic() - failed[0] > LLM_RETRY_SECONDS:
            return None
        return failed[1]
