"""Settings: one home, one config file, every key known and every value checked when the config is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_app.config import ConfigError, RemoteEmbedding, SourceSpec, load_settings, memos_source


def settings_from(tmp_path: Path, text: str):
    (tmp_path / "config.toml").write_text(text, encoding="utf-8")
    return load_settings(tmp_path)


@pytest.mark.parametrize(("text", "says"), [
    ("[retrieval]\nrrf_kk = 3\n", "[retrieval] has no setting 'rrf_kk'; known: "),
    ('[retrieval]\nrrf_k = "3"\n', "retrieval.rrf_k: must be a whole number from 0 to 1,000, got '3'"),
    ("[retrieval]\nrrf_k = true\n", "retrieval.rrf_k: must be a whole number from 0 to 1,000, got True"),
    ("[retrieval]\nrrf_k = -1\n", "retrieval.rrf_k: must be a whole number from 0 to 1,000, got -1"),
    ("[retrieval]\nvector_floor = 1.5\n", "retrieval.vector_floor: must be a number from 0 to 1, got 1.5"),
    ('[retrieval]\nfusion = "mean"\n', "retrieval.fusion: input should be 'adaptive' or 'rrf', got 'mean'"),
    ("[retrieval]\nlead_idf = -2\n", "retrieval.lead_idf: must be a number (at least 0), got -2"),
    ('[llm]\nmodle = "qwen"\n', "[llm] has no setting 'modle'; known: base_url, budget_chars,"),
    ("[llm]\ntimeout = -1\n", "llm.timeout: must be a number (above 0 and at most 3,600), got -1"),
    ('[mcp]\nallow_private = "false"\n', "mcp.allow_private: input should be a valid boolean, got 'false'"),
    ("[serve]\nobsidian = 1\n", "serve.obsidian: input should be a valid boolean, got 1"),
    ('[serve]\ntrusted_proxies = "127.0.0.1"\n',
     "serve.trusted_proxies: input should be a valid list, got '127.0.0.1'"),
    ('[serve]\ntrusted_proxies = ["proxy.lan"]\n',
     'serve.trusted_proxies: must list IP addresses or networks such as "127.0.0.1" (\'proxy.lan\' is neither)'),
    ('[store]\nurll = "http://x"\n', "[store] has no setting 'urll'; known: docstore_url, url"),
    ("[sync]\nstale = 3\n", "[sync] has no setting 'stale'; known: lock_wait_seconds, stale_seconds"),
    ("[sync]\nstale_seconds = 0\n", "sync.stale_seconds: must be a number from 1 to 2,592,000, got 0"),
    ("[chunking]\nmax_chars = 50\n", "chunking.max_chars: must be a whole number from 100 to 8,000, got 50"),
    ("[bogus]\n", "unknown section(s) ['bogus']"),
])
def test_a_wrong_key_or_value_is_refused_when_the_config_is_read(tmp_path: Path, text: str, says: str):
    with pytest.raises(ConfigError) as caught:
        settings_from(tmp_path, text)
    assert says in str(caught.value) and str(tmp_path / "config.toml") in str(caught.value)


def test_defaults_live_in_one_place_and_fill_every_section(tmp_path: Path):
    settings = settings_from(tmp_path, "[llm]\nmodel = \"qwen2.5\"\n[retrieval]\nrrf_k = 9\nbm25_weight = 1\n")
    assert settings.llm == {"base_url": "", "model": "qwen2.5", "context_window": 32768, "timeout": 120.0,
                            "max_retries": 2, "variants_timeout": 20.0, "budget_chars": 12_000}
    assert settings.mcp == {"allow_private": False} and settings.serve == {"obsidian": False, "trusted_proxies": []}
    assert settings.retrieval == {"rrf_k": 9, "bm25_weight": 1}  # the fusion's own defaults fill the rest
    assert (settings.lock_wait_seconds, settings.stale_seconds) == (10.0, 300.0)


def test_a_retired_retrieval_key_is_ignored_with_a_warning_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """`lead_gap` (one session old) was replaced by `lead_idf`/`lead_coverage`: a home that set it keeps working."""
    with caplog.at_level("WARNING", logger="cflow_brain.config"):
        settings = settings_from(tmp_path, "[retrieval]\nlead_gap = 3\nrrf_k = 9\n")
    assert settings.retrieval == {"rrf_k": 9}
    assert "retrieval.lead_gap is ignored: replaced by lead_idf and lead_coverage" in caplog.text


def test_second_model_false_or_empty_turns_the_second_channel_off(tmp_path: Path):
    assert settings_from(tmp_path, "[embedding]\nsecond_model = false\n").models == ["e5-small"]
    assert settings_from(tmp_path, '[embedding]\nsecond_model = ""\n').models == ["e5-small"]
    assert "embedding.second_model" in refusal(tmp_path, "[embedding]\nsecond_model = true\n")


def test_no_config_file_means_every_default(tmp_path: Path):
    settings = load_settings(tmp_path)
    assert settings.models == ["e5-small", "use-m3"] and settings.sources == []
    assert settings.llm["budget_chars"] == 12_000 and settings.mcp["allow_private"] is False


# --- [embedding], [chunking], [store], [sync]: strict sections like the others, defaults in their models ---

EMBEDDING_KEYS = "base_url, batch_size, concurrency, dimensions, max_retries, model, second_model, timeout"


def refusal(tmp_path: Path, text: str) -> str:
    """The whole error line of a refused config: it starts with the file."""
    with pytest.raises(ConfigError) as caught:
        settings_from(tmp_path, text)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'config.toml'}: "), message
    return message.removeprefix(f"{tmp_path / 'config.toml'}: ")


def test_good_values_of_the_embedding_chunking_store_and_sync_sections_are_read(tmp_path: Path):
    settings = settings_from(tmp_path, """
