"""Settings: one home directory for all state, a TOML config file in it, and per-run overrides."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Self, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

DEFAULT_EMBEDDING = "e5-small"
FAST_EMBEDDING = "use-m3"
REMOTE_PREFIX = "openai:"  # `openai:<name>[@<dimensions>]`: any OpenAI-compatible /v1/embeddings server
CONFIG_FILE = "config.toml"

log = logging.getLogger("cflow_brain.config")


class ConfigError(Exception):
    """The configuration is unusable; the message names the key and what is wrong."""


@dataclass
class SourceSpec:
    """One note source: a vault folder or a Memos server. The token is never stored here (environment only)."""

    name: str
    kind: str
    path: str = ""
    url: str = ""
    include_archived: bool = False
    include_comments: bool = True
    timeout: float | None = None  # Memos client: seconds per request (None: the client's default)
    max_retries: int | None = None  # Memos client: retries of a transient failure (429, 5xx, timeouts)
    page_size: int | None = None  # Memos client: memos per page (servers that time out on big pages)
    token_env: str = ""  # Memos: the environment variable holding this server's token (never the token itself)
    # Memos limits against hostile or broken servers (None: the client's defaults, sized for 100k memos)
    max_memos: int | None = None
    max_memo_bytes: int | None = None
    max_response_bytes: int | None = None
    max_listing_bytes: int | None = None
    request_deadline: float | None = None
    listing_deadline: float | None = None

    def memos_limits(self) -> dict[str, Any]:
        """The Memos client's keyword arguments this source sets."""
        names = ("timeout", "max_retries", "page_size", "max_memos", "max_memo_bytes", "max_response_bytes",
                 "max_listing_bytes", "request_deadline", "listing_deadline")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SourceSpec:
        """A source from a mapping (a remembered source, a --vault or --memos flag), checked as a [[sources]] entry."""
        try:
            return SourceSpec(**SourceSection(**data).model_dump())
        except ValidationError as exc:
            raise ConfigError(_first_problem(exc, "source", SourceSection, table="source")) from None


