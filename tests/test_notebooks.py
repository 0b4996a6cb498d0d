"""The notebooks run top to bottom offline, so they cannot rot (executed with nbclient)."""

from __future__ import annotations

import ast
import json

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO, SHARED
from tests.doubles.openai_server import OpenAIDouble

NOTEBOOKS = REPO / "notebooks"


def run(name: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
                   ).execute()
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> str:
    return "\n".join(str(o.get("text", "")) for cell in notebook.cells for o in cell.get("outputs", []))


@pytest.fixture
def notebook_env(sample_home, monkeypatch):
    monkeypatch.setenv("BRAIN_HOME", str(sample_home))
    for var in ("LLM_BASE_URL", "LLM_MODEL", "LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    return sample_home


def test_explore_notebook(notebook_env):
    text = outputs(run("01_explore_index.ipynb"))
    assert "sample_vault (vault): 41 notes" in text and "link graph:" in text
    assert (notebook_env / "explore.png").exists()


def test_compare_modes_notebook_compares_on_the_sample_vault_without_the_shared_sets(notebook_env, monkeypatch,
                                                                                    tmp_path):
    """A user's clone has no ../shared: the bundled sample vault and its questions still give a comparison."""
    monkeypatch.setenv("BRAIN_EVAL_DIR", str(tmp_path / "no-shared-eval"))
    text = outputs(run("02_compare_retrieval_modes.ipynb"))
    assert "shared eval set: not found — the sample vault's comparison only" in text
    (line,) = [line for line in text.splitlines() if line.startswith("sample_vault {")]
    scores = ast.literal_eval(line.removeprefix("sample_vault "))  # the notebook prints the dict
    assert set(scores) == {"bm25", "vector", "hybrid"} and scores["hybrid"]["hit_rate"] >= 0.9, scores
    assert "我想看哪些电影？ → vault:sample_vault/生活/电影清单.md" in text and "modes.png" in text
    assert "locomo_dev {" not in text


def test_every_sample_question_names_a_note_of_the_sample_vault():
    questions = json.loads((NOTEBOOKS / "sample_questions.json").read_text(encoding="utf-8"))
    assert len(questions) >= 8 and all((REPO / "sample_vault" / path).is_file() for q in questions
                                       for path in q["notes"])


@pytest.mark.skipif(not (SHARED / "eval" / "locomo_dev").is_dir(), reason="../shared/eval not present")
def test_compare_modes_notebook(notebook_env, monkeypatch):
    monkeypatch.setenv("BRAIN_NOTEBOOK_QUERIES", "20")
    text = outputs(run("02_compare_retrieval_modes.ipynb"))
    assert "sample_vault {" in text and "locomo_dev {'bm25':" in text and "'hybrid':" in text and "'ndcg':" in text
    assert "modes.png" in text
    assert " → vault:" in text  # RetrieverEvaluator scored note ids, straight from the retriever


def test_agent_notebook_drives_the_tools_through_an_llm(notebook_env, monkeypatch):
    call = {"tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "search_notes", "arguments": json.dumps({"query": "观影"})}}]}
    with OpenAIDouble([call, "你想看《花样年华》（电影清单）。"]) as llm:
        monkeypatch.setenv("LLM_BASE_URL", llm.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        text = outputs(run("03_agent_with_tools.ipynb"))
    assert "search_notes" in text and "电影清单" in text
    assert "你想看《花样年华》" in text
    assert "ask_notes: Answer a question from the user's notes" in text and "sources: ['电影清单'" in text
    tool_messages = [m for r in llm.requests for m in r["body"]["messages"] if m.get("role") == "tool"]
    assert tool_messages and "电影清单" in str(tool_messages[0]["content"])


def test_conversation_notebook_condenses_the_follow_up_both_ways(notebook_env, monkeypatch):
    first, follow_up, standalone = "我想看哪些电影？", "第二部是谁导演的？", "想看的电影里第二部《一一》是谁导演的？"

    def reply(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        if "Standalone question:" in prompt:
            return standalone
        return "《一一》是杨德昌导演的。" if prompt.endswith(follow_up) else "想看《花样年华》和《一一》。"

    with OpenAIDouble([reply]) as llm:
        monkeypatch.setenv("LLM_BASE_URL", llm.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        text = outputs(run("04_conversation.ipynb"))
    assert f"Q: {follow_up}\nA: 《一一》是杨德昌导演的。\n   sources: ['电影清单'" in text
    assert f"Q: {follow_up}  (searched: {standalone})\n   mode llm, first source: 电影清单" in text
    assert "stored in session '" in text and f": searched {standalone!r}, sources ['电影清单'" in text
    condensed = [r for r in llm.requests if "Standalone question:" in r["body"]["messages"][-1]["content"]]
    assert len(condensed) == 2 and all(f"user: {first}" in r["body"]["messages"][-1]["content"] for r in condensed)
    chat_engine_turn = next(r["body"]["messages"] for r in llm.requests if r["body"]["messages"][-1]["content"] ==
                            follow_up)
    assert [(m["role"], m["content"]) for m in chat_engine_turn[1:]] == [
        ("user", first), ("assistant", "想看《花样年华》和《一一》。"), ("user", follow_up)]
