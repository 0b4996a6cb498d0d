"""An OpenAI-compatible `/v1/embeddings` server on 127.0.0.1 for tests and benchmarks.

Vectors are deterministic and meaningful enough for retrieval tests: a hashed bag of character 1-, 2- and 3-grams
(lowercased; longer n-grams weigh more, so shared letters alone count little), L2-normalised: texts that share words
or characters are near. `encoding_format` "float" and "base64"
are both served (the openai client asks for base64 unless told otherwise); `dimensions` sets the vector size.

Knobs, all mutable while the server runs: `delay` (seconds slept per request), `fail_after` (requests answered before
every later one fails with `fail_status`), `fail_next` (statuses for the next requests, in order), `retry_after`
(a Retry-After header on injected failures), `api_key` (required bearer). Every request is recorded with its
Authorization header; `max_in_flight` is the most requests served at once; `embedded` counts the texts answered.

Run standalone: `python -m tests.doubles.embeddings_server --port 8089 --delay 0.05`.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

DEFAULT_DIMENSIONS = 256
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))
_NGRAM_WEIGHTS = {1: 0.2, 2: 0.5, 3: 1.0}


def embed_text(text: str, dimensions: int = DEFAULT_DIMENSIONS) -> np.ndarray:
    """The double's vector for one text: hashed, signed, weighted character 1-3-grams, unit length."""
    codes = np.frombuffer(text.lower().encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    vector = np.zeros(dimensions, dtype=np.float64)
    for n, weight in _NGRAM_WEIGHTS.items():
        if len(codes) < n:
            break
        hashed = np.zeros(len(codes) - n + 1, dtype=np.uint64)
        for offset in range(n):
            hashed = (hashed + codes[offset : len(codes) - n + 1 + offset] + np.uint64(n)) * _MIX[offset]
        hashed ^= hashed >> np.uint64(29)
        buckets = (hashed % np.uint64(dimensions)).astype(np.int64)
        signs = np.where((hashed >> np.uint64(40)) & np.uint64(1), weight, -weight)
        vector += np.bincount(buckets, weights=signs, minlength=dimensions)
    norm = np.linalg.norm(vector)
    if norm == 0:
        vector[0] = 1.0
        return vector.astype(np.float32)
    return (vector / norm).astype(np.float32)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a burst of concurrent clients must not meet connection resets (the default is 5)
    daemon_threads = True


class EmbeddingsDouble:
    def __init__(self, api_key: str | None = None, delay: float = 0.0, port: int = 0):
        self.api_key = api_key
        self.delay = delay
        self.fail_after: int | None = None
        self.fail_status = 500
        self.fail_next: list[int] = []
        self.fail_message: str | None = None  # the injected failure's message (default: "injected failure <status>")
        self.retry_after: float | None = None
        self.requests: list[dict[str, Any]] = []
        self.served = 0
        self.embedded = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._port = port
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def auth_headers(self) -> list[str | None]:
        """The Authorization header of every request, in arrival order."""
        return [r["auth"] for r in self.requests]

    def input_sizes(self) -> list[int]:
        """How many texts each embeddings request carried."""
        return [r["inputs"] for r in self.requests if r["path"].endswith("/embeddings")]

    def start(self) -> EmbeddingsDouble:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave together: no 40 ms delayed-ACK stall per request
            wbufsize = 1 << 16

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request"}})
                texts = body.get("input")
                texts = [texts] if isinstance(texts, str) else texts
                with double._lock:
                    double.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                            "inputs": len(texts) if isinstance(texts, list) else 0,
                                            "texts": [str(t)[:200] for t in texts] if isinstance(texts, list) else [],
                                            "model": body.get("model"), "dimensions": body.get("dimensions"),
                                            "encoding_format": body.get("encoding_format")})
                    double.in_flight += 1
                    double.max_in_flight = max(double.max_in_flight, double.in_flight)
                try:
                    if double.delay:
                        time.sleep(double.delay)
                    self._answer(body, texts)
                finally:
                    with double._lock:
                        double.in_flight -= 1

            def _answer(self, body: dict[str, Any], texts: Any) -> None:
                if double.api_key and self.headers.get("Authorization") != f"Bearer {double.api_key}":
                    return self._send(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
                if not self.path.endswith("/v1/embeddings"):
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
                    return self._send(400, {"error": {"message": "input must be non-empty strings",
                                                      "type": "invalid_request_error"}})
                failure = double._failure()
                if failure:
                    headers = {"Retry-After": f"{double.retry_after:g}"} if double.retry_after is not None else {}
                    said = double.fail_message or f"injected failure {failure}"
                    return self._send(failure, {"error": {"message": said,
                                                          "type": "server_error"}}, headers)
                dimensions = int(body.get("dimensions") or DEFAULT_DIMENSIONS)
                as_base64 = body.get("encoding_format") == "base64"
                data = []
                for index, text in enumerate(texts):
                    vector = embed_text(text, dimensions)
                    encoded: Any = base64.b64encode(vector.tobytes()).decode() if as_base64 else vector.tolist()
                    data.append({"object": "embedding", "index": index, "embedding": encoded})
                tokens = sum(len(t) for t in texts)
                with double._lock:
                    double.embedded += len(texts)
                self._send(200, {"object": "list", "data": data, "model": body.get("model", "double"),
                                 "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet."""

        self._server = _Server(("127.0.0.1", self._port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def _failure(self) -> int:
        """The status of an injected failure for this request, or 0 to answer it."""
        with self._lock:
            if self.fail_next:
                return self.fail_next.pop(0)
            if self.fail_after is not None and self.served >= self.fail_after:
                return self.fail_status
            self.served += 1
            return 0

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> EmbeddingsDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds slept per request")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    args = parser.parse_args()
    double = EmbeddingsDouble(api_key=args.api_key, delay=args.delay, port=args.port).start()
    print(f"serving {double.url}/embeddings (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        double.stop()


if __name__ == "__main__":
    main()
