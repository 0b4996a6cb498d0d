"""Read memos from a Memos (or CFlow) server, old `/api/v1/memo` and current `/api/v1/memos` shapes alike.

Kept free of LlamaIndex so that a sync with nothing to do starts fast. See the reader for the Document view.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpcore
import httpx

from readers.markdown_syntax import as_datetime, date_fields, first_h1, strip_code
from readers.records import NoteRecord, SourceListing, encode_list
from readers.redaction import redact_secrets, redacted_line

TOKEN_ENV_VARS = ("CFLOW_API_TOKEN", "MEMOS_TOKEN")
_RETRY_STATUS = {429, 500, 502, 503, 504}
_VISIBILITIES = {"PUBLIC", "PROTECTED", "PRIVATE"}
_MEMOS_TAG = re.compile(r"#([^\s#,]+)")  # the server's own rule: a tag may follow CJK punctuation directly
MiB = 1024 * 1024
# Limits against hostile or broken servers; each is a MemosClient keyword (and a [[sources]] key).
DEFAULT_MAX_MEMOS = 200_000  # memos one listing may hold
DEFAULT_MAX_MEMO_BYTES = 2 * MiB  # one memo's content, as for vault files: larger ones are skipped, indexed copy kept
DEFAULT_MAX_RESPONSE_BYTES = 64 * MiB  # one answer's body, decompressed
DEFAULT_MAX_LISTING_BYTES = 512 * MiB  # all answers of one listing together
DEFAULT_REQUEST_DEADLINE = 120.0  # seconds for one whole answer: the read timeout alone restarts with every byte
DEFAULT_LISTING_DEADLINE = 1800.0  # seconds for one whole listing, retries included
_VALUE_BYTES = 32  # a body may hold one JSON value per this many bytes of max_response_bytes (parsing inflates ~20x)
_ENCODINGS = {"", "identity", "gzip", "x-gzip", "deflate"}  # no brotli: one chunk can inflate without bound
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def token_from_env() -> str | None:
    """The access token from CFLOW_API_TOKEN (or MEMOS_TOKEN): never from a flag that lands in shell history."""
    return next((os.environ[name] for name in TOKEN_ENV_VARS if os.environ.get(name)), None)


class MemosError(Exception):
    """The server could not be read completely; the message says what failed (never the token)."""

    def __init__(self, message: str = "", *, secrets: Iterable[str] = ()):
        super().__init__(redact_secrets(message, secrets))


class MemosAuthError(MemosError):
    """The token was rejected, missing, or silently downgraded to anonymous access."""


@dataclass(frozen=True)
class MemosApi:
    """Which API generation a server speaks: "old" (v0.14–v0.21), "v0.22" (v0.22–v0.23) or "new" (v0.24+)."""

    generation: str
    version: tuple[int, ...]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) or "unknown"


def _parse_version(text: object) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", str(text or ""))[:3])


@dataclass
class Answer:
    """One HTTP answer read whole within the client's limits."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    reason_phrase: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


@dataclass
class _Guard:
    """Limits of the request in flight, enforced on every socket read and write (httpx's timeouts restart per read).

    `tripped` says which limit cut the exchange, so the client can name it instead of a bare timeout.
    """

    deadline: float | None = None
    budget: int | None = None  # raw bytes still allowed, headers and redirect bodies included
    tripped: str = ""

    def timeout(self, timeout: float | None, error: type[Exception]) -> float | None:
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.tripped = "deadline"
            raise error("request deadline passed")
        return left if timeout is None else min(timeout, left)

    def expired(self) -> bool:
        """The last request ran out of time (its socket timeout was cut to what the deadline left)."""
        return self.tripped == "deadline" or (self.deadline is not None and time.monotonic() >= self.deadline)

    def spend(self, count: int) -> None:
        if self.budget is not None:
            self.budget -= count
            if self.budget < 0:
                self.tripped = "bytes"
                raise httpcore.ReadError("response byte limit passed")


class _GuardedStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, guard: _Guard):
        self._inner, self._guard = inner, guard

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, self._guard.timeout(timeout, httpcore.ReadTimeout))
        self._guard.spend(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._guard.timeout(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        timeout = self._guard.timeout(timeout, httpcore.ConnectTimeout)
        return _GuardedStream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._guard)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _GuardedBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend, guard: _Guard):
        self._inner, self._guard = inner, guard

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = self._guard.timeout(timeout, httpcore.ConnectTimeout)
        return _GuardedStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options), self._guard)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = self._guard.timeout(timeout, httpcore.ConnectTimeout)
        return _GuardedStream(self._inner.connect_unix_socket(path, timeout, socket_options), self._guard)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _guarded_transport(url: str, guard: _Guard, verify: bool = True) -> httpx.HTTPTransport:
    """httpx's own transport (with the proxy the environment names for this URL), its sockets watched by `guard`.

    httpx has no public hook below the response stream, so the pool's network backend is wrapped; the hostile-server
    tests fail loudly if a new httpx moves it.
    """
    transport = httpx.HTTPTransport(proxy=_proxy_for(url), verify=verify)
    pool = transport._pool
    pool._network_backend = _GuardedBackend(pool._network_backend, guard)
    return transport


