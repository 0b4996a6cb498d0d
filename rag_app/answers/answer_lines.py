"""Which line of a note answers the question: an extractive answer shows that line, not the best chunk's start.

Every line of the note is a candidate (a list item, a table row, each sentence of a paragraph's lines, a code block
whole) and is scored by the question's words that it holds, each weighted by how rare it is in the home (BM25's IDF:
"手冲" is in many notes, "水温" in one), discounted when it is in the note's title (every line of the note is about
that) and doubled when an amount question measures it (放多少糖 → 糖); by its meaning (the fast model's cosine to the
question, when the home has it, weighed up when question and note are in different languages); and, when the
question asks how much, how many, when or what time, by holding a number (digits, 十点, 半勺, tens). Measured by
bench/answer_lines.py (docs/retrieval.md).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

from rag_app.index.keyword import EN_STOPWORDS, is_question_word, to_simplified, tokenize
from readers.markdown_syntax import is_chinese

TITLE_DISCOUNT = 0.3  # a question word that is in the title says which note, not which line
SECTION_SHARE = 0.5  # a word in the line's section heading counts half
MEANING_WEIGHT = 1.0  # the cosine's weight beside the words' (normalised to the best line's)
OTHER_LANGUAGE = 2.0  # the cosine's weight is doubled when question and note are in different languages
FOCUS_WEIGHT = 2.0  # the words a question asks about: 糖 in 放多少糖, memory in "how much Redis memory"
NUMBER_BONUS = 0.3  # for a line with a number when the question asks for an amount or a time
KIND_WEIGHT = 1.0  # a number of the kind asked (5.8kg for 多重), as a share of the question's weightiest word
HEAD_WEIGHT = 2.0  # a word in a line's label ("- ASIO: a HAL…", "14:52 — Hotfix: lower…") names what the line gives
MAX_UNITS = 200  # lines of one note compared by meaning; a longer note's lines are cut by their words first

# 几 asking "how many", not in 好几天 (several days; but 最好几点 asks), 十几个 (a dozen or so), 没几天, 几乎 (almost),
# 茶几 (a tea table), 几何 (geometry) or 几率 (odds)
_JI = r"(?<![十百千万没茶])(?<!(?<![最你还])好)几(?![乎何率])"
# "when" opening the question, not "… when the tab bar is full"
_ASKS_AMOUNT = re.compile(r"多少|" + _JI + r"|多久|多大|多远|多重|多长|多高|什么时候|哪年|哪天|"
                          r"\bhow (?:much|many|far|long|big|heavy|old|often)\b|\bwhat time\b|^\W*when\b", re.IGNORECASE)
# What an amount question measures: the words right after 多少 / 几 / how much / how many (放多少糖 → 糖, "how much
# Redis memory will" → Redis memory). Not after 哪部 / which: the line that answers names the thing (《步履不停》),
# rarely its kind (片子).
_FOCUS_ZH = re.compile(r"(?:多少|" + _JI + r")[个种部本家位次张条件]?([\u4e00-\u9fff]+)")
_FOCUS_EN = re.compile(r"\bhow (?:much|many)\s+"
                       r"([a-z0-9][\w-]*(?:\s+[a-z0-9][\w-]*)?)", re.IGNORECASE)
_HOW_WORD = re.compile(r"\bhow\s+([a-z]+)", re.IGNORECASE)  # "how much": says what is asked, not what about
# Question phrases whose second word is the asking (什么时候 is "when"), and what a question asks with in English
# beyond the stopwords: modal verbs and the stems of negated auxiliaries (isn't → isn).
_ASKING_PHRASE = re.compile(r"什么(?:时候|时间|地方)")
_FUNCTION_WORDS = frozenset("must may might shall isn aren wasn weren don doesn didn won wouldn shouldn couldn "
                            "haven hasn hadn mustn needn".split())
# A number: digits (not a list item's own number), a Chinese numeral with its unit (十点, 半勺, 两三个; not a lone 一:
# 一点 is "a little"; 一个多小时 is over an hour), or an English number word (tens, hundreds).
_LIST_MARK = re.compile(r"^\s*(?:[-*+]\s+|\d{1,3}[.)、]\s*)")
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_])\d|一个[多半]?(?:小时|钟头|月|星期)|(?:[零一二两三四五六七八九十百千万亿半]{2,}|[零二两三四五六七八九十百千万亿半])\s*(?:个|点|分|秒|天|日|周|星期|月|年|次|遍|"
    r"张|本|杯|勺|克|斤|块|元|岁|度|公里|里|米|小时|钟|倍|成|层|页|人|份|碗|瓶|罐|台|部|件|条|种|家|号|晚|站|趟|顿)|"
    r"\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|sixty|seventy|eighty|"
    r"ninety|hundreds?|thousands?|millions?|billions?|dozens?|tens|half)\b", re.IGNORECASE)
# The kind of amount a question asks for, and a line's number of that kind (a number with its unit): 多重 / how heavy
# is answered by 5.8kg, how far by 8 km or a runner's 5k (not how long: 2k, a 4K screen), how big by 360 KB, which
# frequencies by 3 MHz, 多快 by 150 Mbps, 星期几 by 週一 (not 一周一次), 什么时候 by 春秋 or 9 月. Units follow the
# number; a time may also be said without one (早上, spring, 周末). 星期几 asks a weekday, not 一周几次 (a count) nor
# "which day did we arrive" (a date). A why is answered by a cause said as one (导致, because, "Root cause:"), not
# by a purpose (为了, "to avoid": a trip's lines say why each thing was done) nor a result (所以).
_NUM = (r"(?:(?<![A-Za-z0-9_])\d[\d.,]*\s*|[零一二两三四五六七八九十百千万半几]+\s*|\b(?:one|two|three|four|five|six|"
        r"seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|forty|fifty|sixty|ninety|hundreds? of|a few|"
        r"a couple of|several|half an?)[\s-]+)(?:个\s*)?[多半]?")  # "expire after two weeks" is a duration as 两周 is,
# and 一个多小时 (over an hour) and 两个半小时 as 两小时
_KINDS = [(re.compile(q, re.IGNORECASE), re.compile(line, re.IGNORECASE)) for q, line in (
    (r"多重|多沉|体重|重量|\bhow heavy\b|\bweigh", _NUM + r"(?:kg|g|mg|lbs?|pounds?|oz|tons?|公斤|千克|克|斤|磅|吨)"
     r"(?![a-z])"),
    (r"多远|多长(?!时间)|多高|多深|多宽|多厚|距离|长度|身高|\bhow (?:far|tall|high|deep|wide|long)\b|\bdistance\b|"
     r"\blength\b|\bheight\b", _NUM + r"(?:km|m|cm|mm|mi|miles?|met(?:er|re)s?|kilomet(?:er|re)s?|feet|ft|inch(?:es)?|"
     r"公里|千米|米|厘米|毫米|里|英里)(?![a-z])"),
    (r"多远|\bhow far\b|\bdistance\b", r"(?<![A-Za-z0-9_])\d+(?:\.\d)?\s*k(?![a-z])"),  # a runner's 5k
    (r"多久|多长时间|" + _JI + r"(?:个)?(?:天|小时|分钟|周|星期|月|年)|\bhow long\b|"
     r"\bhow many (?:days|hours|minutes|weeks|months|years)\b|\bduration\b",
     _NUM + r"(?:s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|"
     r"months?|years?|秒|分钟|分|小时|个?钟头|天|周|星期|个月|年)(?![a-z])"),
    (_JI + r"度|多少度|温度|水温|气温|\btemperature\b|\bhow (?:hot|cold|warm)\b", _NUM + r"(?:°|℃|度|degrees?)"),
    (r"多大|容量|大小|\bhow (?:big|large)\b|\bsize\b|\bcapacity\b", _NUM + r"(?:[kmgt]i?b|bytes?|mah|wh|l|ml|升|"
     r"毫升|平米|平方米|㎡|寸|inch(?:es)?)(?![a-z])"),
    (r"多少钱|价格|价钱|花了多少|\bcosts?\b|\bprices?\b|\bhow much (?:did|does|do|is|was) .*\b(?:pay|spend|cost)",
     r"[¥￥$€£]\s*\d|" + _NUM + r"(?:元|块|人民币|rmb|yuan|dollars?|euros?|usd|eur|gbp|[¥￥$€£])(?![a-z])"),
    (r"\bfrequenc|频率|频段", _NUM + r"(?:[kmgt]?hz|赫兹)(?![a-z])"),
    (r"多快|测速|带宽|(?:网速|速度|车速)(?:是|有)?多少|\bhow fast\b|\bwhat(?:'s| is| was)? the speed\b|\bbandwidth\b",
     _NUM + r"(?:[kmgt]i?b(?:ps|/s)|[kmgt]bit/s|km/h|kph|mph|m/s|公里每小时|公里/小时)(?![a-z])"),
    (r"(?<![一二两三四五六七八九十几每这上下本])(?:星期|[周週]|[礼禮]拜)[几幾](?![次天小个遍回])|"
     r"\b(?:what|which) days\b|\b(?:what|which) days? of the week\b",
     r"(?<![一二两三四五六七八九十几])(?:星期|周|礼拜)[1-7一二三四五六日天](?![次遍个回直天起共般切程报子])|工作日(?!志)|周末|\b(?:mon|tues|wednes|thurs|fri|satur|sun)days?\b|"
     r"\bweekdays?\b|\bweekends?\b"),
    (r"为什么|為什麼|原因|怎么会(?!议)|怎麼會(?!議)|\bwhy\b|\bwhat caus|\bhow come\b", r"因为|由于|导致|"
     r"(?:原因|理由)\s*[:：是]|\bbecause\b|\bdue to (?!be\b|the\b|my\b|\w+ (?:on|by|in)\b)|\bcaused? by\b|"
     r"\b(?:root )?cause\s*:|\breason\s*:"),
    (r"多久一次|" + _JI + r"次|\bhow often\b|\bhow many times\b", r"每|一次|\bevery\b|\bper\b|\bdaily\b|\bweekly\b|"
     r"\btimes? a\b|" + _NUM + r"(?:次|遍|times)"),
    (_JI + r"点|什么时候|什么时间|哪年|哪天|\bwhat time\b|^\W*when\b", r"\d{1,2}[:：]\d{2}|" + _NUM + r"(?:点|點|am|pm|"
     r"a\.m\.|p\.m\.|月|日|号|年)|\b(?:19|20)\d\d\b|早上|上午|中午|下午|晚上|凌晨|周末|春|夏|秋|冬|季|"
     r"\b(?:morning|noon|afternoon|evening|night|weekends?|spring|summer|autumn|winter|mondays?|tuesdays?|"
     r"wednesdays?|thursdays?|fridays?|saturdays?|sundays?|january|february|march|april|may|june|july|august|"
     r"september|october|november|december)\b"),
)]
# A line's label: the few words before its first ": " (or ：), after a list marker ("- ASIO: a HAL…", "体重：5.8kg").
_LABEL = re.compile(r"^\s*(?:>\s*)*(?:[-*+]\s+(?:\[[ xX]\]\s+|[☐☑]\s+)?|\d{1,3}[.)、]\s*)?"
                    r"((?:[^:：\n]|:(?!\s)){1,60}?)(?::\s|：)")
_TAGS_ONLY = re.compile(r"^\s*(?:#[^\s#]+\s*)+$")
# A markdown link is read whole: "[How do I restore photos after a disk failure? A guide](https://…)" is no sentence
# end, and its torn-off "](https://…restore-photos-…)" read as a line full of the question's words.
_LINK = r"!?\[[^\]\n]{0,300}\]\([^)\s]{0,500}\)"  # bounded: a line of unclosed brackets stays linear
_SENTENCE = re.compile(rf"(?:{_LINK}|.)+?(?:(?:[。！？?；;]|!(?!\[))+|\.(?=\s)|$)\s*", re.DOTALL)


def sentences(text: str) -> list[str]:
    """A paragraph's sentences, cut after 。！？!?；; and after a period that ends a word (not in 4.5 or v1.2), never
    inside a markdown link."""
    return [s for s in _SENTENCE.findall(text) if s.strip()] or [text]


def line_sentences(text: str) -> list[str]:
    """A paragraph's lines (Obsidian shows each line of a paragraph on its own), each cut into its sentences; joined,
    they give the paragraph back."""
    return [s for line in text.splitlines(keepends=True) for s in sentences(line)]


@dataclass
class LineScorer:
    """Scores candidate lines for one question; `similarity` gives the fast model's cosines (None without it)."""

    terms: list[str]
    weights: dict[str, float]
    asks_amount: bool
    similarity: Callable[[list[str]], list[float] | None] | None = None
    han: bool | None = None  # the question is Chinese (None: not known)
    kinds: tuple[re.Pattern[str], ...] = ()  # a number of the kind the question asks for (5.8kg for 多重)
    reader: Callable[[list[str]], list[float] | None] | None = None  # the main model's cosines of whole passages
    translation: Callable[[], str | None] | None = None  # the question in the other language (its gloss)
    idf: Callable[[str], float | None] | None = None  # how rare a word is in the home (None: no note holds it)
    _glossed: dict[str, float] | None = field(default=None, init=False, repr=False)  # the translation's, read once

    @classmethod
    def for_question(cls, question: str, idf: Callable[[str], float | None],
                     similarity: Callable[[list[str]], list[float] | None] | None = None,
                     reader: Callable[[list[str]], list[float] | None] | None = None,
                     translation: Callable[[], str | None] | None = None) -> LineScorer:
        asking = {t for word in _HOW_WORD.findall(question) + _ASKING_PHRASE.findall(question)
                  for t in tokenize(word)} | _FUNCTION_WORDS
        written: dict[str, set[str]] = {}  # each term's forms as typed: broke for break, wi-fi for wifi
        for token in tokenize(question):
            written.setdefault(_base(token), set()).add(token)
        terms = [t for t in written if not is_question_word(t) and t not in asking]
        # a word weighs as rare as the notes make its rarest typed form (they say "broke", never "break"); a number
        # said in words as rare as its digits, which is what a line holds
        weights = {t: (idf(t) or 0.0) if t.isdigit() else max(idf(w) or 0.0 for w in written[t] | {t})
                   for t in terms}
        for t in {_base(t) for t in _focus(question)}:
            if t in weights:
                weights[t] *= FOCUS_WEIGHT
        kinds = tuple(line for asked, line in _KINDS if asked.search(question))
        return cls(terms, weights, bool(_ASKS_AMOUNT.search(question)), similarity, is_chinese(question), kinds,
                   reader, translation, idf)

    def scores(self, units: list[tuple[str, str]], title: str) -> list[float]:
        """One score per (section, text) unit: the higher, the more likely the line answers."""
        in_title = _Text(title)
        sections = {section: _Text(section) for section, _ in units}
        texts = [_Text(text, labelled=True) for _, text in units]
        words = [self._words(text, sections[section], in_title, self.weights)
                 for (section, _), text in zip(units, texts, strict=True)]
        best = max(words, default=0.0) or 1.0
        scores = [w / best for w in words]
        if self.similarity is not None and units:
            other = self.han is not None and is_chinese("".join(text for _, text in units)) != self.han
            glossed = self._gloss() if other and len(units) > MAX_UNITS else None
            cut = [score + self._words(text, sections[section], in_title, glossed) / best
                   for (section, _), text, score in zip(units, texts, scores, strict=True)] if glossed else scores
            ranked = sorted(range(len(units)), key=lambda k: -cut[k])[:MAX_UNITS]
            cosines = self.similarity([units[k][1] if units[k][0] in ("", title) else f"{units[k][0]} {units[k][1]}"
                                       for k in ranked])  # the title is every line's: it would favour the first
            weight = MEANING_WEIGHT
            if other:
                weight *= OTHER_LANGUAGE  # its words can hardly be the note's: what a line means is what is left
            for k, cosine in zip(ranked, cosines or [], strict=False):
                scores[k] += weight * cosine
        for k, (_, text) in enumerate(units):
            if self.asks_amount and _NUMBER.search(_LIST_MARK.sub("", texts[k].simplified)):
                scores[k] += NUMBER_BONUS
            if _TAGS_ONLY.match(text):
                scores[k] = float("-inf")
        return scores

    def rereads(self, best_line: str | None) -> bool:
        """Whether the best candidates' passages are read again whole (`reader`): not for a Chinese question (e5-small
        chose worse among a Chinese note's passages than the line scores), nor when the best line holds a number of
        the kind asked (5.8kg for 多重: the rule knows what answers, the passage's meaning does not)."""
        if self.reader is None or self.han:
            return False
        return not (best_line and any(kind.search(to_simplified(best_line)) for kind in self.kinds))

    def _gloss(self) -> dict[str, float]:
        """The words of the question's translation (a note in the other language holds those, not the question's:
        侧边栏…默认怎么排序 → sidebar … sort), weighed by rarity as the question's own are; read once."""
        if self._glossed is None:
            gloss = self.translation() if self.translation is not None else None
            tokens = dict.fromkeys(_base(t) for t in tokenize(gloss or "") if not is_question_word(t))
            self._glossed = {t: (self.idf(t) if self.idf else None) or 0.0 for t in tokens if t not in self.weights}
        return self._glossed

    def _words(self, line: _Text, section: _Text, title: _Text, weights: dict[str, float]) -> float:
        total = 0.0
        for term, base in weights.items():
            weight = base * (TITLE_DISCOUNT if term in title else 1.0)
            if line.label is not None and term in line.label and self._names(line.label):
                total += HEAD_WEIGHT * weight
            else:
                total += weight if term in line else SECTION_SHARE * weight if term in section else 0.0
        if any(kind.search(line.simplified) for kind in self.kinds):  # 兩小時 is a duration as 两小时 is
            total += KIND_WEIGHT * max(weights.values(), default=0.0)
        return total

    def _names(self, label: _Text) -> bool:
        """Whether a line's label is mostly the question's words ("Redis memory" for "how much Redis memory"; not
        "More information is available in Netlify's guide")."""
        words = [t for t in label.tokens if not any(c.isdigit() for c in t)]  # "14:52 — Hotfix" names a hotfix
        return sum(t in self.weights for t in words) * 2 > len(words)


