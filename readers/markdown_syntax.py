"""Markdown conventions shared by the readers: frontmatter, #tags, [[wikilinks]], headings, code fences."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
# A tag starts after whitespace or at line start, like Obsidian and Memos (`#([^\s#,]+)`), and stops at punctuation.
_TAG = re.compile(r"(?<![^\s(（])#([^\s#,.;:!?，。；：！？、()（）\[\]{}\"'“”‘’<>|`*]+)")
_WIKILINK = re.compile(r"(!?)\[\[([^\[\]|#\n]*)(#[^\[\]|\n]*)?(?:\|([^\[\]\n]*))?\]\]")
_H1 = re.compile(r"^#\s+(.+?)\s*#*\s*$")
_NON_NOTE_EMBED = re.compile(r"\.(png|jpe?g|gif|svg|webp|pdf|mp3|mp4|webm|mov|wav|excalidraw)$", re.IGNORECASE)


def strip_code(text: str) -> str:
    """Text with fenced blocks and inline code blanked out, so `# comment` in code is not a tag."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        match = _FENCE.match(line.lstrip())
        if fence is not None:
            if match and match.group(1) == fence:
                fence = None
            out.append("")
            continue
        if match:
            fence = match.group(1)
            out.append("")
            continue
        out.append(_INLINE_CODE.sub(" ", line))
    return "\n".join(out)


def parse_tags(text: str) -> list[str]:
    """Inline #tags outside code, in order of first appearance; nested tags keep `/`; pure numbers are not tags."""
    seen: dict[str, None] = {}
    for line in strip_code(text).split("\n"):
        if _H1.match(line) or re.match(r"^#{1,6}\s", line):
            continue
        for match in _TAG.finditer(line):
            tag = match.group(1).strip("/-_")
            if tag and not tag.isdigit():
                seen.setdefault(tag, None)
    return list(seen)


@dataclass(frozen=True)
class WikiLink:
    target: str
    heading: str = ""
    alias: str = ""


def parse_wikilinks(text: str) -> list[WikiLink]:
    """`[[note]]`, `[[note|alias]]`, `[[note#heading]]` and note embeds, outside code; attachments are not links."""
    links: list[WikiLink] = []
    for match in _WIKILINK.finditer(strip_code(text)):
        target = match.group(2).strip()
        if not target or _NON_NOTE_EMBED.search(target):
            continue
        heading = (match.group(3) or "").lstrip("#").strip()
        links.append(WikiLink(target=target, heading=heading, alias=(match.group(4) or "").strip()))
    return links


def first_h1(text: str) -> str:
    """The first level-one heading outside code, or ''."""
    for line in strip_code(text).split("\n"):
        match = _H1.match(line)
        if match:
            return match.group(1).strip()
    return ""


@dataclass
class Frontmatter:
    data: dict[str, Any] = field(default_factory=dict)
    body: str = ""
    warning: str = ""


def split_frontmatter(text: str) -> Frontmatter:
    """Split YAML frontmatter from the body, tolerantly: broken frontmatter gives a warning and the body is kept."""
    if not text.startswith("---"):
        return Frontmatter(body=text)
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return Frontmatter(body=text)
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        return Frontmatter(body=text, warning="frontmatter is not closed (no second '---'); indexed as plain text")
    raw = "\n".join(lines[1:end])
    body = "\n".join(lines[end + 1 :])
    import yaml

    try:
        data = yaml.safe_load(raw) if raw.strip() else {}
    except yaml.YAMLError as exc:
        reason = str(exc).split("\n")[0]
        return Frontmatter(body=body, warning=f"frontmatter is not valid YAML ({reason}); body indexed without it")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return Frontmatter(body=body, warning=f"frontmatter is a {type(data).__name__}, not a mapping; ignored")
    return Frontmatter(data={str(k): v for k, v in data.items()}, body=body)


def as_string_list(value: Any) -> list[str]:
    """Frontmatter lists come as YAML lists, comma/space strings or scalars."""
    if value is None:
        return []
    if isinstance(value, (list, tuple, set)):
        items = [str(v) for v in value if v is not None]
    else:
        items = re.split(r"[,\s]+", str(value))
    return [item.strip().lstrip("#") for item in items if item and item.strip().lstrip("#")]


def as_datetime(value: Any) -> dt.datetime | None:
    """Parse a frontmatter or API date (date, datetime, ISO string, unix seconds) as an aware UTC datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    if isinstance(value, (int, float)):
        try:
            return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
        except (OverflowError, OSError, ValueError):
            return None
    text = str(value).strip().replace("Z", "+00:00")
    for candidate in (text, text.replace(" ", "T", 1)):
        try:
            parsed = dt.datetime.fromisoformat(candidate)
        except ValueError:
            continue
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    match = re.match(r"^(\d{4})[-/.年](\d{1,2})[-/.月](\d{1,2})", text)
    if match:
        try:
            return dt.datetime(*map(int, match.groups()), tzinfo=dt.UTC)
        except ValueError:
            return None
    return None


def date_fields(prefix: str, moment: dt.datetime | None) -> dict[str, str | int]:
    """`{prefix: ISO string, prefix_ts: unix seconds}` for Chroma metadata and date filters."""
    if moment is None:
        return {}
    return {prefix: moment.isoformat().replace("+00:00", "Z"), f"{prefix}_ts": int(moment.timestamp())}
