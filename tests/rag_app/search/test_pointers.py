"""A found note's line that holds the question's words and links to another note sends the reader there."""

from __future__ import annotations

import pytest

from rag_app.search.pointers import pointers, question_weights, share_held

WEIGHTS = {"支付": 2.0, "超时": 3.0, "事故": 2.0}  # 支付超时事故的根因是什么, as the home weighs its words


def result(note_id: str, text: str) -> dict:
    return {"note_id": note_id, "source": "vault", "chunks": [{"text": text}]}


def resolve(target: str, _linking: object) -> str | None:
    return {"incident": "n:incident", "runbook": "n:runbook", "plan": "n:plan", "meeting": "n:meeting"}.get(target)


def test_a_line_holding_the_questions_words_points_to_its_one_link():
    meeting = result("n:meeting", "上周回顾\n- 支付超时事故已复盘，改进项跟进中，详见 [[incident]]。")
    found = [(p.source, p.target, p.sentence) for p in pointers([meeting], WEIGHTS, resolve)]
    assert found == [(0, "n:incident", "支付超时事故已复盘，改进项跟进中，详见 incident。")]


def test_in_a_line_of_several_links_only_the_one_whose_alias_names_the_subject_points():
    index = "- 工作：[[runbook]]、[[incident|三月支付超时事故]]、[[plan]]"
    assert [p.target for p in pointers([result("n:home", index)], WEIGHTS, resolve)] == ["n:incident"]


def test_a_line_without_most_of_the_questions_words_points_nowhere():
    assert pointers([result("n:meeting", "- 超时重试的讨论见 [[plan]]")], WEIGHTS, resolve) == []


def test_no_pointer_to_itself_to_an_unknown_note_to_an_embed_from_code_or_from_below_the_first_three():
    lines = ("- 支付超时事故 [[meeting]]\n- 支付超时事故 [[nowhere]]\n- 支付超时事故 ![[incident]]\n"
             "- 附图 ![[incident|支付超时事故]]\n- 支付超时事故，`详见 [[incident]]`\n"
             "```\n支付超时事故 详见 [[incident]]\n```")
    assert pointers([result("n:meeting", lines)], WEIGHTS, resolve) == []
    below = [result(f"n:{k}", "nothing here") for k in range(3)] + [result("n:x", "- 支付超时事故 [[incident]]")]
    assert pointers(below, WEIGHTS, resolve) == []


def test_a_chinese_word_counts_inside_a_longer_one_and_unknown_words_weigh_nothing():
    assert share_held("支付超时事故已复盘", WEIGHTS) == 1.0
    weights = question_weights("支付超时事故的根因是什么", {"支付": 2.0, "超时": 3.0, "事故": 2.0}.get)
    assert weights == WEIGHTS  # 根因 is in no note; 什么 asks


def test_the_note_a_matching_line_links_to_comes_first_as_relevant_as_the_line(sample_brain):
    """支付超时事故的根因是什么, asked of the sample vault: the meeting note holds the words and says the details are in
    the (English) incident note, which no channel ranked near the top."""
    found = sample_brain.search("支付超时事故的根因是什么", 5, expand=False)
    first, second = found.results[:2]
    assert first["path"].endswith("work/incident-2024-03-payment-timeout.md")
    sentence = "支付超时事故已复盘，改进项跟进中，详见 incident-2024-03-payment-timeout。"
    assert first["linked_from"] == {"note_id": second["note_id"], "title": "周会纪要 2024-04-08", "sentence": sentence}
    assert first["relevance"] == second["relevance"] and first["strength"] == "strong"
    assert found.answer_state == "found"


def test_a_linked_note_the_filters_hide_stays_out(sample_brain):
    found = sample_brain.search("支付超时事故的根因是什么", 5, expand=False, path_prefix="work/meetings/")
    assert [r["path"] for r in found.results] == ["work/meetings/周会纪要-2024-04-08.md"]
    assert "linked_from" not in found.results[0]


def test_a_sentence_never_ends_inside_a_link():
    """An alias may hold 。: the link is whole, and its sentence has two links, so only the alias points."""
    line = "- [[runbook|x]]、[[incident|支付超时事故。复盘]]"
    assert [(p.target, p.sentence) for p in pointers([result("n:home", line)], WEIGHTS, resolve)] == [
        ("n:incident", "x、支付超时事故。复盘")]


