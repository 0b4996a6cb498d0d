"""Where text is code: fenced blocks and inline spans of markdown, as an LLM or a note writes them.

Code is shown and kept word for word (`&v[0]` is an index, not a citation; `Vec<i32>` needs no escaping): what
rewrites answer text (citation marks, the page's escaping, citation links) works on the prose between these parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from readers.markdown_syntax import fence_opening, fenced_block_end

_INLINE = re.compile(r"(?<![`\\])(`+)(?!`)([^\n]+?)(?<!`)\1(?!`)")  # "\`" is an escaped backtick
_RUN = re.compile(r"`+")


@dataclass(frozen=True)
class Part:
    text: str  # prose as written; code without its fences or backticks
    kind: str = "prose"  # "prose", "inline" or "block"
    info: str = ""  # a block's language, as its opening fence names it
    raw: str = ""  # code as written, fences or backticks included


def split_code(text: str) -> list[Part]:
    """The text as prose and code parts, in order; joined back by `render` (or rewritten prose in between)."""
    parts: list[Part] = []
    prose: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        fence = fence_opening(lines[i])
        if not fence:
            prose.append(lines[i])
            i += 1
            continue
        end, closed = fenced_block_end(lines, i)
        parts += _inline_parts("".join(prose))
        prose = []
        info = lines[i].strip()[len(fence):].strip()
        parts.append(Part("".join(lines[i + 1:end - closed]).rstrip("\r\n"), "block", info, "".join(lines[i:end])))
        i = end
    parts += _inline_parts("".join(prose))
    return parts


def _inline_parts(text: str) -> list[Part]:
    parts: list[Part] = []
    pos = 0
    for match in _INLINE.finditer(text):
        if match.start() > pos:
            parts.append(Part(text[pos:match.start()]))
        content = match.group(2)
        if content.startswith(" ") and content.endswith(" ") and content.strip():
            content = content[1:-1]
        parts.append(Part(content, "inline", raw=match.group(0)))
        pos = match.end()
    if pos < len(text):
        parts.append(Part(text[pos:]))
    return parts


def code_markdown(part: Part) -> str:
    """A code part as markdown that can only be read as that code: its fence or backticks longer than any run of
    backticks inside it, a block on lines of its own."""
    longest = max((len(run) for run in _RUN.findall(part.text)), default=0)
    if part.kind == "inline":
        pad = " " if part.text.startswith(("`", " ")) or part.text.endswith(("`", " ")) else ""
        ticks = "`" * (longest + 1)
        return f"{ticks}{pad}{part.text}{pad}{ticks}"
    fence = "`" * max(3, longest + 1)
    info = re.sub(r"[^\w+#.-]", "", (part.info.split() or [""])[0])[:30]  # the language: its first word
    return f"{fence}{info}\n{part.text}\n{fence}\n" if part.text else f"{fence}{info}\n{fence}\n"


def as_written(parts: list[Part]) -> str:
    """The parts joined back into the text they came from (prose perhaps rewritten, code exactly as written)."""
    return "".join(part.text if part.kind == "prose" else part.raw for part in parts)


def render(parts: list[Part]) -> str:
    """The parts as markdown: prose as it is, code as `code_markdown` writes it (unambiguous to any renderer)."""
    out: list[str] = []
    for part in parts:
        if part.kind == "prose":
            out.append(part.text)
            continue
        if part.kind == "block" and out and not out[-1].endswith("\n"):
            out.append("\n")
        out.append(code_markdown(part))
    return "".join(out)
