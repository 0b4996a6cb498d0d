"""The keyword channel: a tokenizer that segments Chinese (jieba, Traditional folded to Simplified) and English
(lowercase, light stemming, identifiers kept whole), and a bm25s index over cached chunk tokens.

Stock LlamaIndex BM25 turns a run of Han characters into one token, so Chinese queries score ~0; here tokens are
computed once per chunk at sync time, so rebuilding the index after a sync is fast and a search process only loads it.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import math
import os
import re
import sqlite3
import threading
import time
import unicodedata
import weakref
import zlib
from collections.abc import Callable, Iterable
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rag_app.index.user_cache import cache_dir
from readers.markdown_syntax import HAN, HAN_CHARS, HAN_RUN

if TYPE_CHECKING:  # imported where the index is used: a sync that finds nothing changed needs the tokenizer only
    import numpy as np

TOKENIZER_VERSION = "kw-v3"  # v3: Latin letters with accents folded (Zürich → zurich)
_ACCENTED = re.compile(r"[\u00c0-\u024f\u1e00-\u1eff]")
_UNACCENTED = {"ß": "ss", "ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ł": "l", "ı": "i", "þ": "th", "ð": "d"}
_RUNS = re.compile(f"([{HAN_CHARS}]+)|([a-z0-9]+(?:[._\\-/:@][a-z0-9]+)*)")
_WORD = re.compile(r"[a-z0-9]+")
EN_STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does doing for from had has have how i if in into is it its "
    "me my of on or our so than that the their them then there these they this to was we were what when where which "
    "who whom why will with would you your about after again all also am any because before being between both did "
    "down during each few further he her here hers him his itself just more most no nor not now off once only other "
    "out over own same she should some such through too under until up very while yours".split()
)
ZH_STOPWORDS = frozenset(
    "的 了 和 是 在 我 有 也 就 都 而 及 与 着 或 一个 没有 我们 你们 他们 她们 它们 这个 那个 这些 那些 之 "
    "吗 呢 吧 啊 哦 把 被 让 给 对 从 向 于 以 为 所 其 但 并 很 还 又 再 已 已经 么 什么 怎么 如何 哪些 哪个 "
    "是否 可以 一下 一些 这 那 你 他 她 它 之后 之前 关于 相关".split()
)

# What a question asks with, not what it is about: no passage that answers "哪一本书规范了梵语的语法" says 哪一. Kept
# in the BM25 query (harmless there), but not counted as content when judging how much of a query a chunk covers.
# Folded to Simplified, as tokens are; English question words are stopwords already.
QUESTION_WORDS = frozenset(
    "哪 几 几个 几位 几次 几年 几种 几岁 几天 几名 谁 何 何时 何地 何处 何人 何种 何者 为何 为什么 多少 多久 多长 多大 "
    "多高 多远 怎样 怎么样 怎么 啥 甚么 什么 如何 是否 吗 呢 难道 是不是 有没有".split()
)


def is_question_word(token: str) -> bool:
    """An interrogative token: one of QUESTION_WORDS, or a word jieba formed with 哪 (哪一, 哪里, 哪位, 哪年...)."""
    return token in QUESTION_WORDS or token.startswith("哪")


LAZY_HAN_CHARS = 2000
_dictionary_lock = threading.RLock()
_lazy_han_chars = 0


class _WordFrequencies:
    """jieba's prefix dictionary read word by word from a per-user SQLite file. A search tokenizes one short query:
    a few dozen lookups instead of loading all 500k entries (0.2 s of a cold `brain search`). A read error switches
    the process to the whole dictionary."""

    def __init__(self, path: Path):
        self._db = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, check_same_thread=False)
        self.total = self._db.execute("SELECT freq FROM freq WHERE word = ?", ("\x00total",)).fetchone()[0]

    def get(self, word: str, default: Any = None) -> Any:
        try:
            row = self._db.execute("SELECT freq FROM freq WHERE word = ?", (word,)).fetchone()
        except sqlite3.Error:
            return _jieba_full().dt.FREQ.get(word, default)
        return default if row is None else row[0]

    def __contains__(self, word: object) -> bool:
        return self.get(str(word)) is not None

    def __getitem__(self, word: str) -> int:
        value = self.get(word)
        if value is None:
            raise KeyError(word)
        return value


def _jieba(han_chars: int) -> Any:
    """jieba, with its dictionary read lazily from SQLite while a process has segmented little text (a search), then
    loaded whole (a sync segments megabytes)."""
    global _lazy_han_chars
    with _dictionary_lock:
        _lazy_han_chars += han_chars
        jieba = _jieba_lazy() if _lazy_han_chars <= LAZY_HAN_CHARS else None
        return jieba or _jieba_full()


@lru_cache(maxsize=1)
def _jieba_lazy() -> Any:
    import jieba

    cache = _cache_path(jieba, ".sqlite")
    if cache is None or not cache.is_file():
        return None
    try:
        frequencies = _WordFrequencies(cache)
    except (sqlite3.Error, TypeError):
        with contextlib.suppress(OSError):
            cache.unlink()  # damaged: the full load writes it again
        return None
    jieba.setLogLevel(60)
    jieba.dt.FREQ, jieba.dt.total, jieba.dt.initialized = frequencies, frequencies.total, True
    return jieba


@lru_cache(maxsize=1)
def _jieba_full() -> Any:
    """jieba with its whole dictionary in memory, from a marshal file cached per user (jieba's own cache lives in the
    shared temp dir, where another user could plant it, and is never read); the SQLite copy for lazy lookups is
    written beside it on first use."""
    import jieba

    with _dictionary_lock:
        jieba.setLogLevel(60)
        cache = _cache_path(jieba, ".marshal")
        loaded = None
        if cache is not None and cache.is_file():
            with contextlib.suppress(Exception):  # a damaged cache is rebuilt below
                loaded = marshal.loads(cache.read_bytes())
        if loaded is None:  # from the dictionary itself: jieba's own cache is a file anyone may plant in the temp dir
            fresh = jieba.Tokenizer()
            loaded = fresh.gen_pfdict(fresh.get_dict_file())
            if cache is not None:
                write_cache(cache, lambda path: path.write_bytes(marshal.dumps(loaded)))
        jieba.dt.FREQ, jieba.dt.total, jieba.dt.initialized = loaded[0], loaded[1], True
        lazy = _cache_path(jieba, ".sqlite")
        if lazy is not None and not lazy.is_file():
            write_cache(lazy, lambda path: _write_frequencies(path, loaded[0], loaded[1]))
        return jieba


def _write_frequencies(path: Path, frequencies: dict[str, int], total: int) -> None:
    db = sqlite3.connect(str(path))
    try:
        db.execute("CREATE TABLE freq (word TEXT PRIMARY KEY, freq INTEGER NOT NULL) WITHOUT ROWID")
        db.executemany("INSERT INTO freq VALUES (?, ?)", [*frequencies.items(), ("\x00total", total)])
        db.commit()
    finally:
        db.close()


def write_cache(path: Path, write: Any, family: str = "jieba-") -> None:
    """Write a cache file atomically (a partial file never has the final name) and drop the caches of other
    dictionaries of its `family` beside it (a jieba upgrade would otherwise leave ~18 MB behind each time) and partial
    files over an hour old; a read-only cache only costs speed."""
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        partial.unlink(missing_ok=True)
        write(partial)
        os.replace(partial, path)
        for stale in path.parent.glob(f"{family}*{path.suffix}"):
            if stale != path:
                stale.unlink(missing_ok=True)
        for orphan in path.parent.glob(f"{family}*.tmp"):  # left by a process killed mid-write
            if time.time() - orphan.stat().st_mtime > 3600:
                orphan.unlink(missing_ok=True)
    except (OSError, sqlite3.Error):
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


@lru_cache(maxsize=1)
def dictionary_key(dictionary: Path) -> str:
    """The dictionary's size and CRC: the same words share one cache whichever install (or reinstall) they come from."""
    data = dictionary.read_bytes()
    return f"{len(data)}-{zlib.crc32(data):08x}"