def test_the_linked_heading_is_the_last_one_named_without_a_tables_escape():
    found = pointers([result("n:m", "| 支付超时事故 | [[incident#Summary#Root cause\\|见]] |")], WEIGHTS, resolve)
    assert [(p.target, p.heading) for p in found] == [("n:incident", "Root cause")]


def test_only_the_sentence_that_holds_the_link_points_not_the_one_before_it_on_the_line():
    trip = "成都的节奏很慢。下次想去都江堰和青城山。出发前照例看了一遍 [[plan]]，这次没忘东西。"
    weights = {"下次": 2.0, "成都": 3.0, "想": 1.0}  # 下次去成都想去哪里
    assert pointers([result("n:trip", trip)], weights, resolve) == []


def test_each_linked_note_goes_above_the_note_whose_line_sent_it(home, make_vault):
    """Two results point, each to its own note: the second is placed by its own pointer, not by the position its
    pointer had before the first linked note came in."""
    from rag_app.engine import Brain

    vault = make_vault({
        "周报.md": "# 周报\n\n- 支付超时复盘已完成，详见 [[incident]]。\n",
        "月报.md": "# 月报\n\n- 支付超时复盘的改进项，见 [[followup]]。\n",
        "incident.md": "# Incident\n\nThe gateway dropped pooled connections after the provider's maintenance.\n",
        "followup.md": "# Follow-up\n\nRetry on connection reset; alert on upstream errors.\n",
        "其他.md": "# 其他\n\n今天去公园散步，天气很好。\n",
    })
    brain = Brain(home)
    assert not brain.sync(vaults=(str(vault),)).failed
    results = brain.search("支付超时复盘", 5, expand=False).results
    titles = [r["title"] for r in results]
    assert titles.index("Incident") == titles.index("周报") - 1
    assert titles.index("Follow-up") == titles.index("月报") - 1
    linked = {r["title"]: r["linked_from"]["title"] for r in results if r.get("linked_from")}
    assert linked == {"Incident": "周报", "Follow-up": "月报"}
    brain.close()


def test_a_dendron_link_names_its_note_after_the_pipe():
    """Dendron writes `[[label|note]]`, across vaults `[[label|dendron://vault/note#heading]]`: the label names no
    note, what follows the pipe does."""
    line = "- 支付超时事故的复盘，见 [[复盘|dendron://team/incident#timeline]]"
    assert [p.target for p in pointers([result("n:meeting", line)], WEIGHTS, resolve)] == ["n:incident"]


def test_a_linked_note_must_hold_the_questions_words_its_line_lacks(home, make_vault):
    """支付超时复盘的根因: the weekly's line holds 支付, 超时, 复盘 but not 根因, a word the home knows; the note it
    links to is brought in only when it holds 根因 (a "see [[…]]" for the subject is not one for what is asked)."""
    from rag_app.engine import Brain

    def first_two(incident: str) -> list[str]:
        notes = {"周报.md": "# 周报\n\n- 支付超时复盘已完成，详见 [[incident]]。\n",
                 "incident.md": f"# Incident\n\n{incident}\n",
                 "方法.md": "# 方法\n\n根因分析的方法很多，五个为什么是其中一种。\n"}
        vault = make_vault(notes, name=f"v{len(incident)}")
        own = home / f"h{len(incident)}"
        own.mkdir(mode=0o700)
        (own / "config.toml").write_text((home / "config.toml").read_text(encoding="utf-8"), encoding="utf-8")
        brain = Brain(own)  # the fast model, as `home`
        assert not brain.sync(vaults=(str(vault),)).failed
        titles = [r["title"] for r in brain.search("支付超时复盘的根因", 3, expand=False).results[:2]]
        brain.close()
        return titles

    assert first_two("The gateway dropped pooled connections.")[0] == "周报"
    assert first_two("The gateway dropped pooled connections. 根因：连接池超时。") == ["Incident", "周报"]


