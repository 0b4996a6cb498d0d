"""Markdown conventions: code stripping, #tags, [[wikilinks]], H1 titles, frontmatter, frontmatter values, dates."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
import yaml

from readers.markdown_syntax import (
    ALIAS_BUDGET,
    HAN,
    HAN_RUN,
    MAX_NESTING,
    WikiLink,
    as_datetime,
    as_string_list,
    as_text_list,
    closes_fence,
    date_fields,
    fence_opening,
    first_h1,
    markdown_blocks,
    parse_tags,
    parse_wikilinks,
    readable_wikilinks,
    split_frontmatter,
    strip_code,
)

UTC = dt.UTC
PLUS_8 = dt.timezone(dt.timedelta(hours=8))


# --- code ---------------------------------------------------------------------------------------------------------


def test_strip_code_blanks_fenced_blocks_and_inline_code_but_keeps_line_count() -> None:
    """Backtick and tilde fences and inline spans disappear; every other line stays where it was."""
    text = "keep #a\n```py\n# code\n```\n~~~\n#tilde\n~~~\nx `#inline` y"
    stripped = strip_code(text)
    assert stripped.split("\n") == ["keep #a", "", "", "", "", "", "", "x   y"]


def test_a_fence_closes_only_on_a_run_at_least_as_long_without_info_string() -> None:
    """A ```` fence may contain ``` lines; a ```lang line does not close a block."""
    text = "````\n```\n#inside\n```\n````\n#after\n```\n```py\n#still\n```\n#out"
    assert strip_code(text).split("\n") == ["", "", "", "", "", "#after", "", "", "", "", "#out"]


@pytest.mark.parametrize(("line", "fence"), [
    ("```", "```"), ("```python", "```"), ("````md", "````"), ("~~~", "~~~"), ("~~~~ ~~~", "~~~~"),
    ("    ```", "```"),  # in a list item a fence is indented under it
    ("\u3000```", "```"), ("```a`b", ""), ("``", ""), ("text ```", ""), ("~~", ""),
])
def test_one_rule_says_which_line_opens_a_fence(line: str, fence: str) -> None:
    """The fence every parser uses (chunks, answers, code spans, previews, tags): three or more backticks or tildes
    first on a line; a backtick fence's info string holds no backtick."""
    assert fence_opening(line) == fence


@pytest.mark.parametrize(("line", "fence", "closes"), [
    ("```", "```", True), ("````", "```", True), ("  ```  ", "```", True), ("```", "````", False),
    ("```python", "```", False), ("~~~", "```", False), ("", "```", False), ("``` x", "```", False),
])
def test_one_rule_says_which_line_closes_a_fence(line: str, fence: str, closes: bool) -> None:
    assert closes_fence(line, fence) is closes


def test_double_backtick_inline_code_may_contain_a_backtick() -> None:
    """``a ` #b`` is one code span, so #b inside it is code."""
    assert parse_tags("``a ` #b`` #c") == ["c"]


# --- tags ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#plain and #two", ["plain", "two"]),
        ("读完了 #读书 很好", ["读书"]),
        ("#work/infra is nested", ["work/infra"]),
        ("刚看完 #科幻。还不错", ["科幻"]),
        ("好书 #科幻 #小说！", ["科幻", "小说"]),
        ("《三体》 #科幻》", ["科幻"]),
        ("(#paren) and （#全角）", ["paren", "全角"]),
        ("end of sentence #done.", ["done"]),
        ("# Title\n## Sub title", []),
        ("## Meeting #work", ["work"]),
        ("see http://x/#a and https://example.com/page#frag", []),
        ("see [the section](#anchor)", []),
        ("issue #123 and #2024", []),
        ("#123abc", ["123abc"]),
        ("mid#word", []),
        ("#dup #dup #other #dup", ["dup", "other"]),
        ("#Work then #work", ["Work"]),
        ("`#inline` #real", ["real"]),
        ("```\n#fenced\n```\n#real", ["real"]),
        ("~~~\n#tilde\n~~~\n#real", ["real"]),
        ("#-", []),
        ("color #fff;", ["fff"]),
    ],
)
def test_parse_tags(text: str, expected: list[str]) -> None:
    """Inline tags follow Obsidian: after whitespace, outside code, not headings, anchors or pure numbers."""
    assert parse_tags(text) == expected


