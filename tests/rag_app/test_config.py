"""Settings: one home, one config file, every key known and every value checked when the config is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_app.config import ConfigError, load_settings


def settings_from(tmp_path: Path, text: str):
    (tmp_path / "config.toml").write_text(text, encoding="utf-8")
    return load_settings(tmp_path)


@pytest.mark.parametrize(("text", "says"), [
    ("[retrieval]\nrrf_kk = 3\n", "[retrieval] has no setting 'rrf_kk'; known: "),
    ('[retrieval]\nrrf_k = "3"\n', "retrieval.rrf_k must be int, got '3'"),
    ("[retrieval]\nrrf_k = true\n", "retrieval.rrf_k must be int, got True"),
    ('[llm]\nmodle = "qwen"\n', "[llm] has no setting 'modle'; known: base_url, budget_chars,"),
    ("[llm]\ntimeout = -1\n", "llm.timeout: input should be greater than 0, got -1"),
    ('[mcp]\nallow_private = "false"\n', "mcp.allow_private: input should be a valid boolean, got 'false'"),
    ("[serve]\nobsidian = 1\n", "serve.obsidian: input should be a valid boolean, got 1"),
    ('[store]\nurll = "http://x"\n', "[store] has no setting(s) ['urll']; known: url"),
    ("[sync]\nstale = 3\n", "[sync] has no setting(s) ['stale']"),
    ("[sync]\nstale_seconds = 0\n", "sync.stale_seconds must be a number from 1 to"),
    ("[chunking]\nmax_chars = 50\n", "chunking.max_chars must be an integer from 100 to 8000"),
    ("[bogus]\n", "unknown section(s) ['bogus']"),
])
def test_a_wrong_key_or_value_is_refused_when_the_config_is_read(tmp_path: Path, text: str, says: str):
    with pytest.raises(ConfigError) as caught:
        settings_from(tmp_path, text)
    assert says in str(caught.value) and str(tmp_path / "config.toml") in str(caught.value)


def test_defaults_live_in_one_place_and_fill_every_section(tmp_path: Path):
    settings = settings_from(tmp_path, "[llm]\nmodel = \"qwen2.5\"\n[retrieval]\nrrf_k = 9\nbm25_weight = 1\n")
    assert settings.llm == {"base_url": "", "model": "qwen2.5", "context_window": 32768, "timeout": 120.0,
                            "max_retries": 2, "budget_chars": 12_000}
    assert settings.mcp == {"allow_private": False} and settings.serve == {"obsidian": False}
    assert settings.retrieval == {"rrf_k": 9, "bm25_weight": 1}  # the fusion's own defaults fill the rest
    assert (settings.lock_wait_seconds, settings.stale_seconds) == (10.0, 300.0)


def test_no_config_file_means_every_default(tmp_path: Path):
    settings = load_settings(tmp_path)
    assert settings.models == ["e5-small", "use-m3"] and settings.sources == []
    assert settings.llm["budget_chars"] == 12_000 and settings.mcp["allow_private"] is False