[embedding]
model = "openai:text-embedding-3-small"
second_model = "use-m3"
base_url = "http://127.0.0.1:8080/v1/"
dimensions = 512
batch_size = 64
concurrency = 8
max_retries = 0
timeout = 5
[chunking]
max_chars = 1000
overlap = 500
[store]
url = "http://127.0.0.1:8000"
[sync]
lock_wait_seconds = 0
stale_seconds = 60
""")
    assert settings.embedding_model == "openai:text-embedding-3-small@512"  # dimensions are part of the model id
    assert settings.models == ["openai:text-embedding-3-small@512", "use-m3"]
    remote = settings.remote_embedding
    assert isinstance(remote, RemoteEmbedding)
    assert (remote.base_url, remote.dimensions, remote.batch_size, remote.concurrency, remote.max_retries) == \
        ("http://127.0.0.1:8080/v1", 512, 64, 8, 0)
    assert remote.timeout == 5.0 and isinstance(remote.timeout, float)
    assert (settings.chunk_max_chars, settings.chunk_overlap) == (1000, 500)
    assert settings.store_url == "http://127.0.0.1:8000"
    assert (settings.lock_wait_seconds, settings.stale_seconds) == (0.0, 60.0)
    assert all(isinstance(value, float) for value in (settings.lock_wait_seconds, settings.stale_seconds))


def test_without_these_sections_every_default_comes_from_the_section_models(tmp_path: Path):
    settings = settings_from(tmp_path, "[embedding]\n[chunking]\n[store]\n[sync]\n")
    assert (settings.embedding_model, settings.second_model) == ("e5-small", None)
    assert settings.remote_embedding == RemoteEmbedding()
    assert (settings.remote_embedding.batch_size, settings.remote_embedding.timeout) == (16, 60.0)
    assert (settings.chunk_max_chars, settings.chunk_overlap, settings.store_url) == (600, 100, "")
    assert (settings.lock_wait_seconds, settings.stale_seconds) == (10.0, 300.0)
    assert load_settings(tmp_path / "no-config").chunk_overlap == 100


@pytest.mark.parametrize("text", [
    "[embedding]\ndimensions = 1\nmodel = 'openai:m'\n", "[embedding]\ndimensions = 65536\nmodel = 'openai:m'\n",
    "[embedding]\nbatch_size = 1\nconcurrency = 1\nmax_retries = 0\ntimeout = 0.05\n",
    "[embedding]\nbatch_size = 2048\nconcurrency = 32\nmax_retries = 20\ntimeout = 600\n",
    "[embedding]\nmodel = 'hf:/models/minilm'\nsecond_model = ''\n",
    "[embedding]\nmodel = 'openai:m@256'\ndimensions = 256\n",
    "[chunking]\nmax_chars = 100\noverlap = 50\n", "[chunking]\nmax_chars = 8000\noverlap = 4000\n",
    "[chunking]\noverlap = 0\n",
    "[store]\nurl = ''\n",
    "[sync]\nlock_wait_seconds = 3600\nstale_seconds = 1\n",
    "[sync]\nlock_wait_seconds = 0.5\nstale_seconds = 2592000\n",
])
def test_the_ends_of_every_range_are_accepted(tmp_path: Path, text: str):
    settings_from(tmp_path, text)


@pytest.mark.parametrize(("text", "says"), [
    # a value of the wrong type names the key, even where Python would take it (a bool is not a number)
    ('[embedding]\nbatch_size = "16"\n', "embedding.batch_size: must be a whole number from 1 to 2,048, got '16'"),
    ("[embedding]\ntimeout = true\n", "embedding.timeout: must be a number from 0.05 to 600, got True"),
    ("[embedding]\ndimensions = 64.0\nmodel = 'openai:m'\n",
     "embedding.dimensions: must be a whole number from 1 to 65,536, got 64.0"),
    ("[embedding]\nbase_url = 8080\n", "embedding.base_url: input should be a valid string, got 8080"),
    ("[embedding]\nmodel = 5\n", "embedding.model: input should be a valid string, got 5"),
    ("[embedding]\nsecond_model = 3\n", "embedding.second_model: input should be a valid string, got 3"),
    ("[chunking]\nmax_chars = 600.0\n", "chunking.max_chars: must be a whole number from 100 to 8,000, got 600.0"),
    ("[chunking]\noverlap = true\n", "chunking.overlap: must be a whole number, got True"),
    ("[store]\nurl = 8000\n", "store.url: input should be a valid string, got 8000"),
    ('[sync]\nlock_wait_seconds = "10"\n', "sync.lock_wait_seconds: must be a number from 0 to 3,600, got '10'"),
    ("[sync]\nstale_seconds = false\n", "sync.stale_seconds: must be a number from 1 to 2,592,000, got False"),
    ("sync = 5\n", "[sync] must be a table"),
    # a number out of its range says the whole range
    ("[embedding]\ndimensions = 0\nmodel = 'openai:m'\n",
     "embedding.dimensions: must be a whole number from 1 to 65,536, got 0"),
    ("[embedding]\ndimensions = 65537\nmodel = 'openai:m'\n",
     "embedding.dimensions: must be a whole number from 1 to 65,536, got 65537"),
    ("[embedding]\nbatch_size = 2049\n", "embedding.batch_size: must be a whole number from 1 to 2,048, got 2049"),
    ("[embedding]\nconcurrency = 33\n", "embedding.concurrency: must be a whole number from 1 to 32, got 33"),
    ("[embedding]\nmax_retries = -1\n", "embedding.max_retries: must be a whole number from 0 to 20, got -1"),
    ("[embedding]\ntimeout = 0.01\n", "embedding.timeout: must be a number from 0.05 to 600, got 0.01"),
    ("[embedding]\ntimeout = nan\n", "embedding.timeout: must be a number from 0.05 to 600, got nan"),
    ("[chunking]\nmax_chars = 8001\n", "chunking.max_chars: must be a whole number from 100 to 8,000, got 8001"),
    ("[chunking]\noverlap = 301\n",
     "chunking.overlap: must be a whole number from 0 to 300 (half of max_chars), got 301"),
    ("[chunking]\noverlap = -1\n",
     "chunking.overlap: must be a whole number from 0 to 300 (half of max_chars), got -1"),
    ("[chunking]\nmax_chars = 150\n",  # the default overlap (100) is more than half of 150
     "chunking.overlap: must be a whole number from 0 to 75 (half of max_chars), got 100"),
    ("[sync]\nlock_wait_seconds = 3601\n", "sync.lock_wait_seconds: must be a number from 0 to 3,600, got 3601"),
    ("[sync]\nlock_wait_seconds = -inf\n", "sync.lock_wait_seconds: must be a number from 0 to 3,600, got -inf"),
    ("[sync]\nstale_seconds = 2592001\n", "sync.stale_seconds: must be a number from 1 to 2,592,000, got 2592001"),
    # the value's meaning is checked too
    ('[embedding]\nbase_url = "127.0.0.1:8080"\n', "embedding.base_url: must be an http(s) URL, got '127.0.0.1:8080'"),
    ('[embedding]\nsecond_model = "bert"\n', "embedding.second_model: must be 'e5-small' (default), 'use-m3' (fast), "
     "'hf:<local dir or model name>' or 'openai:<name>' (an embeddings server), or \"\" for none, got 'bert'"),
    ("[embedding]\nmodel = 'openai:m@128'\ndimensions = 64\n",
     "embedding.dimensions needs model = 'openai:<name>' (without another '@<dimensions>'), got 'openai:m@128'"),
    # unknown keys: every one of them, beside the known ones
    ('[embedding]\nbaseurl = "http://x"\n', f"[embedding] has no setting 'baseurl'; known: {EMBEDDING_KEYS}"),
    ("[chunking]\nsize = 500\noverlap = 50\n", "[chunking] has no setting 'size'; known: max_chars, overlap"),
    ('[store]\nhost = "127.0.0.1"\n', "[store] has no setting 'host'; known: docstore_url, url"),
    ("[sync]\nstale = 3\nlock_wait = 1\n", "[sync] has no setting 'stale', 'lock_wait'; known: lock_wait_seconds, "
     "stale_seconds"),
    ("[sync]\nstale = 3\nlock_wait_seconds = -1\n", "[sync] has no setting 'stale'; known: lock_wait_seconds, "
     "stale_seconds"),  # a misspelt key is reported before a bad value
])
def test_the_embedding_chunking_store_and_sync_sections_refuse_with_the_key_named(tmp_path: Path, text: str, says: str):
    assert refusal(tmp_path, text) == says


def test_trusted_proxies_are_read_as_addresses_or_networks_and_none_by_default(tmp_path: Path):
    text = '[serve]\ntrusted_proxies = ["127.0.0.1", "10.0.0.0/8", "::1"]\n'
    assert settings_from(tmp_path, text).serve["trusted_proxies"] == ["127.0.0.1", "10.0.0.0/8", "::1"]
    assert settings_from(tmp_path, "[serve]\n").serve["trusted_proxies"] == []


SOURCE_KEYS = ("include_archived, include_comments, kind, listing_deadline, max_listing_bytes, max_memo_bytes, "
               "max_memos, max_response_bytes, max_retries, name, page_size, path, request_deadline, timeout, "
               "token_env, url")
VAULT = '[[sources]]\nkind = "vault"\npath = "/tmp/notes"\n'
MEMOS = '[[sources]]\nkind = "memos"\nurl = "https://memos.example.com"\n'


@pytest.mark.parametrize(("text", "says"), [
    # a misspelt key is refused, naming every key a source knows (not silently ignored)
    (MEMOS + 'tokn_env = "X"\n', f"sources[0] has no setting 'tokn_env'; known: {SOURCE_KEYS}"),
    (VAULT + MEMOS + 'tokn_env = "X"\nlimit = 3\n', f"sources[1] has no setting 'tokn_env', 'limit'; known: "
     f"{SOURCE_KEYS}"),
    # a quoted boolean is not a boolean (bool("false") is True)
    (MEMOS + 'include_archived = "false"\n', "sources[0].include_archived: input should be a valid boolean, "
     "got 'false'"),
    (MEMOS + "include_comments = 0\n", "sources[0].include_comments: input should be a valid boolean, got 0"),
    (MEMOS + "token_env = 5\n", "sources[0].token_env: input should be a valid string, got 5"),
    ('[[sources]]\nkind = "vault"\npath = 5\n', "sources[0].path: input should be a valid string, got 5"),
    # numbers: their type and whole range, as in every section
    (MEMOS + 'timeout = "fast"\n', "sources[0].timeout: must be a number from 0.05 to 600, got 'fast'"),
    (MEMOS + "timeout = true\n", "sources[0].timeout: must be a number from 0.05 to 600, got True"),
    (MEMOS + "max_retries = 1.5\n", "sources[0].max_retries: must be a whole number from 0 to 20, got 1.5"),
    (VAULT + MEMOS + "page_size = 0\n", "sources[1].page_size: must be a whole number from 1 to 1,000, got 0"),
    (MEMOS + "max_memos = 100000001\n",
     "sources[0].max_memos: must be a whole number from 1 to 100,000,000, got 100000001"),
    (MEMOS + "listing_deadline = 0.5\n", "sources[0].listing_deadline: must be a number from 1 to 604,800, got 0.5"),
    # what a source means is checked too
    ('[[sources]]\nkind = "obsidian"\npath = "/tmp"\n',
     "sources[0].kind: must be 'vault' or 'memos', got 'obsidian'"),
    ('[[sources]]\npath = "/tmp"\n', "sources[0].kind: must be 'vault' or 'memos', got ''"),
    ('[[sources]]\nkind = "vault"\n', "sources[0].path: a vault source needs 'path', got ''"),
    ('[[sources]]\nkind = "memos"\n', "sources[0].url: a memos source needs 'url', got ''"),
    ('[[sources]]\nkind = "memos"\nurl = "memos.example.com"\n', "sources[0].url: the Memos URL must look like "
     "https://memos.example.com (http or https, then a host), got 'memos.example.com'"),
    (MEMOS + 'token_env = "memos_pat_xyz-1"\n', "sources[0].token_env: must name an environment variable (put the "
     "token in that variable, never in the config), got 'memos_pat_xyz-1'"),
    (VAULT + 'name = "a/b"\n', "sources[0].name: up to 100 characters, no '/', backslash or control characters, not "
     "'.' or '..' (it is part of every note id), got 'a/b'"),
    ("sources = [5]\n", "sources[0] must be a table"),
])
def test_a_source_entry_refuses_unknown_keys_and_wrong_types_with_the_entry_named(tmp_path: Path, text: str,
                                                                                   says: str):
    assert refusal(tmp_path, text) == says


@pytest.mark.parametrize("url", ["memos.example.com", "ftp://memos.example.com", "https://", "https://a b",
                                 "https://memos.example.com:99999"])
def test_a_memos_flag_meets_the_config_file_rule(url: str):
    """`--memos URL` and a [[sources]] url are checked by one rule (SourceSection), before anything is remembered."""
    with pytest.raises(ConfigError, match="the Memos URL must look like https://memos.example.com"):
        memos_source(url)
    assert memos_source("https://memos.example.com/").url == "https://memos.example.com"


def test_a_source_entry_reads_every_key_with_its_type(tmp_path: Path):
    text = (MEMOS + 'name = "cflow"\ntoken_env = "CFLOW_TOKEN"\ninclude_archived = false\ninclude_comments = false\n'
            "timeout = 30\nmax_retries = 0\npage_size = 1000\nmax_memos = 5\nlisting_deadline = 60\n" + VAULT)
    memos, vault = settings_from(tmp_path, text).sources
    assert (memos.name, memos.token_env, memos.include_archived, memos.include_comments) == \
        ("cflow", "CFLOW_TOKEN", False, False)
    assert memos.memos_limits() == {"timeout": 30.0, "max_retries": 0, "page_size": 1000, "max_memos": 5,
                                    "listing_deadline": 60.0}
    assert isinstance(memos.memos_limits()["timeout"], float)
    assert (vault.name, vault.kind, vault.path, vault.include_archived, vault.include_comments) == \
        ("notes", "vault", "/tmp/notes", False, True)
    assert SourceSpec.from_dict(memos.to_dict()) == memos  # the manifest keeps a source as to_dict() and reads it back
