"""Search replies that fit an agent's context window: brief by default, the matched passages on request.

An agent reads previews to decide which notes to open with get_note; sending every hit's passages cost 12–24k
characters per search. A brief result names the note (id, title, path or url, strength, relevance when the engine
gives it, dates, tags) and carries one preview: the sentences or lines that best match the queries, not the note's
start, at most PREVIEW_CHARS characters for a strong hit, fewer for related and weak ones; get_note reads a note.
"""

import json
import re
from collections.abc import Iterable
from typing import Any

from rag_app.answers.answer import query_words  # the index's extractor, as answers use it (a shell reads no index)
from readers.markdown_syntax import HAN, fence_opening, readable_wikilinks

__all__ = ["PASSAGE_CHARS", "PREVIEW_CHARS", "REPLY_CHARS", "PREVIEW_CHARS_BY_STRENGTH", "brief_result",
           "brief_results", "passages", "preview", "query_terms"]

PREVIEW_CHARS = 300
RELATED_PREVIEW_CHARS = 200
WEAK_PREVIEW_CHARS = 120  # a weak hit is a lead, not an answer: its preview says what it is about
PREVIEW_CHARS_BY_STRENGTH = {"strong": PREVIEW_CHARS, "related": RELATED_PREVIEW_CHARS, "weak": WEAK_PREVIEW_CHARS}
REPLY_CHARS = 4_000  # a brief k=10 reply, metadata and coverage included (issue 19's goal)
MIN_PREVIEW_CHARS = 100  # every hit says what it is about, even when k=20 overruns REPLY_CHARS
PASSAGE_CHARS = 1_000
NAMING_KEYS = ("note_id", "title", "path", "url")
DATE_KEYS = ("created", "updated")

_SENTENCE_END = re.compile(r"(?<=[。！？；!?;])|(?<=[.…])\s+")
_LINE_MARK = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+(?:\[[ xX]\]\s+)?|\d+[.)]\s+)")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$")
_EMPHASIS = re.compile(r"\*\*|__|~~")


def query_terms(queries: Iterable[str]) -> set[str]:
    """What a passage is matched on: the queries' words (`query_words`, in both scripts, one-character words too),
    lower case."""
    return {word.lower() for query in queries for word in query_words(query, both_scripts=True, lone_characters=True)}


def preview(texts: list[str], terms: set[str], limit: int = PREVIEW_CHARS, title: str = "") -> str:
    """At most `limit` characters cut on sentence or line ends: the best-matching sentence of the matched
    passages (the first passage's start when none contains a query term), then its neighbours while they fit.
    A line that only repeats the title is left out (the result names it already)."""
    best: tuple[int, int, int] | None = None  # (weight, -passage, -sentence): heaviest match, then earliest
    split = [[s for s in _sentences(text) if s != title] for text in texts]
    for p, sentences in enumerate(split):
        for s, sentence in enumerate(sentences):
            key = (_weight(sentence, terms), -p, -s)
            if best is None or key > best:
                best = key
    if best is None:
        return ""
    sentences, at = split[-best[1]], -best[2]
    if len(sentences[at]) > limit:
        return _window(sentences[at], terms, limit)
    first = last = at
    size = len(sentences[at])
    while True:  # the sentences after the match first (they finish its thought), then those before
        if last + 1 < len(sentences) and size + 1 + len(sentences[last + 1]) <= limit:
            last += 1
            size += 1 + len(sentences[last])
        elif first > 0 and size + 1 + len(sentences[first - 1]) <= limit:
            first -= 1
            size += 1 + len(sentences[first])
        else:
            break
    return " ".join(sentences[first:last + 1])


def _weight(sentence: str, terms: set[str]) -> int:
    """How well a sentence matches: the letters of the distinct query terms it holds, so "publish" outweighs "my".
    An English term matches the start of a word ("publish" in "published", never "do" in "window"); a Chinese word
    matches anywhere."""
    lowered = sentence.lower()
    return sum(len(term) for term in terms
               if (term in lowered if _is_cjk(term) else re.search(rf"(?<![^\W_]){re.escape(term)}", lowered)))


def _is_cjk(term: str) -> bool:
    return HAN.match(term) is not None


def _sentences(text: str) -> list[str]:
    """A passage's lines split into sentences, as read rather than as written: no Markdown line marks (headings,
    bullets, quotes), table rules, emphasis marks or wikilink brackets, no runs of blanks."""
    found = []
    for line in text.splitlines():
        if _TABLE_RULE.match(line) or fence_opening(line):
            continue
        line = readable_wikilinks(_EMPHASIS.sub("", _LINE_MARK.sub("", line)))
        line = " ".join(line.strip(" |").split())
        found.extend(piece.strip() for piece in _SENTENCE_END.split(line) if piece.strip())
    return found


