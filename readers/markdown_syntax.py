"""Markdown conventions shared by the readers and every layer above them: frontmatter, #tags, [[wikilinks]] and what
they show, headings, code fences, and which characters are Han. Each is written once, here."""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass, field
from typing import Any

# Han characters: CJK Unified Ideographs, Extension A and the Compatibility Ideographs (not the Yijing hexagram
# symbols between Extension A and the main block, nor kana or hangul).
HAN_CHARS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
HAN = re.compile(f"[{HAN_CHARS}]")
HAN_RUN = re.compile(f"[{HAN_CHARS}]+")
_LATIN_LETTER = re.compile(r"[A-Za-z]")


def is_chinese(text: str) -> bool:
    """Whether a text reads as Chinese: Han characters are at least 30 % of its letters (EMNLP2022的举办地 is; a note
    in English quoting one Chinese title is not)."""
    han = len(HAN.findall(text))
    return han > 0 and han >= 0.3 * (han + len(_LATIN_LETTER.findall(text)))


# A fenced code block opens on a line whose first non-blank characters are three or more backticks or tildes (a
# backtick fence's info string holds no backtick: ```a`b is inline code) and closes on a line that is a run of the
# same character at least as long with nothing after it that could name a language (```python opens, never closes;
# ``` --> closes), else at the end of the text. Any indentation: a fence in a list item is indented under it, and
# a line indented less than its opening fence ends it unclosed (the list item has ended, and the block with it).
_FENCE = re.compile(r"\s*(`{3,}|~{3,})(.*)")
_INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
# A tag starts after whitespace, an opening bracket or at line start, like Obsidian and Memos (`#([^\s#,]+)`), but
# not in a link anchor `[x](#part)`; it stops at punctuation (ASCII or CJK).
_TAG = re.compile(
    r"(?<![^\s(（])(?<!\]\()#"
    r"([^\s#,.;:!?，。；：！？、()（）\[\]{}\"'“”‘’<>|`*~@$%^&=+\\《》「」『』【】…]+)"
)
# [[target#heading|alias]], ![[embed]]: groups embed mark, target, #heading (nested: #h1#h2), alias; one line.
WIKILINK = re.compile(r"(!?)\[\[([^\[\]|#\n]*)(#[^\[\]|\n]*)?(?:\|([^\[\]\n]*))?\]\]")
# CommonMark ATX heading: up to 3 spaces of indent; a closing run of '#' only counts after a space (`# C#` is "C#").
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")
_NON_NOTE_EMBED = re.compile(
    r"\.(png|jpe?g|gif|bmp|svg|webp|avif|pdf|mp3|m4a|ogg|flac|wav|3gp|mp4|webm|ogv|mov|mkv|excalidraw|canvas)$",
    re.IGNORECASE,
)


def fence_opening(line: str) -> str:
    """The fence (``` or ~~~, perhaps longer) if this line opens a fenced code block, else ''."""
    match = _FENCE.fullmatch(line.rstrip("\r\n"))
    if not match or (match.group(1)[0] == "`" and "`" in match.group(2)):
        return ""
    return match.group(1)


def closes_fence(line: str, fence: str) -> bool:
    """Whether this line closes the block `fence` opened: a run of its character at least as long, then nothing that
    could name a language."""
    stripped = line.strip()
    return stripped.startswith(fence) and not re.search(r"\w", stripped.lstrip(fence[0]))


def fenced_block_end(lines: list[str], start: int) -> tuple[int, bool]:
    """The fenced block opened at `lines[start]`: the index after its last line, and whether a closing fence ends it
    (not: the text ended, or a line indented less than the opening fence did)."""
    fence, indent = fence_opening(lines[start]), _indent(lines[start])
    for j in range(start + 1, len(lines)):
        if closes_fence(lines[j], fence):
            return j + 1, True
        if indent and lines[j].strip() and _indent(lines[j]) < indent:
            return j, False
    return len(lines), False


def _indent(line: str) -> int:
    expanded = line.expandtabs(4)
    return len(expanded) - len(expanded.lstrip())


