"""Names a question asks about that the notes never mention: an absent subject is "not in your notes" (issue 28).

"import my Kindle highlights into notes", asked of a vault that never says Kindle, matched a changelog's "import"
and "highlights" and was called related; "How do Jon and Gina both like to destress?", asked of a vault that names
neither, was found or unsure for 62 of 100 such questions. Whatever the other words match, no note can say anything
about a thing it never names. A name is a capitalised word inside an English sentence (Kindle, WebDAV, RemNote,
Gina) or a Latin word with a capital or a digit inside a Chinese question (用 Syncthing 同步, CPI, C919; not the
English word a person drops into Chinese: 日语考试的 deadline).

A name counts as mentioned when the notes hold it as BM25 reads them or spelled apart (Wi-Fi for WiFi, VS Code for
VSCode, PostgreSQL for Postgres), or as a note's alias or file name: a false "not in your notes" costs an answer the
person wrote down, so every doubt goes to "mentioned".
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Container, Iterable
from typing import TYPE_CHECKING

from rag_app.index.keyword import EN_STOPWORDS, HAN_RUN, PerIndex, _stemmer, tokenize
from rag_app.search.time_phrases import MONTH_NAMES
from readers.markdown_syntax import is_chinese

if TYPE_CHECKING:
    import numpy as np

    from rag_app.index.keyword import KeywordIndex

# A year the question is anchored to: 2022年…, "in 2019" (not a count: 2000步, "2000 steps"). Asked of notes that never
# say it and of which none is dated then (a time phrase with dated notes became a filter and left the question), no
# note can tell what happened that year.
_YEAR = re.compile(r"(?<![\d.])((?:19|20)\d\d)(?=\s*年)|"
                   r"\b(?:in|since|during|from|before|after|until)\s+((?:19|20)\d\d)(?!\d)", re.IGNORECASE)
_LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[.\-][A-Za-z0-9]+)*")
_SENTENCE_END = re.compile(r"[.?!:;\"'“‘(\[。！？：；]\s*$")
_LETTERS = re.compile(r"[A-Za-z]+")
_SEPARATORS = re.compile(r"[._\-/:@]")
_UMLAUT = re.compile(r"(?<=[a-z])(?:oe|ue|ae)")  # German ö, ü, ä as typed without them
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # VSCode → VS, Code
TIME_WORDS = MONTH_NAMES | frozenset(
    "sept am pm monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs fri sat "
    "sun".split())
# British spellings and their American forms (the dictionary's English is American, and BM25's stemmer keeps them apart)
_BRITISH = tuple((re.compile(pattern), american) for pattern, american in (
    (r"(?<=[a-z]{2})is(e|es|ed|ing|ation|ations)$", r"iz\1"), (r"(?<=[a-z])ys(e|es|ed|ing)$", r"yz\1"),
    (r"(?<=[a-z])our(s|ed|ing|ful|less)?$", r"or\1"), (r"(?<=[a-z]{2})tre(s|d)?$", r"ter\1"),
    (r"(?<=[a-z]{2})ence(s)?$", r"ense\1"), (r"(?<=[a-z]{2})ogue(s)?$", r"og\1"),
    (r"(?<=[a-z]{2}[aeiou])ll(ed|ing|er|ers)$", r"l\1")))
_INITIALS = ("", "zh", "ch", "sh", *"bpmfdtnlgkhjqxrzcsyw")
_FINALS = ("a o e i u v ai ei ao ou an en er in un vn ia ie iu ua uo ui ve ue ang eng ing ong ian iao uai uan van "
           "iang iong uang").split()
_SYLLABLES = frozenset(initial + final for initial in _INITIALS for final in _FINALS)
TYPO_LETTERS = 4  # a word this long one typo away from a dictionary word is that word mistyped
LONGEST_NAME = 40  # characters: a longer "word" (A.A.A.…) is pasted text, not a name
MAX_NAMES = 5  # named back to the person at most
MAX_CHECKED = 20  # names of one question looked up
PREFIX_LETTERS = 5  # a name this long that begins a word the notes hold is that word shortened (Postgres)
MAX_SPELLINGS = 20  # words of the notes tried as a name's other spellings under a filter


def _joins(character: str) -> bool:
    """Whether a character beside a Latin run makes it part of a longer word (Atatürk, 20000mAh), not a name of its
    own: a letter or digit of an alphabetic script (Han and kana stand apart from Latin letters)."""
    return character.isalnum() and ord(character) < 0x2E80


def names(question: str, english_home: bool) -> list[str]:
    """The words of a question that name a thing, each once, as written (`english_home`: the notes are mostly in a
    language written in Latin letters, so an English question's names would be spelled alike there). Not a sentence's
    first word, "I", a month, a weekday or am/pm; none in a question typed All In Capitals Or Title Case. A year the
    question is anchored to (`_YEAR`) in any language."""
    found: dict[str, str] = {year: year for pair in _YEAR.findall(question) for year in pair if year}
    letters = [c for c in question if c.isascii() and c.isalpha()]
    chinese = is_chinese(question)
    if not chinese and (not english_home or sum(c.isupper() for c in letters) > 0.6 * len(letters)):
        return list(found.values())
    for line in question.splitlines():
        first_alnum = next((k for k, c in enumerate(line) if c.isalnum()), len(line))
        matches = [m for m in _LATIN_WORD.finditer(line) if len(m.group(0)) <= LONGEST_NAME
                   and not (m.start() and _joins(line[m.start() - 1]))
                   and not (m.end() < len(line) and _joins(line[m.end()]))]
        words = [m.group(0) for m in matches]
        titled = len(words) >= 4 and sum(w[0].isupper() for w in words[1:]) >= 0.8 * (len(words) - 1)
        for match in matches:
            word = match.group(0)
            if word.lower() in TIME_WORDS:
                continue
            if chinese:
                is_name = any(c.isupper() or c.isdigit() for c in word)  # CPI, G20; not deadline or the kg of 5.8kg
            else:
                inner = any(c.isupper() for c in word[1:])  # WebDAV, RemNote, CPI
                opening = match.start() <= first_alnum or bool(
                    _SENTENCE_END.search(line[max(0, match.start() - 8): match.start()]))
                long_enough = len(word) > 2 or word == word.upper() != "I"  # AI, not Dr or I
                is_name = inner or (word[0].isupper() and not opening and long_enough and not titled)
            if is_name:
                found.setdefault(word.lower(), word)
    return list(found.values())


def unmentioned(question: str, mentioned: Callable[[str], bool], english_home: bool) -> list[str]:
    """The question's names (`names`; the first MAX_CHECKED: more is pasted text) that `mentioned` says no note the
    search may show holds, at most MAX_NAMES."""
    return [name for name in names(question, english_home)[:MAX_CHECKED] if not mentioned(name)][:MAX_NAMES]


def nonwords(question: str, mentioned: Callable[[str], bool], lexicon: Callable[[], Container[str]]) -> list[str]:
    """A question no reader can read, its words named back as absent subjects are (at most MAX_NAMES): one of Latin
    letters only (no Han character, no digit) none of whose content words can be read (`readable`; tdipmhotpcsepw, a
    cat on the keyboard). [] when any word is read: one known word makes it a question with a subject to look for."""
    if HAN_RUN.search(question) or any(c.isdigit() for c in question):
        return []
    words = list(dict.fromkeys(w for w in _LETTERS.findall(question) if w.lower() not in EN_STOPWORDS))
    if not words or len(words) > MAX_CHECKED or any(readable(w, mentioned, lexicon) for w in words):
        return []
    return words[:MAX_NAMES]


def readable(word: str, mentioned: Callable[[str], bool], lexicon: Callable[[], Container[str]]) -> bool:
    """Whether a Latin word is one a reader knows: the notes the search may show hold it (`mentioned`) in its own or
    its American spelling (licence, colour, analyse, centre: the notes may say license), the dictionary's English
    knows it (`lexicon`: stems) or a word one typo away (pyhton; the dictionary only, so no typo test can tell what a
    hidden note holds), or it is pinyin (huoguo: the notes write 火锅)."""
    low = word.lower()
    spellings = [low, *dict.fromkeys(pattern.sub(american, low) for pattern, american in _BRITISH
                                     if pattern.search(low))]
    if any(mentioned(spelling) for spelling in spellings) or _pinyin(low):
        return True
    candidates = spellings + (_one_typo_away(low) if len(low) >= TYPO_LETTERS else [])
    known = lexicon()
    return any(stem in known for stem in _stemmer().stemWords(candidates))


def _one_typo_away(word: str) -> list[str]:
    """Every string one deletion, transposition, substitution or insertion of a letter away from `word`."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    deleted = [head + tail[1:] for head, tail in splits if tail]
    swapped = [head + tail[1] + tail[0] + tail[2:] for head, tail in splits if len(tail) > 1]
    replaced = [head + c + tail[1:] for head, tail in splits if tail for c in letters]
    inserted = [head + c + tail for head, tail in splits for c in letters]
    return list(dict.fromkeys(deleted + swapped + replaced + inserted))


def _pinyin(word: str) -> bool:
    """Whether a word splits wholly into pinyin syllables (tones left off): a Chinese word spelled in letters."""
    fits = [True] + [False] * len(word)
    for end in range(1, len(word) + 1):
        fits[end] = any(fits[start] and word[start:end] in _SYLLABLES for start in range(max(0, end - 6), end))
    return fits[-1] and len(word) <= LONGEST_NAME


class Spellings:
    """The home's words as other spellings of a name: joined (wifi for Wi-Fi), and in order (postgresql begins with
    postgres). Made once per keyword index, only when a name is not found as written."""

    def __init__(self, keyword: KeywordIndex):
        vocabulary = list(keyword.bm25.vocab_dict) if keyword.ids else []
        self.sorted = sorted(vocabulary)
        self.joined: dict[str, list[str]] = {}
        for token in vocabulary:
            if _SEPARATORS.search(token):
                self.joined.setdefault(_SEPARATORS.sub("", token), []).append(token)

    def of(self, name: str) -> list[str]:
        """The home's words that may be this name spelled otherwise (Goedel is Gödel, folded to godel)."""
        low = name.lower()
        found = [t for other in {_UMLAUT.sub(lambda m: m.group(0)[0], low)} - {low} for t in tokenize(other)]
        found += self.joined.get(_SEPARATORS.sub("", low), [])
        if len(low) >= PREFIX_LETTERS:
            start = bisect.bisect_left(self.sorted, low)
            for token in self.sorted[start: start + MAX_SPELLINGS]:
                if not token.startswith(low):
                    break
                found.append(token)
        return found


spellings = PerIndex(Spellings)  # the keyword index's Spellings, made once per index when a name is not found


class Mentions:
    """Whether the notes a search may show (`allowed` chunk ids, None for all) mention a name: as BM25 reads them,
    spelled apart (`Spellings`, or its capitalised parts each held: VS Code for VSCode), or as a note's alias or file
    name (`aliases`: token → note ids, asked only when the words do not settle it). With a filter only the notes it
    allows count (`notes`: theirs): a private note that names it changes nothing an agent is told."""

    def __init__(self, keyword: KeywordIndex, allowed: set[str] | None, notes: set[str] | None,
                 aliases: Callable[[], Callable[[str], Iterable[str]]]):
        self.keyword = keyword
        self.allowed = allowed
        self.notes = notes  # the notes of the `allowed` chunks
        self.aliases = aliases
        self._rows: np.ndarray | None = None

    def __call__(self, name: str) -> bool:
        tokens = tokenize(name)
        if not tokens or self._held(tokens):
            return True
        parts = [tokenize(part) for part in _PARTS.findall(name)]
        if len(parts) > 1 and all(not part or self._held(part) for part in parts):
            return True
        others = spellings(self.keyword).of(name)
        if others and self._held(others):
            return True
        holders = self.aliases()
        named = {note for token in tokens for note in holders(token)}
        return bool(named if self.notes is None else named & self.notes)

    def _held(self, tokens: list[str]) -> bool:
        """Whether a chunk the search may show holds one of the tokens."""
        if self.allowed is not None and self._rows is None:
            self._rows = self.keyword.rows_of(self.allowed)
        return self.keyword.holds(tokens, self._rows)
