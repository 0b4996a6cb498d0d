"""The engine's search as LlamaIndex query and chat engines (`Brain.as_query_engine()`, `Brain.as_chat_engine()`).

Both are LlamaIndex's own classes over the engine's retriever (rag_app.search.retrieve.NoteFusionRetriever): a
`RetrieverQueryEngine` and a `CondensePlusContextChatEngine`. What they add is the brain's way of answering: the LLM
sees only the notes that may answer (strong or related), as numbered, fenced sources under the brain's system prompt,
so an answer cites them as [n] and `source_nodes[n - 1]` is source n. Without an LLM the query engine answers with
the notes' best passages, as `brain ask` does; a chat engine needs one (a conversation without an LLM is
`Brain.ask(question, session=...)`).

A chat engine's memory is a brain session (rag_app.answers.sessions): every turn it completes is stored there, with its
citations, and shows in `brain sessions` and on the chat page; a session's earlier turns are its history.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.base.response.schema import RESPONSE_TYPE
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.chat_engine import CondensePlusContextChatEngine
from llama_index.core.llms import ChatMessage, MessageRole, MockLLM
from llama_index.core.memory import BaseMemory
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts import ChatPromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import BaseSynthesizer, CompactAndRefine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from rag_app.answers.answer import (
    NOT_FOUND,
    SYSTEM_PROMPT,
    answerable,
    citations_from,
    cited_numbers,
    extractive_answer,
    fenced_source,
    not_found_answer,
    possible_matches,
    unsure_answer,
)
from rag_app.answers.sessions import HISTORY_TURNS, SessionStore, history_messages, without_citations
from rag_app.search import relevance
from rag_app.search.retrieve import NoteFusionRetriever

QUESTION_WITH_SOURCES = "Sources:\n{context_str}\n\nQuestion: {query_str}"
CHAT_CONTEXT = ("Sources from the user's notes for this turn:\n\n{context_str}\n\n"
                "Answer the user's last message from these sources only, citing them as [n].")


class NumberedSources(BaseNodePostprocessor):
    """The notes that may answer (strong or related; weak ones are leads, never an answer; when the search is unsure,
    the first leads, marked certainty="unsure"), each rendered for the LLM as `<source id="n" title=… where=…>` around
    its matched passages; the result's fields stay as metadata."""

    @classmethod
    def class_name(cls) -> str:
        return "NumberedSources"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        results = [n.node.metadata for n in nodes]
        unsure = relevance.answer_state(results) == "unsure"
        usable = possible_matches(results) if unsure else answerable(results)
        by_id = {n.node.node_id: n for n in nodes}
        out = []
        for number, result in enumerate(usable, 1):
            note = by_id[result["note_id"]]
            text = fenced_source(number, result, note.node.get_content(), unsure=unsure)
            node = TextNode(id_=note.node.node_id, text=text, metadata={**result, "n": number},
                            excluded_llm_metadata_keys=[*result, "n"], excluded_embed_metadata_keys=[*result, "n"])
            out.append(NodeWithScore(node=node, score=note.score))
        return out


AnsweringLines = Callable[[str, list[dict[str, Any]]], tuple[Any, dict[str, str]]]


class ExtractiveSynthesizer(BaseSynthesizer):
    """An answer without an LLM: the notes' best passages under their titles, the question's words in bold, cited
    as [n] in the retriever's order (answer.extractive_answer); when no note seems to answer, that, with the
    nearest notes as leads. With `lines` (Asker.answering_lines) each passage is its note's answering line, as `ask`
    shows it."""

    def __init__(self, lines: AnsweringLines | None = None) -> None:
        super().__init__(llm=MockLLM(), empty_response=NOT_FOUND)  # never called: no "Could not load OpenAI model"
        self._lines = lines

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: dict[str, Any]) -> None:
        """No prompts: nothing is sent to a model."""

    def synthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None,
                   **response_kwargs: Any) -> RESPONSE_TYPE:
        return super().synthesize(query, nodes, additional_source_nodes,
                                  results=[n.node.metadata for n in nodes], **response_kwargs)

    async def asynthesize(self, query: Any, nodes: list[NodeWithScore], additional_source_nodes: Any = None,
                          **response_kwargs: Any) -> RESPONSE_TYPE:
        return await super().asynthesize(query, nodes, additional_source_nodes,
                                         results=[n.node.metadata for n in nodes], **response_kwargs)

    def get_response(self, query_str: str, text_chunks: Any, results: list[dict[str, Any]] | None = None,
                     **response_kwargs: Any) -> str:
        results = results or []
        citations = citations_from(results)
        if not answerable(results):
            if relevance.answer_state(results) == "unsure":
                return unsure_answer(query_str, results, citations, None, *self._reading(query_str,
                                                                                         possible_matches(results)))
            return not_found_answer(citations, unmentioned=results[0].get("unmentioned") if results else None)
        return extractive_answer(query_str, results, citations, None, None, *self._reading(query_str,
                                                                                          answerable(results)))

    def _reading(self, query: str, shown: list[dict[str, Any]]) -> tuple[Any, dict[str, str] | None]:
        """(line scorer, full texts) for the shown notes' answering lines; none without `lines`."""
        return self._lines(query, shown) if self._lines is not None else (None, None)

    async def aget_response(self, query_str: str, text_chunks: Any, results: list[dict[str, Any]] | None = None,
                            **response_kwargs: Any) -> str:
        return self.get_response(query_str, text_chunks, results)