def _focus(question: str) -> set[str]:
    """The tokens of what the question asks about: the first word after a Chinese question word, the first one or two
    after an English one (up to a stop word)."""
    found: set[str] = set()
    for run in _FOCUS_ZH.findall(question):
        found.update(tokenize(run)[:1])
    for phrase in _FOCUS_EN.findall(question):
        words = phrase.split()
        kept = words[:1] + [w for w in words[1:2] if w.lower() not in EN_STOPWORDS]
        found.update(t for w in kept for t in tokenize(w))
    return found


# English verbs whose past the stemmer leaves alone: "how far did I run" is answered by "Ran 3 times this week" (a
# journal says what was done). Forms that are also other words (left, saw, felt, lay) are not in it.
_IRREGULAR = dict(pair.split(":") for pair in (
    "ran:run went:go gone:go ate:eat eaten:eat bought:buy took:take taken:take wrote:write written:write found:find "
    "gave:give given:give got:get gotten:get made:make said:say thought:think told:tell came:come knew:know "
    "known:know kept:keep met:meet paid:pay sent:send spent:spend slept:sleep built:build brought:bring began:begin "
    "begun:begin broke:break broken:break chose:choos chosen:choos drove:drive driven:drive drank:drink drunk:drink "
    "flew:fli flown:fli forgot:forget forgotten:forget grew:grow grown:grow held:hold lost:lose rode:ride "
    "ridden:ride sold:sell stood:stand swam:swim taught:teach understood:understand woke:wake won:win wore:wear "
    "worn:wear seen:see did:do done:do sang:sing sung:sing spoke:speak spoken:speak sat:sit caught:catch "
    "fought:fight heard:hear led:lead lent:lend meant:mean shot:shoot shut:shut threw:throw thrown:throw "
    "tried:tri fed:feed").split())