def _proxy_for(url: str) -> str | None:
    parts = urlsplit(url)
    proxies = {} if urllib.request.proxy_bypass(parts.hostname or "") else urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


class _TlsWhenNeeded(httpx.BaseTransport):
    """The https transport, made at the first https request (a redirect, for a server on plain http): loading the
    certificate store costs 0.1-0.3 s that a sync of a server on http (a LAN, localhost) need not pay."""

    def __init__(self, guard: _Guard):
        self._guard = guard
        self._inner: httpx.HTTPTransport | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._inner is None:
            self._inner = _guarded_transport(str(request.url), self._guard)
        return self._inner.handle_request(request)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


def _transports(base_url: str, guard: _Guard) -> dict[str, Any]:
    """The client's transports: a server on plain http reached without an https proxy gets one that sets up no TLS;
    anything https (the server, a redirect, a proxy) is verified as usual."""
    proxy = _proxy_for(base_url) or ""
    if base_url.startswith("https://") or proxy.startswith("https://"):
        return {"transport": _guarded_transport(base_url, guard)}
    return {"transport": _guarded_transport(base_url, guard, verify=False),
            "mounts": {"https://": _TlsWhenNeeded(guard)}}


class MemosClient:
    """A read-only HTTP client with bounded retries (429, 5xx, timeouts), complete paging, and hard limits.

    A listing (what `fetch_memos` reads through `begin_listing`) holds at most `max_memos` memos and
    `max_listing_bytes` of answers, and ends within `listing_deadline` seconds; one answer is at most
    `max_response_bytes` and arrives within `request_deadline` seconds. Breaking a limit fails the listing with a
    message naming the limit, so a hostile or broken server costs bounded memory and time.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        page_size: int = 1000,
        max_pages: int = 10_000,
        max_memos: int = DEFAULT_MAX_MEMOS,
        max_memo_bytes: int = DEFAULT_MAX_MEMO_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_listing_bytes: int = DEFAULT_MAX_LISTING_BYTES,
        request_deadline: float = DEFAULT_REQUEST_DEADLINE,
        listing_deadline: float = DEFAULT_LISTING_DEADLINE,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not re.match(r"^https?://", base_url or ""):
            raise MemosError(f"Memos URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._token = (token or "").strip() or None  # a pasted token often ends with a newline
        if self._token and not re.fullmatch(r"[\x21-\x7e]+", self._token):
            raise MemosAuthError(
                f"the access token contains spaces or non-ASCII characters; set it again in {TOKEN_ENV_VARS[0]}"
            )
        self.max_retries = max_retries
        self.backoff = backoff
        self.page_size = page_size
        self.max_pages = max_pages
        self.max_memos = max_memos
        self.max_memo_bytes = max_memo_bytes
        self.max_response_bytes = max_response_bytes
        self.max_listing_bytes = max_listing_bytes
        self.request_deadline = request_deadline
        self.listing_deadline = listing_deadline
        self.warnings: list[str] = []  # repairs made while reading the current listing
        self._sleep = sleep
        self._secrets = (self._token,) if self._token else ()
        self._guard = _Guard()
        self.begin_listing()
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip, deflate", "User-Agent": "cflow-brain"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            follow_redirects=True,
            **_transports(self.base_url, self._guard),
        )

    def __repr__(self) -> str:
        return f"MemosClient({self.base_url!r}, token={'set' if self._token else 'none'})"

    @property
    def has_token(self) -> bool:
        return self._token is not None

    def begin_listing(self) -> None:
        """Start a listing: its clock, its memo and byte counts, its warnings."""
        self._listing_ends = time.monotonic() + self.listing_deadline
        self._listed_memos = 0
        self._listed_bytes = 0
        self.warnings = []

    def _error(self, message: str, kind: type[MemosError] = MemosError) -> MemosError:
        """An error whose text cannot carry the token, whatever the server echoed into it."""
        return kind(message, secrets=self._secrets)

    def _says(self, response: Answer) -> str:
        return _error_message(response, self._secrets)

    def _auth_hint(self) -> str:
        if self._token:
            return f"the token was rejected; set a valid access token in {TOKEN_ENV_VARS[0]}"
        return f"this server requires an access token; set one in {TOKEN_ENV_VARS[0]}"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemosClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, what: str = "") -> Answer:
        """Send one request, retrying transient failures a bounded number of times, within every limit."""
        delay = self.backoff
        where = f"{method} {path}{what}"
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            if time.monotonic() >= self._listing_ends:
                raise self._listing_timeout(where)
            try:
                answer = self._exchange(method, path, params, where)
            except httpx.TransportError as exc:
                if self._guard.tripped == "bytes":
                    raise self._too_large(where) from None
                if time.monotonic() >= self._listing_ends:
                    raise self._listing_timeout(where) from None
                if last:
                    raise self._error(f"{where}: {self._failure(exc)} after {attempt + 1} attempts") from None
                self._sleep(delay)
                delay *= 2
                continue
            if answer.status_code in _RETRY_STATUS and not last:
                self._sleep(min(_retry_after(answer) or delay, 10.0))
                delay *= 2
                continue
            return answer
        raise AssertionError("unreachable")

    def send_once(self, method: str, path: str, body: Any) -> Answer:
        """Send `body` as JSON once: never retried (a retry could write twice), never redirected (the token stays
        with its server), within request_deadline and max_response_bytes like every read."""
        where = f"{method} {path}"
        try:
            return self._exchange(method, path, None, where, json_body=body)
        except httpx.HTTPError as exc:
            if self._guard.tripped == "bytes":
                raise self._too_large(where) from None
            raise self._error(f"{where}: {self._failure(exc)}") from None

    def _failure(self, exc: httpx.HTTPError) -> str:
        """What ended an attempt, naming the limit when one did."""
        if self._guard.expired():
            return f"no complete answer within {self.request_deadline:g} s (request_deadline)"
        if isinstance(exc, httpx.TimeoutException):
            return "timed out"
        return f"connection failed ({type(exc).__name__})"

    def _exchange(self, method: str, path: str, params: dict[str, Any] | None, where: str,
                  json_body: Any = None) -> Answer:
        """One attempt, read as a stream: the body stops at max_response_bytes, the whole at request_deadline.

        A request with a `json_body` (a write) follows no redirect."""
        guard = self._guard
        guard.deadline = min(time.monotonic() + self.request_deadline, self._listing_ends)
        guard.budget = 2 * self.max_response_bytes + MiB  # raw bytes: chunk framing, headers, redirect bodies
        guard.tripped = ""
        try:
            with self._http.stream(method, path, params=params, json=json_body,
                                   follow_redirects=json_body is None) as response:
                encoding = response.headers.get("content-encoding", "").strip().lower()
                if encoding not in _ENCODINGS:
                    raise self._error(f"{where}: the answer uses an unsupported content encoding {encoding[:40]!r}")
                if int(response.headers.get("content-length", "0") or 0) > self.max_response_bytes:
                    raise self._too_large(where)
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    self._listed_bytes += len(chunk)
                    if len(body) > self.max_response_bytes:
                        raise self._too_large(where)
                    if self._listed_bytes > self.max_listing_bytes:
                        raise self._error(
                            f"{where}: the listing passed {self.max_listing_bytes} bytes (max_listing_bytes); "
                            "if the server really holds that much, raise max_listing_bytes for this source"
                        )
                return Answer(response.status_code, response.headers, bytes(body), response.reason_phrase)
        except ValueError:  # a Content-Length that is not a number
            raise self._error(f"{where}: malformed Content-Length header") from None
        finally:
            guard.budget = None

    def _too_large(self, where: str) -> MemosError:
        return self._error(
            f"{where}: the answer is larger than {self.max_response_bytes} bytes (max_response_bytes); "
            "if the server really sends that much, raise max_response_bytes for this source"
        )

    def _listing_timeout(self, where: str) -> MemosError:
        return self._error(
            f"{where}: the listing took longer than {self.listing_deadline:g} s (listing_deadline); "
            "if the server is just slow, raise listing_deadline for this source"
        )

    def _count(self, memos: int, where: str) -> None:
        """Count memos into the listing; past max_memos the listing stops (a server may page forever)."""
        self._listed_memos += memos
        if self._listed_memos > self.max_memos:
            raise self._error(
                f"{where}: the listing passed {self.max_memos} memos (max_memos); "
                "if the server really holds that many, raise max_memos for this source"
            )

    def get_json(self, path: str, params: dict[str, Any] | None = None, what: str = "") -> Any:
        response = self.request("GET", path, params, what)
        if response.status_code == 401:
            raise self._error(f"GET {path}{what}: 401 {self._says(response)}: {self._auth_hint()}", MemosAuthError)
        if response.status_code >= 400:
            raise self._error(f"GET {path}{what}: HTTP {response.status_code} {self._says(response)}")
        return self.parse_json(response.content, f"GET {path}{what}")

    def parse_json(self, body: bytes, where: str) -> Any:
        """JSON within a value budget (parsing can inflate a body ~20x); bad text repaired with a warning, not fatal.

        Lone surrogates (`"\\ud800"`) and invalid UTF-8 become U+FFFD, as a text editor would show them.
        """
        values = body.count(b",") + body.count(b"[") + body.count(b"{")
        if values > self.max_response_bytes // _VALUE_BYTES:
            raise self._error(
                f"{where}: the answer holds more than {self.max_response_bytes // _VALUE_BYTES} JSON values "
                "(max_response_bytes / 32); if the server really sends that much, raise max_response_bytes"
            )
        try:
            text = body.decode("utf-8")
            suspect = _SURROGATE_ESCAPE.search(body) is not None
        except UnicodeDecodeError:
            text, suspect = body.decode("utf-8", errors="surrogateescape"), True
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise self._error(f"{where}: malformed JSON ({reason})") from None
        if suspect:
            self.warnings += [f"{where}: {label}: invalid text replaced with U+FFFD" for label in _repair(value)]
        return value

    def detect(self) -> MemosApi:
        """Probe the profile endpoints in the order the API history suggests."""
        probes = (("/api/v1/instance/profile", None), ("/api/v1/workspace/profile", None), ("/api/v1/status", "old"))
        for path, generation in probes:
            response = self.request("GET", path)
            if response.status_code in (404, 405, 501):
                continue
            if response.status_code == 401:
                raise self._error(f"GET {path}: 401 {self._says(response)}: {self._auth_hint()}", MemosAuthError)
            if response.status_code >= 400:
                raise self._error(f"GET {path}: HTTP {response.status_code} {self._says(response)}")
            try:
                body = self.parse_json(response.content, f"GET {path}")
            except MemosError:
                continue
            profile = body.get("profile") if isinstance(body, dict) and generation == "old" else body
            if not isinstance(profile, dict) or not isinstance(profile.get("version"), str):
                continue  # every Memos profile names its version: another JSON server's 200 is not one
            version = _parse_version(profile["version"])
            if generation == "old" or (version and version < (0, 22)):
                return MemosApi("old", version)
            if version and version < (0, 24):
                return MemosApi("v0.22", version)
            return MemosApi("new", version)
        # the fallback the API history allows: no /api/v1/memos, and /api/v1/memo lists memos as an array
        if self.request("GET", "/api/v1/memos", {"pageSize": 1}).status_code == 404:
            response = self.request("GET", "/api/v1/memo", {"limit": 1})
            if response.status_code < 400 and _is_json_list(response.content):
                return MemosApi("old", ())
        raise self._error(f"{self.base_url} does not look like a Memos server (no known API endpoint answered)")

    def current_user(self, api: MemosApi) -> dict[str, Any] | None:
        """Who the token belongs to, or None when this version has no way to ask; raises if the token is refused."""
        if api.generation == "old":
            return None
        candidates = (
            ("GET", "/api/v1/auth/me"),
            ("GET", "/api/v1/auth/sessions/current"),
            ("POST", "/api/v1/auth/status"),
        )
        for method, path in candidates:
            response = self.request(method, path)
            if response.status_code in (404, 405, 501):
                continue
            if response.status_code in (401, 403):
                raise self._error(
                    f"the Memos server does not accept the token ({method} {path}: {response.status_code}); "
                    f"set a valid access token in {TOKEN_ENV_VARS[0]}",
                    MemosAuthError,
                )
            if response.status_code >= 500:  # retries are spent: guessing "anonymous" could hide PRIVATE memos
                raise self._error(f"{method} {path}: HTTP {response.status_code} {self._says(response)}")
            if response.status_code >= 400:
                return None
            try:
                body = self.parse_json(response.content, f"{method} {path}")
            except MemosError:
                return None
            if isinstance(body, dict):
                user = body.get("user") if isinstance(body.get("user"), dict) else body
                return user if user.get("name") else None
        return None

    def list_raw(self, api: MemosApi, *, include_archived: bool, user: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Every memo the token can see (comments included for the old API, which lists them)."""
        if api.generation == "old":
            try:
                return self._walk_offsets("/api/v1/memo", {} if include_archived else {"rowStatus": "NORMAL"})
            except MemosError as exc:
                if "Missing user" in str(exc):
                    raise self._error(
                        f"this Memos server (old API) lists memos only for a signed-in user: "
                        f"set an access token in {TOKEN_ENV_VARS[0]}",
                        MemosAuthError,
                    ) from None
                raise
        params: dict[str, Any] = {}
        me = str((user or {}).get("name") or "")
        if api.generation == "v0.22":
            # v0.22–v0.23 list archived memos unless filtered, and everyone's memos unless a creator is named.
            terms = ([f"creator == '{me}'"] if me.startswith("users/") else []) + (
                [] if include_archived else ["row_status == 'NORMAL'"]
            )
            if terms:
                params["filter"] = " && ".join(terms)
        elif api.version[:2] in ((0, 24), (0, 25)) and self.has_token:
            # v0.24–v0.25 list the caller's PRIVATE memos only with parent=users/{me}.
            if not me.startswith("users/"):
                raise self._error(
                    f"Memos {api.version_text} lists PRIVATE memos only for a named user, and the server did not say "
                    "whom the token belongs to; the listing would be incomplete"
                )
            params["parent"] = me
        memos = self._walk_pages("/api/v1/memos", params)
        if include_archived and api.generation == "new":
            memos += self._walk_pages("/api/v1/memos", {**params, "state": "ARCHIVED"})
        # A memo archived between the two walks shows up in both: keep one, the later (archived) view.
        return list({str(m.get("name") or id(m)): m for m in memos}.values())

    def list_comments(self, memo_name: str) -> list[dict[str, Any]]:
        return self._walk_pages(f"/api/v1/{quote(memo_name, safe='/')}/comments", {})

    def _walk_offsets(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Old API pages by limit/offset (no limit would return every memo in one answer of unbounded size).

        A short page is the last; a page longer than the limit means the server ignores it and sent everything.
        Offsets shift when memos are written mid-walk, so memos are de-duplicated by id.
        """
        by_id: dict[str, dict[str, Any]] = {}
        offset = 0
        for page in range(self.max_pages):
            what = f" (page {page + 1})"
            body = self.get_json(path, {**params, "limit": self.page_size, "offset": offset}, what=what)
            if isinstance(body, dict) and isinstance(body.get("data"), list):
                body = body["data"]
            if not isinstance(body, list):
                raise self._error(f"GET {path}{what}: expected a JSON array of memos")
            self._count(len(body), f"GET {path}{what}")
            before = len(by_id)
            for memo in body:
                if isinstance(memo, dict):
                    by_id[str(memo["id"]) if memo.get("id") is not None else f"#{len(by_id)}"] = memo
            if len(body) != self.page_size:
                return list(by_id.values())
            if len(by_id) == before:
                raise self._error(f"GET {path}{what}: the server sent the same page again (offset ignored?)")
            offset += len(body)
        raise self._error(f"GET {path}: more than {self.max_pages} pages; paging stopped")

    def _walk_pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Follow nextPageToken until it is empty or missing, de-duplicating by name (paging is offset-based)."""
        seen_tokens: set[str] = set()
        by_name: dict[str, dict[str, Any]] = {}
        token = ""
        for page in range(self.max_pages):
            query = {**params, "pageSize": self.page_size}
            if token:
                query["pageToken"] = token
            what = f" (page {page + 1})"
            body = self.get_json(path, query, what=what)
            if not isinstance(body, dict) or not isinstance(body.get("memos"), list):  # present, even when empty
                raise self._error(f"GET {path}{what}: expected an object with a 'memos' list")
            memos = body.get("memos") or []
            self._count(len(memos), f"GET {path}{what}")
            for memo in memos:
                if isinstance(memo, dict):
                    by_name[str(memo.get("name") or memo.get("uid") or len(by_name))] = memo
            token = str(body.get("nextPageToken") or "")
            if not token:
                return list(by_name.values())
            if token in seen_tokens:
                raise self._error(f"GET {path}: the server returned page token {token!r} twice; paging stopped")
            seen_tokens.add(token)
        raise self._error(f"GET {path}: more than {self.max_pages} pages; paging stopped")


def _is_json_list(content: bytes) -> bool:
    try:
        return isinstance(json.loads(content), list)
    except ValueError:
        return False


def _repair(value: Any) -> list[str]:
    """Replace lone surrogates in every string of a parsed answer, in place; name the memos (or parts) repaired."""
    memos = value if isinstance(value, list) else value.get("memos") if isinstance(value, dict) else None
    labels = []
    for memo in memos if isinstance(memos, list) else []:
        if isinstance(memo, dict) and _repair_strings(memo):
            label = memo.get("name") or memo.get("uid") or memo.get("id")
            labels.append("a memo" if label is None else f"memo {label}")
    if _repair_strings(value):
        labels.append("the answer")
    return labels


def _repair_strings(root: Any) -> bool:
    """Iterative (a deep answer must not hit the recursion limit); True when anything was replaced."""
    changed = False
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in list(node.items()):
                if isinstance(item, str) and _SURROGATE.search(item):
                    node[key], changed = _SURROGATE.sub("\ufffd", item), True
                elif isinstance(item, dict | list):
                    stack.append(item)
                if _SURROGATE.search(key):
                    node[_SURROGATE.sub("\ufffd", key)], changed = node.pop(key), True
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str) and _SURROGATE.search(item):
                    node[index], changed = _SURROGATE.sub("\ufffd", item), True
                elif isinstance(item, dict | list):
                    stack.append(item)
    return changed


