"""A Chinese question about English notes is also searched as its English gloss (CC-CEDICT's first senses)."""

from __future__ import annotations

import json

import pytest

from rag_app.search.cross_language import dictionary, english_gloss

# One English note a subject, enough chunks (≥ MIN_POOL) for a match by meaning to stand out of the rest.
ENGLISH_NOTES = {
    "Schadenfreude.md": "# Schadenfreude\n\nThe pleasure people feel at the misfortune or bad luck of others, a secret "
                        "happiness when someone else fails.\n",
    "Capillary Action.md": "# Capillary Action\n\nWater rises in a thin tube because the liquid molecules are "
                           "attracted to the tube's walls more than to each other.\n",
    "Gimbal Lock.md": "# Gimbal Lock\n\nWhen two axes of rotation line up, a gimbal loses one degree of freedom.\n",
    "Klein Bottle.md": "# Klein Bottle\n\nA closed surface with no inside and outside; it cannot be embedded in three "
                       "dimensions without crossing itself.\n",
    "Blue Green Deployment.md": "# Blue Green Deployment\n\nRun two identical production environments and switch "
                                "traffic between them to release with instant rollback.\n",
    "Diffie-Hellman.md": "# Diffie-Hellman Key Exchange\n\nTwo parties agree on a shared secret key over a public "
                         "network without ever sending the key.\n",
    "Prion.md": "# Prion\n\nA misfolded protein that makes normal proteins fold wrongly; prions cause mad cow "
                "disease.\n",
    "Compound Interest.md": "# Compound Interest\n\nInterest earned is added to the principal, so the final amount "
                            "grows exponentially with each period.\n",
    "Radiocarbon Dating.md": "# Radiocarbon Dating\n\nArchaeologists date bone and wood from the decay of the "
                             "radioactive isotope carbon-14.\n",
    "Tea Processing.md": "# Tea Processing\n\nTea leaves are plucked, withered, rolled, oxidised and dried.\n",
}
FILLER = ["sourdough starter feeding", "bicycle chain lubrication", "houseplant repotting in spring",
          "marathon training plan", "guitar string changing", "sailing knots for beginners",
          "chess opening principles", "budget spreadsheet template", "camping stove maintenance",
          "birdwatching field notes", "piano practice log", "knitting a simple scarf", "espresso grinder settings",
          "running shoe rotation", "python virtual environments", "git rebase workflow", "linux file permissions",
          "keyboard switch types", "photography exposure triangle", "aquarium water changes",
          "composting kitchen scraps", "rock climbing grades"]


def english_vault() -> dict[str, str]:
    files = dict(ENGLISH_NOTES)
    for n, subject in enumerate(FILLER):
        files[f"note {n}.md"] = f"# {subject.title()}\n\nMy notes on {subject}: what worked, what to try next time.\n"
    return files


def test_a_chinese_question_is_glossed_in_english_content_words() -> None:
    gloss = english_gloss("看到别人倒霉就暗自高兴的心理")
    assert gloss is not None and "bad luck" in gloss and "happy" in gloss
    assert "的" not in gloss and "什么" not in (english_gloss("量子纠缠是什么") or "什么")


def test_words_are_the_dictionarys_own_not_jiebas() -> None:
    """jieba splits 新员工入职要做什么 as 员工 / 职要; the dictionary's longest match keeps 入职 (to join a job)."""
    gloss = english_gloss("新员工入职要做什么")
    assert gloss is not None and "staff" in gloss and "employment" in gloss


def test_traditional_script_is_glossed_too() -> None:
    assert english_gloss("量子糾纏是什麼") == english_gloss("量子纠缠是什么") == "quantum entanglement"


@pytest.mark.parametrize("text", ["饿唐靠霸隆苟辍淡", "深挂吃那奶", "猫", "how do prions spread", ""])
def test_no_gloss_for_a_string_that_is_not_chinese_prose(text: str) -> None:
    """Random characters fall mostly outside dictionary words: there is no meaning to carry over."""
    assert english_gloss(text) is None