# --- wikilinks ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[note]]", [WikiLink("note")]),
        ("[[note|alias]]", [WikiLink("note", alias="alias")]),
        ("[[note#heading]]", [WikiLink("note", heading="heading")]),
        ("[[note#heading|alias]]", [WikiLink("note", heading="heading", alias="alias")]),
        ("[[sub/读书笔记]]", [WikiLink("sub/读书笔记")]),
        ("| [[note\\|alias]] | [[other#h\\|x]] |", [WikiLink("note", alias="alias"), WikiLink("other", "h", "x")]),
        ("![[embedded note]]", [WikiLink("embedded note")]),
        ("![[image.png]] ![[photo.JPG|300]] ![[doc.pdf#page=2]] [[clip.mp4]]", []),
        ("[[#heading in this note]]", []),
        ("`[[inline]]`\n```\n[[fenced]]\n```\n[[real]]", [WikiLink("real")]),
        ("[[a]] and [[b]] and [[a]]", [WikiLink("a"), WikiLink("b"), WikiLink("a")]),
    ],
)
def test_parse_wikilinks(text: str, expected: list[WikiLink]) -> None:
    """Note links and note embeds count; attachments, self-heading links and links in code do not."""
    assert parse_wikilinks(text) == expected


@pytest.mark.parametrize(("text", "shown"), [
    ("[[note]]", "note"), ("[[note|别名]]", "别名"), ("[[note#heading]]", "note › heading"),
    ("[[note#h1#h2]]", "note › h1 › h2"), ("[[note#^block1]]", "note › block1"), ("[[#heading]]", "heading"),
    ("![[image.png]]", "image.png"), ("| [[note\\|alias]] |", "| alias |"), ("[[note\\]]", "note"),
    ("[[a|  ]]", "a"), ("[[a\nb]]", "[[a\nb]]"), ("[[a]] [[b|c]]", "a c"),
])
def test_a_wikilink_reads_as_obsidian_shows_it(text: str, shown: str) -> None:
    """One rule for answers, agent previews and the page: the alias, else the target › heading."""
    assert readable_wikilinks(text) == shown


def test_han_is_the_ideographs_and_nothing_else() -> None:
    """CJK Unified Ideographs with Extension A and the compatibility block; not the Yijing hexagrams between them
    (suggest.py once counted them), kana, hangul or full-width punctuation."""
    assert all(HAN.fullmatch(c) for c in "中㐀䶵豈鿿")
    assert not any(HAN.search(c) for c in "䷀䷿あア한，。a1")
    assert HAN_RUN.findall("看电影 and 读书。") == ["看电影", "读书"]


NOTE = """# 菜谱
intro line
more intro

## 番茄炒蛋 ##
- 番茄 2 个
  软的
- 鸡蛋
    ```text
    not an item
    ```
| a | b |
|---|---|
```` md
```
# not a heading
```
````
   ### C# and F#
text"""


def test_the_one_block_parser_reads_headings_code_tables_items_and_paragraphs() -> None:
    """What chunks and answers are cut on: CommonMark headings (≤ 3 spaces, `C#` keeps its #) and fences (a fence in
    a list item is code of its own; ```` holds ```), tables, items with their continuation, paragraphs."""
    blocks = markdown_blocks(NOTE)
    assert [(b.kind, len(b.lines), b.after_blank) for b in blocks] == [
        ("heading", 1, True), ("text", 2, False), ("heading", 1, True), ("item", 2, False), ("item", 1, False),
        ("code", 3, False), ("table", 2, False), ("code", 5, False), ("heading", 1, False), ("text", 1, False)]
    assert [b.path for b in blocks][-2:] == [((1, "菜谱"), (2, "番茄炒蛋"), (3, "C# and F#"))] * 2
    assert blocks[2].path == ((1, "菜谱"), (2, "番茄炒蛋")) and blocks[1].path == ((1, "菜谱"),)


def test_an_unclosed_fence_ends_with_its_list_item_or_the_note() -> None:
    blocks = markdown_blocks("1. key:\n    ```json\n    {}\n\n## Next\ntext")
    assert [(b.kind, b.closed) for b in blocks] == [("item", True), ("code", False), ("heading", True),
                                                     ("text", True)]
    assert [(b.kind, b.closed) for b in markdown_blocks("```\ncode\n\n# not a heading")] == [("code", False)]
    assert [b.kind for b in markdown_blocks("<!--\n```sh\nnpm i\n``` -->\n# Title")][-1] == "heading"