def _window(sentence: str, terms: set[str], limit: int) -> str:
    """A sentence too long for the preview: `limit` characters around its first query term, on word ends."""
    lowered = sentence.lower()
    hits = [p for p in (lowered.find(term) for term in terms) if p >= 0]
    start = max(0, min(hits) - limit // 4) if hits else 0
    start = min(start, len(sentence) - (limit - 2))
    if start > 0 and sentence[start - 1].isalnum() and sentence[start].isascii():
        start = sentence.find(" ", start) + 1 or start
    piece = sentence[start:start + limit - 2]
    if start + len(piece) < len(sentence) and piece[-1:].isascii() and " " in piece[limit // 2:]:
        piece = piece[:piece.rindex(" ")]
    return ("…" if start else "") + piece + ("…" if start + len(piece) < len(sentence) else "")


def passages(chunks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The matched passages, each capped at PASSAGE_CHARS, without the text they share with one shown before
    (chunking overlaps a long paragraph's windows, and the best chunk of a note may come after its neighbour)."""
    shown: list[dict[str, str]] = []
    seen: list[str] = []
    for chunk in chunks:
        text = chunk.get("text", "")
        if any(text in before for before in seen):
            continue
        head = max((_overlap(before, text) for before in seen), default=0)
        tail = max((_overlap(text, after) for after in seen), default=0)
        seen.append(text)
        kept = text[head:len(text) - tail].strip() if head + tail < len(text) else ""
        if kept:
            shown.append({"heading": chunk.get("heading") or "", "text": kept[:PASSAGE_CHARS]})
    return shown


def _overlap(before: str, after: str, least: int = 20) -> int:
    """How many leading characters of `after` repeat the end of `before` (0 below `least`: a shared phrase is not
    an overlap)."""
    for size in range(min(len(before), len(after)), least - 1, -1):
        if before.endswith(after[:size]):
            return size
    return 0


def brief_results(results: list[dict[str, Any]], queries: list[str], detail: str, room: int) -> list[dict[str, Any]]:
    """Search hits as agents see them, best first, in about `room` characters of JSON. The previews share what the
    names and dates leave: the few strong hits get up to PREVIEW_CHARS each, and when many hits are strong or long
    named each gets its share (at least MIN_PREVIEW_CHARS)."""
    terms = query_terms(queries)
    shaped = [brief_result(result, terms, detail, 0) for result in results]
    if detail == "passages":
        return shaped
    left = room - _chars(shaped)
    for n, (result, brief) in enumerate(zip(results, shaped, strict=True)):
        share = max(MIN_PREVIEW_CHARS, left // (len(results) - n))
        limit = min(PREVIEW_CHARS_BY_STRENGTH.get(result.get("strength"), WEAK_PREVIEW_CHARS), share)
        brief["preview"] = preview(_texts(result), terms, limit, result.get("title") or "")
        left -= _chars(brief["preview"]) - 2
    return shaped


def _chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _texts(result: dict[str, Any]) -> list[str]:
    return [c.get("text", "") for c in result.get("chunks") or [{"text": result.get("excerpt") or ""}]]


def brief_result(result: dict[str, Any], terms: set[str], detail: str, limit: int = PREVIEW_CHARS) -> dict[str, Any]:
    """One search hit: what names and dates it, and a preview of at most `limit` characters, or with
    detail="passages" its matched passages instead (the preview is a cut of the first, so it is not sent twice)."""
    shaped = {key: result[key] for key in NAMING_KEYS if result.get(key)}
    shaped["strength"] = result.get("strength")
    if result.get("relevance") is not None:
        shaped["relevance"] = result["relevance"]
    shaped.update({key: str(result[key])[:10] for key in DATE_KEYS if result.get(key)})
    if result.get("tags"):
        shaped["tags"] = result["tags"]
    if (result.get("topic") or {}).get("stands_out"):  # the one that decides a label; the rest are every note's
        shaped["topic"] = {"text": result["topic"]["text"], "similarity": result["topic"]["similarity"]}
    if result.get("linked_from"):  # found because a sentence of that note, holding the question's words, links here
        shaped["linked_from"] = {key: result["linked_from"][key] for key in ("note_id", "sentence")}
    if result.get("duplicates"):
        shaped["duplicates"] = result["duplicates"]
    if detail == "passages":
        shaped["passages"] = passages(result.get("chunks") or [{"text": result.get("excerpt") or ""}])
    else:
        shaped["preview"] = preview(_texts(result), terms, limit, result.get("title") or "") if limit else ""
    return shaped