def _blank_fences(text: str) -> list[str]:
    """The lines of `text`, with fenced code blocks (fences included) blanked."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if fence_opening(lines[i]):
            end, _ = fenced_block_end(lines, i)
            lines[i:end] = [""] * (end - i)
            i = end
        else:
            i += 1
    return lines


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
    for match in WIKILINK.finditer(strip_code(text)):
        # Inside a table the alias pipe is escaped (`[[note\|alias]]`): the backslash is not part of the name.
        target = match.group(2).strip().rstrip("\\").strip()
        if not target or _NON_NOTE_EMBED.search(target):
            continue
        heading = (match.group(3) or "").lstrip("#").strip().rstrip("\\").strip()
        links.append(WikiLink(target=target, heading=heading, alias=(match.group(4) or "").strip()))
    return links


def piped_target(alias: str) -> str:
    """The note a link's text after the pipe names when the link is Dendron's `[[label|note]]` (or, across vaults,
    `[[label|dendron://vault/note#heading]]`): the note, without the vault prefix or a heading."""
    return re.sub(r"^dendron://[^/]*/", "", alias.strip()).split("#")[0].strip()


def wikilink_shown(match: re.Match[str]) -> str:
    """What Obsidian shows for a WIKILINK match: its alias, else its target and heading (`note › heading`, nested
    headings joined the same way, a block reference's ^ dropped); a pipe escaped in a table (`[[note\\|alias]]`)
    leaves no backslash."""
    alias = (match.group(4) or "").strip()
    if alias:
        return alias
    target = match.group(2).strip().rstrip("\\").strip()
    headings = [h.strip().removeprefix("^").rstrip("\\").strip() for h in (match.group(3) or "").split("#")]
    return " › ".join(part for part in (target, *headings) if part)


def readable_wikilinks(text: str) -> str:
    """Text with each wikilink as what Obsidian shows for it ([[a|b]] → b, [[a#h]] → a › h, ![[x.png]] → x.png)."""
    return WIKILINK.sub(wikilink_shown, text)


def headings(text: str) -> list[tuple[int, str]]:
    """The headings outside code blocks, in order: (level, title as written, inline code kept; `# C#` is "C#")."""
    if "#" not in text:
        return []
    return [(len(m.group(1)), m.group(2).strip()) for m in map(_HEADING.match, _blank_fences(text)) if m]


def first_h1(text: str) -> str:
    """The first level-one heading outside code blocks, or ''."""
    return next((title for level, title in headings(text) if level == 1), "")


@dataclass(frozen=True)
class Block:
    """One block of a note: a heading, fenced code (fences included; `closed` false when the note ends inside it), a
    table (consecutive `|` lines), a list item (with its indented continuation lines), or a paragraph."""

    kind: str  # heading, code, table, item, text
    lines: tuple[str, ...]  # as written
    path: tuple[tuple[int, str], ...]  # the headings it sits under (level, title), outermost first; a heading: its own
    # last
    after_blank: bool  # a blank line (or the note's start) comes before it
    closed: bool = True

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def markdown_blocks(text: str) -> list[Block]:
    """A note's blocks in order: the one block parser (chunks, answers). Line-based and as fast as reading the lines
    (markdown-it-py, which the page renders with, parses ~20x slower: too slow for a sync of every note); headings,
    fences and indentation follow CommonMark, blank lines separate blocks, and a paragraph ends where a heading,
    fence, list item or table row starts."""
    blocks: list[Block] = []
    path: list[tuple[int, str]] = []
    lines = text.replace("\r\n", "\n").split("\n")
    blank = True
    i = 0

    def add(kind: str, end: int, closed: bool = True) -> None:
        blocks.append(Block(kind, tuple(lines[i:end]), tuple(path), blank, closed))

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            blank, i = True, i + 1
            continue
        if fence_opening(line):
            end, closed = fenced_block_end(lines, i)
            add("code", end, closed)
            i = end
        elif heading := _HEADING.match(line):
            level = len(heading.group(1))
            path = [(lvl, title) for lvl, title in path if lvl < level] + [(level, heading.group(2).strip())]
            add("heading", i + 1)
            i += 1
        elif line.lstrip().startswith("|"):
            j = next((j for j in range(i, len(lines)) if not lines[j].lstrip().startswith("|")), len(lines))
            add("table", j)
            i = j
        elif _ITEM.match(line):
            j = i + 1
            while (j < len(lines) and lines[j].strip() and lines[j][:1] in (" ", "\t") and not _ITEM.match(lines[j])
                   and not fence_opening(lines[j])):  # a fence in an item is code of its own
                j += 1
            add("item", j)
            i = j
        else:
            j = i + 1
            while j < len(lines) and lines[j].strip() and not _starts_block(lines[j]):
                j += 1
            add("text", j)
            i = j
        blank = False
    return blocks


def _starts_block(line: str) -> bool:
    return bool(fence_opening(line) or _HEADING.match(line) or _ITEM.match(line) or line.lstrip().startswith("|"))


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
