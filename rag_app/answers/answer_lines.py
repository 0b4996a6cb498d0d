"""Which line of a note answers the question: an extractive answer shows that line, not the best chunk's start.

Every line of the note is a candidate (a list item, a table row, a sentence of a paragraph, a code block whole) and is
scored by the question's words that it holds, each weighted by how rare it is in the home (BM25's IDF: "手冲" is in
many notes, "水温" in one) and discounted when it is in the note's title (every line of the note is about that), by
its meaning (the fast model's cosine to the question, when the home has it), and, when the question asks how much,
how many or when, by holding a number. Measured by bench/answer_lines.py (docs/retrieval.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

TITLE_DISCOUNT = 0.3  # a question word that is in the title says which note, not which line
SECTION_SHARE = 0.5  # a word in the line's section heading counts half
MEANING_WEIGHT = 1.0  # the cosine's weight beside the words' (normalised to the best line's)
NUMBER_BONUS = 0.3  # for a line with a digit when the question asks for an amount or a time
MAX_UNITS = 200  # lines of one note compared by meaning; a longer note's lines are cut by their words first

_ASKS_AMOUNT = re.compile(r"多少|几|多久|多大|多远|多重|多长|多高|什么时候|哪年|哪天|\bhow (?:much|many|far|long|big|"
                          r"heavy|old|often)\b|\bwhat time\b|\bwhen\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_TAGS_ONLY = re.compile(r"^\s*(?:#[^\s#]+\s*)+$")
_SENTENCE = re.compile(r".+?(?:[。！？!?；;]+|\.(?=\s)|$)\s*", re.DOTALL)


def sentences(text: str) -> list[str]:
    """A paragraph's sentences, cut after 。！？!?；; and after a period that ends a word (not in 4.5 or v1.2)."""
    return [s for s in _SENTENCE.findall(text) if s.strip()] or [text]


@dataclass
class LineScorer:
    """Scores candidate lines for one question; `similarity` gives the fast model's cosines (None without it)."""

    terms: list[str]
    weights: dict[str, float]
    asks_amount: bool
    similarity: Callable[[list[str]], list[float] | None] | None = None

    @classmethod
    def for_question(cls, question: str, idf: Callable[[str], float | None],
                     similarity: Callable[[list[str]], list[float] | None] | None = None) -> LineScorer:
        from rag_app.index.keyword import is_question_word, tokenize

        terms = [t for t in dict.fromkeys(tokenize(question)) if not is_question_word(t)]
        return cls(terms, {t: idf(t) or 0.0 for t in terms}, bool(_ASKS_AMOUNT.search(question)), similarity)

    def scores(self, units: list[tuple[str, str]], title: str) -> list[float]:
        """One score per (section, text) unit: the higher, the more likely the line answers."""
        from rag_app.index.keyword import tokenize

        in_title = set(tokenize(title))
        words = [self._words(set(tokenize(text)), set(tokenize(section)), in_title) for section, text in units]
        best = max(words, default=0.0) or 1.0
        scores = [w / best for w in words]
        if self.similarity is not None and units:
            ranked = sorted(range(len(units)), key=lambda k: -scores[k])[:MAX_UNITS]
            cosines = self.similarity([units[k][1] if units[k][0] in ("", title) else f"{units[k][0]} {units[k][1]}"
                                       for k in ranked])  # the title is every line's: it would favour the first
            for k, cosine in zip(ranked, cosines or [], strict=False):
                scores[k] += MEANING_WEIGHT * cosine
        for k, (_, text) in enumerate(units):
            if self.asks_amount and _DIGIT.search(text):
                scores[k] += NUMBER_BONUS
            if _TAGS_ONLY.match(text):
                scores[k] = float("-inf")
        return scores

    def _words(self, line: set[str], section: set[str], title: set[str]) -> float:
        total = 0.0
        for term in self.terms:
            weight = self.weights[term] * (TITLE_DISCOUNT if term in title else 1.0)
            total += weight if term in line else SECTION_SHARE * weight if term in section else 0.0
        return total