_SOURCE_NAME = re.compile(r"[^/\\\x00-\x1f\x7f]{1,100}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def default_source_name(spec: SourceSpec) -> str:
    """A readable, stable name: the vault folder's name, or the Memos host."""
    if spec.kind == "vault":
        base = Path(spec.path).expanduser().resolve().name
    else:
        base = re.sub(r"^https?://", "", spec.url).split("/")[0].replace(":", "-")
    return re.sub(r"[^\w.\-]+", "-", base).strip("-") or spec.kind


def vault_source(path: str) -> SourceSpec:
    resolved = str(Path(path).expanduser().resolve())
    return SourceSpec.from_dict({"kind": "vault", "path": resolved})


def memos_source(url: str) -> SourceSpec:
    return SourceSpec.from_dict({"kind": "memos", "url": url.strip().rstrip("/")})


_MEMOS_URL_RULE = "the Memos URL must look like https://memos.example.com (http or https, then a host)"


def _is_memos_url(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
        parts = urlsplit("")
    host = parts.hostname or ""
    return parts.scheme in ("http", "https") and port_ok and bool(re.fullmatch(r"[\w.\-]+|\[[0-9a-fA-F:.]+\]|"
                                                                                r"[0-9a-fA-F:]+", host))


class _Section(BaseModel):
    """A config section: unknown keys are errors that list the known ones; values are checked by type (strict: a
    quoted "false" is not a boolean, true is not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _default(section: type[_Section], key: str) -> Any:
    """A key's default, read from its section: the model is the one place defaults are written."""
    return section.model_fields[key].default


class SourceSection(_Section):
    """One [[sources]] entry; SourceSpec is what the rest of the app holds. Keys are validated in this order, so a
    later key's check can read the earlier ones (kind, then path and url, then the name made from them)."""

    kind: str = Field("", validate_default=True)
    path: str = Field("", validate_default=True)
    url: str = Field("", validate_default=True)
    name: str = Field("", validate_default=True)
    include_archived: bool = False
    include_comments: bool = True
    token_env: str = ""  # Memos: the environment variable holding this server's token (never the token itself)
    timeout: float | None = Field(None, ge=0.05, le=600.0)
    max_retries: int | None = Field(None, ge=0, le=20)
    page_size: int | None = Field(None, ge=1, le=1000)
    max_memos: int | None = Field(None, ge=1, le=100_000_000)
    max_memo_bytes: int | None = Field(None, ge=1_000, le=1 << 30)
    max_response_bytes: int | None = Field(None, ge=1_000, le=1 << 34)
    max_listing_bytes: int | None = Field(None, ge=1_000, le=1 << 40)
    request_deadline: float | None = Field(None, ge=0.1, le=86_400.0)
    listing_deadline: float | None = Field(None, ge=1.0, le=7 * 86_400.0)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in ("vault", "memos"):
            raise ValueError("must be 'vault' or 'memos'")
        return value

    @field_validator("path")
    @classmethod
    def _vault_has_path(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("kind") == "vault" and not value:
            raise ValueError("a vault source needs 'path'")
        return value

    @field_validator("url")
    @classmethod
    def _memos_has_url(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("kind") == "memos" and not value:
            raise ValueError("a memos source needs 'url'")
        if info.data.get("kind") == "memos" and not _is_memos_url(value):
            raise ValueError(_MEMOS_URL_RULE)
        return value

    @field_validator("name")
    @classmethod
    def _usable_name(cls, value: str, info: ValidationInfo) -> str:
        """A name is part of every note id; none given: the vault folder's name or the Memos host."""
        if not value and {"kind", "path", "url"} <= info.data.keys():
            value = default_source_name(SourceSpec(name="", kind=info.data["kind"], path=info.data["path"],
                                                   url=info.data["url"]))
        if not _SOURCE_NAME.fullmatch(value) or value.strip(". ") == "" or value != value.strip():
            raise ValueError("up to 100 characters, no '/', backslash or control characters, not '.' or '..' (it is "
                             "part of every note id)")
        return value

    @field_validator("token_env")
    @classmethod
    def _names_a_variable(cls, value: str) -> str:
        if value and not _ENV_NAME.fullmatch(value):
            raise ValueError("must name an environment variable (put the token in that variable, never in the "
                             "config)")
        return value


class RemoteEmbedding(_Section):
    """[embedding] options of an `openai:<name>` model. The key is read from the environment when the model is built
    (EMBEDDING_API_KEY, else OPENAI_API_KEY), never stored here."""

    base_url: str = ""  # env EMBEDDING_BASE_URL wins; empty: https://api.openai.com/v1
    dimensions: int | None = Field(None, ge=1, le=65536)  # folded into the model id (`openai:<name>@<dimensions>`)
    batch_size: int = Field(16, ge=1, le=2048)  # texts per request
    concurrency: int = Field(4, ge=1, le=32)  # requests in flight at once
    max_retries: int = Field(3, ge=0, le=20)  # retries of a 429, 5xx, timeout or lost connection, with backoff
    timeout: float = Field(60.0, ge=0.05, le=600)  # seconds per request

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not re.match(r"https?://[^\s/]", value):
            raise ValueError("must be an http(s) URL")
        return value.rstrip("/")


class EmbeddingSection(RemoteEmbedding):
    """[embedding]: the dense model, an optional second channel, and the server options of an `openai:` model."""

    model: str = DEFAULT_EMBEDDING
    second_model: str | None = None  # None: use-m3 beside e5-small (cheap, strong on paraphrase); "" turns it off

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if not _is_embedding_model(value):
            raise ValueError(f"must be {_MODEL_CHOICES}")
        return value

    @field_validator("second_model", mode="before")
    @classmethod
    def _false_means_none(cls, value: object) -> object:
        """`second_model = false` reads as it is meant (no second channel), as it did before sections were typed."""
        return "" if value is False else value

    @field_validator("second_model")
    @classmethod
    def _known_second_model(cls, value: str | None) -> str | None:
        if value and not _is_embedding_model(value):
            raise ValueError(f"must be {_MODEL_CHOICES}, or \"\" for none")
        return value

    @model_validator(mode="after")
    def _dimensions_in_model_id(self) -> Self:
        """`dimensions` becomes part of the model id (`openai:<name>@<dimensions>`), so changing it re-embeds."""
        if self.dimensions is None:
            return self
        parts = remote_model(self.model)
        if parts is None or parts[1] not in (None, self.dimensions):
            raise ValueError("embedding.dimensions needs model = 'openai:<name>' (without another '@<dimensions>'), "
                             f"got {self.model!r}")
        self.model = f"{REMOTE_PREFIX}{parts[0]}@{self.dimensions}"
        return self


class ChunkingSection(_Section):
    """[chunking]: heading/paragraph-aware chunks; long paragraphs are cut into overlapping windows."""

    max_chars: int = Field(600, ge=100, le=8000)
    overlap: int = Field(100, validate_default=True)  # checked even when only max_chars is set

    @field_validator("overlap")
    @classmethod
    def _overlap_within_half(cls, value: int, info: ValidationInfo) -> int:
        if "max_chars" not in info.data:  # max_chars itself is wrong: that error is the one reported
            return value
        half = info.data["max_chars"] // 2
        if not 0 <= value <= half:
            raise ValueError(f"must be a whole number from 0 to {half:,} (half of max_chars)")
        return value


class StoreSection(_Section):
    url: str = ""  # a Chroma server (http://host:port; env BRAIN_STORE_URL and --store-url win); empty: the home
    docstore_url: str = ""  # the ingestion docstore in PostgreSQL (postgresql://user:pw@host:port/db); empty: the home


class SyncSection(_Section):
    lock_wait_seconds: float = Field(10.0, ge=0, le=3600)  # how long a sync waits for another one to finish
    stale_seconds: float = Field(300.0, ge=1, le=30 * 86_400)  # shells without a watcher re-check older sources


class RetrievalSection(_Section):
    """[retrieval]: how the channels are fused. Defaults tuned on the dev sets in ../shared/eval (docs/retrieval.md);
    rag_app.search.query.RetrievalConfig adds what a home's models change."""

    fusion: Literal["adaptive", "rrf"] = "adaptive"
    rrf_k: int = Field(7, ge=0, le=1000)
    bm25_weight: float = Field(0.25, ge=0)
    vector_weight: float = Field(1.0, ge=0)
    second_weight: float = Field(3.0, ge=0)
    second_gate: float = Field(4.0, ge=0)
    lexical_weight: float = Field(1.5, ge=0)
    fast_only: bool = False
    candidates: int = Field(50, ge=1, le=1000)
    chunks_per_note: int = Field(3, ge=1, le=100)
    num_queries: int = Field(4, ge=1, le=10)
    coverage_power: float = Field(1.0, ge=0, le=10)
    vector_floor: float = Field(0.5, ge=0, le=1)  # e5's say when BM25 covers none of the query (all of it at full)
    lead_idf: float = Field(3.0, ge=0)  # BM25's best chunk goes first over chunks lacking words it has worth this IDF
    lead_coverage: float = Field(0.5, ge=0, le=1)  # ... when it covers at least this share of the query (0 idf: off)
    feedback_chunks: int = Field(3, ge=1, le=20)  # a dense channel asked again toward the query's first fused chunks
    feedback_weight: float = Field(0.5, ge=0, le=5)  # ... their mean vector's weight at no BM25 coverage (0: off)


class LLMSection(_Section):
    """[llm]: any OpenAI-compatible endpoint (env LLM_BASE_URL / LLM_MODEL / LLM_API_KEY win; the key never here)."""

    base_url: str = ""
    model: str = ""
    context_window: int = Field(32768, ge=512, le=10_000_000)
    timeout: float = Field(120.0, gt=0, le=3600)
    max_retries: int = Field(2, ge=0, le=10)
    variants_timeout: float = Field(20.0, gt=0, le=600)  # search variants are optional: a slow LLM never holds search
    budget_chars: int = Field(12_000, ge=1_000, le=1_000_000)  # the most note text sent with one question


class MCPSection(_Section):
    allow_private: bool = False  # agents (MCP, tools) see PRIVATE memos only when this is true


class ServeSection(_Section):
    obsidian: bool = False  # vault notes link to obsidian:// on the page
    # Reverse proxies whose X-Forwarded-For is believed (addresses or networks, e.g. "127.0.0.1"); none by default:
    # the login lockout counts by the address that connected, which no header can change.
    trusted_proxies: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"must list IP addresses or networks such as \"127.0.0.1\" ({item!r} is neither)") \
                    from None
        return value


class CaptureSection(_Section):
    """[capture]: agents may save new notes (off by default) into one source: a folder of a vault, or a Memos server
    (as PRIVATE memos). The source is looked up when a note is captured; the folder never leaves the vault."""

    enabled: bool = False
    source: str = Field("", max_length=100, validate_default=True)
    folder: str = Field("Inbox", max_length=300)

    @field_validator("source")
    @classmethod
    def _source_when_enabled(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("enabled") and not value.strip():
            raise ValueError("name the vault or memos source captured notes go to")
        return value

    @field_validator("folder")
    @classmethod
    def _folder_inside_vault(cls, value: str) -> str:
        parts = value.split("/")
        if any(not p.strip() or p.startswith(".") or "\\" in p or not p.isprintable() for p in parts):
            raise ValueError("give a folder inside the vault, relative (a/b), without '..', dot-folders or "
                             "backslashes")
        return value


@dataclass
class Settings:
    home: Path
    sources: list[SourceSpec] = field(default_factory=list)
    embedding_model: str = _default(EmbeddingSection, "model")
    second_model: str | None = _default(EmbeddingSection, "second_model")
    chunk_max_chars: int = _default(ChunkingSection, "max_chars")
    chunk_overlap: int = _default(ChunkingSection, "overlap")
    store_url: str = _default(StoreSection, "url")
    docstore_url: str = _default(StoreSection, "docstore_url")
    lock_wait_seconds: float = _default(SyncSection, "lock_wait_seconds")
    stale_seconds: float = _default(SyncSection, "stale_seconds")
    retrieval: dict[str, Any] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=lambda: LLMSection().model_dump())
    mcp: dict[str, Any] = field(default_factory=lambda: MCPSection().model_dump())
    serve: dict[str, Any] = field(default_factory=lambda: ServeSection().model_dump())
    capture: dict[str, Any] = field(default_factory=lambda: CaptureSection().model_dump())
    remote_embedding: RemoteEmbedding = field(default_factory=RemoteEmbedding)

    @property
    def models(self) -> list[str]:
        """The dense models: the main one, then a second channel (USE-m3 by default when the main one is e5-small)."""
        second = self.second_model
        if second is None:
            second = FAST_EMBEDDING if self.embedding_model == DEFAULT_EMBEDDING else ""
        return [self.embedding_model] + ([second] if second and second != self.embedding_model else [])

    @property
    def model_id(self) -> str:
        """What the manifest records per note: every dense model the note is embedded with."""
        return "+".join(self.models)

    @property
    def manifest_path(self) -> Path:
        return self.home / "index.sqlite"

    @property
    def chroma_path(self) -> Path:
        return self.home / "chroma"

    @property
    def bm25_path(self) -> Path:
        return self.home / "bm25"

    @property
    def log_path(self) -> Path:
        return self.home / "brain.log"


def default_home() -> Path:
    """BRAIN_HOME, else the per-user data directory."""
    env = os.environ.get("BRAIN_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("cflow-brain", appauthor=False))


_MODEL_CHOICES = (f"{DEFAULT_EMBEDDING!r} (default), {FAST_EMBEDDING!r} (fast), 'hf:<local dir or model name>' or "
                  "'openai:<name>' (an embeddings server)")


def _is_embedding_model(model: str) -> bool:
    return model in (DEFAULT_EMBEDDING, FAST_EMBEDDING) or (model.startswith("hf:") and len(model) > 3) \
        or remote_model(model) is not None


def validate_embedding_model(model: str) -> str:
    if _is_embedding_model(model):
        return model
    raise ConfigError(f"embedding.model must be {_MODEL_CHOICES}, got {model!r}")


_REMOTE_MODEL = re.compile(re.escape(REMOTE_PREFIX) + r"(?P<name>[^\s@]\S*?)(?:@(?P<dims>[1-9][0-9]{0,5}))?")


def remote_model(model: str) -> tuple[str, int | None] | None:
    """`openai:<name>[@<dimensions>]` → (name, dimensions); None for a model that is not served remotely."""
    match = _REMOTE_MODEL.fullmatch(model)
    if match is None:
        return None
    return match["name"], int(match["dims"]) if match["dims"] else None


def model_slug(model: str) -> str:
    """A collection-safe name for a model id (Chroma: 3–63 chars of [a-zA-Z0-9._-])."""
    slug = re.sub(r"[^a-zA-Z0-9._-]+", "-", model).strip("-._")
    if len(slug) > 40:
        import hashlib

        slug = slug[:30] + "-" + hashlib.sha1(model.encode()).hexdigest()[:8]
    return slug or "model"


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The home a command uses: the one given, else default_home()."""
    return Path(home).expanduser() if home else default_home()


def load_settings(home: str | os.PathLike[str] | None = None, store_url: str | None = None) -> Settings:
    """Read `<home>/config.toml` (optional) and the environment; flags given here win."""
    home_path = resolve_home(home)
    settings = Settings(home=home_path)
    config_file = home_path / CONFIG_FILE
    if config_file.exists():
        try:
            data = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{config_file}: not valid TOML ({exc})") from None
        try:
            _apply(settings, data, config_file)
        except ConfigError as exc:
            raise ConfigError(str(exc) if str(config_file) in str(exc) else f"{config_file}: {exc}") from None
    env_store = os.environ.get("BRAIN_STORE_URL")
    settings.store_url = store_url or env_store or settings.store_url
    return settings


def _apply(settings: Settings, data: dict[str, Any], where: Path) -> None:
    known = {"sources", "embedding", "chunking", "store", "sync", "llm", "retrieval", "serve", "mcp",
             "capture"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {sorted(unknown)}; known: {sorted(known)}")
    sources = data.get("sources", [])
    if not isinstance(sources, list):
        raise ConfigError(f"{where}: 'sources' must be an array of tables ([[sources]])")
    settings.sources = [SourceSpec(**_typed_section(SourceSection, f"sources[{i}]", entry, where,
                                                    table=f"sources[{i}]").model_dump())
                        for i, entry in enumerate(sources)]
    names = [s.name for s in settings.sources]
    if len(names) != len(set(names)):
        raise ConfigError(f"{where}: two sources share a name: {names}")
    embedding = _typed_section(EmbeddingSection, "embedding", data.get("embedding", {}), where)
    settings.embedding_model, settings.second_model = embedding.model, embedding.second_model
    settings.remote_embedding = RemoteEmbedding(**embedding.model_dump(include=set(RemoteEmbedding.model_fields)))
    chunking = _typed_section(ChunkingSection, "chunking", data.get("chunking", {}), where)
    settings.chunk_max_chars, settings.chunk_overlap = chunking.max_chars, chunking.overlap
    store = _typed_section(StoreSection, "store", data.get("store", {}), where)
    check_docstore_url(store.docstore_url)
    settings.store_url, settings.docstore_url = store.url, store.docstore_url
    sync = _typed_section(SyncSection, "sync", data.get("sync", {}), where)
    settings.lock_wait_seconds, settings.stale_seconds = sync.lock_wait_seconds, sync.stale_seconds
    settings.retrieval = _retrieval_section(data.get("retrieval", {}), where)
    settings.llm = _typed_section(LLMSection, "llm", data.get("llm", {}), where).model_dump()
    settings.mcp = _typed_section(MCPSection, "mcp", data.get("mcp", {}), where).model_dump()
    settings.serve = _typed_section(ServeSection, "serve", data.get("serve", {}), where).model_dump()
    settings.capture = _typed_section(CaptureSection, "capture", data.get("capture", {}), where).model_dump()


def check_docstore_url(url: str) -> None:
    """A `[store] docstore_url` must name a PostgreSQL database (the only server docstore): refused at config load,
    like every other bad value, rather than at the first sync that writes. The message never shows a login."""
    if not url:
        return
    parts = urlsplit(url)
    try:
        usable = parts.scheme in ("postgresql", "postgres") and bool(parts.hostname) and bool(parts.path.strip("/"))
        parts.port  # noqa: B018 (a port that is not a number raises ValueError)
    except ValueError:
        usable = False
    if not usable:
        raise ConfigError("store.docstore_url must look like postgresql://user@host:5432/database, "
                          f"got {without_login(url)!r}")


def without_login(url: str) -> str:
    """A URL for messages and status: whatever stands before its host (user, password) shown as ***."""
    scheme, sep, rest = url.partition("://")
    _, at, host = rest.rpartition("@")
    return scheme + sep + ("***@" + host if at else rest)


_AnySection = TypeVar("_AnySection", bound=_Section)


def _typed_section(model: type[_AnySection], name: str, data: object, where: Path,
                   table: str | None = None) -> _AnySection:
    """The section validated, with every default filled in (the defaults live in the model, nowhere else). `table`
    is how the section is named on its own (default `[name]`; a [[sources]] entry is `sources[i]`)."""
    table = table or f"[{name}]"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {table} must be a table")
    try:
        return model(**data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_first_problem(exc, name, model, table)}") from None


def _first_problem(exc: ValidationError, name: str, model: type[_Section], table: str | None = None) -> str:
    """One line naming `section.key`: unknown keys first (all of them, beside the known ones), else the first bad
    value, a number described by its whole range."""
    errors = exc.errors()
    unknown = [repr(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden"]
    if unknown:
        return f"{table or f'[{name}]'} has no setting {', '.join(unknown)}; known: " \
               f"{', '.join(sorted(model.model_fields))}"
    error = errors[0]
    if not error["loc"]:  # a rule across keys: its message names them
        return str(error["ctx"]["error"])
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "value_error":
        problem = str(error["ctx"]["error"])
    else:
        field = model.model_fields.get(key)
        rule = _number_rule(field) if field is not None else ""
        problem = f"must be {rule}" if rule else error["msg"].lower()
    return f"{name}.{key}: {problem}, got {error.get('input')!r}"


def _number_rule(field: FieldInfo) -> str:
    """What a number key accepts, e.g. 'a whole number from 1 to 32' ('' for a key that is not a number)."""
    kinds = set(get_args(field.annotation) or (field.annotation,)) - {type(None)}
    if kinds not in ({int}, {float}):
        return ""
    kind = "a whole number" if kinds == {int} else "a number"
    limits = {name: getattr(item, name) for item in field.metadata for name in ("ge", "gt", "le", "lt")
              if hasattr(item, name)}
    if "ge" in limits and "le" in limits:
        return f"{kind} from {_shown(limits['ge'])} to {_shown(limits['le'])}"
    words = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}
    said = [f"{words[name]} {_shown(limit)}" for name, limit in limits.items()]
    return f"{kind} ({' and '.join(said)})" if said else kind


def _shown(number: float) -> str:
    """3600 → '3,600', 0.05 → '0.05'."""
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


RETIRED_RETRIEVAL_KEYS = {"lead_gap": "replaced by lead_idf and lead_coverage (docs/retrieval.md)"}


def _retrieval_section(data: object, where: Path) -> dict[str, Any]:
    """The [retrieval] keys the file sets, validated like every section. A retired key is ignored with a warning: an
    old tuning line must not make a home unusable."""
    if isinstance(data, dict):
        for key in RETIRED_RETRIEVAL_KEYS.keys() & data.keys():
            log.warning("%s: retrieval.%s is ignored: %s", where, key, RETIRED_RETRIEVAL_KEYS[key])
        data = {k: v for k, v in data.items() if k not in RETIRED_RETRIEVAL_KEYS}
    return _typed_section(RetrievalSection, "retrieval", data, where).model_dump(exclude_unset=True)
