"""Time phrases in a query ("上周", "去年", "2024年3月", "last month", "in 2023") become a date filter.

The phrase is removed from the query text so that it does not pull in notes that merely mention a date word.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_MONTHS = {m: i for i, m in enumerate(
    "january february march april may june july august september october november december".split(), 1)}
_MONTH_ABBR = {m[:3]: i for m, i in _MONTHS.items()}
MONTH_NAMES = frozenset(_MONTHS) | frozenset(_MONTH_ABBR)  # a month is a time, not a subject (search.unmentioned)


@dataclass
class TimeRange:
    phrase: str
    since: dt.date
    until: dt.date  # inclusive

    def to_dict(self) -> dict[str, str]:
        return {"phrase": self.phrase, "since": self.since.isoformat(), "until": self.until.isoformat()}


def _month_range(year: int, month: int) -> tuple[dt.date, dt.date]:
    start = dt.date(year, month, 1)
    nxt = dt.date(year + (month == 12), month % 12 + 1, 1)
    return start, nxt - dt.timedelta(days=1)


def _week_range(day: dt.date, weeks_back: int) -> tuple[dt.date, dt.date]:
    monday = day - dt.timedelta(days=day.weekday()) - dt.timedelta(weeks=weeks_back)
    return monday, monday + dt.timedelta(days=6)


def _rules(today: dt.date) -> list[tuple[re.Pattern[str], object]]:
    last_month = (today.replace(day=1) - dt.timedelta(days=1))
    return [
        (re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月(?:份)?"), lambda m: _month_range(int(m[1]), int(m[2]))),
        (re.compile(r"(\d{4})\s*年"), lambda m: (dt.date(int(m[1]), 1, 1), dt.date(int(m[1]), 12, 31))),
        (re.compile(r"\b(\d{4})-(\d{2})\b(?!-\d)"), lambda m: _month_range(int(m[1]), int(m[2]))),
        (re.compile(r"\b(?:in\s+)?(" + "|".join(_MONTHS) + r"|" + "|".join(_MONTH_ABBR) + r")\.?\s+(\d{4})\b", re.I),
         lambda m: _month_range(int(m[2]), _MONTHS.get(m[1].lower()) or _MONTH_ABBR[m[1].lower()[:3]])),
        (re.compile(r"\b(?:in|during|from)\s+(\d{4})\b", re.I),
         lambda m: (dt.date(int(m[1]), 1, 1), dt.date(int(m[1]), 12, 31))),
        (re.compile(r"上上周|上上个?星期"), lambda m: _week_range(today, 2)),
        (re.compile(r"上周|上个?星期|上个?礼拜"), lambda m: _week_range(today, 1)),
        (re.compile(r"本周|这周|这个?星期"), lambda m: _week_range(today, 0)),
        (re.compile(r"上个?月"), lambda m: _month_range(last_month.year, last_month.month)),
        (re.compile(r"本月|这个月"), lambda m: _month_range(today.year, today.month)),
        (re.compile(r"前年"), lambda m: (dt.date(today.year - 2, 1, 1), dt.date(today.year - 2, 12, 31))),
        (re.compile(r"去年"), lambda m: (dt.date(today.year - 1, 1, 1), dt.date(today.year - 1, 12, 31))),
        (re.compile(r"今年"), lambda m: (dt.date(today.year, 1, 1), today)),
        (re.compile(r"昨天"), lambda m: (today - dt.timedelta(days=1),) * 2),
        (re.compile(r"今天"), lambda m: (today, today)),
        (re.compile(r"\blast\s+week\b", re.I), lambda m: _week_range(today, 1)),
        (re.compile(r"\bthis\s+week\b", re.I), lambda m: _week_range(today, 0)),
        (re.compile(r"\blast\s+month\b", re.I), lambda m: _month_range(last_month.year, last_month.month)),
        (re.compile(r"\bthis\s+month\b", re.I), lambda m: _month_range(today.year, today.month)),
        (re.compile(r"\blast\s+year\b", re.I),
         lambda m: (dt.date(today.year - 1, 1, 1), dt.date(today.year - 1, 12, 31))),
        (re.compile(r"\bthis\s+year\b", re.I), lambda m: (dt.date(today.year, 1, 1), today)),
        (re.compile(r"\byesterday\b", re.I), lambda m: (today - dt.timedelta(days=1),) * 2),
    ]


def extract_time_range(query: str, today: dt.date | None = None) -> tuple[str, TimeRange | None]:
    """The query without its first time phrase, and the date range the phrase means (or the query and None)."""
    today = today or dt.date.today()
    for pattern, to_range in _rules(today):
        match = pattern.search(query)
        if not match:
            continue
        try:
            since, until = to_range(match)  # type: ignore[operator]
        except ValueError:
            continue
        cleaned = (query[: match.start()] + " " + query[match.end() :]).strip()
        cleaned = re.sub(r"^(的|里|中|期间)\s*", "", re.sub(r"\s{2,}", " ", cleaned)).strip(" ,，。的")
        cleaned = re.sub(r"\s+(from|in|during|of|on|since)$", "", cleaned, flags=re.I)
        return cleaned or query, TimeRange(match.group(0).strip(), since, until)
    return query, None