# --- first H1 -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("intro\n# Title\n# Second", "Title"),
        ("## Sub\n### Deeper", ""),
        ("#hashtag line", ""),
        ("```\n# comment in code\n```\n# Real", "Real"),
        ("# C#", "C#"),
        ("# Closed heading ##", "Closed heading"),
        ("   # Indented three", "Indented three"),
        ("    # Indented four is code", ""),
        ("# The `foo` function", "The `foo` function"),
        ("# 标题 #标签", "标题 #标签"),
        ("#\n# ", ""),
    ],
)
def test_first_h1(text: str, expected: str) -> None:
    """The first ATX level-one heading outside fences, as written."""
    assert first_h1(text) == expected


# --- frontmatter --------------------------------------------------------------------------------------------------


def test_frontmatter_is_split_from_the_body() -> None:
    """A closed YAML mapping becomes data; the body starts after the closing line."""
    fm = split_frontmatter("---\ntitle: T\ntags: [a, b]\n---\n# Body\ntext")
    assert (fm.data, fm.body, fm.warning) == ({"title": "T", "tags": ["a", "b"]}, "# Body\ntext", "")


def test_frontmatter_may_close_with_dots() -> None:
    """YAML's document end marker `...` closes frontmatter too."""
    assert split_frontmatter("---\na: 1\n...\nbody") == split_frontmatter("---\na: 1\n---\nbody")
    assert split_frontmatter("---\na: 1\n...\nbody").data == {"a": 1}


def test_empty_frontmatter_is_no_data_and_no_warning() -> None:
    """`---` twice (or with blank lines between) is valid and empty."""
    for text in ("---\n---\nbody", "---\n\n---\nbody"):
        fm = split_frontmatter(text)
        assert (fm.data, fm.body, fm.warning) == ({}, "body", "")


def test_text_without_frontmatter_is_all_body() -> None:
    """Only a first line of exactly `---` opens frontmatter."""
    for text in ("plain\n---\nx: 1\n---", "----\nx: 1\n----", "--- not yaml\nx"):
        fm = split_frontmatter(text)
        assert (fm.data, fm.body, fm.warning) == ({}, text, "")


@pytest.mark.parametrize(
    ("text", "warning_part"),
    [
        ("---\ntitle: x\nno closing line", "not closed"),
        ("---\ntitle: x\n\ttags: [a]\n---\nbody", "not valid YAML"),
        ("---\na: [unclosed\n---\nbody", "not valid YAML"),
        ("---\n- a\n- b\n---\nbody", "is a list, not a mapping"),
        ("---\njust a sentence\n---\nbody", "is a str, not a mapping"),
        ("---\n42\n---\nbody", "is a int, not a mapping"),
    ],
)
def test_unusable_frontmatter_warns_and_keeps_the_whole_text(text: str, warning_part: str) -> None:
    """Nothing is lost: a note that merely starts with a `---` rule is indexed in full."""
    fm = split_frontmatter(text)
    assert fm.data == {}
    assert fm.body == text
    assert warning_part in fm.warning


def test_an_impossible_date_does_not_break_the_rest_of_the_frontmatter() -> None:
    """`2024-02-30` stays text instead of failing YAML loading (it used to raise ValueError out of the scan)."""
    fm = split_frontmatter("---\ntitle: T\ncreated: 2024-02-30\n---\nbody")
    assert (fm.data, fm.warning) == ({"title": "T", "created": "2024-02-30"}, "")


def test_frontmatter_keys_become_strings() -> None:
    """Chroma metadata keys are strings, so YAML int/bool keys are converted."""
    assert split_frontmatter("---\n2024: a\ntrue: b\n---\n").data == {"2024": "a", "True": "b"}


def test_frontmatter_is_parsed_with_libyaml_when_it_is_there() -> None:
    """The C loader is ~10x faster; it must still keep the safe constructors and the custom ones."""
    from readers.markdown_syntax import _yaml_loader

    if yaml.__with_libyaml__:
        assert issubclass(_yaml_loader(), yaml.CSafeLoader)
    assert split_frontmatter("---\nx: !!python/object/apply:os.system [echo hi]\n---\nb").warning.startswith(
        "frontmatter is not valid YAML"
    )


