"""Names a question asks about that the notes never mention: an absent subject is "not in your notes" (issue 28).

"import my Kindle highlights into notes", asked of a vault that never says Kindle, matched a changelog's "import"
and "highlights" and was called related; "How do Jon and Gina both like to destress?", asked of a vault that names
neither, was found or unsure for 62 of 100 such questions. Whatever the other words match, no note can say anything
about a thing it never names. A name is a capitalised word inside an English sentence (Kindle, WebDAV, RemNote,
Gina; not the sentence's first word, not "I" or "Dr", not a month or weekday) or a Latin word inside a Chinese question
(用 Syncthing 同步, CPI, C919: brands and acronyms are written in Latin letters there).

An English question asked of notes mostly in Chinese is not read for names: those notes write Chengdu as 成都.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from readers.markdown_syntax import HAN

_LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[.\-][A-Za-z0-9]+)*")
_SENTENCE_START = re.compile(r"(?:^|[.?!:;\"'“‘(\[]\s*)$")
TIME_WORDS = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec "
    "monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs fri sat sun".split())


def names(question: str, english_home: bool) -> list[str]:
    """The words of a question that name a thing, each once, as written (`english_home`: the notes are mostly in a
    language written in Latin letters, so an English question's names would be spelled alike there)."""
    chinese = len(HAN.findall(question)) > sum(c.isascii() and c.isalpha() for c in question)
    if not chinese and not english_home:
        return []
    found: dict[str, str] = {}
    for match in _LATIN_WORD.finditer(question):
        word = match.group(0)
        if word.lower() in TIME_WORDS:
            continue
        if chinese:
            is_name = len(word) >= 3 or any(c.isupper() for c in word)  # CPI, G20; not the kg of 5.8kg
        else:
            inner = any(c.isupper() for c in word[1:])  # WebDAV, RemNote, CPI
            opening = bool(_SENTENCE_START.search(question[: match.start()]))
            long_enough = len(word) > 2 or word == word.upper() != "I"  # AI, not Dr or I
            is_name = inner or (word[0].isupper() and not opening and long_enough)
        if is_name:
            found.setdefault(word.lower(), word)
    return list(found.values())


def unmentioned(question: str, mentioned: Callable[[str], bool], english_home: bool) -> list[str]:
    """The question's names (`names`) that `mentioned` says no note the search may show holds."""
    return [name for name in names(question, english_home) if not mentioned(name)]