def fetch_memos(
    base_url: str,
    token: str | None,
    *,
    source: str = "memos",
    include_archived: bool = False,
    include_comments: bool = True,
    client: MemosClient | None = None,
    known: Mapping[str, str] | None = None,
    signatures: Mapping[str, str] | None = None,
) -> SourceListing:
    """List every memo completely or raise: a partial listing must never look like deletions.

    `known` maps the note ids the index holds to their content hash ("" for a note to be read again): a memo whose
    record has that hash is listed in `unchanged_ids`, not as a record, and known memos the server no longer lists
    (nor keeps, as over a limit) are listed in `gone_ids`. The server is always read whole: Memos has no change feed
    that reports deletions. `signatures`: known notes' `memo_signature` from an earlier pass (`listing.signatures`);
    a memo whose answer still matches is listed in `unchanged_ids` without being parsed (a no-change sync of
    thousands of memos stays fast)."""
    own_client = client is None
    client = client or MemosClient(base_url, token)
    client.begin_listing()
    try:
        api = client.detect()
        user = client.current_user(api) if client.has_token else None
        try:
            raw = client.list_raw(api, include_archived=include_archived, user=user)
        except MemosError as exc:
            if api.generation == "v0.22" and "filter is required" in str(exc):
                raise MemosAuthError(
                    "the Memos server treated the request as anonymous ('filter is required'): "
                    f"set a valid access token in {TOKEN_ENV_VARS[0]}"
                ) from None
            raise
        if api.generation != "old" and include_comments:
            raw += _fetch_comments(client, raw)
        uids = {str(m["name"]): str(m["uid"]) for m in raw if m.get("name") and m.get("uid")}
        listing = SourceListing(records=[], warnings=list(client.warnings))
        known, signatures = known or {}, signatures or {}
        # v0.22 links and parents resolve through other memos' uids: a memo's answer alone does not make its record.
        # The size limit is stamped: a memo under the limit its signature was recorded with may be over a lower one.
        stamp = None if api.generation == "v0.22" else [client.base_url, source, include_comments, api.generation,
                                                        api.version, client.max_memo_bytes]
        visibilities: set[str] = set()  # of the memos listed, parsed or not
        for memo in raw:
            signature = memo_signature(memo, stamp) if stamp is not None else ""
            key = _memo_key(memo, api) if signatures else None
            if key is not None:
                note_id = memo_note_id(source, key)
                if known.get(note_id) and signatures.get(note_id) == signature:
                    listing.unchanged_ids.add(note_id)
                    visibilities.add(str(memo.get("visibility") or "").upper())
                    continue
            size = _content_bytes(memo, client.max_memo_bytes)
            oversized = size > client.max_memo_bytes
            record = memo_to_record({**memo, "content": ""} if oversized else memo, api, client.base_url, source, uids)
            if record is None:
                listing.skipped += 1
                listing.warnings.append(f"memo without id or name skipped: {str(memo)[:80]}")
                continue
            if api.generation == "old" and not include_comments and record.metadata.get("parent"):
                continue
            if oversized:  # like a vault file over its limit, but the server still has it: keep the indexed copy
                listing.skipped += 1
                listing.kept_ids.add(record.id)
                listing.warnings.append(
                    f"{record.metadata.get('url') or record.id}: {size} bytes is over the {client.max_memo_bytes}-byte "
                    "limit (max_memo_bytes); skipped, its indexed copy is kept"
                )
                continue
            listing.records.append(record)
            visibilities.add(str(record.metadata.get("visibility")))
            if signature:
                listing.signatures[record.id] = signature
        if not client.has_token:
            listing.warnings.append(f"no token set ({TOKEN_ENV_VARS[0]}): only PUBLIC memos are visible")
        _check_downgrade(client.has_token, user, listing, visibilities)
        listing.warnings = [redact_secrets(warning, client._secrets) for warning in listing.warnings]
        if known:
            _leave_out_unchanged(listing, known)
        listing.settle(known)
        return listing
    finally:
        if own_client:
            client.close()


