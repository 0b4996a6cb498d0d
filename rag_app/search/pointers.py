"""Links a found note points through: a line of a top result that holds the question's words and links to another
note names the note that holds them ("支付超时事故已复盘，详见 [[incident-2024-03-payment-timeout]]" for
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
from readers.markdown_syntax import WIKILINK, readable_wikilinks, wikilink_shown

POINTER_TOP = 3  # the first results whose lines may point
POINTER_SHARE = 0.6  # of the question's word weight (IDF) the pointing text must hold
MAX_POINTED = 2  # notes one search may bring in this way
LINE_CHARS = 200  # of the pointing line, as results carry it


@dataclass(frozen=True)
class Pointer:
    """`source`: the position of the pointing result; `target`: the linked note's id; `heading`: the linked heading
    (`[[note#heading]]`), if any; `line`: the pointing line as Obsidian shows it; `lacking`: the question's words
    the line does not hold (the linked note must: see rag_app.search.retrieve)."""

    source: int
    target: str
    heading: str
    line: str
    lacking: frozenset[str] = frozenset()


def question_weights(question: str, idf: Callable[[str], float | None]) -> dict[str, float]:
    """The question's words the home holds, by IDF (question words aside): what a pointing line must hold."""
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
    """Links of the first POINTER_TOP results' matched chunks whose pointing text holds POINTER_SHARE of the
    question's weight: the sentence the link is in when it is that sentence's one link ("…已复盘，详见 [[x]]。"; not
    the sentence before it on the same line), the link's shown text (its alias) when the sentence has several (an
    index line lists many notes; only the one its alias names is meant). Best pointer first, each target once,
    never a result pointing to itself."""
    found: list[Pointer] = []
    seen: set[str] = set()
    for position, result in enumerate(results[:POINTER_TOP]):
        for chunk in result.get("chunks") or []:
            for match, said, sentence in _links(str(chunk.get("text") or "")):
                if share_held(said, weights) < POINTER_SHARE:
                    continue
                lacking = frozenset(weights) - held(said, weights)
                target = next(filter(None, (resolve(name, result) for name in _names(match))), None)
                if target is None or target == result["note_id"] or target in seen:
                    continue
                seen.add(target)
                heading = (match.group(3) or "").lstrip("#").strip()
                found.append(Pointer(position, target, heading, _plain(readable_wikilinks(sentence)), lacking))
    return found


def _names(match: re.Match[str]) -> list[str]:
    """What a link may name: its target, then (Dendron writes `[[label|note]]`) what follows the pipe, without a
    `dendron://vault/` prefix or a `#heading`."""
    names = [match.group(2).strip().rstrip("\\").strip()]
    if match.group(4):
        names.append(re.sub(r"^dendron://[^/]*/", "", match.group(4).strip()).split("#")[0].strip())
    return [n for n in names if n]


def _links(text: str) -> Iterator[tuple[re.Match[str], str, str]]:
    """Each link of a text (embeds aside) with what points through it (see `pointers`) and its sentence."""
    for line in text.splitlines():
        for sentence in _SENTENCE.findall(line):
            links = [m for m in WIKILINK.finditer(sentence) if not m.group(1)]
            for match in links:
                yield match, readable_wikilinks(sentence) if len(links) == 1 else wikilink_shown(match), sentence


_SENTENCE = re.compile(r".+?(?:[。！？!?；;]+|\.(?=\s)|$)\s*")  # a link's alias may hold a period: only ". " ends


def _plain(line: str) -> str:
    """The line without its list or task mark, at most LINE_CHARS characters."""
    line = re.sub(r"^\s*(?:[-*+]\s+(?:\[[ xX]\]\s+)?|\d{1,3}[.)]\s+)", "", line).strip()
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"
