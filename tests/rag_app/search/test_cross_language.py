"""A question in the other language than the notes is also searched as its word-by-word gloss (CC-CEDICT): a Chinese
question about English notes in English, an English question about Chinese notes in Chinese."""

from __future__ import annotations

import json

import pytest

from rag_app.search.cross_language import (
    chinese_gloss,
    dictionary,
    distinctive_words,
    english_gloss,
    english_words,
)

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


def vault_with_filler(notes: dict[str, str], name: str, filler: list[str]) -> dict[str, str]:
    """The subject notes and numbered filler notes (`name` with {n}), so a match stands out of a real pool."""
    return {**notes, **{name.format(n=n): text for n, text in enumerate(filler)}}


def english_vault() -> dict[str, str]:
    return vault_with_filler(ENGLISH_NOTES, "note {n}.md", [
        f"# {subject.title()}\n\nMy notes on {subject}: what worked, what to try next time.\n" for subject in FILLER])


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


def test_an_english_question_never_loads_the_dictionary() -> None:
    """Every English question asked of English notes passes through content_words: 4 MB and 32 MB resident for
    nothing, had it loaded the dictionary first."""
    from rag_app.search import cross_language

    cross_language.dictionary.cache_clear()
    assert cross_language.content_words("how do prions spread") is None
    assert cross_language.dictionary.cache_info().currsize == 0


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


def test_a_damaged_dictionary_cache_is_built_again(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import marshal

    from rag_app.search import cross_language

    monkeypatch.setattr(cross_language, "cache_dir", lambda: tmp_path)
    built = {"cedict-": cross_language.dictionary, "cedictrev-": cross_language._reverse}
    for read in built.values():
        read.cache_clear()
    try:
        first = {family: read() for family, read in built.items()}
        for family, read in built.items():
            (cached,) = tmp_path.glob(f"{family}*.marshal")
            for damage in (b"\x00garbage", marshal.dumps(["not", "a", "dictionary"])):
                cached.write_bytes(damage)
                read.cache_clear()
                assert read() == first[family]
        assert len(list(tmp_path.glob("*.marshal"))) == 2  # writing one family's file leaves the other's
    finally:
        for read in built.values():
            read.cache_clear()


# Chinese notes, one subject each, and enough others (≥ MIN_POOL chunks) for a match to stand out of the rest.
CHINESE_NOTES = {
    "咖啡冲煮.md": "# 咖啡冲煮\n\n手冲咖啡的水温我用九十三度。豆子研磨太细味道发苦，研磨太粗味道发酸，"
                   "酸了就磨细一点。\n",
    "植物养护.md": "# 植物养护\n\n绿萝和仙人掌最好养，浇水一周一次，冬天少浇。\n",
    "猫咪日常.md": "# 猫咪日常\n\n我家猫叫橘子，体重五公斤，每天喂两次猫粮，每周梳毛。\n",
    "理财笔记.md": "# 理财笔记\n\n每个月工资到账先存三千，剩下的做预算，记账用表格。\n",
    "研究计划.md": "# 研究计划\n\n下学期的研究计划还没定，先读完导师给的三篇论文。\n",
}
CHINESE_FILLER = ["周一的会议记录", "读书清单整理", "搬家准备事项", "牙医预约提醒", "周末爬山计划", "装修预算草稿",
                  "电脑清理步骤", "信用卡还款日", "父母生日礼物", "健身房课程表", "汽车年检时间", "快递地址变更",
                  "菜市场价格", "雨季防潮方法", "键盘清洁方法", "手机备份步骤", "阳台晾衣架", "邻居借书记录",
                  "小区停车规则", "冬季取暖费用", "旧衣服捐赠", "电影票根收藏", "公司年会节目", "孩子补习安排",
                  "二手自行车"]


def chinese_vault() -> dict[str, str]:
    return vault_with_filler(CHINESE_NOTES, "杂记{n}.md", [
        f"# {subject}\n\n关于{subject}的一些想法和记录，下次再补充细节。\n" for subject in CHINESE_FILLER])


def test_an_english_question_is_glossed_in_the_chinese_words_the_home_uses() -> None:
    """Of the headwords with a sense, the one the home holds most; a word no headword of which the home holds is left
    out (it could match nothing there), and so are the words that only shape a question (would, get, say)."""
    uses = {"咖啡": 3, "酸": 2, "味": 1, "口味": 4}.get
    assert english_words("would my coffee get sour") == ["coffe", "sour"]
    assert chinese_gloss("would my coffee get sour", uses=lambda word: uses(word, 0)) == "咖啡 酸"
    assert chinese_gloss("coffee taste", uses=lambda word: uses(word, 0)) == "咖啡 口味"
    assert chinese_gloss("coffee taste", uses=lambda word: {"味": 5}.get(word, 0)) == "味"
    assert chinese_gloss("quantum teleportation", uses=lambda word: uses(word, 0)) is None
    assert english_words("番茄要选什么样的") is None and english_words("the of and") is None


def test_a_gloss_counts_only_the_words_that_tell_notes_apart() -> None:
    """A word in over COMMON_SHARE of the home's chunks, or in none, does not say which note."""
    uses = {"研究": 1, "咖啡": 3, "的": 100}.get
    assert distinctive_words("研究 咖啡 的 量子", lambda word: uses(word, 0), chunks=100) == 2
    assert distinctive_words("研究", lambda word: uses(word, 0), chunks=100) == 1


def test_an_english_question_finds_its_chinese_note_through_the_gloss(home, make_vault) -> None:
    from rag_app.engine import Brain

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(chinese_vault())),)).failed
    asked = brain.search("pour-over coffee tastes sour", k=5, expand=False)
    assert asked.coverage["translation"] == "咖啡 酸" and asked.coverage["translation_language"] == "Chinese"
    assert asked.results[0]["title"] == "咖啡冲煮" and asked.answer_state == "found"
    assert asked.results[0]["strength"] == "related"  # a translation alone never makes a note "strong"
    plants = brain.search("which plants are easy to keep alive", k=5, expand=False)
    assert plants.results[0]["title"] == "植物养护" and plants.answer_state == "found"


def test_a_gloss_of_few_words_ranks_but_does_not_rate(home, make_vault) -> None:
    """"What did Caroline research?": the name has no gloss, and 研究 alone is in some note of any home. The note it
    finds may come first, but is not called related on the gloss's say."""
    from rag_app.engine import Brain

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(chinese_vault())),)).failed
    asked = brain.search("What did Caroline research?", k=5, expand=False)
    assert asked.coverage["translation"] == "研究"
    assert "translation_opinion" not in asked.results[0] and asked.answer_state != "found"


def test_an_english_question_the_home_knows_is_searched_as_written(sample_brain) -> None:
    """The sample vault holds English notes too: a question in their words needs no gloss."""
    asked = sample_brain.search("rust borrow checker rules", k=5, expand=False)
    assert asked.coverage["translation"] is None and asked.results[0]["title"] == "Rust ownership notes"


def test_the_cli_says_which_language_the_question_was_also_searched_in(home, make_vault) -> None:
    from tests.rag_app.shells.test_cli import brain

    assert brain(home, "sync", "--vault", str(make_vault(chinese_vault()))).returncode == 0
    searched = brain(home, "search", "pour-over coffee tastes sour", "-k", "3")
    assert searched.returncode == 0, searched.stderr
    assert '(also searched in Chinese, word by word: "咖啡 酸")' in searched.stdout
    found = json.loads(brain(home, "search", "pour-over coffee tastes sour", "--json").stdout)
    assert found["coverage"]["translation_language"] == "Chinese" and found["answer_state"] == "found"
