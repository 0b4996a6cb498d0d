"""The agent tools as LlamaIndex sees them: a real FunctionAgent, untrusted arguments, PRIVATE memos kept out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

from rag_app.engine import Brain
from tests.doubles.memos_server import MemosDouble
from tests.doubles.openai_server import OpenAIDouble
from tools.function_tools import (
    CAPTURE_TOOL,
    MAX_LINKS,
    MAX_REPLY_BYTES,
    TOOL_NAMES,
    BrainTools,
    brain_tools,
    capped_json,
)


@pytest.fixture(scope="module")
def sample_tools(sample_home: Path) -> dict[str, FunctionTool]:
    """One Brain for the module: each one loads the embedding model."""
    return {tool.metadata.name: tool for tool in brain_tools(Brain(sample_home))}


def call(tool: FunctionTool, **arguments: object) -> dict:
    return json.loads(str(tool.call(**arguments)))


def test_a_function_agent_searches_with_the_tool_and_the_llm_reads_the_result(sample_tools):
    search_call = {"tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "search_notes", "arguments": json.dumps({"query": "观影"}, ensure_ascii=False)}}]}
    with OpenAIDouble([search_call, "你的观影记录在《电影清单》里。"]) as double:
        llm = OpenAILike(model="qwen2.5", api_base=double.url, api_key="x", is_chat_model=True,
                         is_function_calling_model=True, max_retries=0)
        agent = FunctionAgent(tools=list(sample_tools.values()), llm=llm, streaming=False,
                              system_prompt="Answer from the user's notes.")

        async def ask() -> object:
            return await agent.run(user_msg="我最近看了哪些电影？")

        answer = asyncio.run(ask())
    assert "电影清单" in str(answer)
    first, second = (r["body"] for r in double.requests)
    assert sorted(t["function"]["name"] for t in first["tools"]) == sorted(TOOL_NAMES)
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_messages and tool_messages[0]["tool_call_id"] == "call_1"
    found = json.loads(tool_messages[0]["content"])
    assert found["results"][0]["title"] == "电影清单"


@pytest.mark.parametrize(("tool", "arguments", "message"), [
    ("get_note", {"note_id": "../../etc/passwd"}, "a note id looks like"),
    ("get_note", {"note_id": "/etc/passwd"}, "a note id looks like"),
    ("related_notes", {"note_id": "vault:notes/../../x.md"}, "cannot contain '..'"),
    ("get_note", {"note_id": "vault:sample_vault/missing.md"}, "no note with id"),
    ("get_note", {}, "note_id is required"),
    ("search_notes", {"query": "电影", "k": True}, "k must be an integer from 1 to 20, got true"),
    ("search_notes", {"query": "电影", "path": "/etc"}, "unknown argument(s): path"),
])
def test_hostile_arguments_get_a_clear_json_error_flagged_as_an_error(sample_tools, tool, arguments, message):
    output = sample_tools[tool].call(**arguments)
    reply = json.loads(output.content)
    assert output.is_error and set(reply) == {"error", "tool", "hint"} and message in reply["error"], reply
    assert len(output.content) < 400


def test_outputs_are_capped_and_point_back_to_the_note(sample_tools):
    found = call(sample_tools["search_notes"], query="观影", queries=["电影"], k=20, detail="passages")
    assert found["coverage"]["queries"][:2] == ["观影", "电影"]
    assert 0 < len(found["results"]) <= 20
    assert all(0 < len(p["text"]) <= 1_000 for r in found["results"] for p in r["passages"])
    assert not sample_tools["search_notes"].call(query="观影").is_error
    note = call(sample_tools["get_note"], note_id=found["results"][0]["note_id"])
    assert note["title"] == "电影清单" and "《千与千寻》" in note["text"] and len(note["text"]) <= 20_000
    status = call(sample_tools["brain_status"])
    assert status["notes"] > 0 and status["private_memos_visible"] is False and "home" not in status


def test_private_memos_stay_hidden_from_agents_unless_allowed(home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        double.add_memo("私人日记：牙医说智齿要拔，费用三千。#健康", visibility="PRIVATE")
        double.add_memo("牙医诊所周六也营业，地址在公司楼下。#生活", visibility="PUBLIC")
        assert not Brain(home).sync(memos=(double.url,)).failed
    ids = {hit["visibility"]: hit["note_id"] for hit in Brain(home).search("牙医", 5).results}
    private, public = ids["PRIVATE"], ids["PUBLIC"]

    def agent_view() -> tuple[set[str], dict, dict]:
        tools = BrainTools(Brain(home))
        found = json.loads(tools.call("search_notes", {"query": "牙医", "k": 5}).text)
        return ({r["note_id"] for r in found["results"]},
                json.loads(tools.call("get_note", {"note_id": private}).text),
                json.loads(tools.call("related_notes", {"note_id": public}).text))

    seen, note, related = agent_view()
    assert seen == {public}
    assert note["error"] == f"no note with id {private!r}" and note["tool"] == "get_note"
    assert private not in json.dumps(related)

    with (home / "config.toml").open("a", encoding="utf-8") as config:
        config.write("\n[mcp]\nallow_private = true\n")
    seen, note, _ = agent_view()
    assert seen == {public, private}
    assert "智齿" in note["text"]


def test_a_hostile_note_with_huge_metadata_lists_gets_a_bounded_reply(home: Path, make_vault):
    tags = [f"tag{i:05d}-{'x' * 30}" for i in range(20_000)]
    aliases = [f"别名{i}" * 20 for i in range(5_000)]
    hub = "---\ntitle: hub\ntags: [" + ", ".join(tags) + "]\naliases: [" + ", ".join(aliases) + "]\n---\n# hub\n"
    hub += "".join(f"[[n{i}]] " for i in range(3_000)) + "\n观影记录和电影清单。"
    vault = make_vault({"hub.md": hub, "n1.md": "# n1\n[[hub]] 电影"})
    assert len(hub.encode()) > 900_000
    assert not Brain(home).sync(vaults=(str(vault),)).failed
    tools = BrainTools(Brain(home))

    replies = {name: tools.call(name, arguments) for name, arguments in [
        ("get_note", {"note_id": "vault:notes/hub.md"}), ("related_notes", {"note_id": "vault:notes/hub.md"}),
        ("search_notes", {"query": "电影 观影", "k": 20})]}
    for name, reply in replies.items():
        assert not reply.is_error and len(reply.text.encode()) <= MAX_REPLY_BYTES, (name, len(reply.text))
    note = json.loads(replies["get_note"].text)
    for key in ("tags", "aliases", "broken_links"):
        assert len(note[key]) <= MAX_LINKS and note[f"{key}_total"] > MAX_LINKS, key
    assert note["backlinks"] == ["vault:notes/n1.md"]
    found = json.loads(replies["search_notes"].text)["results"]
    assert all(len(r.get("tags", [])) <= MAX_LINKS for r in found)


def test_every_reply_fits_the_byte_cap_and_says_what_was_cut():
    results = [{"note_id": f"vault:v/{i}.md", "title": "标题" * 5_000, "tags": ["t" * 3_000] * 200,
                "passages": [{"heading": "", "text": "字" * 1_000}] * 3} for i in range(20)]
    reply = capped_json({"query": "q", "results": results})
    data = json.loads(reply)
    assert len(reply.encode()) <= MAX_REPLY_BYTES
    assert data["query"] == "q" and 1 <= len(data["results"]) < 20
    assert [r["note_id"] for r in data["results"]] == [f"vault:v/{i}.md" for i in range(len(data["results"]))]
    assert data["results"][0]["tags_total"] == 200 and len(data["results"][0]["tags"]) <= MAX_LINKS
    assert data["reply_capped"]["cuts"] >= 2 and f"results[{len(data['results'])}:]" in data["reply_capped"]["cut"]
    assert data["results"][0]["title"].endswith("…")

    small = {"note_id": "vault:v/a.md", "text": "短", "tags": ["a"]}
    assert json.loads(capped_json(small)) == small


def test_a_function_agent_captures_a_note_and_then_finds_it(home: Path, make_vault):
    vault = make_vault({"movies.md": "# 电影清单\n《千与千寻》\n"})
    (home / "config.toml").write_text(
        f'[embedding]\nmodel = "use-m3"\n\n[[sources]]\nname = "notes"\nkind = "vault"\npath = "{vault}"\n\n'
        '[capture]\nenabled = true\nsource = "notes"\nfolder = "Inbox"\n', encoding="utf-8")
    brain = Brain(home)
    assert not brain.sync().failed

    def tool_call(call_id: str, name: str, arguments: dict) -> dict:
        return {"tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]}

    script = [tool_call("call_1", "capture_note", {"text": "周五晚上去看《奥本海默》IMAX。", "title": "周五观影",
                                                   "tags": ["电影"]}),
              tool_call("call_2", "search_notes", {"query": "奥本海默", "queries": ["Oppenheimer IMAX"]}),
              "已记下：周五观影。"]
    with OpenAIDouble(script) as double:
        llm = OpenAILike(model="qwen2.5", api_base=double.url, api_key="x", is_chat_model=True,
                         is_function_calling_model=True, max_retries=0)
        agent = FunctionAgent(tools=brain_tools(brain), llm=llm, streaming=False,
                              system_prompt="Keep what the user asks you to keep, in their notes.")

        async def ask() -> object:
            return await agent.run(user_msg="帮我记一下：周五晚上去看《奥本海默》IMAX。")

        answer = asyncio.run(ask())
    assert "周五观影" in str(answer)
    offered = {t["function"]["name"] for t in double.requests[0]["body"]["tools"]}
    assert offered == {*TOOL_NAMES, CAPTURE_TOOL}
    replies = {m["tool_call_id"]: json.loads(m["content"]) for m in double.requests[-1]["body"]["messages"]
               if m["role"] == "tool"}
    saved, found = replies["call_1"], replies["call_2"]
    assert saved["indexed"] is True and saved["path"].startswith("Inbox/")
    assert found["results"][0]["note_id"] == saved["note_id"] and found["results"][0]["title"] == "周五观影"
    assert (vault / saved["path"]).is_file()


def test_without_capture_enabled_no_capture_tool_exists(sample_tools, sample_home: Path):
    assert sorted(sample_tools) == sorted(TOOL_NAMES)
    refused = BrainTools(Brain(sample_home)).call(CAPTURE_TOOL, {"text": "keep this"})
    assert refused.is_error and json.loads(refused.text)["hint"].startswith("the tools are search_notes")


def test_a_private_memo_capture_says_agents_cannot_search_it_unless_allowed(home: Path, monkeypatch):
    monkeypatch.setenv("CFLOW_API_TOKEN", "memos_pat_test")
    with MemosDouble(mode="head") as double:
        double.add_memo("public note #x", visibility="PUBLIC")
        (home / "config.toml").write_text(
            f'[embedding]\nmodel = "use-m3"\n\n[[sources]]\nname = "cflow"\nkind = "memos"\nurl = "{double.url}"\n\n'
            '[capture]\nenabled = true\nsource = "cflow"\n', encoding="utf-8")
        tools = BrainTools(Brain(home))
        assert not tools.brain.sync().failed
        saved = json.loads(tools.call(CAPTURE_TOOL, {"text": "私人：体检报告下周出。"}).text)
        assert saved["visibility"] == "PRIVATE" and saved["hidden_from_agents"] is True
        found = json.loads(tools.call("search_notes", {"query": "体检报告"}).text)
        assert saved["note_id"] not in {r["note_id"] for r in found["results"]}
        assert "体检报告" in tools.brain.search("体检报告", 3).results[0]["excerpt"]


def test_search_notes_takes_at_most_max_queries_texts_query_included(sample_home: Path):
    from rag_app.engine import MAX_QUERIES

    tools = BrainTools(Brain(sample_home))
    texts = [f"电影 {n}" for n in range(MAX_QUERIES)]
    assert not tools.call("search_notes", {"query": "观影", "queries": texts[1:]}).is_error
    refused = tools.call("search_notes", {"query": "观影", "queries": texts})
    assert refused.is_error
    assert json.loads(refused.text)["error"].startswith(f"queries must be a list of at most {MAX_QUERIES - 1} strings")


def test_an_agent_sees_what_a_chinese_question_was_also_searched_as(home: Path, make_vault):
    """Without `queries`, a Chinese question about English notes is glossed: the agent is told so (and may send its
    own English variants instead, which replace the gloss)."""
    from tests.rag_app.search.test_cross_language import english_vault

    brain = Brain(home)
    assert not brain.sync(vaults=(str(make_vault(english_vault())),)).failed
    tools = {tool.metadata.name: tool for tool in brain_tools(brain)}
    bare = call(tools["search_notes"], query="看到别人倒霉就暗自高兴的心理")
    assert bare["coverage"]["translation"].startswith("see other people have bad luck")
    assert bare["results"][0]["title"] == "Schadenfreude"
    helped = call(tools["search_notes"], query="看到别人倒霉就暗自高兴的心理", queries=["schadenfreude"])
    assert "translation" not in helped["coverage"] and helped["results"][0]["title"] == "Schadenfreude"


def test_an_agent_is_told_which_line_sent_it_to_a_linked_note(sample_tools):
    """The agent search (private notes left out: a filter) follows the meeting note's link as a person's does."""
    reply = call(sample_tools["search_notes"], query="支付超时事故的根因是什么")
    first, second = reply["results"][:2]
    assert first["path"].endswith("incident-2024-03-payment-timeout.md") and first["strength"] == "strong"
    assert first["linked_from"]["note_id"] == second["note_id"] and "详见" in first["linked_from"]["sentence"]
