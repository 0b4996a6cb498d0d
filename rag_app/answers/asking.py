"""A question answered from the notes, as `Brain.ask` gives it: a follow-up is condensed with its conversation into
the query that is searched; the answer is written by the LLM from the notes that may answer, else it is passages
(each note's answering line), the unsure or the not-found wording; the turn is stored in its session.

The engine hands an `Asker` what it holds (settings, its LLM, its search, its index and the lock around it, its
conversations); the answer is composed here, from answer.py, answer_lines.py, sessions.py and llm.py.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rag_app.answers import answer as answers
from rag_app.answers.answer_lines import LineScorer
from rag_app.answers.llm import LLMLink, error_reason, llm_config, missing_message
from rag_app.answers.sessions import (
    HISTORY_TURNS,
    SessionStore,
    SessionStoreError,
    condense_prompt,
    condense_without_llm,
    history_messages,
    standalone_from_reply,
    stands_alone,
)
from rag_app.config import Settings
from rag_app.search.relevance import LEAD

if TYPE_CHECKING:
    from rag_app.answers.answer import AnswerResponse
    from rag_app.search.retrieve import SearchIndex, SearchResponse

log = logging.getLogger("cflow_brain.answers")


class Asker:
    """Answers one home's questions (`ask`) with what its Brain holds:

    - `search(query, k, **filters)`: the Brain's search (stale check and coverage included);
    - `searcher()` and `lock`: the open search index, read under the lock (notes' full text, the keyword index's IDF,
      the USE-m3 similarity of a note's lines to the question);
    - `link`: the LLM, and its last failure (answers are passages while it is down);
    - `note_count()`: how many notes the home holds (an empty home says so instead of "not found");
    - `sessions()`: the conversations file."""

    def __init__(self, settings: Settings, link: LLMLink, search: Callable[..., SearchResponse],
                 searcher: Callable[[], SearchIndex], lock: threading.RLock, note_count: Callable[[], int],
                 sessions: Callable[[], SessionStore]):
        self.settings = settings
        self.link = link
        self.search = search
        self.searcher = searcher
        self._lock = lock
        self.note_count = note_count
        self.sessions = sessions

    @property
    def _sessions(self) -> SessionStore:
        return self.sessions()

    def ask(
        self,
        question: str,
        k: int = 6,
        *,
        session: str | None = None,
        sources: tuple[str, ...] = (),
        tags: tuple[str, ...] = (),
        since: str | dt.date | None = None,
        until: str | dt.date | None = None,
        on_token: Callable[[str], None] | None = None,
        budget: int | None = None,
        audience: str = "user",
        turn_id: str | None = None,
    ) -> AnswerResponse:
        """Search, then answer only from the notes found, citing them as [n]. Without an LLM: extractive passages.

        With a `session`, the question continues that conversation: it is condensed with the earlier turns into the
        standalone query that is searched (`coverage["condensed_query"]`), the LLM sees the history within the budget,
        and the turn is stored. A `turn_id` the session already holds (the same ask run again: `brain ask` after its
        warm engine died having stored the turn) answers with that turn and stores nothing."""
        if session is not None and turn_id is not None:
            stored = self._sessions.stored_turn(session, turn_id, question)
            if stored is not None:
                if on_token is not None:
                    on_token(stored["answer"])
                return answers.AnswerResponse(stored["answer"], stored["citations"], stored["coverage"],
                                              stored["mode"], cited=stored["coverage"].get("cited") or [])
        history = self._sessions.turns(session, last=HISTORY_TURNS) if session is not None else []
        config = llm_config(self.settings.llm)
        llm = self.link.llm()
        llm_error = self.link.llm_state(probe=True)["error"] if llm is not None else None  # down: passages at once
        query = question
        if history:
            query, condense_error = self._condense(question, history, None if llm_error else llm, config.api_key)
            llm_error = llm_error or condense_error
        found = self.search(query, k, sources=sources, tags=tags, since=since, until=until, audience=audience)
        citations = answers.citations_from(found.results)
        coverage = dict(found.coverage)
        coverage["not_found"] = found.not_found
        coverage["answer_state"] = found.answer_state
        if history:
            coverage["condensed_query"] = query
        if not found.results and self.note_count() == 0:
            coverage["empty_index"] = True
        total = budget or self.settings.llm["budget_chars"]
        notice = None
        if config.missing:
            coverage.update(llm="incomplete", llm_missing=config.missing)
            notice = f"{missing_message(config.missing)}; showing passages"
        elif llm is None:
            coverage["llm"] = "off"
        unsure = found.answer_state == "unsure"
        usable = answers.possible_matches(found.results) if unsure else answers.answerable(found.results)
        if llm is not None and usable and llm_error is None:
            sent = answers.citations_from(usable)  # the LLM sees only passages that may answer: [n] are theirs
            with self._lock:
                manifest = self.searcher().manifest
                full = {r["note_id"]: (manifest.note_doc(r["note_id"]) or ("",))[0]
                        for r in usable[: answers.FULL_TEXT_NOTES]}
            past = self._history_messages(history, total)
            context = answers.build_context(usable, full, total - sum(len(m.content or "") for m in past), unsure)
            try:
                text = answers.llm_answer(llm, question, context, on_token, past)
            except Exception as exc:  # the LLM is optional: fall back, say why, never fail the question
                llm_error = error_reason(exc, config.api_key)
                self.link.failed(llm_error)
            else:
                self.link.succeeded()
                cited = answers.cited_numbers(text, len(sent))
                coverage.update(cited=cited, llm="used")
                return self._remember(session, turn_id, question, answers.AnswerResponse(
                    text, sent, coverage, "llm", len(context), cited))
        if llm_error is not None:
            coverage.update(llm="unavailable", llm_error=llm_error)
            notice = f"LLM unavailable ({llm_error}); showing passages"
        coverage.setdefault("llm", "unused")  # configured, but nothing was found to answer from
        mode = "extractive"
        if coverage.get("empty_index"):
            text = answers.NO_NOTES
        elif coverage.get("no_note_matches_filters"):
            text, mode = answers.no_match_answer(coverage["filters"]), "not_found"
        elif found.not_found:
            text = answers.not_found_answer(citations, unmentioned=coverage.get("unmentioned"),
                                            filters=coverage.get("filters"))
            mode = "not_found"
        elif unsure:
            scorer, notes = self.answering_lines(query, answers.possible_matches(found.results))
            text, mode = answers.unsure_answer(question, found.results, citations, query, scorer, notes), "unsure"
        else:
            scorer, notes = self.answering_lines(query, answers.answerable(found.results))
            text = answers.extractive_answer(question, found.results, citations, notice, query, scorer, notes)
        if on_token is not None:
            on_token(text)
        return self._remember(session, turn_id, question, answers.AnswerResponse(text, citations, coverage, mode))

    def answering_lines(self, query: str, shown: list[dict[str, Any]]) -> tuple[Any, dict[str, str]]:
        """What an extractive answer needs to show each note's answering line: a scorer for the query's lines
        (answers.answer_lines) and the shown notes' full text (the query engine's answers use it too)."""
        with self._lock:
            index = self.searcher()
            keyword = index.keyword()
            notes = {r["note_id"]: (index.manifest.note_doc(r["note_id"]) or ("",))[0] for r in shown}
        scorer = LineScorer.for_question(query, keyword.idf, lambda lines: index.line_similarities(query, lines),
                                         lambda passages: index.passage_similarities(query, passages),
                                         lambda: index.translation(query))
        return scorer, notes

    def _condense(self, question: str, history: list[dict[str, Any]], llm: Any,
                  secret: str) -> tuple[str, str | None]:
        """(standalone query, LLM error): CondensePlusContextChatEngine's condense step with an LLM, else (or when
        it fails) the follow-up with the last turn's subject (rag_app.answers.sessions.condense_without_llm)."""
        if llm is not None:
            try:
                condensed = standalone_from_reply(str(llm.complete(condense_prompt(question, history))))
            except Exception as exc:  # unreachable: the answer falls back to passages, and says why
                reason = error_reason(exc, secret)
                self.link.failed(reason)
                return condense_without_llm(question, history, self._stands_alone(question, history)), reason
            if condensed:
                return condensed, None
        return condense_without_llm(question, history, self._stands_alone(question, history)), None

    def _stands_alone(self, question: str, history: list[dict[str, Any]]) -> bool:
        """Whether the question starts a new subject, read from its own top 3 (sessions.stands_alone)."""
        found = self.search(question, 3, expand=False)
        return stands_alone(question, found.results, found.answer_state, history[-1], LEAD)

    @staticmethod
    def _history_messages(history: list[dict[str, Any]], budget: int) -> list[Any]:
        """Earlier turns for the answer request: at most a quarter of the character budget, newest first."""
        return history_messages(history, budget // 4) if history else []

    def _remember(self, session: str | None, turn_id: str | None, question: str,
                  response: AnswerResponse) -> AnswerResponse:
        """Store the turn; when the sessions file cannot take it (locked, full, damaged), the answer is still given
        and `coverage["session_not_saved"]` says why."""
        if session is not None:
            try:
                self._sessions.append(session, {"question": question, "answer": response.answer,
                                                "citations": response.citations, "coverage": response.coverage,
                                                "mode": response.mode}, turn_id)
            except SessionStoreError as exc:
                log.warning("the answer was given but not saved in session %r: %s", session, exc)
                response.coverage["session_not_saved"] = f"this answer was not saved in session {session!r}: {exc}"
        return response