WEEKLY = {  # 支付超时复盘: the weekly holds the words and links on; the linked note is long on its own words
    "支付超时复盘周报.md": "# 支付超时复盘周报\n\n- 支付超时复盘已完成，详见 [[记录]]。\n",
    "记录.md": "# 记录\n\n支付超时复盘：根因是连接池过期。" + "连接池的参数和监控细节。" * 30 + "\n",
    "月报.md": "# 月报\n\n支付超时复盘：月度总结。\n",
    "其他.md": "# 其他\n\n今天去公园散步，天气很好。\n",
}


@pytest.fixture
def weekly(home, make_vault):
    from rag_app.engine import Brain

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(WEEKLY)),)).failed
    yield brain
    brain.close()


def test_with_the_vector_store_down_a_linked_note_is_capped_as_every_result(weekly, monkeypatch):
    """Found by keyword only, nothing is strong: the note a link brought in neither."""
    from rag_app.search import retrieve

    def unreachable(self, _bundle):
        raise retrieve.StoreUnreachable(self.index.settings)

    monkeypatch.setattr(retrieve.VectorRetriever, "_similar", unreachable)
    monkeypatch.setattr(retrieve, "gated_out", lambda *_: False)  # the fast model's channel runs (and fails)
    found = weekly.search("支付超时复盘", 2, expand=False)  # 记录 is not among the 2 found: the link brings it
    assert "store_down" in found.coverage and found.results[0].get("linked_from")
    assert all(r["strength"] != "strong" for r in found.results)


def test_a_link_is_not_followed_when_its_note_would_push_the_result_that_sent_it_out(weekly):
    one = weekly.search("支付超时复盘", 1, expand=False).results
    assert [r["title"] for r in one] == ["支付超时复盘周报"] and "linked_from" not in one[0]
    two = weekly.search("支付超时复盘", 2, expand=False).results
    assert [r["title"] for r in two] == ["记录", "支付超时复盘周报"]


def test_a_link_back_to_the_note_that_sent_is_not_followed(home, make_vault):
    """A and B link to each other, both found: the first link is followed, the one back is not."""
    from rag_app.engine import Brain

    brain = Brain(home)
    vault = make_vault({"甲.md": "# 甲\n\n支付超时复盘，详见 [[乙]]。\n",
                        "乙.md": "# 乙\n\n支付超时复盘，另见 [[甲]]。\n"})
    assert not brain.sync(vaults=(str(vault),)).failed
    results = brain.search("支付超时复盘", 5, expand=False).results
    assert sum(bool(r.get("linked_from")) for r in results) == 1
    brain.close()


def test_a_search_that_may_not_show_a_note_resolves_links_as_if_it_were_not_there():
    """A PRIVATE memo titled 牙医账单 beside a vault note of that name: an agent's search (which may not show the
    memo) resolves [[牙医账单]] from a public memo to the vault note, as it would were the memo not there; what it
    shows says nothing of the hidden one."""
    from rag_app.search.graph import LinkResolver

    notes = {"memos:1": {"source": "memos", "title": "牙医账单"}, "vault:v/牙医账单.md": {"source": "v",
             "title": "牙医账单", "path": "牙医账单.md"}}
    resolver = LinkResolver(notes)
    assert resolver.resolve("牙医账单", {"source": "memos"}) == "memos:1"
    assert resolver.resolve("牙医账单", {"source": "memos"}, lambda n: n != "memos:1") == "vault:v/牙医账单.md"
    assert resolver.resolve("memos:1", {"source": "memos"}, lambda n: n != "memos:1") is None


def test_a_note_a_link_raised_does_not_send_on(home, make_vault):
    """甲 (found) links to 乙, which only links on to 丙: 乙 comes in, 丙 does not (one hop)."""
    from rag_app.engine import Brain

    brain = Brain(home)
    vault = make_vault({"甲.md": "# 甲\n\n支付超时复盘，详见 [[乙]]。\n",
                        "乙.md": "# 乙\n\n见下。\n\n- 支付超时复盘的细节，详见 [[丙]]。\n",
                        "丙.md": "# 丙\n\nThe gateway dropped pooled connections.\n",
                        "其他.md": "# 其他\n\n今天去公园散步。\n"})
    assert not brain.sync(vaults=(str(vault),)).failed
    results = brain.search("支付超时复盘", 5, expand=False).results
    linked = {r["title"]: r["linked_from"]["title"] for r in results if r.get("linked_from")}
    assert linked == {"乙": "甲"}
    brain.close()
