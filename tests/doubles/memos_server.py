"""A faithful HTTP test double for the Memos API (see /work/shared/memos-api/SUMMARY.md).

Modes: ``old`` (v0.18.2 echo API), ``v0.22`` (early gRPC-gateway API), ``v0.25`` and ``head``
(v0.30+/HEAD).  The read side a sync client needs is served (version probes, memo list,
single memo and comments), and memo creation (``POST /api/v1/memos``, old ``POST /api/v1/memo``).
Fault injection is driven by the mutable ``faults`` dict; ``raw_overrides``
bends one memo's JSON into shapes the store cannot produce (null content, unknown enum values...).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import mimetypes
import random
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]

MODES = ("old", "v0.22", "v0.25", "head")
VERSIONS = {"old": "0.18.2", "v0.22": "0.22.5", "v0.25": "0.25.0", "head": "0.30.0"}
DEFAULT_PAGE_SIZE = {"v0.22": 10, "v0.25": 10, "head": 50}
MAX_PAGE_SIZE = 1000  # head only (v0.27+)
OWNER = "steven"  # the user the configured token belongs to (id 1)
VISIBILITIES = ("PRIVATE", "PROTECTED", "PUBLIC")
TAG_RE = re.compile(r"#([^\s#,]+)")
UID_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,34}[A-Za-z0-9])?$")
SHORTUUID_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
GATEWAY_401 = b'{"code": 16, "message": "authentication required"}\n'
OLD_BAD_TOKEN = "Invalid or expired access token"
OMIT: Any = object()  # a ``raw_overrides`` value that removes the key from the memo JSON
# HTTP status -> (gRPC code, message) for injected errors in the new API.
GRPC_ERRORS = {
    400: (3, "invalid argument"),
    401: (16, "user not authenticated"),
    403: (7, "permission denied"),
    404: (5, "not found"),
    429: (8, "resource exhausted"),
    500: (13, "internal error"),
    503: (14, "service unavailable"),
    504: (4, "deadline exceeded"),
}


class _ApiError(Exception):
    """A request error carrying its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Attachment:
    id: int
    uid: str
    filename: str
    type: str
    size: int
    created: int


@dataclass
class _Memo:
    id: int
    uid: str
    content: str
    visibility: str
    archived: bool
    pinned: bool
    created: int
    updated: int
    creator: str
    parent: int | None
    attachments: list[_Attachment]


@dataclass
class Stream:
    """A hostile answer: ``head`` and ``prefix``, then ``chunk`` ``count`` times (None: until the client hangs up),
    ``interval`` seconds apart. With ``drip_headers`` the chunks go out inside an unfinished header block."""

    chunk: bytes = b" " * 65536
    count: int | None = None
    interval: float = 0.0
    prefix: bytes = b'{"memos":['
    headers: tuple[tuple[str, str], ...] = (("Content-Type", JSON_TYPE),)
    drip_headers: bool = False


@dataclass
class _Reply:
    status: int
    body: bytes
    content_type: str = JSON_TYPE
    page: int | None = None  # page index of a successful list answer
    reset: bool = False  # send half the body, then reset the connection


def _dump(obj: object) -> bytes:
    """UTF-8 JSON; text that UTF-8 cannot carry (a lone surrogate a hostile server sends) goes out escaped."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def _rfc3339(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(raw):
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("failed to unmarshal page token: proto: cannot parse invalid wire-format data")


def encode_page_token(limit: int, offset: int) -> str:
    """Encode ``PageToken{limit=1, offset=2}`` the way Memos does (base64.StdEncoding of proto)."""
    raw = b"".join(bytes([num << 3]) + _varint(val) for num, val in ((1, limit), (2, offset)) if val)
    return base64.b64encode(raw).decode()


def decode_page_token(token: str) -> tuple[int, int]:
    """Decode a page token into ``(limit, offset)``; ValueError carries a Go-like message."""
    try:
        raw = base64.b64decode(token, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"failed to decode page token: illegal base64 data ({exc})") from None
    fields = {1: 0, 2: 0}
    pos = 0
    while pos < len(raw):
        key, pos = _read_varint(raw, pos)
        wire = key & 7
        if wire == 0:
            fields[key >> 3], pos = _read_varint(raw, pos)
        elif wire == 2:
            size, pos = _read_varint(raw, pos)
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            pos = len(raw) + 1
        if pos > len(raw):
            raise ValueError("failed to unmarshal page token: proto: cannot parse invalid wire-format data")
    limit, offset = (v - (1 << 64) if v >= 1 << 63 else v for v in (fields[1], fields[2]))
    return limit, max(offset, 0)


def _tags(content: str, ancestors: bool) -> list[str]:
    out: dict[str, None] = {}
    for tag in TAG_RE.findall(content):
        if ancestors:
            parts = tag.split("/")
            out.update({"/".join(parts[:i]): None for i in range(1, len(parts))})
        out[tag] = None
    return list(out)


def _snippet(content: str) -> str:
    return " ".join(content.split())[:64]


# Who-am-I endpoints: v0.22–v0.24 POST /auth/status, v0.25 GET /auth/sessions/current, v0.26+ GET /auth/me.
AUTH_PATHS = {"v0.22": "/api/v1/auth/status", "v0.25": "/api/v1/auth/sessions/current", "head": "/api/v1/auth/me"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], double: MemosDouble) -> None:
        super().__init__(address, _Handler)
        self.double = double

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: without this, each answer waits ~40 ms
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.server.double._handle(self)

    def do_POST(self) -> None:  # noqa: N802 - the v0.22 auth status RPC, and memo creation
        length = int(self.headers.get("Content-Length") or 0)
        self.post_body = self.rfile.read(length) if length else b""
        self.server.double._handle(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Keep test output quiet."""


