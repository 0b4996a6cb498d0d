"""Chunking: headings and paragraphs respected, long paragraphs windowed with overlap, code fences kept whole."""

from __future__ import annotations

from rag_app.ingest.chunking import CHUNKER_VERSION, chunk_id, chunk_markdown, chunker_id


def test_short_note_is_one_chunk():
    chunks = chunk_markdown("# Title\n\nOne short paragraph.")
    assert len(chunks) == 1 and chunks[0].heading == "Title"
    assert "# Title" in chunks[0].text and "One short paragraph." in chunks[0].text


def test_sections_start_new_chunks_once_the_chunk_is_substantial():
    body = "\n\n".join(f"## Part {i}\n\n" + ("句子。" * 60) for i in range(3))
    chunks = chunk_markdown("# Doc\n\n" + body, max_chars=400)
    assert len(chunks) == 3
    assert [c.heading for c in chunks] == ["Doc", "Doc › Part 1", "Doc › Part 2"]
    assert "## Part 0" in chunks[0].text
    assert chunks[1].text.startswith("## Part 1")


def test_long_paragraph_is_windowed_with_overlap_at_sentence_ends():
    paragraph = "".join(f"第{i}句话讲一件事。" for i in range(200))
    chunks = chunk_markdown(paragraph, max_chars=300, overlap=60)
    assert len(chunks) > 3 and all(len(c.text) <= 300 for c in chunks)
    assert all(c.text.endswith("。") for c in chunks[:-1])
    assert chunks[0].text[-20:] in chunks[1].text


def test_code_fence_kept_whole_when_it_fits_even_with_blank_lines_and_hashes():
    code = "```python\n# not a heading\n\ndef f():\n    return 1\n\n\nprint(f())\n```"
    chunks = chunk_markdown("# Note\n\nIntro.\n\n" + code + "\n\nAfter.", max_chars=600)
    assert any(code in c.text for c in chunks)
    assert all(c.heading == "Note" for c in chunks)


def test_fences_pair_as_the_one_block_parser_pairs_them():
    """A ```` block that shows a ``` block is one code block (``` lines inside are its text); an unclosed fence in a
    list item ends with the item, so the next section keeps its heading."""
    shown = "````\n```mermaid\ngraph TD;\n    A-->B;\n```\n````"
    chunks = chunk_markdown(f"# Diagrams\n\nA flow chart:\n\n{shown}\n\nDone.", max_chars=40)
    assert any(c.text == shown for c in chunks), [c.text for c in chunks]
    open_in_item = "# A\n\n1. Bind a key:\n\n    ```json\n    {\"key\": \"ctrl+l\"}\n\n## B\n\nText of B."
    assert chunk_markdown(open_in_item, max_chars=30)[-1].heading == "A › B"


def test_oversized_code_fence_is_split_rather_than_dropped():
    code = "```\n" + "\n".join(f"line {i} of a very long generated file" for i in range(200)) + "\n```"
    chunks = chunk_markdown(code, max_chars=500, overlap=50)
    assert len(chunks) > 5 and "line 199" in chunks[-1].text


def test_empty_and_whitespace_notes_give_no_chunks():
    assert chunk_markdown("") == [] and chunk_markdown("\n\n   \n") == []


def test_ids_and_version():
    assert chunk_id("vault:v/a.md", 3) == "vault:v/a.md:chunk:3"
    assert chunker_id(600, 100) == f"{CHUNKER_VERSION}/600/100"