def test_a_chinese_question_finds_its_english_note_through_the_gloss(home, make_vault) -> None:
    from rag_app.engine import Brain

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(english_vault())),)).failed
    asked = brain.search("看到别人倒霉就暗自高兴的心理", k=5, expand=False)
    assert asked.coverage["translation"] and "bad luck" in asked.coverage["translation"]
    assert asked.results[0]["title"] == "Schadenfreude" and asked.answer_state == "found"
    assert asked.results[0]["strength"] == "related"  # a translation alone never makes a note "strong"
    nonsense = brain.search("饿唐靠霸隆苟辍淡", k=5, expand=False)
    assert nonsense.coverage["translation"] is None and nonsense.answer_state != "found"


def test_a_home_that_knows_the_questions_words_is_searched_as_written(sample_brain) -> None:
    """The sample vault is written in Chinese: its own words find its notes; a gloss would only add noise."""
    asked = sample_brain.search("番茄要选什么样的", k=5, expand=False)
    assert asked.coverage["translation"] is None and asked.coverage["queries"] == ["番茄要选什么样的"]


def test_an_agents_variants_replace_the_gloss(home, make_vault) -> None:
    from rag_app.engine import Brain

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(english_vault())),)).failed
    asked = brain.search("看到别人倒霉就暗自高兴的心理", k=5, variants=["schadenfreude", "joy at others' misfortune"],
                         expand=False)
    assert asked.coverage["translation"] is None and len(asked.coverage["queries"]) == 3


def test_the_cli_says_what_the_question_was_also_searched_as(home, make_vault) -> None:
    from tests.rag_app.shells.test_cli import brain

    vault = make_vault(english_vault())
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    searched = brain(home, "search", "看到别人倒霉就暗自高兴的心理", "-k", "3")
    assert searched.returncode == 0, searched.stderr
    assert '(also searched in English, word by word: "see other people have bad luck' in searched.stdout
    assert "Schadenfreude" in searched.stdout.split("also searched")[1]
    found = json.loads(brain(home, "search", "看到别人倒霉就暗自高兴的心理", "--json").stdout)
    assert found["coverage"]["translation"].startswith("see other people") and found["answer_state"] == "found"


def test_of_a_words_senses_the_one_the_home_knows_best_is_used() -> None:
    """笔记 is first "take down (in writing)", then "notes": a vault that says notes, not "take down", gets notes."""
    assert english_gloss("笔记库") == "take down warehouse"
    vocabulary = {"notes", "warehouse"}
    known = lambda text: sum(w in vocabulary for w in text.split()) / len(text.split())  # noqa: E731
    assert english_gloss("笔记库", known=known) == "notes warehouse"


def test_a_pasted_page_is_glossed_within_the_querys_own_limit() -> None:
    from rag_app.search.query import MAX_QUERY_CHARS

    page = "考古学家根据放射性同位素的衰变判断骨头的年代，" * 80
    gloss = english_gloss(page[:MAX_QUERY_CHARS])
    assert gloss is not None and len(gloss) <= MAX_QUERY_CHARS and "archaeologist" in gloss
    words = [w for w in dictionary() if len(w) == 2 and "\u4e00" <= w[0] <= "\u9fff" and "\u4e00" <= w[1] <= "\u9fff"]
    many = "，".join(words[::50])[:MAX_QUERY_CHARS]  # a thousand distinct words: glossed, over 2,000 characters
    gloss = english_gloss(many)
    assert gloss is not None and MAX_QUERY_CHARS - 50 < len(gloss) <= MAX_QUERY_CHARS and not gloss.endswith(" ")


def test_a_damaged_dictionary_cache_is_parsed_again(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import marshal

    from rag_app.search import cross_language

    monkeypatch.setattr(cross_language, "cache_dir", lambda: tmp_path)
    cross_language.dictionary.cache_clear()
    try:
        parsed = cross_language.dictionary()
        (cached,) = tmp_path.glob("cedict-*.marshal")
        for damage in (b"\x00garbage", marshal.dumps(["not", "a", "dictionary"])):
            cached.write_bytes(damage)
            cross_language.dictionary.cache_clear()
            assert cross_language.dictionary() == parsed
    finally:
        cross_language.dictionary.cache_clear()