def _cache_path(jieba: Any, suffix: str) -> Path | None:
    """Per-user cache files (marshal and SQLite) in the private cache folder (user_cache.cache_dir), keyed on jieba's
    version and dictionary so an upgrade never reuses a stale one. None when there is no private cache folder."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        key = dictionary_key(Path(jieba.__file__).parent / jieba.DEFAULT_DICT_NAME)
    except (OSError, KeyError, AttributeError, TypeError):
        return None
    return folder / f"jieba-{jieba.__version__}-{key}{suffix}"


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def to_simplified(text: str) -> str:
    """Fold Traditional to Simplified only when the text has Han characters (zhconv is slow on long Latin text)."""
    if not HAN.search(text):
        return text
    import zhconv

    return zhconv.convert(text, "zh-cn")


def tokenize(text: str) -> list[str]:
    """Tokens for BM25: jieba search-mode words, English stems, identifiers whole and in parts.

    No Han character bigrams: measured on the dev sets they cost BM25 0.027 nDCG@10 on rgb_zh_dev (0.714 → 0.687)
    and gained nothing elsewhere; spurious pairs across word boundaries ("电影清单" → "影清") match unrelated notes.
    """
    text = _ACCENTED.sub(_unaccented, to_simplified(unicodedata.normalize("NFKC", text).lower()))
    tokens: list[str] = []
    for match in _RUNS.finditer(text):
        han, latin = match.groups()
        if han:
            tokens.extend(w for w in _jieba(len(han)).cut_for_search(han) if w not in ZH_STOPWORDS)
            continue
        words = _WORD.findall(latin)
        if len(words) > 1:
            tokens.append(latin)
        kept = [w for w in words if w not in EN_STOPWORDS and (len(w) > 1 or w.isdigit())]
        tokens.extend(_stemmer().stemWords(kept) if kept else [])
    return tokens


def _unaccented(match: re.Match[str]) -> str:
    """A Latin letter without its accents, as English text writes it (Zürich, Gödel, São Paulo are searched as typed
    on a keyboard without them); one the accents are not marks of (ø, ß) by its usual spelling."""
    letter = match.group(0)
    bare = "".join(c for c in unicodedata.normalize("NFKD", letter) if c.isascii())
    return bare or _UNACCENTED.get(letter, letter)


_OTHER_WORD = re.compile(rf"[^\W_{HAN_CHARS}]+(?:[._\-/:@][^\W_{HAN_CHARS}]+)*")


def query_words(text: str, both_scripts: bool = False, lone_characters: bool = False) -> list[str]:
    """The words that carry a query's subject, as written, in order, each once (case aside): what answers, excerpts
    and agent previews find and highlight in a passage, and what a conversation carries as its subject.

    In each run of Han characters, jieba's words (search mode, read on the Simplified form) of two or more characters
    that are neither stop words nor question words (哪一, 几个); the one-character words only when the query has no
    longer one (猫 — not the 年 of 2024年3月的读书笔记), or with `lone_characters` (a preview's sentence that holds the
    想看 of 想看的电影 is the better one). Elsewhere, words of two or more letters or digits that are not English stop
    words, an identifier whole (ERR_CONN_RESET_4471, a.b/c). With `both_scripts`, a Traditional word is followed by
    its Simplified form: notes may be written in either script.
    """
    found: list[tuple[str, str, bool]] = []  # (as written, Simplified, Han)
    pos = 0
    for han in [*HAN_RUN.finditer(text), None]:
        end = han.start() if han else len(text)
        found += [(w, w, False) for w in _OTHER_WORD.findall(text, pos, end)
                  if len(w) > 1 and w.lower() not in EN_STOPWORDS]
        if han is None:
            break
        pos, run = han.end(), han.group(0)
        folded = to_simplified(run)
        same = len(folded) == len(run)  # zhconv maps character for character, nearly always
        for word, a, b in _jieba(len(run)).tokenize(folded if same else run, mode="search"):
            simplified = to_simplified(word)
            if simplified not in ZH_STOPWORDS and not is_question_word(simplified):
                found.append((run[a:b], folded[a:b] if same else simplified, True))
    longer = any(han and len(w) > 1 for w, _, han in found)
    words: dict[str, str] = {}
    for written, simplified, han in found:
        if han and longer and len(written) < 2 and not lone_characters:
            continue
        words.setdefault(written.lower(), written)
        if both_scripts and simplified != written:
            words.setdefault(simplified, simplified)
    return list(words.values())


def chunk_index_text(text: str, metadata: dict[str, Any]) -> str:
    """What BM25 sees of a chunk: title, heading and tags as well as the text (titles and tags are strong signals)."""
    tags = " ".join(json.loads(metadata.get("tags") or "[]")) if metadata.get("tags") else ""
    return "\n".join(str(v) for v in (metadata.get("title"), metadata.get("heading"), tags, text) if v)


class KeywordIndex:
    """bm25s over chunk tokens; `ids[i]` is the chunk id of row i. Saved under `<home>/bm25/` with a stamp."""

    def __init__(self, ids: list[str], bm25: Any):
        self.ids = ids
        self.bm25 = bm25
        self.row = {chunk_id: i for i, chunk_id in enumerate(ids)}
        self._df: np.ndarray | None = None

    def df(self, token: str, rows: np.ndarray | None = None) -> int:
        """How many chunks contain a token; with `rows` (`rows_of`), how many of those."""
        import numpy as np

        column = self.bm25.vocab_dict.get(token) if self.ids else None
        if column is None:
            return 0
        if rows is None:
            return int(self._dfs()[column])
        indptr, indices = self.bm25.scores["indptr"], self.bm25.scores["indices"]
        return int(np.isin(indices[indptr[column]: indptr[column + 1]], rows).sum())

    def _dfs(self) -> np.ndarray:
        """Every column's document frequency, from the posting lists (read once)."""
        if self._df is None:
            import numpy as np

            indptr = np.asarray(self.bm25.scores["indptr"])
            self._df = indptr[1:] - indptr[:-1]
        return self._df

    @cached_property
    def han_share(self) -> float:
        """The share of the home's words (each chunk's distinct tokens) written in Han characters: ~0 for a vault in
        English, most of a vault in Chinese."""
        import numpy as np

        if not self.ids or not self.bm25.vocab_dict:
            return 0.0
        df = self._dfs()
        columns = np.fromiter((c for t, c in self.bm25.vocab_dict.items() if c < len(df) and HAN.search(t)),
                              dtype=np.int64)
        total = float(df.sum())
        return float(df[columns].sum()) / total if total and len(columns) else 0.0

    def idf(self, token: str) -> float | None:
        """Inverse document frequency of a token, or None when no chunk has it."""
        df = self.df(token)
        return math.log(1 + (len(self.ids) - df + 0.5) / (df + 0.5)) if df else None

    def term_matrix(self, query_tokens: list[str], chunk_ids: list[str]) -> tuple[list[float | None], np.ndarray]:
        """Each query token's IDF (None when no chunk has it) and which chunks contain which token (a boolean
        matrix, chunks × tokens), from the posting lists."""
        import numpy as np

        idfs = [self.idf(t) for t in query_tokens]
        contains = np.zeros((len(chunk_ids), len(query_tokens)), dtype=bool)
        if not chunk_ids or not any(i is not None for i in idfs):
            return idfs, contains
        rows = np.asarray([self.row.get(c, -1) for c in chunk_ids])
        indptr, indices = self.bm25.scores["indptr"], self.bm25.scores["indices"]
        for j, (token, idf) in enumerate(zip(query_tokens, idfs, strict=True)):
            if idf is not None:
                column = self.bm25.vocab_dict[token]
                contains[:, j] = np.isin(rows, indices[indptr[column] : indptr[column + 1]])
        return idfs, contains

    def rows_of(self, chunk_ids: Iterable[str]) -> np.ndarray:
        """The index rows of chunk ids (the ones it holds), for `holds`."""
        import numpy as np

        return np.fromiter((r for r in (self.row.get(c, -1) for c in chunk_ids) if r >= 0), dtype=np.int64)

    def holds(self, tokens: list[str], rows: np.ndarray | None = None) -> bool:
        """Whether some chunk holds one of the tokens; with `rows` (`rows_of`), some chunk of those."""
        return any(self.df(token, rows) for token in tokens)

    @staticmethod
    def build(rows: Iterable[tuple[str, list[str]]]) -> KeywordIndex:
        import bm25s

        ids: list[str] = []
        corpus: list[list[str]] = []
        for chunk_id, tokens in rows:
            ids.append(chunk_id)
            corpus.append(tokens or ["\u2205"])
        bm25 = bm25s.BM25(k1=1.2, b=0.75)
        if corpus:
            bm25.index(corpus, show_progress=False)
        return KeywordIndex(ids, bm25)

    def save(self, directory: Path, stamp: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory.with_name(directory.name + ".tmp")
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        tmp.mkdir()
        if self.ids:
            self.bm25.save(str(tmp), show_progress=False)
        (tmp / "ids.json").write_text(json.dumps({"stamp": stamp, "ids": self.ids}), encoding="utf-8")
        import shutil

        old = directory.with_name(directory.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def load(directory: Path, stamp: str) -> KeywordIndex | None:
        """The saved index if it matches `stamp` (the manifest's chunk generation), else None."""
        meta_path = directory / "ids.json"
        if not meta_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except ValueError:
            return None
        if meta.get("stamp") != stamp:
            return None
        import bm25s

        if not meta["ids"]:
            return KeywordIndex([], bm25s.BM25())
        return KeywordIndex(meta["ids"], bm25s.BM25.load(str(directory), mmap=False, show_progress=False))

    def search(self, query_tokens: list[str], k: int, allowed: np.ndarray | None = None) -> list[tuple[str, float]]:
        """Top-k (chunk id, score) with score > 0; `allowed` is a 0/1 mask over rows (filters)."""
        if not self.ids or not query_tokens:
            return []
        vocab = self.bm25.vocab_dict
        known = [t for t in query_tokens if t in vocab]
        if not known:
            return []
        k = min(k, len(self.ids))
        docs, scores = self.bm25.retrieve(
            [known], k=k, show_progress=False, weight_mask=allowed, n_threads=0
        )
        return [(self.ids[int(d)], float(s)) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]


T = TypeVar("T")


class PerIndex(Generic[T]):
    """A value made from a keyword index once per index (an index is replaced, not changed, when the notes change),
    held only as long as the index is."""

    def __init__(self, make: Callable[[KeywordIndex], T]):
        self._make = make
        self._made: weakref.WeakKeyDictionary[KeywordIndex, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, keyword: KeywordIndex) -> T:
        with self._lock:
            found = self._made.get(keyword)
        if found is None:
            found = self._make(keyword)
            with self._lock:
                self._made[keyword] = found
        return found
