"""Read memos from a Memos (or CFlow) server, old `/api/v1/memo` and current `/api/v1/memos` shapes alike.

Kept free of LlamaIndex so that a sync with nothing to do starts fast. See the reader for the Document view.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from readers.markdown_syntax import as_datetime, date_fields, first_h1, strip_code
from readers.records import NoteRecord, SourceListing, encode_list

TOKEN_ENV_VARS = ("CFLOW_API_TOKEN", "MEMOS_TOKEN")
_RETRY_STATUS = {429, 500, 502, 503, 504}
_VISIBILITIES = {"PUBLIC", "PROTECTED", "PRIVATE"}
_MEMOS_TAG = re.compile(r"#([^\s#,]+)")  # the server's own rule: a tag may follow CJK punctuation directly


def token_from_env() -> str | None:
    """The access token from CFLOW_API_TOKEN (or MEMOS_TOKEN): never from a flag that lands in shell history."""
    return next((os.environ[name] for name in TOKEN_ENV_VARS if os.environ.get(name)), None)


class MemosError(Exception):
    """The server could not be read completely; the message says what failed (never the token)."""


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


class MemosClient:
    """A read-only HTTP client with bounded retries (429, 5xx, timeouts) and complete paging."""

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
        self._sleep = sleep
        headers = {"Accept": "application/json", "User-Agent": "cflow-brain"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, follow_redirects=True)

    def __repr__(self) -> str:
        return f"MemosClient({self.base_url!r}, token={'set' if self._token else 'none'})"

    @property
    def has_token(self) -> bool:
        return self._token is not None

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

    def request(self, method: str, path: str, params: dict[str, Any] | None = None, what: str = "") -> httpx.Response:
        """Send one request, retrying transient failures a bounded number of times."""
        delay = self.backoff
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._http.request(method, path, params=params)
            except httpx.TransportError as exc:
                if last:
                    failure = (
                        "timed out"
                        if isinstance(exc, httpx.TimeoutException)
                        else f"connection failed ({type(exc).__name__})"
                    )
                    raise MemosError(f"{method} {path}{what}: {failure} after {attempt + 1} attempts") from None
                self._sleep(delay)
                delay *= 2
                continue
            if response.status_code in _RETRY_STATUS and not last:
                self._sleep(min(_retry_after(response) or delay, 10.0))
                delay *= 2
                continue
            return response
        raise AssertionError("unreachable")

    def get_json(self, path: str, params: dict[str, Any] | None = None, what: str = "") -> Any:
        response = self.request("GET", path, params, what)
        if response.status_code == 401:
            raise MemosAuthError(f"GET {path}{what}: 401 {_error_message(response)}: {self._auth_hint()}")
        if response.status_code >= 400:
            raise MemosError(f"GET {path}{what}: HTTP {response.status_code} {_error_message(response)}")
        try:
            return response.json()
        except ValueError as exc:
            raise MemosError(f"GET {path}{what}: malformed JSON ({exc})") from None

    def detect(self) -> MemosApi:
        """Probe the profile endpoints in the order the API history suggests."""
        probes = (("/api/v1/instance/profile", None), ("/api/v1/workspace/profile", None), ("/api/v1/status", "old"))
        for path, generation in probes:
            response = self.request("GET", path)
            if response.status_code in (404, 405, 501):
                continue
            if response.status_code == 401:
                raise MemosAuthError(f"GET {path}: 401 {_error_message(response)}: {self._auth_hint()}")
            if response.status_code >= 400:
                raise MemosError(f"GET {path}: HTTP {response.status_code} {_error_message(response)}")
            try:
                body = response.json()
            except ValueError:
                continue
            if not isinstance(body, dict):
                continue
            version = _parse_version(body.get("version") or (body.get("profile") or {}).get("version"))
            if generation == "old" or (version and version < (0, 22)):
                return MemosApi("old", version)
            if version and version < (0, 24):
                return MemosApi("v0.22", version)
            return MemosApi("new", version)
        if self.request("GET", "/api/v1/memo").status_code < 400:
            return MemosApi("old", ())
        raise MemosError(f"{self.base_url} does not look like a Memos server (no known API endpoint answered)")

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
                raise MemosAuthError(
                    f"the Memos server does not accept the token ({method} {path}: {response.status_code}); "
                    f"set a valid access token in {TOKEN_ENV_VARS[0]}"
                )
            if response.status_code >= 500:  # retries are spent: guessing "anonymous" could hide PRIVATE memos
                raise MemosError(f"{method} {path}: HTTP {response.status_code} {_error_message(response)}")
            if response.status_code >= 400:
                return None
            try:
                body = response.json()
            except ValueError:
                return None
            if isinstance(body, dict):
                user = body.get("user") if isinstance(body.get("user"), dict) else body
                return user if user.get("name") else None
        return None

    def list_raw(self, api: MemosApi, *, include_archived: bool, user: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Every memo the token can see (comments included for the old API, which lists them)."""
        if api.generation == "old":
            params = {} if include_archived else {"rowStatus": "NORMAL"}
            try:
                body = self.get_json("/api/v1/memo", params)
            except MemosError as exc:
                if "Missing user" in str(exc):
                    raise MemosAuthError(
                        f"this Memos server (old API) lists memos only for a signed-in user: "
                        f"set an access token in {TOKEN_ENV_VARS[0]}"
                    ) from None
                raise
            if isinstance(body, dict) and isinstance(body.get("data"), list):
                body = body["data"]
            if not isinstance(body, list):
                raise MemosError("GET /api/v1/memo: expected a JSON array of memos")
            return [m for m in body if isinstance(m, dict)]
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
                raise MemosError(
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

    def _walk_pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Follow nextPageToken until it is empty or missing, de-duplicating by name (paging is offset-based)."""
        seen_tokens: set[str] = set()
        by_name: dict[str, dict[str, Any]] = {}
        token = ""
        for page in range(self.max_pages):
            query = {**params, "pageSize": self.page_size}
            if token:
                query["pageToken"] = token
            body = self.get_json(path, query, what=f" (page {page + 1})")
            if not isinstance(body, dict) or not isinstance(body.get("memos", []), list):
                raise MemosError(f"GET {path} (page {page + 1}): expected an object with a 'memos' list")
            for memo in body.get("memos") or []:
                if isinstance(memo, dict):
                    by_name[str(memo.get("name") or memo.get("uid") or len(by_name))] = memo
            token = str(body.get("nextPageToken") or "")
            if not token:
                return list(by_name.values())
            if token in seen_tokens:
                raise MemosError(f"GET {path}: the server returned page token {token!r} twice; paging stopped")
            seen_tokens.add(token)
        raise MemosError(f"GET {path}: more than {self.max_pages} pages; paging stopped")


def fetch_memos(
    base_url: str,
    token: str | None,
    *,
    source: str = "memos",
    include_archived: bool = False,
    include_comments: bool = True,
    client: MemosClient | None = None,
) -> SourceListing:
    """List every memo completely or raise: a partial listing must never look like deletions."""
    own_client = client is None
    client = client or MemosClient(base_url, token)
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
        listing = SourceListing(records=[])
        for memo in raw:
            record = memo_to_record(memo, api, client.base_url, source, uids)
            if record is None:
                listing.skipped += 1
                listing.warnings.append(f"memo without id or name skipped: {str(memo)[:80]}")
                continue
            if api.generation == "old" and not include_comments and record.metadata.get("parent"):
                continue
            listing.records.append(record)
        if not client.has_token:
            listing.warnings.append(f"no token set ({TOKEN_ENV_VARS[0]}): only PUBLIC memos are visible")
        _check_downgrade(client.has_token, user, listing)
        return listing
    finally:
        if own_client:
            client.close()


def _fetch_comments(client: MemosClient, memos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Current servers leave comments out of lists; fetch them only for memos whose relations show comments."""
    comments: list[dict[str, Any]] = []
    for memo in memos:
        name = str(memo.get("name") or "")
        if name and any(rel["type"] == "COMMENT" and rel["to"] == name for rel in _relations(memo)):
            comments += client.list_comments(name)
    return comments


def _check_downgrade(has_token: bool, user: dict[str, Any] | None, listing: SourceListing) -> None:
    """A token was given, the server could not say who we are, and only PUBLIC memos came back: likely anonymous."""
    if not has_token or user is not None or not listing.records:
        return
    if all(record.metadata.get("visibility") == "PUBLIC" for record in listing.records):
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
    if api.generation == "old":
        raw_id = memo.get("id")
        if raw_id is None:
            return None
        memo_id = self_key = str(raw_id)  # relations use the numeric id even when v0.20+ adds a `name`
        link_key = str(memo.get("uid") or memo.get("name") or raw_id) if api.version >= (0, 19) else memo_id
        url = f"{base_url}/m/{link_key}"
        created = as_datetime(memo.get("createdTs"))
        updated = as_datetime(memo.get("updatedTs"))
        archived = str(memo.get("rowStatus") or "").upper() == "ARCHIVED"
        field_tags = None
        creator = str(memo.get("creatorUsername") or memo.get("creatorId") or "")
    else:
        self_key = str(memo.get("name") or "")
        if not self_key:
            return None
        uid = str(memo.get("uid") or "") if api.generation == "v0.22" else ""
        memo_id = uid or self_key.removeprefix("memos/")
        use_memos_path = api.version >= (0, 25) or not api.version
        url = f"{base_url}/memos/{memo_id}" if use_memos_path else f"{base_url}/m/{memo_id}"
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
    links = [_note_id(r["to"], api, uids) for r in outgoing if r["type"] == "REFERENCE"]
    parent_ref = memo.get("parent")
    if isinstance(parent_ref, dict):  # v0.16–v0.18.1 embed the parent memo
        parent_ref = parent_ref.get("id")
    parent_refs = ([str(parent_ref)] if parent_ref else []) + [r["to"] for r in outgoing if r["type"] == "COMMENT"]
    parent = next(filter(None, (_note_id(ref, api, uids) for ref in parent_refs)), "")
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
    return NoteRecord(id=f"memos:{memo_id}", text=content, metadata=metadata)


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


def _note_id(ref: str, api: MemosApi, uids: Mapping[str, str] | None) -> str:
    """The record id a relation or parent points at; '' on v0.22 when the target's uid is unknown (not listed)."""
    if api.generation == "v0.22":
        uid = (uids or {}).get(ref)
        return f"memos:{uid}" if uid else ""
    return f"memos:{ref.removeprefix('memos/')}"


def _attachment_names(memo: dict[str, Any]) -> list[str]:
    items = memo.get("attachments") or memo.get("resources") or memo.get("resourceList") or []
    return [str(item.get("filename") or "") for item in items if isinstance(item, dict) and item.get("filename")]


def _first_line(content: str, limit: int = 60) -> str:
    for line in content.split("\n"):
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:limit]
    return "(empty memo)"


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def _error_message(response: httpx.Response) -> str:
    """The server's own error text (echo `{message}` or gateway `{code, message}`), short and on one line.

    Bodies that say nothing (old servers answer 429 with `null`) give the reason phrase instead.
    """
    text = " ".join(response.text.split())
    try:
        body = json.loads(response.text)
    except ValueError:
        body = text
    if isinstance(body, dict) and body.get("message"):
        return " ".join(str(body["message"]).split())[:200]
    return text[:200] if body else response.reason_phrase
