"""Links a found note points through: a sentence of a top result that holds the question's words and links to
another note names the note that holds them ("支付超时事故已复盘，详见 [[incident-2024-03-payment-timeout]]" for
支付超时事故的根因是什么; an index's "[[incident-2024-03-payment-timeout|三月支付超时事故]]"). Obsidian users write such
lines to send the reader on; the linked note (in English here, so neither BM25 nor e5 found it) is put where the
reader would go next: just above the note that points to it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rag_app.index.keyword import HAN_RUN, is_question_word, to_simplified, tokenize
from readers.markdown_syntax import WIKILINK, piped_target, readable_wikilinks, strip_code, wikilink_shown

POINTER_TOP = 3  # the first results whose sentences may point
POINTER_SHARE = 0.6  # of the question's word weight (IDF) the pointing text must hold
MAX_POINTED = 2  # notes one search may bring in this way
SENTENCE_CHARS = 200  # of the pointing sentence, as results carry it


@dataclass(frozen=True)
class Pointer:
    """`source`: the position of the pointing result; `target`: the linked note's id; `heading`: the linked heading
    (`[[note#heading]]`), if any; `sentence`: the pointing sentence as Obsidian shows it; `lacking`: the question's
    words the sentence does not hold (the linked note must: see rag_app.search.retrieve)."""

    source: int
    target: str
    heading: str
    sentence: str
    lacking: frozenset[str] = frozenset()


def question_weights(question: str, idf: Callable[[str], float | None]) -> dict[str, float]:
    """The question's words the home holds, by IDF (question words aside): what a pointing sentence must hold."""
    return {t: w for t in dict.fromkeys(tokenize(question)) if not is_question_word(t) and (w := idf(t))}


def held(text: str, weights: Mapping[str, float]) -> set[str]:
    """The words a text holds (a Chinese word counts inside a longer one: 事故 in 事故已复盘)."""
    tokens = set(tokenize(text))
    folded = to_simplified(text.lower())
    return {t for t in weights if t in tokens or (HAN_RUN.fullmatch(t) and t in folded)}


def share_held(text: str, weights: Mapping[str, float]) -> float:
    """The share of the words' weight a text holds."""
    total = sum(weights.values())
    return sum(weights[t] for t in held(text, weights)) / total if total else 0.0


def pointers(results: list[dict[str, Any]], weights: Mapping[str, float],
             resolve: Callable[[str, Mapping[str, Any]], str | None]) -> list[Pointer]:
    """Links (outside code, embeds aside) of the first POINTER_TOP results' matched chunks whose pointing text holds
    POINTER_SHARE of the question's weight: the sentence the link is in when it is that sentence's one link
    ("…已复盘，详见 [[x]]。"; not the sentence before it on the same line), the link's shown text (its alias) when
    the sentence has several (an index line lists many notes; only the one its alias names is meant). In the order
    found, never a result pointing to itself; which to follow is the caller's choice."""
    found: list[Pointer] = []
    for position, result in enumerate(results[:POINTER_TOP]):
        for chunk in result.get("chunks") or []:
            for match, said, sentence in _links(str(chunk.get("text") or "")):
                if share_held(said, weights) < POINTER_SHARE:
                    continue
                target = next(filter(None, (resolve(name, result) for name in _names(match))), None)
                if target is None or target == result["note_id"]:
                    continue
                lacking = frozenset(weights) - held(said, weights)
                found.append(Pointer(position, target, _heading(match), _unmarked(readable_wikilinks(sentence)),
                                     lacking))
    return found


def _names(match: re.Match[str]) -> list[str]:
    """What a link may name: its target, then (Dendron writes `[[label|note]]`) what follows the pipe."""
    names = [match.group(2).strip().rstrip("\\").strip()]
    if match.group(4):
        names.append(piped_target(match.group(4)))
    return [n for n in names if n]


def _heading(match: re.Match[str]) -> str:
    """The linked heading: the last of `#h1#h2`, a block's `^` and a table's escaped pipe (`\\|`) left out."""
    parts = [p.strip().rstrip("\\").strip().removeprefix("^") for p in (match.group(3) or "").split("#")]
    return next((p for p in reversed(parts) if p), "")


def _links(text: str) -> Iterator[tuple[re.Match[str], str, str]]:
    """Each link of a text outside code (embeds aside) with what points through it (see `pointers`) and its
    sentence. Sentences end at 。！？!?；; or a period before a blank, never inside a link (an alias may hold one)
    nor at an embed's `!`."""
    for line in strip_code(text).splitlines():
        links = list(WIKILINK.finditer(line))
        spans = [(m.start(), m.end()) for m in links]
        ends = [e.end() for e in _SENTENCE_END.finditer(line) if not any(a <= e.start() < b for a, b in spans)]
        for match in links:
            if match.group(1):
                continue
            start = max((e for e in ends if e <= match.start()), default=0)
            end = min((e for e in ends if e >= match.end()), default=len(line))
            sentence = line[start:end]
            count = sum(1 for m in links if not m.group(1) and start <= m.start() and m.end() <= end)
            yield match, readable_wikilinks(sentence) if count == 1 else wikilink_shown(match), sentence


_SENTENCE_END = re.compile(r"[。！？!?；;]+|\.(?=\s)")


def _unmarked(sentence: str) -> str:
    """The sentence without a list or task mark, at most SENTENCE_CHARS characters."""
    sentence = re.sub(r"^\s*(?:[-*+]\s+(?:\[[ xX]\]\s+)?|\d{1,3}[.)]\s+)", "", sentence).strip()
    return sentence if len(sentence) <= SENTENCE_CHARS else sentence[: SENTENCE_CHARS - 1] + "…"
