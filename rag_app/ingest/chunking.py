"""Heading- and paragraph-aware chunking of markdown (pure Python: no LlamaIndex import)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from readers.markdown_syntax import markdown_blocks

# Bump when chunk boundaries change: every note is re-chunked and re-embedded. Not bumped when the block parser became
# the one of readers.markdown_syntax (issue 31): `bench/chunk_compare.py` (2026-12-03) found 6 of 19,229 notes (the
# dev sets, both real vaults, the sample vault) chunked differently, all with fences this chunker paired wrongly
# (```` around ```, an open fence in a list item), none in a dev set; they are chunked right when they next change.
CHUNKER_VERSION = "md-v1"
_SENTENCE_END = re.compile(r"[。！？!?；;]|\.(?=\s)|\n")


@dataclass
class Chunk:
    text: str
    heading: str


@dataclass
class _Block:
    text: str
    heading: str
    starts_section: bool
    is_code: bool


def _blocks(text: str) -> list[_Block]:
    """Paragraphs (the lines between blank lines), fenced code blocks and headings, each tagged with the heading path
    it sits under; a heading keeps the paragraph after it. Built on the one block parser
    (readers.markdown_syntax.markdown_blocks), which says where headings and code are."""
    blocks: list[_Block] = []
    path: tuple[tuple[int, str], ...] = ()
    buf: list[str] = []
    new_section = False
    after_heading = False

    def flush(is_code: bool = False) -> None:
        nonlocal new_section
        body = "\n".join(buf).strip("\n")
        buf.clear()
        if body.strip():
            blocks.append(_Block(body, " › ".join(title for _, title in path), new_section, is_code))
            new_section = False

    for block in markdown_blocks(text):
        if block.kind == "heading" or block.kind == "code" or (block.after_blank and not after_heading):
            flush()
        path = block.path
        buf.extend(block.lines)
        if block.kind == "code":
            flush(is_code=True)
        new_section = new_section or block.kind == "heading"
        after_heading = block.kind == "heading"
    flush()
    return blocks


def _windows(text: str, max_chars: int, overlap: int) -> list[str]:
    """Split an over-long block into overlapping windows, preferring to cut after a sentence end."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + max_chars, len(text))
        if end < len(text):
            floor = start + int(max_chars * 0.6)
            cuts = [m.end() for m in _SENTENCE_END.finditer(text, floor, end)]
            if cuts:
                end = cuts[-1]
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        if end >= len(text):
            break
        start = max(end - overlap, start + 1)
    return pieces


def chunk_markdown(text: str, max_chars: int = 600, overlap: int = 100) -> list[Chunk]:
    """Pack paragraphs into chunks of at most `max_chars` (code blocks up to twice that stay whole).

    A heading starts a new chunk unless the chunk so far is short, so tiny sections do not become tiny chunks.
    """
    chunks: list[Chunk] = []
    current: list[str] = []
    current_heading = ""
    size = 0

    def emit() -> None:
        nonlocal size
        if current:
            chunks.append(Chunk("\n\n".join(current), current_heading))
        current.clear()
        size = 0

    for block in _blocks(text):
        limit = max_chars * 2 if block.is_code else max_chars
        pieces = [block.text] if len(block.text) <= limit else _windows(block.text, max_chars, overlap)
        for piece in pieces:
            breaks_section = block.starts_section and size >= max_chars // 3
            if current and (breaks_section or size + len(piece) + 2 > max_chars):
                emit()
            if not current:
                current_heading = block.heading
            current.append(piece)
            size += len(piece) + 2
    emit()
    return chunks


def chunk_id(note_id: str, n: int) -> str:
    return f"{note_id}:chunk:{n}"


def chunker_id(max_chars: int, overlap: int) -> str:
    """Identifies the chunking in the manifest: a change of version or size re-chunks every note."""
    return f"{CHUNKER_VERSION}/{max_chars}/{overlap}"
