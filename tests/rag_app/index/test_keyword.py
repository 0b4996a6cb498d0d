"""The keyword channel's tokenizer and BM25 index: Chinese segmented, Traditional folded, English stemmed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_app.index.keyword import KeywordIndex, dictionary_key, query_words, tokenize
from tests.conftest import REPO, write_files


def test_chinese_is_segmented_into_words_without_spurious_bigrams() -> None:
    tokens = tokenize("我想看电影清单")
    assert {"电影", "清单"} <= set(tokens)
    assert "影清" not in tokens  # a pair across a word boundary would match unrelated notes
    assert "我想看电影清单" not in tokens


@pytest.mark.parametrize(("query", "words"), [
    ("我想看哪些电影？", ["电影"]),  # stop words (我, 哪些), and 想, 看: a longer word carries the subject
    ("我的猫", ["猫"]),  # no longer word: the one character is the subject
    ("2024年3月的读书笔记", ["2024", "读书", "笔记", "读书笔记"]),  # not 年: the query has longer words
    ("哪一本書規範了梵語？", ["本書", "規範", "梵語"]),  # as written; 哪一 asks, it is not the subject
    ("ERR_CONN_RESET_4471 的原因", ["ERR_CONN_RESET_4471", "原因"]),  # identifiers whole
    ("how to fix the Rust borrow checker in rust", ["fix", "Rust", "borrow", "checker"]),  # first spelling, once
    ("Привет мир", ["Привет", "мир"]), ("", []), ("的 a", []),
])
def test_query_words_are_the_subject_as_written(query: str, words: list[str]) -> None:
    """The one extractor of a query's words (answers' highlights and passages, search excerpts, agent previews,
    a conversation's subject)."""
    assert query_words(query) == words


def test_query_words_in_both_scripts_and_with_lone_characters() -> None:
    assert query_words("電影清單", both_scripts=True) == ["電影", "电影", "清單", "清单"]
    assert query_words("电影清单", both_scripts=True) == ["电影", "清单"]
    assert query_words("想看的电影", lone_characters=True) == ["想", "看", "电影"]


def test_traditional_chinese_folds_to_simplified() -> None:
    assert set(tokenize("電影清單")) == set(tokenize("电影清单"))


def test_latin_accents_fold_so_a_name_is_found_as_typed_without_them() -> None:
    """Zürich was indexed as "rich" (the ü cut the word); São Paulo, Pokémon and Søren are typed without accents."""
    assert tokenize("Zürich") == tokenize("Zurich") == ["zurich"]
    assert tokenize("São Paulo Pokémon Søren straße") == tokenize("Sao Paulo Pokemon Soren strasse")
    assert tokenize("日本語") == ["日本", "日本语"]  # Han and kana are left as they were


def test_english_is_lowercased_stemmed_and_stopwords_dropped() -> None:
    assert tokenize("The Running Dogs") == ["run", "dog"]


def test_identifiers_stay_whole_and_in_parts() -> None:
    tokens = tokenize("ERR_CONN_RESET at api.example.com")
    assert "api.example.com" in tokens
    assert {"api", "exampl", "com"} <= set(tokens)


def test_bm25_ranks_the_note_that_has_the_words() -> None:
    index = KeywordIndex.build([("a", tokenize("周末观影：电影清单")), ("b", tokenize("跑步训练计划")),
                                ("c", tokenize("grocery list"))])
    assert index.search(tokenize("电影"), 3)[0][0] == "a"
    assert index.search(tokenize("无关词"), 3) == []


def _tokenize_in_fresh_process(cache_home: Path, texts: int = 1, env: dict[str, str] | None = None) -> str:
    """Tokenize in a new interpreter; until a process has segmented LAZY_HAN_CHARS characters, jieba's dictionary
    is read lazily."""
    code = ("from rag_app.index.keyword import tokenize\n"
            f"for _ in range({texts}): out = tokenize('我想看电影清单，還有台北的咖啡館')\n"
            "import jieba; print(type(jieba.dt.FREQ).__name__, ' '.join(out))")
    env = env or {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_jieba_dictionary_is_cached_per_user_and_damaged_caches_are_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "cflow-brain"
    older = write_files(folder, {"jieba-0.42.0-123-0badf00d.marshal": b"x", "jieba-0.42.0-123-0badf00d.sqlite": b"x",
                                 "jieba-0.42.1-9-0badf00d.77.tmp": b"x", "jieba-0.42.1-9-0badf00d.78.tmp": b"x"})
    folder.chmod(0o700)
    os.utime(folder / "jieba-0.42.1-9-0badf00d.77.tmp", (1_000_000, 1_000_000))  # a day-old partial write
    first = _tokenize_in_fresh_process(tmp_path)
    assert first.startswith("dict ")  # no cache yet: the whole dictionary, and both caches are written
    # another dictionary's caches go (upgrades leave nothing behind), and so do old partial files, not fresh ones
    assert [p.name for p in older.glob("*0badf00d*")] == ["jieba-0.42.1-9-0badf00d.78.tmp"]
    whole, lazy = next(folder.glob("jieba-*.marshal")), next(folder.glob("jieba-*.sqlite"))
    assert whole.stat().st_size > 1_000_000 and lazy.stat().st_size > 1_000_000
    assert folder.stat().st_mode & 0o077 == 0
    words = first.split(" ", 1)[1]
    assert _tokenize_in_fresh_process(tmp_path) == f"_WordFrequencies {words}"  # a search: lazy lookups
    assert _tokenize_in_fresh_process(tmp_path, texts=400) == f"dict {words}"  # a sync: loaded whole
    whole.write_bytes(b"not marshal data")
    lazy.write_bytes(b"not a database")
    assert _tokenize_in_fresh_process(tmp_path) == f"dict {words}"
    assert _tokenize_in_fresh_process(tmp_path) == f"_WordFrequencies {words}"
    assert whole.stat().st_size > 1_000_000


def test_the_cache_key_is_the_dictionarys_content_not_its_install_time(tmp_path: Path) -> None:
    one, two, other = (write_files(tmp_path / name, {"dict.txt": text}) / "dict.txt"
                       for name, text in (("a", "电影 5 n\n"), ("b", "电影 5 n\n"), ("c", "电影 6 n\n")))
    os.utime(two, (1_000_000, 1_000_000))
    assert dictionary_key(one) == dictionary_key(two) != dictionary_key(other)


def test_no_usable_cache_directory_still_tokenizes(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": "/proc/no-such-home", "XDG_CACHE_HOME": "relative-cache"}
    out = _tokenize_in_fresh_process(tmp_path, env=env)
    assert out.split(" ", 1)[1] == "想 看 电影 清单 还有 台北 咖啡 咖啡馆"
    assert not (REPO / "relative-cache").exists()