# --- hostile frontmatter: aliases and nesting ---------------------------------------------------------------------


def billion_laughs(levels: int) -> str:
    """The classic alias bomb: each level is a list of nine aliases to the level before (9**levels strings)."""
    names = "abcdefghijklmnop"[:levels]
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip(names, names[1:], strict=False):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "---\n" + "\n".join(lines) + f"\ntitle: *{names[-1]}\n---\n# Body\n\nstill here\n"


@pytest.mark.parametrize("levels", [6, 9, 16])
def test_an_alias_bomb_is_refused_fast_and_the_body_kept(levels: int) -> None:
    """~380 bytes that expand to 9**9 strings: refused from the node graph, before any value is built or printed."""
    text = billion_laughs(levels)
    started = time.process_time()
    fm = split_frontmatter(text)
    assert time.process_time() - started < 0.5
    assert fm.data == {}
    assert fm.body == "# Body\n\nstill here\n"
    assert fm.warning == (
        f"frontmatter refused: its aliases expand it by more than {ALIAS_BUDGET:,} nodes and characters; "
        "dropped, the body is indexed"
    )


def test_an_alias_bomb_through_merge_keys_is_refused() -> None:
    """`<<: *prev` merges copy key/value pairs level by level: the same explosion through mappings."""
    lines = ["l0: &l0 {" + ", ".join(f"k{i}: v{i}" for i in range(9)) + "}"]
    lines += [f"l{n}: &l{n} {{" + ", ".join([f"<<: *l{n - 1}"] + [f"x{i}: *l{n - 1}" for i in range(8)]) + "}"
              for n in range(1, 9)]
    fm = split_frontmatter("---\n" + "\n".join(lines) + "\n---\nbody")
    assert (fm.data, fm.body) == ({}, "body")
    assert "aliases expand it" in fm.warning


def test_one_long_string_repeated_by_aliases_counts_its_characters() -> None:
    """A few thousand aliases to one long string are as costly as the bomb once joined into tags: characters count."""
    text = "---\nlong: &s " + "x" * 1000 + "\ntags: [" + ", ".join(["*s"] * 100) + "]\n---\nbody"
    assert "aliases expand it" in split_frontmatter(text).warning
    small = "---\nlong: &s " + "x" * 100 + "\ntags: [" + ", ".join(["*s"] * 100) + "]\n---\nbody"
    assert split_frontmatter(small).warning == ""


def test_a_value_that_contains_itself_is_refused() -> None:
    """`&a [*a]` is a list inside itself: printing it never ends (YAML allows it, the composer shares the node)."""
    for text in ("---\na: &a [*a]\n---\nbody", "---\na: &a {b: {c: *a}}\n---\nbody"):
        fm = split_frontmatter(text)
        assert (fm.data, fm.body) == ({}, "body")
        assert fm.warning.startswith("frontmatter refused: an alias refers to a value that contains it; dropped")


def test_ordinary_aliases_and_merge_keys_still_load() -> None:
    """Real frontmatter reuses a few small values: well within the budget."""
    text = "---\nbase: &b {status: draft, tags: [x, y]}\npost:\n  <<: *b\n  title: T\nagain: *b\n---\nbody"
    fm = split_frontmatter(text)
    assert fm.warning == ""
    assert fm.data["post"] == {"status": "draft", "tags": ["x", "y"], "title": "T"}
    assert fm.data["again"] == fm.data["base"]


def test_nesting_is_capped() -> None:
    """Values nested past the cap would overflow Python's recursion when printed; at the cap they load."""
    deep = split_frontmatter("---\na: " + "[" * MAX_NESTING + "]" * MAX_NESTING + "\n---\nbody")
    assert (deep.data, deep.body) == ({}, "body")
    assert deep.warning.startswith(f"frontmatter refused: values nested deeper than {MAX_NESTING} levels; dropped")
    ok = split_frontmatter("---\na: " + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1) + "\n---\nbody")
    assert (ok.warning, ok.body) == ("", "body")