class MemosDouble:
    """In-process Memos server; see the module docstring.

    ``faults`` keys, all but ``status_on_path`` acting on the memo list endpoint only: ``delay`` (seconds before
    answering), ``burst_429`` (answer 429 this many times), ``fail_after_pages`` / ``unauthorized_after_pages``
    (500 / 401 once this many pages were served), ``status_on_page`` ({page index: status}, once unless ``sticky``),
    ``truncate_page`` / ``reset_page`` (page index whose body is cut / whose connection resets mid-body),
    ``repeat_token`` (always hand out the second page's token), ``non_json_error`` (error bodies as text/plain),
    ``call_after_pages`` ({pages served: callable}, each called once before the next list request: a user writing
    or archiving a memo mid-walk), ``status_on_path`` ({path: status} for any other endpoint, e.g. who-am-I),
    ``raw_reply`` ((status, body bytes) answered as text on the list path, GET and POST alike: nothing is created).

    Hostile servers, on the memo list: ``echo_auth`` (answer this status with the request's Authorization header and
    bare token in the message), ``body_filter`` (a callable rewriting each list body's bytes), ``endless_pages``
    (this many fresh memos per page and a new page token, forever; current API only), ``stream`` (a `Stream`
    sent instead of the answer: huge, never-ending or dripping bodies or headers).
    """

    def __init__(
        self, mode: str = "head", token: str | None = "memos_pat_test", private_instance: bool = False
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.token = token  # mutable: change it to simulate a revoked token
        self.private_instance = private_instance  # honoured in head mode only (v0.30+)
        self.url = ""
        self.requests: list[dict[str, Any]] = []
        self.faults: dict[str, Any] = {}
        # memo key -> fields merged into that memo's JSON wherever it is served; a value of OMIT drops the field
        self.raw_overrides: dict[str, Json] = {}
        self._lock = threading.RLock()
        self._rng = random.Random(0)
        self._memos: dict[int, _Memo] = {}
        self._uids: dict[str, int] = {}
        self._relations: list[tuple[int, int, str]] = []  # (memo_id, related_memo_id, type)
        self._users: dict[str, int] = {OWNER: 1}
        self._next_id = 0
        self._next_attachment_id = 0
        self._now = 1_700_000_000
        self._pages_served = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, port: int = 0) -> MemosDouble:
        """Bind to 127.0.0.1 (``port`` 0 picks a free one) and serve in a daemon thread."""
        self._server = _Server(("127.0.0.1", port), self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> MemosDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- data manipulation -----------------------------------------------------------------

    def add_memo(
        self,
        content: str,
        *,
        visibility: str = "PRIVATE",
        archived: bool = False,
        pinned: bool = False,
        created: int | None = None,
        updated: int | None = None,
        parent: str | None = None,
        creator: str = OWNER,
        relations: Sequence[str] = (),
        attachments: Sequence[str] = (),
    ) -> str:
        """Insert a memo and return its key (old mode: str(id); other modes: uid)."""
        if visibility not in VISIBILITIES:
            raise ValueError(f"visibility must be one of {VISIBILITIES}")
        with self._lock:
            parent_id = self._get(parent).id if parent is not None else None
            related = [self._get(key).id for key in relations]
            if created is None:
                self._now += 60
                created = self._now
            updated = created if updated is None else updated
            self._now = max(self._now, created, updated)
            self._next_id += 1
            self._users.setdefault(creator, len(self._users) + 1)
            memo = _Memo(
                id=self._next_id,
                uid=self._new_uid(),
                content=content,
                visibility=visibility,
                archived=archived,
                pinned=pinned,
                created=created,
                updated=updated,
                creator=creator,
                parent=parent_id,
                attachments=[self._new_attachment(name, created - 100) for name in attachments],
            )
            self._memos[memo.id] = memo
            self._uids[memo.uid] = memo.id
            if parent_id is not None:
                self._relations.append((memo.id, parent_id, "COMMENT"))
            self._relations.extend((memo.id, rid, "REFERENCE") for rid in related)
            return self._key(memo)

    def edit_memo(self, key: str, content: str) -> None:
        """Replace the content and bump updateTime."""
        with self._lock:
            memo = self._get(key)
            self._now = max(self._now, memo.updated) + 60
            memo.content, memo.updated = content, self._now

    def delete_memo(self, key: str) -> None:
        """Hard delete, with the memo's relations and its comments (as HEAD does)."""
        with self._lock:
            memo = self._get(key)
            for comment_id, parent_id, kind in list(self._relations):
                if kind == "COMMENT" and parent_id == memo.id and comment_id in self._memos:
                    self.delete_memo(self._key(self._memos[comment_id]))
            del self._memos[memo.id], self._uids[memo.uid]
            self._relations = [r for r in self._relations if memo.id not in r[:2]]

    def archive_memo(self, key: str) -> None:
        """Set the memo's row status to ARCHIVED (updateTime is left alone)."""
        with self._lock:
            self._get(key).archived = True

    def memo_json(self, key: str) -> Json:
        """The memo as the API returns it to the token owner."""
        with self._lock:
            return self._memo_json(self._get(key), self._relation_index())

    # ---- internals: store ------------------------------------------------------------------

    def _new_uid(self) -> str:
        return "".join(self._rng.choice(SHORTUUID_ALPHABET) for _ in range(22))

    def _new_attachment(self, filename: str, created: int) -> _Attachment:
        self._next_attachment_id += 1
        mime = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        size = self._rng.randint(1_000, 5_000_000)
        return _Attachment(self._next_attachment_id, self._new_uid(), filename, mime, size, created)

    def _key(self, memo: _Memo) -> str:
        return str(memo.id) if self.mode == "old" else memo.uid

    def _get(self, key: str) -> _Memo:
        memo_id = int(key) if self.mode == "old" else self._uids[key]
        return self._memos[memo_id]

    def _relation_index(self) -> dict[int, list[tuple[int, int, str]]]:
        index: dict[int, list[tuple[int, int, str]]] = {}
        for rel in self._relations:
            index.setdefault(rel[0], []).append(rel)
            index.setdefault(rel[1], []).append(rel)
        return index

    # ---- internals: JSON shapes ------------------------------------------------------------

    def _name(self, memo_id: int) -> str:
        return f"memos/{memo_id}" if self.mode == "v0.22" else f"memos/{self._memos[memo_id].uid}"

    def _creator(self, memo: _Memo) -> str:
        return f"users/{memo.creator}" if self.mode == "head" else f"users/{self._users[memo.creator]}"

    def _memo_json(self, memo: _Memo, rels: dict[int, list[tuple[int, int, str]]]) -> Json:
        mine = rels.get(memo.id, [])
        out = self._old_json(memo, mine) if self.mode == "old" else self._new_json(memo, mine)
        merged = out | self.raw_overrides.get(self._key(memo), {})
        return {key: value for key, value in merged.items() if value is not OMIT}

    def _new_json(self, memo: _Memo, mine: list[tuple[int, int, str]]) -> Json:
        content = memo.content
        props: Json = {
            "hasLink": "http://" in content or "https://" in content,
            "hasTaskList": "- [ ]" in content or "- [x]" in content,
            "hasCode": "`" in content,
            "hasIncompleteTasks": "- [ ]" in content,
        }
        out: Json = {"name": self._name(memo.id)}
        if self.mode == "v0.22":
            out["uid"] = memo.uid
            out["rowStatus"] = "ARCHIVED" if memo.archived else "ACTIVE"
        else:
            out["state"] = "ARCHIVED" if memo.archived else "NORMAL"
        out["creator"] = self._creator(memo)
        out["createTime"], out["updateTime"] = _rfc3339(memo.created), _rfc3339(memo.updated)
        if self.mode != "head":
            out["displayTime"] = _rfc3339(memo.created)
        out["content"] = content
        if self.mode != "head":
            out["nodes"] = [
                {"type": "PARAGRAPH", "paragraphNode": {"children": [{"type": "TEXT", "textNode": {"content": line}}]}}
                for line in content.splitlines()
                if line.strip()
            ]
        out["visibility"] = memo.visibility
        out["tags"] = [] if self.mode == "v0.22" else _tags(content, ancestors=self.mode == "head")
        out["pinned"] = memo.pinned
        if self.mode == "v0.22":
            if memo.parent is not None:
                out["parentId"] = memo.parent
            out["resources"] = [self._attachment_json(a, memo) for a in memo.attachments]
            out["relations"] = [{"memo": f"memos/{a}", "relatedMemo": f"memos/{b}", "type": t} for a, b, t in mine]
            props = {"tags": _tags(content, ancestors=False)} | props
        else:
            out["attachments"] = [self._attachment_json(a, memo) for a in memo.attachments]
            out["relations"] = [
                {
                    "memo": {"name": self._name(a), "snippet": _snippet(self._memos[a].content)},
                    "relatedMemo": {"name": self._name(b), "snippet": _snippet(self._memos[b].content)},
                    "type": t,
                }
                for a, b, t in mine
            ]
        out["reactions"] = []
        if self.mode == "head":
            props["title"] = next((ln[2:].strip() for ln in content.splitlines() if ln.startswith("# ")), "")
        out["property"] = props
        if memo.parent is not None and self.mode != "v0.22":
            out["parent"] = self._name(memo.parent)
        out["snippet"] = _snippet(content)
        return out

    def _attachment_json(self, att: _Attachment, memo: _Memo) -> Json:
        if self.mode == "v0.22":
            head: Json = {"name": f"resources/{att.id}", "uid": att.uid}
        else:
            head = {"name": f"attachments/{att.uid}"}
        return head | {
            "createTime": _rfc3339(att.created),
            "filename": att.filename,
            "externalLink": "",
            "type": att.type,
            "size": str(att.size),
            "memo": self._name(memo.id),
        }

    def _old_json(self, memo: _Memo, rels: list[tuple[int, int, str]]) -> Json:
        creator_id = self._users[memo.creator]
        return {
            "id": memo.id,
            "rowStatus": "ARCHIVED" if memo.archived else "NORMAL",
            "creatorId": creator_id,
            "createdTs": memo.created,
            "updatedTs": memo.updated,
            "displayTs": memo.created,
            "content": memo.content,
            "visibility": memo.visibility,
            "pinned": memo.pinned,
            "creatorName": memo.creator.capitalize(),
            "creatorUsername": memo.creator,
            "resourceList": [
                {
                    "id": a.id,
                    "creatorId": creator_id,
                    "createdTs": a.created,
                    "updatedTs": a.created,
                    "filename": a.filename,
                    "externalLink": "",
                    "type": a.type,
                    "size": a.size,
                }
                for a in memo.attachments
            ],
            "relationList": [{"memoId": a, "relatedMemoId": b, "type": t} for a, b, t in rels],
        }

    # ---- internals: HTTP -------------------------------------------------------------------

    def _handle(self, handler: _Handler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        auth = handler.headers.get("Authorization")
        bearer = auth.split() if auth else []
        token = bearer[1] if len(bearer) == 2 and bearer[0].lower() == "bearer" else ""
        if parts.path in self.faults.get("status_on_path", {}):
            reply = self._fault_reply(self.faults["status_on_path"][parts.path])
        elif "raw_reply" in self.faults and parts.path == self._list_path():
            reply = _Reply(*self.faults["raw_reply"], TEXT_TYPE)
        elif handler.command == "POST" and parts.path == self._list_path():
            with self._lock:
                reply = self._create(getattr(handler, "post_body", b""), token)
        elif parts.path == self._list_path():
            reply = self._list_with_faults(parts.path, query, token, auth or "")
        else:
            with self._lock:
                reply = self._route(parts.path, query, token)
        with self._lock:  # logged before answering, so a client that has its answer also sees the log entry
            self.requests.append(
                {"method": handler.command, "path": parts.path, "query": query, "auth": auth, "status": reply.status}
            )
        stream = self.faults.get("stream") if parts.path == self._list_path() else None
        if stream is not None:
            self._send_stream(handler, stream)
        else:
            self._send(handler, reply)

    def _list_path(self) -> str:
        return "/api/v1/memo" if self.mode == "old" else "/api/v1/memos"

    def _create(self, body: bytes, token: str) -> _Reply:
        """CreateMemo: the token's owner writes ``{"content", "visibility"}`` (the old API's CreateMemoRequest, v0.22's
        CreateMemoRequest, and the current API's Memo body alike); the stored memo comes back."""
        if self.token is None or token != self.token:
            if self.mode == "old":
                return self._error(401, "Missing user in session")
            return _Reply(401, GATEWAY_401, TEXT_TYPE)
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return self._error(400, "Malformatted post memo request")
        content = request.get("content") if isinstance(request, dict) else None
        visibility = request.get("visibility") or "PRIVATE"
        if not isinstance(content, str) or not content.strip() or visibility not in VISIBILITIES:
            return self._error(400, "Malformatted post memo request" if self.mode == "old" else "invalid memo")
        key = self.add_memo(content, visibility=visibility)
        return self._json(self._memo_json(self._get(key), self._relation_index()))

    @staticmethod
    def _send_stream(handler: _Handler, stream: Stream) -> None:
        handler.close_connection = True
        write = handler.wfile.write
        try:
            if stream.drip_headers:
                write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            else:
                handler.send_response(200)
                for name, value in stream.headers:
                    handler.send_header(name, value)
                handler.send_header("Connection", "close")
                handler.end_headers()
                write(stream.prefix)
            sent = 0
            while stream.count is None or sent < stream.count:
                write(stream.chunk)
                handler.wfile.flush()
                sent += 1
                if stream.interval:
                    time.sleep(stream.interval)
        except OSError:  # the client gave up: that is the point
            pass

    @staticmethod
    def _send(handler: _Handler, reply: _Reply) -> None:
        handler.send_response(reply.status)
        handler.send_header("Content-Type", reply.content_type)
        handler.send_header("Content-Length", str(len(reply.body) * 2 + 4096 if reply.reset else len(reply.body)))
        handler.end_headers()
        if not reply.reset:
            handler.wfile.write(reply.body)
            return
        handler.wfile.write(reply.body[: len(reply.body) // 2])
        handler.wfile.flush()
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
        handler.close_connection = True

    def _json(self, obj: object, status: int = 200) -> _Reply:
        body = _dump(obj) + (b"\n" if self.mode == "old" else b"")  # echo's encoder ends with a newline
        return _Reply(status, body)

    def _error(self, status: int, message: str, code: int | None = None) -> _Reply:
        if self.mode == "old":
            return self._json({"message": message}, status)
        return self._json({"code": code or GRPC_ERRORS[status][0], "message": message, "details": []}, status)

    def _fault_reply(self, status: int) -> _Reply:
        phrase = HTTPStatus(status).phrase
        if self.faults.get("non_json_error"):
            return _Reply(status, phrase.encode(), TEXT_TYPE)
        if self.mode == "old":
            return _Reply(status, b"null\n") if status == 429 else self._error(status, phrase)
        code, message = GRPC_ERRORS.get(status, (2, "unknown"))
        return self._error(status, message, code)

    def _unauthorized_reply(self) -> _Reply:
        if self.mode == "old":
            return self._error(401, OLD_BAD_TOKEN)
        return _Reply(401, GATEWAY_401, TEXT_TYPE)

    def _list_with_faults(self, path: str, query: dict[str, str], token: str, auth: str) -> _Reply:
        faults = self.faults
        if faults.get("delay"):
            time.sleep(faults["delay"])
        if "echo_auth" in faults:
            return self._error(faults["echo_auth"], f"malformed request header Authorization: {auth} (token {token})")
        if faults.get("endless_pages"):
            return self._endless_page(faults["endless_pages"])
        with self._lock:
            if self._pages_served in faults.get("call_after_pages", {}):
                faults["call_after_pages"].pop(self._pages_served)()
            if faults.get("burst_429", 0) > 0:
                faults["burst_429"] -= 1
                return self._fault_reply(429)
            if self._pages_served >= faults.get("fail_after_pages", float("inf")):
                return self._fault_reply(500)
            if self._pages_served >= faults.get("unauthorized_after_pages", float("inf")):
                return self._unauthorized_reply()
            reply = self._route(path, query, token)
            if reply.page is None:
                return reply
            on_page = faults.get("status_on_page", {})
            if reply.page in on_page:
                status = on_page[reply.page] if faults.get("sticky") else on_page.pop(reply.page)
                return self._fault_reply(status)
            if faults.get("truncate_page") == reply.page:
                reply.body = reply.body[: len(reply.body) // 2]
            if faults.get("body_filter"):
                reply.body = faults["body_filter"](reply.body)
            reply.reset = faults.get("reset_page") == reply.page
            self._pages_served += 1
            return reply

    def _endless_page(self, count: int) -> _Reply:
        """``count`` memos never seen before and a token to more of them: a server that pages forever."""
        with self._lock:
            self._pages_served += 1
            page = self._pages_served
        memos = [
            {"name": f"memos/endless-{page}-{i}", "state": "NORMAL", "creator": f"users/{OWNER}",
             "createTime": _rfc3339(self._now), "updateTime": _rfc3339(self._now), "visibility": "PRIVATE",
             "content": f"endless page {page} memo {i} #endless", "tags": ["endless"], "pinned": False}
            for i in range(count)
        ]
        return self._json({"memos": memos, "nextPageToken": encode_page_token(count, page * count)})

    def _route(self, path: str, query: dict[str, str], token: str) -> _Reply:
        authed = self.token is not None and token == self.token
        try:
            if self.mode == "old":
                return self._route_old(path, query, token, authed)
            return self._route_new(path, query, authed)
        except _ApiError as err:
            return self._error(err.status, err.message)

    # ---- old API (v0.18.2) -----------------------------------------------------------------

    def _route_old(self, path: str, query: dict[str, str], token: str, authed: bool) -> _Reply:
        if path == "/api/v1/status":
            return self._json(
                {
                    "host": {"id": 1, "username": OWNER, "nickname": OWNER.capitalize(), "role": "HOST"},
                    "profile": {"mode": "prod", "version": VERSIONS["old"]},
                    "disablePublicMemos": False,
                    "memoDisplayWithUpdatedTs": False,
                }
            )
        if not path.startswith("/api/v1/") or path.count("/") > 4:
            return self._error(404, "Not Found")
        if token and not authed:
            return self._error(401, OLD_BAD_TOKEN)
        if path == "/api/v1/memo":
            return self._list_old(query, authed)
        prefix, _, raw_id = path.rpartition("/")
        if prefix != "/api/v1/memo":
            return self._error(404, "Not Found")
        if not raw_id.lstrip("-").isdigit():
            return self._error(400, f"ID is not a number: {raw_id}")
        memo = self._memos.get(int(raw_id))
        if memo is None:
            return self._error(404, f"Memo not found: {raw_id}")
        owner = authed and memo.creator == OWNER
        if memo.visibility == "PRIVATE" and not owner:
            return self._error(403, "this memo is private only")
        if memo.visibility == "PROTECTED" and not authed:
            return self._error(403, "this memo is protected, missing user in session")
        return self._json(self._memo_json(memo, self._relation_index()))

    def _list_old(self, query: dict[str, str], authed: bool) -> _Reply:
        creator_id: int | None = None
        if "creatorId" in query:
            if not query["creatorId"].lstrip("-").isdigit():
                return self._error(400, f"ID is not a number: {query['creatorId']}")
            creator_id = int(query["creatorId"])
        elif "creatorUsername" in query:
            creator_id = self._users.get(query["creatorUsername"], -1)
        if creator_id is None:
            if not authed:
                return self._error(400, "Missing user to find memo")
            creator_id = 1
        if not authed:
            allowed: tuple[str, ...] = ("PUBLIC",)
        elif creator_id != 1:
            allowed = ("PUBLIC", "PROTECTED")
        else:
            allowed = VISIBILITIES
        row_status = query.get("rowStatus") or None
        tag = query.get("tag", "").lower()
        text = query.get("content", "").lower()
        memos = [
            m
            for m in self._memos.values()
            if self._users[m.creator] == creator_id
            and m.visibility in allowed
            and (row_status is None or row_status == ("ARCHIVED" if m.archived else "NORMAL"))
            and (not tag or f"#{tag}" in m.content.lower())
            and text in m.content.lower()
        ]
        memos.sort(key=lambda m: (m.pinned, m.created, m.id), reverse=True)
        page = 0
        limit = query.get("limit", "")
        if limit.isdigit():
            size = int(limit)
            offset = int(query["offset"]) if query.get("offset", "").isdigit() else 0
            memos = memos[offset : offset + size]
            page = offset // size if size else 0
        rels = self._relation_index()
        reply = self._json([self._memo_json(m, rels) for m in memos])
        reply.page = page
        return reply

    # ---- new API (v0.22, v0.25, head) ------------------------------------------------------

    def _route_new(self, path: str, query: dict[str, str], authed: bool) -> _Reply:
        if path == ("/api/v1/instance/profile" if self.mode == "head" else "/api/v1/workspace/profile"):
            return self._json(self._profile())
        if path == AUTH_PATHS[self.mode]:
            if not authed:
                raise _ApiError(401, "user not authenticated")
            user = {"name": "users/1", "username": OWNER, "role": "HOST", "state": "NORMAL"}
            return self._json({"user": user} if self.mode != "v0.22" else user)
        parts = path.split("/")
        if parts[:4] != ["", "api", "v1", "memos"] or len(parts) > 6 or (len(parts) == 6 and parts[5] != "comments"):
            return self._error(404, "Not Found")
        if self.mode == "head" and self.private_instance and not authed:
            return _Reply(401, GATEWAY_401, TEXT_TYPE)
        if len(parts) == 4:
            return self._list_new(query, authed)
        memo = self._lookup(parts[4])
        if len(parts) == 6:
            return self._comments(memo, authed)
        if memo.archived and self.mode != "v0.22" and not (authed and memo.creator == OWNER):
            raise _ApiError(404, "memo not found")
        if memo.visibility != "PUBLIC":
            if not authed:
                if self.mode == "v0.22":
                    raise _ApiError(403, "permission denied")
                raise _ApiError(401, "user not authenticated")
            if memo.visibility == "PRIVATE" and memo.creator != OWNER:
                raise _ApiError(403, "permission denied")
        return self._json(self._memo_json(memo, self._relation_index()))

    def _profile(self) -> Json:
        version = VERSIONS[self.mode]
        if self.mode == "v0.22":
            return {"owner": "users/1", "version": version, "mode": "prod"}
        if self.mode == "v0.25":
            return {"owner": "users/1", "version": version, "mode": "prod", "instanceUrl": self.url}
        return {
            "version": version,
            "demo": False,
            "instanceUrl": "" if self.private_instance else self.url,
            "admin": {"name": f"users/{OWNER}", "role": "ADMIN", "username": OWNER, "displayName": OWNER.capitalize()},
            "commit": "76a762924306",
            "needsSetup": False,
            "accessMode": "INSTANCE_ACCESS_MODE_PRIVATE" if self.private_instance else "INSTANCE_ACCESS_MODE_PUBLIC",
        }

    def _lookup(self, ident: str) -> _Memo:
        if self.mode == "v0.22":
            if not ident.isdigit():
                raise _ApiError(400, f'invalid memo name: strconv.Atoi: parsing "{ident}": invalid syntax')
            memo = self._memos.get(int(ident))
        else:
            if not UID_RE.match(ident):
                raise _ApiError(400, f"invalid memo name: invalid memo uid: {ident}")
            memo = self._memos.get(self._uids.get(ident, 0))
        if memo is None:
            raise _ApiError(404, "memo not found")
        return memo

    def _comments(self, memo: _Memo, authed: bool) -> _Reply:
        ids = [a for a, b, t in self._relations if t == "COMMENT" and b == memo.id]
        comments = [self._memos[i] for i in ids]
        if self.mode != "v0.22":  # v0.22 applies no visibility check to comments at all
            comments = [c for c in comments if self._visible(c, authed)]
            comments.sort(key=lambda m: (m.created, m.id), reverse=True)
        rels = self._relation_index()
        out: Json = {"memos": [self._memo_json(c, rels) for c in comments]}
        if self.mode != "v0.22":
            out["nextPageToken"] = ""
        if self.mode == "v0.25":
            out["totalSize"] = len(comments)
        return self._json(out)

    @staticmethod
    def _visible(memo: _Memo, authed: bool) -> bool:
        if not authed:
            return memo.visibility == "PUBLIC"
        return memo.creator == OWNER or memo.visibility != "PRIVATE"

    def _list_new(self, query: dict[str, str], authed: bool) -> _Reply:
        memos = self._select_v022(query, authed) if self.mode == "v0.22" else self._select_current(query, authed)
        token = query.get("pageToken", query.get("page_token", ""))
        if token:
            try:
                limit, offset = decode_page_token(token)
            except ValueError as exc:
                raise _ApiError(400, f"invalid page token: {exc}") from None
        else:
            raw = query.get("pageSize", query.get("page_size", "0")) or "0"
            if not raw.lstrip("-").isdigit():
                raise _ApiError(400, f'parsing field "page_size": strconv.ParseInt: parsing "{raw}": invalid syntax')
            limit, offset = int(raw), 0
        if limit <= 0:
            limit = DEFAULT_PAGE_SIZE[self.mode]
        if self.mode == "head":
            limit = min(limit, MAX_PAGE_SIZE)
        window = memos[offset : offset + limit + 1]
        next_token = encode_page_token(limit, offset + limit) if len(window) > limit else ""
        if self.faults.get("repeat_token"):
            next_token = encode_page_token(limit, limit)
        rels = self._relation_index()
        out: Json = {"memos": [self._memo_json(m, rels) for m in window[:limit]], "nextPageToken": next_token}
        if self.mode == "v0.25":
            out["totalSize"] = len(memos)
        reply = self._json(out)
        reply.page = offset // limit
        return reply

    def _select_current(self, query: dict[str, str], authed: bool) -> list[_Memo]:
        """Scope, filter and order per v0.25 / HEAD ListMemos."""
        archived = query.get("state") in ("ARCHIVED", "2")
        if archived and not authed:
            return []
        check = self._cel_filter(query.get("filter", ""))
        parent = query.get("parent", "")  # v0.24-v0.25 only
        creator_id = 1 if archived else None
        if self.mode == "v0.25" and parent.startswith("users/") and parent[6:].isdigit():
            creator_id = int(parent[6:])

        def in_scope(m: _Memo) -> bool:
            if creator_id is not None and self._users[m.creator] != creator_id:
                return False
            if not authed:
                return m.visibility == "PUBLIC"
            if creator_id == 1 or (self.mode == "head" and creator_id is None and m.creator == OWNER):
                return True
            return m.visibility != "PRIVATE"

        memos = [
            m for m in self._memos.values() if m.parent is None and m.archived == archived and in_scope(m) and check(m)
        ]
        return self._ordered(memos, query.get("orderBy", query.get("order_by", "")))

    def _ordered(self, memos: list[_Memo], order_by: str) -> list[_Memo]:
        pinned = by_updated = ascending = False
        for item in filter(None, (f.split() for f in order_by.split(","))):
            direction = item[1].lower() if len(item) > 1 else "desc"
            if direction not in ("asc", "desc"):
                raise _ApiError(400, f"invalid order_by: invalid order direction: {item[1]}, must be 'asc' or 'desc'")
            if item[0] == "pinned":
                pinned = True
            elif item[0] in ("display_time", "create_time", "name", "update_time"):
                by_updated = by_updated or item[0] == "update_time"
                ascending = direction == "asc"
            else:
                raise _ApiError(400, f"invalid order_by: unsupported order field: {item[0]}")
        memos.sort(key=lambda m: (m.updated if by_updated else m.created, m.id), reverse=not ascending)
        if pinned:
            memos.sort(key=lambda m: not m.pinned)
        return memos

    def _cel_filter(self, expr: str) -> Callable[[_Memo], bool]:
        """Compile the small CEL subset a reader uses: atoms joined by ``&&``."""
        checks: list[Callable[[_Memo], bool]] = []
        for atom in filter(None, (a.strip().strip("()").strip() for a in expr.split("&&"))):
            if m := re.fullmatch(r"creator_id\s*==\s*(\d+)", atom):
                checks.append(lambda memo, n=int(m[1]): self._users[memo.creator] == n)
            elif m := re.fullmatch(r"visibility\s*==\s*[\"'](\w+)[\"']", atom):
                checks.append(lambda memo, v=m[1]: memo.visibility == v)
            elif m := re.fullmatch(r"visibility\s+in\s*\[(.*)\]", atom):
                names = re.findall(r"\w+", m[1])
                checks.append(lambda memo, vs=names: memo.visibility in vs)
            elif m := re.fullmatch(r"[\"'](.+)[\"']\s+in\s+tags", atom):
                checks.append(lambda memo, t=m[1]: t in _tags(memo.content, ancestors=self.mode == "head"))
            elif m := re.fullmatch(r"content\.contains\([\"'](.*)[\"']\)", atom):
                checks.append(lambda memo, s=m[1]: s in memo.content)
            elif m := re.fullmatch(r"pinned(?:\s*==\s*(true|false))?", atom):
                checks.append(lambda memo, want=m[1] != "false": memo.pinned == want)
            else:
                raise _ApiError(400, f"invalid filter: failed to compile filter: unsupported expression {atom!r}")
        return lambda memo: all(check(memo) for check in checks)

    def _select_v022(self, query: dict[str, str], authed: bool) -> list[_Memo]:
        """Scope and filter per v0.22 buildMemoFindWithFilter (archived memos included by default)."""
        expr = query.get("filter", "")
        if not authed and not expr:
            raise _ApiError(
                400,
                "failed to build find memos with filter: rpc error: code = InvalidArgument desc = filter is required",
            )
        terms = dict(re.findall(r"(\w+)\s*==\s*('[^']*'|\"[^\"]*\"|\[[^\]]*\]|\w+)", expr))
        creator = terms.get("creator", "").strip("'\"")
        creator_id = int(creator[6:]) if creator.startswith("users/") and creator[6:].isdigit() else None
        visibilities = re.findall(r"\w+", terms.get("visibilities", "")) or list(VISIBILITIES)
        if not authed:
            visibilities = ["PUBLIC"]
        elif creator_id is not None and creator_id != 1:
            visibilities = ["PUBLIC", "PROTECTED"]
        row_status = terms.get("row_status", "").strip("'\"")
        searches = re.findall(r"[\"']([^\"']*)[\"']", terms.get("content_search", ""))
        with_comments = terms.get("include_comments") == "true"
        memos = [
            m
            for m in self._memos.values()
            if (creator_id is None or self._users[m.creator] == creator_id)
            and m.visibility in visibilities
            and (not row_status or row_status == ("ARCHIVED" if m.archived else "NORMAL"))
            and all(s in m.content for s in searches)
            and (with_comments or m.parent is None)
        ]
        memos.sort(key=lambda m: (m.created, m.id), reverse=True)
        if terms.get("order_by_pinned") == "true":
            memos.sort(key=lambda m: not m.pinned)
        return memos


# ---- seeding / script entry point ----------------------------------------------------------

_ZH = [
    "今天读完了《三体》的第二部，黑暗森林法则让人久久不能平静。",
    "早上跑步五公里，状态不错，配速比上周快了十秒。",
    "和团队讨论了新版本的发布计划，决定先做灰度。",
    "周末去图书馆借了几本关于城市规划的书。",
    "把笔记系统从纸质本迁移到了数字化工具里。",
    "学习 Rust 的所有权模型，借用检查器还是有点难懂。",
    "晚饭做了番茄炒蛋，简单但很好吃。",
    "记录一个想法：把每周回顾和月度目标联系起来。",
    "读到一句话：写作是思考的延伸。",
    "下午开会太多，真正专注的时间不到两小时。",
]
_EN = [
    "Finished the quarterly review and sent the summary to the team.",
    "Idea: cache the embeddings per note hash so re-indexing is cheap.",
    "Reading notes on Designing Data-Intensive Applications, chapter 5.",
    "The meeting ran long; next time keep a strict agenda.",
    "Try the new pagination logic against a large dataset before release.",
    "Weekly review: finish the reading list and clean up the inbox.",
    "Bug: sync skips memos created during a long walk over pages.",
    "Remember to back up the database before upgrading the server.",
]
_EXTRAS = [
    "参考 https://example.com/notes/{i} 的讨论。",
    "- [ ] follow up on item {i}\n- [x] draft written",
    "Snippet: `memos list --page-size {i}`",
    "# Note {i}",
]
_TAGS = ["读书", "科幻/硬科幻", "运动", "工作/会议", "idea", "review", "rust", "日记", "work/planning", "health"]


def seed_memos(double: MemosDouble, n: int, seed: int = 0) -> list[str]:
    """Add ``n`` realistic memos (mixed Chinese/English, #tags, some archived/pinned/comments)."""
    rng = random.Random(seed)
    keys: list[str] = []
    roots: list[str] = []
    for i in range(n):
        target = rng.randint(80, 320)  # sentences and tags bring the total to about 100-400 chars
        paragraphs = [rng.choice(_EXTRAS).format(i=i)] if rng.random() < 0.2 else []
        while sum(map(len, paragraphs)) < target:
            paragraphs.insert(0, rng.choice(_ZH if rng.random() < 0.55 else _EN))
        tags = " ".join(f"#{t}" for t in rng.sample(_TAGS, rng.randint(0, 3)))
        content = "\n\n".join(paragraphs + ([tags] if tags else []))
        created = 1_600_000_000 + i * 5_400 + rng.randint(0, 3_600)
        updated = created + (rng.randint(60, 86_400) if rng.random() < 0.2 else 0)
        parent = rng.choice(roots) if roots and rng.random() < 0.03 else None
        key = double.add_memo(
            content,
            visibility=rng.choices(VISIBILITIES, weights=(70, 10, 20))[0],
            archived=parent is None and rng.random() < 0.05,
            pinned=parent is None and rng.random() < 0.03,
            created=created,
            updated=updated,
            parent=parent,
            relations=[rng.choice(roots)] if roots and rng.random() < 0.05 else [],
            attachments=[f"photo_{i}.jpg"] if rng.random() < 0.05 else [],
        )
        keys.append(key)
        if parent is None:
            roots.append(key)
    return keys


def main(argv: Sequence[str] | None = None) -> None:
    """Seed a double and serve it until killed; the URL is the first stdout line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=MODES, default="head")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="memos_pat_test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--private", action="store_true", help="private instance (head mode)")
    args = parser.parse_args(argv)
    double = MemosDouble(args.mode, token=args.token, private_instance=args.private)
    seed_memos(double, args.count, args.seed)
    double.start(args.port)
    print(double.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        double.stop()


if __name__ == "__main__":
    main()
