"""The engine as LlamaIndex query and chat engines, through real Chroma over the sample vault: cited answers with an
LLM (the OpenAI-compatible double), the passages without one, and chat turns that are a brain session."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.chat_engine import CondensePlusContextChatEngine
from llama_index.core.query_engine import RetrieverQueryEngine

from rag_app.answers.answer import NOT_FOUND, SYSTEM_PROMPT
from rag_app.engine import Brain, ConfigError
from tests.doubles.openai_server import OpenAIDouble

FILMS = "我想看哪些电影？"
NONSENSE = "xyzzy plugh"


@pytest.fixture
def llm_brain(sample_brain, monkeypatch):
    """A Brain over the sample vault whose LLM is the double; yields (brain, double)."""

    def start(replies: list) -> tuple[Brain, OpenAIDouble]:
        double = OpenAIDouble(replies).start()
        started.append(double)
        monkeypatch.setenv("LLM_BASE_URL", double.url)
        monkeypatch.setenv("LLM_MODEL", "qwen2.5")
        return Brain(sample_brain.home), double

    started: list[OpenAIDouble] = []
    yield start
    for double in started:
        double.stop()


def test_without_an_llm_the_query_engine_answers_as_ask_does(sample_brain):
    """No LLM configured (and no OpenAI key): the standard RetrieverQueryEngine answers with the passages, exactly
    `ask`'s extractive answer, or says the notes do not cover it; never "Could not load OpenAI model"."""
    engine = sample_brain.as_query_engine(4)
    assert isinstance(engine, RetrieverQueryEngine)
    for question in (FILMS, NONSENSE):
        asked = sample_brain.ask(question, 4)
        response = engine.query(question)
        assert str(response) == asked.answer
        assert [n.node.node_id for n in response.source_nodes] == [c["note_id"] for c in asked.citations]
        assert str(asyncio.run(engine.aquery(question))) == asked.answer
    assert str(engine.query(FILMS)).startswith("Extractive answer (no LLM configured)")
    assert str(engine.query(NONSENSE)).startswith(NOT_FOUND)


def test_with_an_llm_the_query_engine_cites_numbered_sources(llm_brain):
    brain, llm = llm_brain(["想看《花样年华》和《一一》[1]。"])
    response = brain.as_query_engine(4).query(FILMS)
    assert str(response) == "想看《花样年华》和《一一》[1]。"
    assert response.source_nodes[0].node.metadata["title"] == "电影清单"
    assert {n.node.metadata["strength"] for n in response.source_nodes} <= {"strong", "related"}
    messages = llm.requests[-1]["body"]["messages"]
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert messages[1]["content"].startswith('Sources:\n<source id="1" title="电影清单" where="生活/电影清单.md">\n')
    assert messages[1]["content"].endswith(f"</source>\n\nQuestion: {FILMS}")


def test_the_llm_is_not_asked_when_no_note_may_answer(llm_brain):
    brain, llm = llm_brain(["made up"])
    response = brain.as_query_engine(4).query(NONSENSE)
    assert str(response) == NOT_FOUND and response.source_nodes == []
    assert llm.requests == []


def test_a_chat_engines_turns_are_a_brain_session(llm_brain):
    """Condensed with the history, retrieved with the standalone question, answered with the history; each turn is
    stored in the session with its citations (as `ask --session` stores it), and the session's turns are the history
    of a chat engine opened on it later, streaming or not."""
    follow_up, standalone = "第二部是谁导演的？", "想看的电影里第二部《一一》是谁导演的？"

    def reply(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        if "Standalone question:" in prompt:
            return standalone
        return "《一一》是杨德昌导演的[1]。" if prompt.endswith(follow_up) else "想看《花样年华》和《一一》[1]。"

    brain, llm = llm_brain([reply])
    chat = brain.as_chat_engine("电影 (chat engine)", k=4)
    assert isinstance(chat, CondensePlusContextChatEngine)
    first = chat.chat(FILMS)
    assert str(first) == "想看《花样年华》和《一一》[1]。"
    streamed = brain.as_chat_engine("电影 (chat engine)", k=4).stream_chat(follow_up)
    assert "".join(streamed.response_gen) == "《一一》是杨德昌导演的[1]。"

    answer_request = llm.requests[-1]["body"]["messages"]
    assert [(m["role"], m["content"]) for m in answer_request[-3:]] == [
        ("user", FILMS), ("assistant", "想看《花样年华》和《一一》。"), ("user", follow_up)]
    condense = llm.requests[-2]["body"]["messages"][-1]["content"]
    assert "Standalone question:" in condense and f"user: {FILMS}\nassistant: 想看《花样年华》和《一一》。" in condense
    session = brain.session("电影 (chat engine)")
    assert [t["question"] for t in session["turns"]] == [FILMS, follow_up]
    assert session["turns"][1]["answer"] == "《一一》是杨德昌导演的[1]。"
    assert session["turns"][1]["coverage"]["condensed_query"] == standalone
    assert session["turns"][1]["coverage"]["cited"] == [1]
    assert session["turns"][1]["citations"][0]["title"] == "电影清单"
    assert len(brain.as_chat_engine("电影 (chat engine)").chat_history) == 4
    chat.reset()
    assert "电影 (chat engine)" not in [s["name"] for s in brain.sessions()]


def test_a_chat_engine_without_an_llm_names_the_setting(sample_brain, monkeypatch):
    with pytest.raises(ConfigError, match=r"\[llm\].*config.toml.*LLM_BASE_URL and LLM_MODEL.*Brain.ask"):
        sample_brain.as_chat_engine()
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="LLM_BASE_URL is set but LLM_MODEL"):
        Brain(sample_brain.home).as_chat_engine()


def test_a_session_memory_set_replaces_the_turns_and_reset_deletes_the_session(home, tmp_path):
    """What CondensePlusContextChatEngine does with an explicit `chat_history` (set) and on `reset()`."""
    from llama_index.core.llms import ChatMessage, MessageRole

    from rag_app.answers.llama_engines import SessionMemory
    from rag_app.answers.sessions import SessionStore

    store = SessionStore(tmp_path / "sessions.sqlite")
    store.append("s", {"question": "old", "answer": "old answer", "citations": [], "coverage": {}, "mode": "llm"})
    memory = SessionMemory(store, "s", Brain(home).as_retriever(4), history_chars=3000)
    user, assistant = MessageRole.USER, MessageRole.ASSISTANT
    memory.set([ChatMessage(role=user, content="q1"), ChatMessage(role=assistant, content="a1 [1]"),
                ChatMessage(role=user, content="q2"), ChatMessage(role=assistant, content="a2")])
    assert [t["question"] for t in store.turns("s")] == ["q1", "q2"]
    assert [(m.role, m.content) for m in memory.get()] == [(user, "q1"), (assistant, "a1"), (user, "q2"),
                                                           (assistant, "a2")]
    memory.reset()
    assert not store.exists("s") and memory.get() == []
