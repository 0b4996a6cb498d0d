"""An OpenAI-compatible chat server on 127.0.0.1 for tests: JSON and SSE streaming, scripted replies, a request log.

`replies` is a list of callables or strings consumed in order (the last one repeats); a callable gets the request body
and returns the assistant text, or a dict `{"tool_calls": [...]}` for a function call. A request for search-query
variants (the engine's own prompt, sent before it searches whenever an LLM is configured) is answered with `variants`
and logged in `variant_requests`, so a test about answers scripts and counts the answer requests alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = str | Callable[[dict[str, Any]], Any]
VARIANT_PROMPT = "alternative search queries"


class OpenAIDouble:
    def __init__(self, replies: list[Reply] | None = None, api_key: str | None = None, variants: Reply = ""):
        self.replies: list[Reply] = list(replies or ["ok"])
        self.api_key = api_key
        self.variants = variants
        self.requests: list[dict[str, Any]] = []
        self.variant_requests: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> OpenAIDouble:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                asks_variants = VARIANT_PROMPT in json.dumps(body.get("messages", []), ensure_ascii=False)
                log = double.variant_requests if asks_variants else double.requests
                log.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                if double.api_key and self.headers.get("Authorization") != f"Bearer {double.api_key}":
                    return self._send(401, {"error": {"message": "invalid api key", "type": "auth"}})
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": "not found"}})
                if asks_variants:
                    answer = double.variants(body) if callable(double.variants) else double.variants
                else:
                    answer = double._next(body)
                if body.get("stream"):
                    return self._stream(body, answer)
                return self._send(200, _completion(body, answer))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, body: dict[str, Any], answer: Any) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                text = answer if isinstance(answer, str) else ""
                pieces = [text[i : i + 8] for i in range(0, len(text), 8)] or [""]
                for piece in pieces:
                    chunk = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()),
                             "model": body.get("model", "test"),
                             "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece},
                                          "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                done = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": body.get("model", "test"),
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OpenAIDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next(self, body: dict[str, Any]) -> Any:
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return reply(body) if callable(reply) else reply

    def prompts(self) -> list[str]:
        """The text of every message sent, one string per request."""
        return ["\n".join(str(m.get("content") or "") for m in r["body"].get("messages", [])) for r in self.requests]


def _completion(body: dict[str, Any], answer: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "stop"
    if isinstance(answer, dict) and answer.get("tool_calls"):
        message["tool_calls"] = answer["tool_calls"]
        finish = "tool_calls"
    else:
        message["content"] = str(answer)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "test"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }
