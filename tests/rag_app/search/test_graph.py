"""The link graph over the sample vault: wikilinks resolved by name, path or alias; backlinks; broken links."""

from __future__ import annotations

import pytest

from rag_app.engine import NoteNotFound, SearchError

NOTE = "vault:sample_vault/{}"


def test_links_backlinks_and_broken_links(sample_brain):
    index = sample_brain.get_note(NOTE.format("index.md"))
    assert NOTE.format("生活/电影清单.md") in index["links"]
    assert index["broken_links"] == ["不存在的笔记"]
    films = sample_brain.get_note(NOTE.format("生活/电影清单.md"))
    assert NOTE.format("index.md") in films["backlinks"]
    assert films["text"].startswith("# 电影清单") or "电影清单" in films["text"][:200]
    stats = sample_brain.graph().stats()
    assert stats["notes"] == 41 and stats["broken_links"] == 1 and stats["links"] > 40


def test_related_notes_combine_links_and_meaning(sample_brain):
    related = sample_brain.related(NOTE.format("生活/电影清单.md"), k=3)
    assert {"links to", "linked from"} >= {r["relation"] for r in related["links"]}
    assert NOTE.format("index.md") in [r["note_id"] for r in related["links"]]
    assert len(related["similar"]) == 3
    assert NOTE.format("生活/电影清单.md") not in [r["note_id"] for r in related["similar"]]


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "vault:../../etc/passwd", "vault:a/../../b", "", 7])
def test_note_ids_only_never_paths(sample_brain, bad):
    with pytest.raises(SearchError):
        sample_brain.get_note(bad)


def test_unknown_note_is_not_found(sample_brain):
    with pytest.raises(NoteNotFound):
        sample_brain.get_note("vault:sample_vault/nope.md")


def test_a_dendron_link_names_its_note_after_the_pipe(home, make_vault):
    """Dendron writes `[[label|note]]` and, across vaults, `[[label|dendron://vault/note#heading]]`: the note after
    the pipe is linked, not the label; a link that names no note either way stays broken."""
    from rag_app.engine import Brain

    vault = make_vault({
        "dendron.topic.pod.md": "# Pods\n\nImport and export.\n",
        "dendron.topic.seeds.md": "# Seeds\n\nSeeds differ from [[pods|dendron.topic.pod]]; see [[the docs|"
                                  "dendron://dendron.dendron-site/dendron.topic.pod#usage]] and [[nowhere]].\n",
    }, name="vault")
    brain = Brain(home)
    assert not brain.sync(vaults=(str(vault),)).failed
    seeds = brain.get_note("vault:vault/dendron.topic.seeds.md")
    assert seeds["links"] == ["vault:vault/dendron.topic.pod.md"] and seeds["broken_links"] == ["nowhere"]
    assert "vault:vault/dendron.topic.seeds.md" in brain.get_note("vault:vault/dendron.topic.pod.md")["backlinks"]
    brain.close()
