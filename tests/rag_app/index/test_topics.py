"""A note's topics (title, aliases, tags, headings) are embedded once by a sync and compared with a question."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag_app.config import load_settings
from rag_app.engine import Brain
from rag_app.index import topics
from rag_app.index.manifest import Manifest
from rag_app.index.topics import TOPICS_GENERATION, TopicIndex, fill_topics, topics_of


class CountingEmbed:
    """Unit vectors from a text's hash: what was embedded, and how often, is what these tests look at."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += texts
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts]
        return [list(r / np.linalg.norm(r)) for r in rows]


def test_a_chunks_topics_are_its_notes_names_its_headings_last_part_and_the_headings_in_its_text():
    meta = {"title": "电影清单", "aliases": '["watchlist"]', "tags": '["电影", "生活"]', "heading": "电影清单 › 已看"}
    text = "| 片名 |\n\n## 想看 ##\n\n- 《一一》\n#not-a-heading\n"
    assert topics_of(meta, text) == ["电影清单", "已看", "想看", "watchlist", "电影", "生活"]


def test_a_note_with_thousands_of_tags_gives_its_first_names_not_all():
    """A hostile note (20,000 tags) cost 20 minutes of embedding; its title and headings come first, then a bounded
    number of aliases and tags."""
    meta = {"title": "hub", "tags": [f"tag{i}" for i in range(20_000)], "heading": "hub › part"}
    got = topics_of(meta, "## inside\n")
    assert len(got) == topics.MAX_NOTE_TOPICS and got[:4] == ["hub", "part", "inside", "tag0"]


def test_a_comment_in_code_is_not_a_topic_and_a_heading_keeps_its_hash():
    """Headings by the one heading rule (readers.markdown_syntax.headings): a `# comment` in a fenced block is code."""
    text = "## C# notes\n\n```bash\n# install the tool\nbrew install x\n```\n"
    assert topics_of({"title": "t"}, text) == ["t", "C# notes"]


def test_a_heading_that_is_a_sentence_and_broken_lists_are_not_topics():
    assert topics_of({"title": "t", "tags": "not json", "heading": "x" * 200}) == ["t"]
    assert topics_of({"title": "", "tags": None, "heading": ""}) == []


def synced_home(home: Path, make_vault) -> Path:
    vault = make_vault({
        "movies.md": "---\ntags: [电影]\n---\n# 电影清单\n\n## 想看\n\n- 《一一》 杨德昌\n",
        "plants.md": "# 植物养护\n\n绿萝很好养，一周浇一次水。\n",
    })
    Brain(home).sync(vaults=(str(vault),))
    return vault


def test_a_sync_embeds_every_topic_once_and_a_sync_with_no_change_embeds_none(home, make_vault, monkeypatch):
    synced_home(home, make_vault)
    manifest = Manifest(load_settings(home).manifest_path)
    stored = manifest.topic_vectors(["电影清单", "想看", "电影", "植物养护"])
    assert set(stored) == {"电影清单", "想看", "电影", "植物养护"}
    assert manifest.get_meta(TOPICS_GENERATION) == manifest.generation()
    embed = CountingEmbed()
    assert fill_topics(manifest, embed) == 0 and embed.calls == []  # the generation is current: nothing is read
    manifest.close()


def test_topics_no_note_names_any_more_lose_their_vectors(home, make_vault):
    vault = synced_home(home, make_vault)
    (vault / "plants.md").write_text("# 多肉\n\n晒太阳。\n", encoding="utf-8")
    Brain(home).sync(vaults=(str(vault),))
    manifest = Manifest(load_settings(home).manifest_path)
    assert set(manifest.topic_vectors(["植物养护", "多肉"])) == {"多肉"}
    manifest.close()


def test_a_home_synced_before_topics_embeds_a_bounded_number_when_first_searched(home, make_vault, monkeypatch):
    synced_home(home, make_vault)
    manifest = Manifest(load_settings(home).manifest_path)
    manifest.db.execute("DELETE FROM topic_vectors")
    manifest.delete_meta(TOPICS_GENERATION)  # as an older home has it
    monkeypatch.setattr(topics, "LAZY_LIMIT", 2)
    embed = CountingEmbed()
    index = TopicIndex.load(manifest, embed)
    assert len(embed.calls) == 2 and len(set(index.texts)) == 2  # the rest waits for the next sync
    assert len(TopicIndex.load(manifest, None)) == 0  # nothing stored, nothing to embed with: no topics
    manifest.close()


def test_best_gives_each_note_its_closest_topic_best_first_within_allowed_notes():
    vectors = np.asarray([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    index = TopicIndex(["a", "b", "b"], ["alpha", "beta", "mix"], vectors)
    best = index.best([[1.0, 0.1]])
    assert {note: topic for note, (_, topic) in best.items()} == {"a": "alpha", "b": "mix"}
    norm = np.hypot(1, 0.1)
    assert best["a"][0] == pytest.approx(1 / norm) and best["b"][0] == pytest.approx(0.68 / norm)
    assert list(index.best([[1.0, 0.1]])) == ["a", "b"]
    assert list(index.best([[1.0, 0.1]], allowed={"b"})) == ["b"]
    assert TopicIndex([], [], np.zeros((0, 0), dtype=np.float32)).best([[1.0, 0.0]]) == {}


def test_best_can_give_only_the_first_notes_and_those_asked_for():
    """A search reads the first few notes and its results' topics, not a dict of every note in the home."""
    vectors = np.asarray([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.5, 0.5]], dtype=np.float32)
    index = TopicIndex(["a", "b", "c", "d"], ["alpha", "beta", "gamma", "delta"], vectors)
    assert list(index.best([[1.0, 0.0]], top=2)) == ["a", "b"]
    assert list(index.best([[1.0, 0.0]], top=1, include=["c"])) == ["a", "c"]
    assert list(index.best([[1.0, 0.0]], allowed={"c", "d"}, top=1)) == ["d"]


def test_a_topic_many_notes_share_is_one_vector():
    """A heading shared by many notes ("Summary") is kept once, and each of them finds it."""
    one = np.asarray([1.0, 0.0], dtype=np.float32).tobytes()
    other = np.asarray([0.0, 1.0], dtype=np.float32).tobytes()
    index = TopicIndex._of([("a", "Summary"), ("b", "Summary"), ("b", "Tea")], {"Summary": one, "Tea": other})
    assert index.vectors.shape == (2, 2)
    assert index.best([[1.0, 0.0]]) == {"a": (1.0, "Summary"), "b": (1.0, "Summary")}
    assert index.best([[0.0, 1.0]], top=1) == {"b": (1.0, "Tea")}
