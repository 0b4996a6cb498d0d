"""Markdown conventions shared by the readers: frontmatter, #tags, [[wikilinks]], headings, code fences."""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass, field
from typing import Any

_FENCE = re.compile(r"(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
# A tag starts after whitespace, an opening bracket or at line start, like Obsidian and Memos (`#([^\s#,]+)`), but
# not in a link anchor `[x](#part)`; it stops at punctuation (ASCII or CJK).
_TAG = re.compile(
    r"(?<![^\s(（])(?<!\]\()#"
    r"([^\s#,.;:!?，。；：！？、()（）\[\]{}\"'“”‘’<>|`*~@$%^&=+\\《》「」『』【】…]+)"
)
_WIKILINK = re.compile(r"(!?)\[\[([^\[\]|#\n]*)(#[^\[\]|\n]*)?(?:\|([^\[\]\n]*))?\]\]")
# CommonMark ATX heading: up to 3 spaces of indent; a closing run of '#' only counts after a space (`# C#` is "C#").
_H1 = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_NON_NOTE_EMBED = re.compile(
    r"\.(png|jpe?g|gif|bmp|svg|webp|avif|pdf|mp3|m4a|ogg|flac|wav|3gp|mp4|webm|ogv|mov|mkv|excalidraw|canvas)$",
    re.IGNORECASE,
)


def _blank_fences(text: str) -> list[str]:
    """The lines of `text`, with fenced code blocks (``` or ~~~, closed by a run at least as long) blanked."""
    out: list[str] = []
    fence = ""
    for line in text.split("\n"):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = ""
            out.append("")
            continue
        match = _FENCE.match(stripped)
        if match:
            fence = match.group(1)
            out.append("")
            continue
        out.append(line)
    return out


def strip_code(text: str) -> str:
    """Text with fenced blocks and inline code blanked out, so `# comment` in code is not a tag."""
    return "\n".join(_INLINE_CODE.sub(" ", line) for line in _blank_fences(text))


def parse_tags(text: str) -> list[str]:
    """Inline #tags outside code, in order of first appearance; nested tags keep `/`; pure numbers are not tags.

    Tags are case-insensitive (as in Obsidian): `#Work` and `#work` are one tag, spelled as first seen.
    """
    seen: dict[str, str] = {}
    for match in _TAG.finditer(strip_code(text)):
        tag = match.group(1).strip("/-_")
        if tag and not tag.isdigit():
            seen.setdefault(tag.casefold(), tag)
    return list(seen.values())


@dataclass(frozen=True)
class WikiLink:
    target: str
    heading: str = ""
    alias: str = ""


def parse_wikilinks(text: str) -> list[WikiLink]:
    """`[[note]]`, `[[note|alias]]`, `[[note#heading]]` and note embeds, outside code; attachments are not links."""
    links: list[WikiLink] = []
    for match in _WIKILINK.finditer(strip_code(text)):
        # Inside a table the alias pipe is escaped (`[[note\|alias]]`): the backslash is not part of the name.
        target = match.group(2).strip().rstrip("\\").strip()
        if not target or _NON_NOTE_EMBED.search(target):
            continue
        heading = (match.group(3) or "").lstrip("#").strip().rstrip("\\").strip()
        links.append(WikiLink(target=target, heading=heading, alias=(match.group(4) or "").strip()))
    return links


def first_h1(text: str) -> str:
    """The first level-one heading outside code blocks, or ''; inline code in the heading is kept."""
    for line in _blank_fences(text):
        match = _H1.match(line)
        if match:
            return match.group(1).strip()
    return ""


# What a frontmatter block may cost once its YAML aliases are expanded (by anything that walks or prints its values):
# nodes plus scalar characters beyond the block's own. Real notes repeat a few small values; a "billion laughs" block
# of a few hundred bytes describes gigabytes.
ALIAS_BUDGET = 50_000
MAX_NESTING = 64


class FrontmatterRefused(ValueError):
    """Frontmatter that parses but is unsafe to use: aliases that expand too far, a value that contains itself, or
    nesting too deep to print."""


@dataclass
class Frontmatter:
    data: dict[str, Any] = field(default_factory=dict)
    body: str = ""
    warning: str = ""


def split_frontmatter(text: str) -> Frontmatter:
    """Split YAML frontmatter from the body, tolerantly.

    Frontmatter that cannot be used (unclosed, invalid YAML, not a mapping) gives a warning and no data, and the whole
    text is kept as the body: a note that merely starts with a `---` rule loses nothing. Frontmatter that is valid but
    refused (see `check_expansion`) is dropped and the body after it kept: it is YAML, not text worth indexing.
    """
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
        data = yaml.load(raw, Loader=_yaml_loader()) if raw.strip() else {}
    except FrontmatterRefused as exc:
        return Frontmatter(body=body, warning=f"frontmatter refused: {exc}; dropped, the body is indexed")
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # RecursionError: the pure-Python parser, deep nesting
        reason = str(exc).split("\n")[0]
        return Frontmatter(body=text, warning=f"frontmatter is not valid YAML ({reason}); indexed as plain text")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        return Frontmatter(body=text, warning=f"frontmatter is a {kind}, not a mapping; indexed as plain text")
    return Frontmatter(data={str(k): v for k, v in data.items()}, body=body)


@functools.cache
def _yaml_loader() -> type:
    """A safe YAML loader (libyaml's when available: ~10x faster) that refuses alias bombs before building values,
    and keeps an impossible date (`2024-02-30`) as text instead of failing the whole block."""
    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_document(self, node: Any) -> Any:
            check_expansion(node)
            return super().construct_document(node)

        def construct_yaml_timestamp(self, node: Any) -> Any:
            try:
                return super().construct_yaml_timestamp(node)
            except ValueError:
                return self.construct_scalar(node)

    Loader.add_constructor("tag:yaml.org,2002:timestamp", Loader.construct_yaml_timestamp)
    return Loader


def check_expansion(root: Any) -> None:
    """Raise `FrontmatterRefused` if a composed YAML node graph would expand beyond `ALIAS_BUDGET`, contains itself
    or nests deeper than `MAX_NESTING`.

    Aliases share nodes, so loading a bomb is cheap and the cost comes later, when values are walked or printed. This
    visits each distinct node once, without recursion, and sums sizes as if every alias were expanded.
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    open_nodes: set[int] = set()
    distinct = 0
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        children = _child_nodes(node)
        if closing:
            open_nodes.discard(key)
            own = 1 + len(node.value) if isinstance(node.value, str) else 1
            distinct += own
            size[key] = own + sum(size[id(child)] for child in children)
            height[key] = 1 + max((height[id(child)] for child in children), default=0)
            if height[key] > MAX_NESTING:
                raise FrontmatterRefused(f"values nested deeper than {MAX_NESTING} levels")
        elif key not in size:
            if key in open_nodes:  # every node popped while one is open descends from it
                raise FrontmatterRefused("an alias refers to a value that contains it")
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    if size[id(root)] - distinct > ALIAS_BUDGET:
        raise FrontmatterRefused(f"its aliases expand it by more than {ALIAS_BUDGET:,} nodes and characters")


def _child_nodes(node: Any) -> list[Any]:
    """A YAML node's children: a sequence's items, a mapping's keys and values, none for a scalar."""
    if isinstance(node.value, str):
        return []
    return [part for item in node.value for part in (item if isinstance(item, tuple) else (item,))]


def _flat_items(value: Any, depth: int = 0) -> list[str]:
    """A YAML list as strings, nesting flattened (an unquoted `- [[note]]` loads as a list in a list).

    The depth is capped: anything nested deeper is not a list of names.
    """
    items: list[str] = []
    for item in value:
        if isinstance(item, (list, tuple)) and depth < 3:
            items.extend(_flat_items(item, depth + 1))
        elif item is not None:
            items.append(str(item))
    return items


def as_string_list(value: Any) -> list[str]:
    """Frontmatter tags: a YAML list, a comma- or space-separated string or a scalar; a leading '#' is dropped."""
    if value is None:
        return []
    items = _flat_items(value) if isinstance(value, (list, tuple, set)) else re.split(r"[,\s]+", str(value))
    return [item.strip().lstrip("#") for item in items if item.strip().lstrip("#")]


def as_text_list(value: Any) -> list[str]:
    """Frontmatter aliases and links: a YAML list, a comma-separated string or a scalar; spaces are kept."""
    if value is None:
        return []
    items = _flat_items(value) if isinstance(value, (list, tuple, set)) else str(value).split(",")
    return [item.strip() for item in items if item.strip()]


def as_datetime(value: Any) -> dt.datetime | None:
    """Parse a frontmatter or API date (date, datetime, ISO string, unix seconds) as an aware UTC datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, dt.datetime):
        return _as_utc(value)
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
        return _as_utc(parsed)
    match = re.match(r"^(\d{4})[-/.年](\d{1,2})[-/.月](\d{1,2})", text)
    if match:
        try:
            return dt.datetime(*map(int, match.groups()), tzinfo=dt.UTC)
        except ValueError:
            return None
    return None


def _as_utc(moment: dt.datetime) -> dt.datetime | None:
    """Naive times are taken as UTC; aware ones are converted, so every stored ISO string ends in Z."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        return None


def date_fields(prefix: str, moment: dt.datetime | None) -> dict[str, str | int]:
    """`{prefix: ISO string, prefix_ts: unix seconds}` for Chroma metadata and date filters."""
    if moment is None:
        return {}
    return {prefix: moment.isoformat().replace("+00:00", "Z"), f"{prefix}_ts": int(moment.timestamp())}