def query_engine(retriever: NoteFusionRetriever, llm: Any | None,
                 lines: AnsweringLines | None = None) -> RetrieverQueryEngine:
    """A RetrieverQueryEngine: with an LLM, a cited answer from the numbered sources; without, extractive (each
    note's answering line with `lines`)."""
    if llm is None:
        return RetrieverQueryEngine(retriever, response_synthesizer=ExtractiveSynthesizer(lines))
    template = ChatPromptTemplate([ChatMessage(role=MessageRole.SYSTEM, content=SYSTEM_PROMPT),
                                   ChatMessage(role=MessageRole.USER, content=QUESTION_WITH_SOURCES)])
    synthesizer = says_not_found(CompactAndRefine(llm=llm, text_qa_template=template))
    return RetrieverQueryEngine(retriever, response_synthesizer=synthesizer, node_postprocessors=[NumberedSources()])


class NotesChatEngine(CondensePlusContextChatEngine):
    """CondensePlusContextChatEngine, except that a turn no note may answer gets NOT_FOUND (the LLM is not asked)
    instead of LlamaIndex's "Empty Response"."""

    def _get_response_synthesizer(self, chat_history: list[ChatMessage], streaming: bool = False) -> CompactAndRefine:
        return says_not_found(super()._get_response_synthesizer(chat_history, streaming))


def chat_engine(retriever: NoteFusionRetriever, llm: Any, store: SessionStore, session: str,
                history_chars: int) -> NotesChatEngine:
    """A CondensePlusContextChatEngine whose memory is the brain session `session`."""
    memory = SessionMemory.from_defaults(store=store, session=session, retriever=retriever,
                                         history_chars=history_chars)
    return NotesChatEngine(retriever, llm, memory, context_prompt=CHAT_CONTEXT, system_prompt=SYSTEM_PROMPT,
                           node_postprocessors=[NumberedSources()])


def says_not_found(synthesizer: CompactAndRefine) -> CompactAndRefine:
    """With no source to answer from, a synthesizer answers its `_empty_response` without calling the LLM (no
    public setting for it in CompactAndRefine or the chat engines' factory)."""
    synthesizer._empty_response = NOT_FOUND
    return synthesizer


class SessionMemory(BaseMemory):
    """A chat engine's memory kept as a brain session (sessions.sqlite), shared with `brain ask --session` and the
    chat page. `get()` gives the latest turns within `history_chars` (answers shortened, their [n] dropped, as
    `Brain.ask` sends them); a user message followed by the assistant's reply is stored as one turn, with the
    sources the retriever found for it (its citations, the condensed query, the coverage). `reset()` deletes the
    session; `set(messages)` replaces its turns with those messages (without citations)."""

    session: str
    history_chars: int
    _store: SessionStore = PrivateAttr()
    _retriever: NoteFusionRetriever = PrivateAttr()
    _question: str | None = PrivateAttr(default=None)

    def __init__(self, store: SessionStore, session: str, retriever: NoteFusionRetriever, history_chars: int):
        super().__init__(session=session, history_chars=history_chars)
        self._store, self._retriever = store, retriever

    @classmethod
    def class_name(cls) -> str:
        return "SessionMemory"

    @classmethod
    def from_defaults(cls, **kwargs: Any) -> SessionMemory:  # type: ignore[override]
        return cls(**kwargs)

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:  # noqa: A002 - LlamaIndex's name
        return history_messages(self._store.turns(self.session, last=HISTORY_TURNS), self.history_chars)

    def get_all(self) -> list[ChatMessage]:
        return [ChatMessage(role=role, content=text) for turn in self._store.turns(self.session)
                for role, text in ((MessageRole.USER, turn["question"]),
                                   (MessageRole.ASSISTANT, without_citations(turn["answer"])))]

    def put(self, message: ChatMessage) -> None:
        if message.role == MessageRole.USER:
            self._question = message.content or ""
        elif message.role == MessageRole.ASSISTANT and self._question is not None:
            self._store.append(self.session, self._turn(self._question, message.content or ""))
            self._question = None

    def _turn(self, question: str, answer: str) -> dict[str, Any]:
        """A stored turn as `Brain.ask` writes it: the numbered sources the LLM saw are its citations."""
        found = self._retriever.last
        results = found.results if found is not None else []
        state = relevance.answer_state(results) if results else "not_found"
        citations = citations_from(possible_matches(results) if state == "unsure" else answerable(results))
        coverage: dict[str, Any] = dict(found.coverage) if found is not None else {}
        coverage.update(not_found=state == "not_found", answer_state=state, llm="used" if citations else "unused",
                        cited=cited_numbers(answer, len(citations)))
        if found is not None and found.query != question:
            coverage["condensed_query"] = found.query
        return {"question": question, "answer": answer, "citations": citations, "coverage": coverage,
                "mode": "llm" if citations else state}

    def set(self, messages: list[ChatMessage]) -> None:
        self.reset()
        question = None
        for message in messages:
            if message.role == MessageRole.USER:
                question = message.content or ""
            elif message.role == MessageRole.ASSISTANT and question is not None:
                self._store.append(self.session, {"question": question, "answer": message.content or "",
                                                  "citations": [], "coverage": {}, "mode": "llm"})
                question = None

    def reset(self) -> None:
        if self._store.exists(self.session):
            self._store.delete(self.session)
        self._question = None