@functools.cache
def _parser_stamp() -> str:
    """A digest of the code that turns a memo into a record: any change to it invalidates every memo signature."""
    from readers import markdown_syntax, records

    modules = (markdown_syntax, records)
    code = b"".join(Path(module.__file__ or "").read_bytes() for module in modules) + Path(__file__).read_bytes()
    return hashlib.blake2b(code, digest_size=8).hexdigest()


def memo_signature(memo: dict[str, Any], stamp: list[Any]) -> str:
    """What a memo's record is made from: the server's answer for it, where it came from (`stamp`: server, source
    name, options, API) and the parsing code. Equal signatures make equal records."""
    payload = json.dumps([stamp, memo], sort_keys=True, ensure_ascii=False, default=str)
    digest = hashlib.blake2b(payload.encode("utf-8", errors="surrogatepass"), digest_size=16).hexdigest()
    return f"{_parser_stamp()}:{digest}"


def _memo_key(memo: dict[str, Any], api: MemosApi) -> str | None:
    """The memo's id in its note id (see `memo_to_record`), or None when it has none."""
    if api.generation == "old":
        return None if memo.get("id") is None else str(memo["id"])
    name = str(memo.get("name") or "")
    if not name:
        return None
    uid = str(memo.get("uid") or "") if api.generation == "v0.22" else ""
    return uid or name.removeprefix("memos/")