def test_without_libyaml_the_pure_python_loader_refuses_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyYAML built without libyaml: the same refusals, and deep nesting (which overflows its recursive parser) is a
    warning, not an exception out of the scan."""
    from readers import markdown_syntax

    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    markdown_syntax._yaml_loader.cache_clear()
    try:
        assert not issubclass(markdown_syntax._yaml_loader(), getattr(yaml, "CSafeLoader", ()))
        assert "aliases expand it" in split_frontmatter(billion_laughs(9)).warning
        assert split_frontmatter("---\na: 1\n---\nbody").data == {"a": 1}
        deep = split_frontmatter("---\na: " + "[" * 5000 + "]" * 5000 + "\n---\nbody")
        assert deep.warning.startswith("frontmatter is not valid YAML")
    finally:
        monkeypatch.undo()
        markdown_syntax._yaml_loader.cache_clear()


def test_nesting_libyaml_refuses_is_invalid_yaml_not_a_crash() -> None:
    """Ten thousand levels: the parser's own limit turns it into a warning, and the text is kept."""
    text = "---\na: " + "[" * 10_000 + "]" * 10_000 + "\n---\nbody"
    fm = split_frontmatter(text)
    assert (fm.data, fm.body) == ({}, text)
    assert fm.warning.startswith("frontmatter is not valid YAML")


# --- frontmatter values -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["a", "b"], ["a", "b"]),
        ("a, b", ["a", "b"]),
        ("a b", ["a", "b"]),
        ("#a #b", ["a", "b"]),
        (["#读书", " 科幻 "], ["读书", "科幻"]),
        ([["nested"], "flat"], ["nested", "flat"]),
        ("single", ["single"]),
        (2024, ["2024"]),
        (["a", None, ""], ["a"]),
        (None, []),
        ("", []),
    ],
)
def test_as_string_list_reads_tag_values(value: Any, expected: list[str]) -> None:
    """Tags come as YAML lists, comma or space strings, with or without '#'."""
    assert as_string_list(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("My Alias", ["My Alias"]),
        ("A, B C", ["A", "B C"]),
        (["[[My Note]]", "[[b|B]]"], ["[[My Note]]", "[[b|B]]"]),
        ([["unquoted link"]], ["unquoted link"]),
        ("#1 fan", ["#1 fan"]),
        (None, []),
    ],
)
def test_as_text_list_keeps_spaces(value: Any, expected: list[str]) -> None:
    """Aliases and link targets are phrases: only commas and YAML lists separate them."""
    assert as_text_list(value) == expected


# --- dates --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (dt.date(2024, 3, 5), dt.datetime(2024, 3, 5, tzinfo=UTC)),
        (dt.datetime(2024, 3, 5, 10, 30), dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)),
        (dt.datetime(2024, 3, 5, 18, 30, tzinfo=PLUS_8), dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)),
        ("2024-03-05", dt.datetime(2024, 3, 5, tzinfo=UTC)),
        ("2024-03-05 10:30", dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)),
        ("2024-03-05T10:30:00Z", dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)),
        ("2024-03-05T18:30:00+08:00", dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)),
        ("2024年3月5日", dt.datetime(2024, 3, 5, tzinfo=UTC)),
        ("2024/3/5", dt.datetime(2024, 3, 5, tzinfo=UTC)),
        ("2024.03.05", dt.datetime(2024, 3, 5, tzinfo=UTC)),
        (1709634600, dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)),
        (1709634600.5, dt.datetime(2024, 3, 5, 10, 30, 0, 500000, tzinfo=UTC)),
        ("2024年13月5日", None),
        ("2024-02-30", None),
        ("someday", None),
        ("", None),
        (None, None),
        (True, None),
        (10**20, None),
    ],
)
def test_as_datetime(value: Any, expected: dt.datetime | None) -> None:
    """Every accepted form becomes an aware UTC datetime; anything else is None, never an exception."""
    parsed = as_datetime(value)
    assert parsed == expected
    if parsed is not None:
        assert parsed.utcoffset() == dt.timedelta(0)


def test_date_fields_give_a_z_iso_string_and_unix_seconds() -> None:
    """Chroma can filter on `<prefix>_ts`; the ISO string is for display."""
    moment = dt.datetime(2024, 3, 5, 10, 30, tzinfo=UTC)
    assert date_fields("created", moment) == {"created": "2024-03-05T10:30:00Z", "created_ts": 1709634600}
    assert date_fields("created", None) == {}