# Numbers said in words read as digits, both ways: "the sixth wifi generation" is answered by "802.11ax (Wi-Fi 6)".
# Not one / first / 1st (a pronoun, "the first step" of any list) nor second / 2nd (also a unit of time). Stems, as
# tokenize leaves them (twelv).
_NUMBER_WORDS = {word: str(n) for n, words in enumerate((
    (), (), ("two",), ("three", "third"), ("four", "fourth"), ("five", "fifth"), ("six", "sixth"),
    ("seven", "seventh"), ("eight", "eighth"), ("nine", "ninth"), ("ten", "tenth"), ("eleven", "eleventh"),
    ("twelv", "twelfth"))) for word in words}
_ORDINAL = re.compile(r"^([3-9]|1[0-2])(?:rd|th)$")


def _base(token: str) -> str:
    """The form a question's token and a line's are compared in: a verb's present (ran → run), a number's digits
    (sixth, 6th → 6), a hyphenated word joined (wi-fi → wifi, e-mail → email: people write both)."""
    if token in _IRREGULAR:
        return _IRREGULAR[token]
    if token in _NUMBER_WORDS:
        return _NUMBER_WORDS[token]
    ordinal = _ORDINAL.match(token)
    if ordinal:
        return ordinal.group(1)
    return token.replace("-", "") if "-" in token.strip("-") else token


_HAN_TERM = re.compile(r"^[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+$")


class _Text:
    """A line as the scorer reads it: its tokens, and its folded text, in which a Chinese word is looked up as written
    (jieba cuts the same characters differently by context: 看完 in the question, 看完想 in the line)."""

    def __init__(self, text: str, labelled: bool = False) -> None:
        self.text = text
        self.tokens = {_base(t) for t in tokenize(_LIST_MARK.sub("", text))}  # "3. Buy milk" holds no 3
        self.simplified = to_simplified(text)  # what kinds and numbers read: NFKC would make 89㎡ 89m2, ① a digit
        self.folded = to_simplified(unicodedata.normalize("NFKC", text).lower())
        label = _LABEL.match(text) if labelled else None
        self.label = _Text(re.split(r"[,，(（]", label.group(1))[0]) if label else None  # "GStreamer, another…"

    def __contains__(self, term: str) -> bool:
        return term in self.tokens or (_HAN_TERM.match(term) is not None and term in self.folded)