def _leave_out_unchanged(listing: SourceListing, known: Mapping[str, str]) -> None:
    """Records whose content hash the index already has become `unchanged_ids`."""
    changed = []
    for record in listing.records:
        if known.get(record.id) == record.content_hash and record.id not in listing.unchanged_ids:
            listing.unchanged_ids.add(record.id)
        elif record.id not in listing.unchanged_ids:
            changed.append(record)
    listing.records = changed


def _content_bytes(memo: dict[str, Any], limit: int) -> int:
    """The memo's content in UTF-8 bytes (exact only near or above `limit`, where it matters)."""
    content = memo.get("content")
    if not isinstance(content, str) or len(content) * 4 <= limit:
        return len(content) if isinstance(content, str) else 0
    return len(content.encode("utf-8", errors="replace"))


def _fetch_comments(client: MemosClient, memos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Current servers leave comments out of lists; fetch them only for memos whose relations show comments."""
    comments: list[dict[str, Any]] = []
    for memo in memos:
        name = str(memo.get("name") or "")
        if name and any(rel["type"] == "COMMENT" and rel["to"] == name for rel in _relations(memo)):
            comments += client.list_comments(name)
    return comments


def _check_downgrade(has_token: bool, user: dict[str, Any] | None, listing: SourceListing,
                     visibilities: set[str]) -> None:
    """A token was given, the server could not say who we are, and only PUBLIC memos came back: likely anonymous."""
    if not has_token or user is not None:
        return
    if visibilities == {"PUBLIC"}:
        listing.warnings.append(
            "only PUBLIC memos were returned although a token was set; if you expected private memos, "
            "the token may be invalid (current Memos servers treat a bad token as anonymous)"
        )


def memo_to_record(
    memo: dict[str, Any], api: MemosApi, base_url: str, source: str, uids: Mapping[str, str] | None = None
) -> NoteRecord | None:
    """Normalise one memo of any API generation into a record with a stable id and a web URL for citations.

    `uids` maps v0.22 names (`memos/<int>`) to uids, so that links and parents there are record ids too.
    """
    content = str(memo.get("content") or "")
    prop = memo.get("property") if isinstance(memo.get("property"), dict) else {}
    memo_id = _memo_key(memo, api)
    if memo_id is None:
        return None
    if api.generation == "old":
        raw_id = memo["id"]
        self_key = memo_id  # relations use the numeric id even when v0.20+ adds a `name`
        link_key = str(memo.get("uid") or memo.get("name") or raw_id) if api.version >= (0, 19) else memo_id
        url = f"{base_url}/m/{safe_uid(link_key)}"
        created = as_datetime(memo.get("createdTs"))
        updated = as_datetime(memo.get("updatedTs"))
        archived = str(memo.get("rowStatus") or "").upper() == "ARCHIVED"
        field_tags = None
        creator = str(memo.get("creatorUsername") or memo.get("creatorId") or "")
    else:
        self_key = str(memo["name"])
        use_memos_path = api.version >= (0, 25) or not api.version
        route = "memos" if use_memos_path else "m"
        url = f"{base_url}/{route}/{safe_uid(memo_id)}"
        created = as_datetime(memo.get("createTime"))
        updated = as_datetime(memo.get("updateTime"))
        state = str(memo.get("state") or memo.get("rowStatus") or "").upper()
        archived = state == "ARCHIVED"
        field_tags = memo.get("tags") if api.generation == "new" else prop.get("tags")
        creator = str(memo.get("creator") or "")
    # The server's own tag list wins; content is parsed only when it sends none (old API, v0.22.0, null fields).
    if isinstance(field_tags, list) and any(field_tags):
        tags = list(dict.fromkeys(str(tag) for tag in field_tags if tag))
    else:
        tags = list(dict.fromkeys(_MEMOS_TAG.findall(strip_code(content))))
    visibility = str(memo.get("visibility") or "PRIVATE").upper()
    if visibility not in _VISIBILITIES:
        visibility = "PRIVATE"
    outgoing = [r for r in _relations(memo) if r["from"] == self_key]
    links = [_note_id(r["to"], api, source, uids) for r in outgoing if r["type"] == "REFERENCE"]
    parent_ref = memo.get("parent")
    if isinstance(parent_ref, dict):  # v0.16–v0.18.1 embed the parent memo
        parent_ref = parent_ref.get("id")
    parent_refs = ([str(parent_ref)] if parent_ref else []) + [r["to"] for r in outgoing if r["type"] == "COMMENT"]
    parent = next(filter(None, (_note_id(ref, api, source, uids) for ref in parent_refs)), "")
    title = str(prop.get("title") or "") or first_h1(content) or _first_line(content)
    metadata: dict[str, str | int | float | bool] = {
        "kind": "memos",
        "source": source,
        "title": title,
        "memo_id": memo_id,
        "url": url,
        "tags": encode_list(tags),
        "links": encode_list(list(dict.fromkeys(filter(None, links)))),
        "visibility": visibility,
        "pinned": bool(memo.get("pinned")),
        "archived": archived,
        "creator": creator,
        "attachments": encode_list(_attachment_names(memo)),
    }
    if parent:
        metadata["parent"] = parent
    metadata.update(date_fields("created", created))
    metadata.update(date_fields("updated", updated))
    return NoteRecord(id=memo_note_id(source, memo_id), text=content, metadata=metadata)


def _relations(memo: dict[str, Any]) -> list[dict[str, str]]:
    """Relations of every generation as {from, to, type}; they list both directions."""
    out: list[dict[str, str]] = []
    for rel in memo.get("relationList") or memo.get("relations") or []:
        if not isinstance(rel, dict):
            continue
        if "memoId" in rel:
            src, dst = str(rel.get("memoId")), str(rel.get("relatedMemoId"))
        else:
            src_raw, dst_raw = rel.get("memo"), rel.get("relatedMemo")
            src = str(src_raw.get("name") if isinstance(src_raw, dict) else src_raw or "")
            dst = str(dst_raw.get("name") if isinstance(dst_raw, dict) else dst_raw or "")
        out.append({"from": src, "to": dst, "type": str(rel.get("type") or "").upper()})
    return out


def memo_note_id(source: str, memo_id: str) -> str:
    """`memos:<source>/<uid>`: ids of two servers never meet (both old APIs number memos 1, 2, …)."""
    return f"memos:{source}/{safe_uid(memo_id)}"


def safe_uid(memo_id: str) -> str:
    """A uid as one path segment of a note id or URL: '/', '..', spaces and the like percent-encoded."""
    encoded = quote(memo_id, safe="")
    return encoded.replace(".", "%2E") if encoded.strip(".") == "" else encoded


def _note_id(ref: str, api: MemosApi, source: str, uids: Mapping[str, str] | None) -> str:
    """The record id a relation or parent points at; '' on v0.22 when the target's uid is unknown (not listed)."""
    if api.generation == "v0.22":
        uid = (uids or {}).get(ref)
        return memo_note_id(source, uid) if uid else ""
    return memo_note_id(source, ref.removeprefix("memos/")) if ref else ""


def _attachment_names(memo: dict[str, Any]) -> list[str]:
    items = memo.get("attachments") or memo.get("resources") or memo.get("resourceList") or []
    return [str(item.get("filename") or "") for item in items if isinstance(item, dict) and item.get("filename")]


def _first_line(content: str, limit: int = 60) -> str:
    for line in content.split("\n"):
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:limit]
    return "(empty memo)"


def _retry_after(response: Answer) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def _error_message(response: Answer, secrets: Iterable[str] = ()) -> str:
    """The server's own error text (echo `{message}` or gateway `{code, message}`), short and on one line.

    Bodies that say nothing (old servers answer 429 with `null`) give the reason phrase instead. The whole body is
    redacted before it is cut, so that no prefix of a secret survives; only a short body is parsed as JSON.
    """
    text = response.text
    try:
        body = json.loads(text) if len(response.content) <= 64 * 1024 else text
    except (ValueError, RecursionError):
        body = text
    if isinstance(body, dict) and body.get("message"):
        return redacted_line(str(body["message"]), secrets)
    return (redacted_line(text, secrets) if body else "") or response.reason_phrase
