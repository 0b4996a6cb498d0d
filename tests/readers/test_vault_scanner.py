"""VaultScanner: which files become notes, what each note's record holds, and how bad files are reported."""

from __future__ import annotations

import codecs
import datetime as dt
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from readers import vault_scanner
from readers.records import NoteRecord, SourceListing, decode_list
from readers.vault_scanner import (
    DEFAULT_MAX_BYTES,
    MAX_FOLDER_DEPTH,
    VaultError,
    VaultScanner,
    decode_note,
    file_signature,
    vault_note_id,
)
from tests.conftest import SAMPLE_VAULT, as_an_ordinary_user

MakeVault = Callable[..., Path]


def scan(root: Path, name: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> SourceListing:
    return VaultScanner(root, name=name, max_bytes=max_bytes).scan()


def by_path(listing: SourceListing) -> dict[str, NoteRecord]:
    return {str(record.metadata["path"]): record for record in listing.records}


def only_note(make_vault: MakeVault, text: str | bytes, rel: str = "note.md") -> tuple[NoteRecord, list[str]]:
    """Scan a vault holding one note; return its record and the scan's warnings."""
    listing = scan(make_vault({rel: text}))
    assert [record.metadata["path"] for record in listing.records] == [rel]
    return listing.records[0], listing.warnings


def listed(record: NoteRecord, key: str) -> list[str]:
    return decode_list(record.metadata[key])


# --- frontmatter --------------------------------------------------------------------------------------------------


def test_frontmatter_title_tags_aliases_and_id_become_metadata(make_vault: MakeVault) -> None:
    """The common Obsidian properties land in metadata; the frontmatter is not part of the text."""
    note, warnings = only_note(
        make_vault, "---\ntitle: 三体\ntags: [读书, 科幻]\naliases: [Three-Body, 三体问题]\nid: 20240305\n---\n正文"
    )
    assert warnings == []
    assert note.text == "正文"
    assert note.metadata["title"] == "三体"
    assert listed(note, "tags") == ["读书", "科幻"]
    assert listed(note, "aliases") == ["Three-Body", "三体问题"]
    assert note.metadata["fm_id"] == "20240305"


@pytest.mark.parametrize(
    "tags_yaml",
    [
        "tags: [a, b/c]",
        "tags:\n  - a\n  - b/c",
        "tags: a, b/c",
        "tags: a b/c",
        "tags: ['#a', '#b/c']",
        "tags: '#a #b/c'",
        "tag: [a, b/c]",
    ],
)
def test_frontmatter_tags_in_every_common_form(make_vault: MakeVault, tags_yaml: str) -> None:
    """YAML list, block list, comma string, space string, leading '#', singular `tag`: all give the same tags."""
    note, _ = only_note(make_vault, f"---\n{tags_yaml}\n---\nbody")
    assert listed(note, "tags") == ["a", "b/c"]


def test_frontmatter_and_inline_tags_merge_without_duplicates(make_vault: MakeVault) -> None:
    """Frontmatter tags come first, then inline ones; a tag in both places (in any case) is listed once."""
    note, _ = only_note(make_vault, "---\ntags: [读书, Work]\n---\n#work #读书 #新标签 `#code`")
    assert listed(note, "tags") == ["读书", "Work", "新标签"]


@pytest.mark.parametrize(
    ("aliases_yaml", "expected"),
    [
        ("aliases: Sleep habits, better sleep", ["Sleep habits", "better sleep"]),
        ("alias: My Alias", ["My Alias"]),
        ("aliases: [My Alias, 别名]", ["My Alias", "别名"]),
    ],
)
def test_aliases_keep_their_spaces(make_vault: MakeVault, aliases_yaml: str, expected: list[str]) -> None:
    """A scalar alias is one phrase; commas separate several (they used to be split on every space)."""
    note, _ = only_note(make_vault, f"---\n{aliases_yaml}\n---\n")
    assert listed(note, "aliases") == expected


@pytest.mark.parametrize(
    ("date_yaml", "iso"),
    [
        ("created: 2024-03-05", "2024-03-05T00:00:00Z"),
        ("created: 2024-03-05 10:30:00", "2024-03-05T10:30:00Z"),
        ("created: 2024-03-05T18:30:00+08:00", "2024-03-05T10:30:00Z"),
        ("created: '2024-03-05'", "2024-03-05T00:00:00Z"),
        ("created: 2024年3月5日", "2024-03-05T00:00:00Z"),
        ("date: 2024-03-05", "2024-03-05T00:00:00Z"),
        ("created: someday\ndate: 2024-03-05", "2024-03-05T00:00:00Z"),
    ],
)
def test_created_date_in_every_common_form(make_vault: MakeVault, date_yaml: str, iso: str) -> None:
    """`created` (or `date`) becomes an ISO string in UTC and unix seconds; an unreadable `created` falls to `date`."""
    note, _ = only_note(make_vault, f"---\n{date_yaml}\n---\n")
    assert note.metadata["created"] == iso
    assert note.metadata["created_ts"] == int(dt.datetime.fromisoformat(iso).timestamp())


def test_updated_and_modified_dates(make_vault: MakeVault) -> None:
    """`updated` (or `modified`) becomes the updated fields."""
    root = make_vault({"a.md": "---\nupdated: 2025-01-12\n---\n", "b.md": "---\nmodified: 2025-01-12T08:00:00Z\n---"})
    a, b = (note.metadata for note in scan(root).records)
    assert (a["updated"], a["updated_ts"]) == ("2025-01-12T00:00:00Z", 1736640000)
    assert (b["updated"], b["updated_ts"]) == ("2025-01-12T08:00:00Z", 1736668800)


def test_an_impossible_date_is_dropped_but_the_rest_of_the_frontmatter_is_kept(make_vault: MakeVault) -> None:
    """`created: 2024-02-30` used to crash the whole scan with ValueError."""
    note, warnings = only_note(make_vault, "---\ntitle: T\ncreated: 2024-02-30\ntags: [a]\n---\n")
    assert (note.metadata["title"], listed(note, "tags"), warnings) == ("T", ["a"], [])
    assert "created" not in note.metadata


def test_daily_note_filename_gives_the_created_date(make_vault: MakeVault) -> None:
    """`daily/2024-03-15.md` without a frontmatter date is created on 2024-03-15; frontmatter wins when present."""
    listing = scan(make_vault({"daily/2024-03-15.md": "# Friday", "daily/2024-03-16.md": "---\ndate: 2024-01-01\n---"}))
    notes = by_path(listing)
    assert notes["daily/2024-03-15.md"].metadata["created"] == "2024-03-15T00:00:00Z"
    assert notes["daily/2024-03-16.md"].metadata["created"] == "2024-01-01T00:00:00Z"


def test_no_date_anywhere_means_no_date_fields(make_vault: MakeVault) -> None:
    """Absent dates are absent keys, not empty strings (Chroma filters on `created_ts`)."""
    note, _ = only_note(make_vault, "# Plain", rel="ideas.md")
    assert not {"created", "created_ts", "updated", "updated_ts"} & set(note.metadata)


def test_empty_frontmatter(make_vault: MakeVault) -> None:
    """`---` twice is valid: no metadata, no warning."""
    note, warnings = only_note(make_vault, "---\n---\n# Title\nbody")
    assert (note.text, note.metadata["title"], warnings) == ("# Title\nbody", "Title", [])


@pytest.mark.parametrize(
    ("frontmatter", "warning_part"),
    [
        ("---\n- a\n- b\n---\n", "frontmatter is a list, not a mapping"),
        ("---\njust a sentence\n---\n", "frontmatter is a str, not a mapping"),
        ("---\ntitle: T\n\ttags: [a]\n---\n", "frontmatter is not valid YAML"),
        ("---\ntitle: T\n", "frontmatter is not closed"),
    ],
)
def test_unusable_frontmatter_warns_naming_the_file_and_the_body_is_still_indexed(
    make_vault: MakeVault, frontmatter: str, warning_part: str
) -> None:
    """The warning starts with the note's path; the body (and its H1 and tags) is read as usual."""
    text = frontmatter + "# Heading\nbody #tag"
    note, warnings = only_note(make_vault, text, rel="sub/broken.md")
    assert len(warnings) == 1
    assert warnings[0].startswith("sub/broken.md: ")
    assert warning_part in warnings[0]
    assert note.text == text
    assert "body #tag" in note.text
    assert (note.metadata["title"], listed(note, "tags")) == ("Heading", ["tag"])


def test_crlf_line_endings(make_vault: MakeVault) -> None:
    """Windows line endings parse like Unix ones and are normalised in the text."""
    note, warnings = only_note(make_vault, b"---\r\ntitle: T\r\ntags: [a]\r\n---\r\n# H\r\nline #b\r\n")
    assert (note.text, note.title, listed(note, "tags"), warnings) == ("# H\nline #b\n", "T", ["a", "b"], [])


# --- titles -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("---\ntitle: From frontmatter\n---\n# From heading", "From frontmatter"),
        ("---\ntitle: ''\n---\n# From heading", "From heading"),
        ("intro\n# From heading\n# Later", "From heading"),
        ("```\n# not a heading\n```\n## H2 only", "my-note"),
        ("no heading at all", "my-note"),
    ],
)
def test_title_is_frontmatter_then_first_h1_then_filename(make_vault: MakeVault, text: str, title: str) -> None:
    """Frontmatter title > first H1 outside code > filename stem."""
    note, _ = only_note(make_vault, text, rel="dir/my-note.md")
    assert note.title == title


# --- links --------------------------------------------------------------------------------------------------------


def test_links_from_body_and_frontmatter(make_vault: MakeVault) -> None:
    """Body wikilinks and note embeds, then `links:`/`related:` entries, each target once; attachments excluded."""
    text = (
        "---\n"
        'links: ["[[b]]", "[[My Note|shown]]"]\n'
        "related:\n  - '[[c#part]]'\n  - [[unquoted]]\n"
        "---\n"
        "[[a]] [[b|B]] [[a#h]] ![[embedded]] ![[pic.png]] `[[code]]`"
    )
    note, warnings = only_note(make_vault, text)
    assert warnings == []
    assert listed(note, "links") == ["a", "b", "embedded", "My Note", "c", "unquoted"]


def test_related_as_a_comma_string(make_vault: MakeVault) -> None:
    """`related: "[[a]], [[b c]]"` is two links; the space inside a name is kept."""
    note, _ = only_note(make_vault, '---\nrelated: "[[a]], [[b c]]"\n---\n')
    assert listed(note, "links") == ["a", "b c"]


# --- files --------------------------------------------------------------------------------------------------------


def test_walk_is_recursive_skips_dot_entries_and_non_markdown(make_vault: MakeVault) -> None:
    """Only `.md` files (any case) outside dot-folders, and not dot-files, become notes."""
    root = make_vault(
        {
            "a.md": "a",
            "UPPER.MD": "upper",
            "sub/deeper/b.md": "b",
            ".obsidian/workspace.md": "x",
            ".trash/old.md": "x",
            ".git/x.md": "x",
            "sub/.hidden/c.md": "x",
            ".dotfile.md": "x",
            "sub/.dot.md": "x",
            "image.png": "x",
            "notes.txt": "x",
            "readme.markdown": "x",
            "sub/md": "x",
        }
    )
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["UPPER.MD", "a.md", "sub/deeper/b.md"]
    assert (listing.warnings, listing.skipped, listing.kept_ids) == ([], 0, set())
    assert by_path(listing)["UPPER.MD"].title == "UPPER"


def test_cjk_and_emoji_filenames(make_vault: MakeVault) -> None:
    """Unicode paths are kept verbatim in ids, paths and fallback titles."""
    listing = scan(make_vault({"生活/电影清单.md": "x", "🎬 films.md": "y"}))
    assert sorted(r.id for r in listing.records) == ["vault:notes/生活/电影清单.md", "vault:notes/🎬 films.md"]
    assert by_path(listing)["🎬 films.md"].title == "🎬 films"


def test_ids_are_vault_name_and_relative_posix_path(make_vault: MakeVault) -> None:
    """The vault name defaults to the folder name; an explicit name replaces it."""
    root = make_vault({"a/b/c.md": "x"}, name="my vault")
    assert [r.id for r in scan(root).records] == ["vault:my vault/a/b/c.md"]
    assert [r.id for r in scan(root, name="work").records] == ["vault:work/a/b/c.md"]
    assert vault_note_id("work", "a/b/c.md") == "vault:work/a/b/c.md"


def test_metadata_holds_only_chroma_scalars_and_lists_as_json(make_vault: MakeVault) -> None:
    """Chroma rejects lists, None and nested values: every value is str/int/float/bool, lists are JSON strings."""
    text = "---\ntitle: 2024\ntags: [a]\naliases: [x]\nlinks: ['[[l]]']\nid: 7\ncreated: 2024-03-05\nx: {k: v}\n---\n"
    note, _ = only_note(make_vault, text)
    for value in [*note.metadata.values(), *note.volatile.values()]:
        assert type(value) in (str, int, float, bool)
    assert note.metadata == {
        "kind": "vault",
        "source": "notes",
        "title": "2024",
        "path": "note.md",
        "tags": '["a"]',
        "aliases": '["x"]',
        "links": '["l"]',
        "fm_id": "7",
        "created": "2024-03-05T00:00:00Z",
        "created_ts": 1709596800,
    }
    assert json.loads(str(note.metadata["tags"])) == ["a"]


def test_a_renamed_file_is_a_new_id(make_vault: MakeVault) -> None:
    """Ids follow paths: after a rename the old id is gone and the new one is listed."""
    root = make_vault({"old.md": "same text"})
    before = scan(root).records
    (root / "old.md").rename(root / "new.md")
    after = scan(root).records
    assert ([r.id for r in before], [r.id for r in after]) == (["vault:notes/old.md"], ["vault:notes/new.md"])


def test_content_hash_ignores_mtime_but_follows_edits(make_vault: MakeVault) -> None:
    """Touching a file changes only `volatile`; editing it changes the hash."""
    root = make_vault({"a.md": "---\ntags: [x]\n---\nversion one"})
    first = scan(root).records[0]
    assert scan(root).records[0].content_hash == first.content_hash
    os.utime(root / "a.md", (1_700_000_000, 1_700_000_000))
    touched = scan(root).records[0]
    assert touched.content_hash == first.content_hash
    assert touched.volatile != first.volatile
    (root / "a.md").write_text("---\ntags: [x]\n---\nversion two", encoding="utf-8")
    assert scan(root).records[0].content_hash != first.content_hash


def test_volatile_holds_the_file_mtime(make_vault: MakeVault) -> None:
    """The mtime is kept for display and filters, outside the hashed metadata."""
    root = make_vault({"a.md": "x"})
    os.utime(root / "a.md", (1_709_634_600, 1_709_634_600))
    note = scan(root).records[0]
    assert note.volatile == {"mtime": "2024-03-05T10:30:00Z", "mtime_ts": 1709634600}
    assert "mtime" not in note.metadata


# --- bad files ----------------------------------------------------------------------------------------------------


def test_invalid_utf8_is_decoded_with_replacement_and_a_warning(make_vault: MakeVault) -> None:
    """The note is still indexed; the warning names the file and the first bad byte."""
    note, warnings = only_note(make_vault, "好".encode() + b" \xff\xfe bad", rel="bad.md")
    assert note.text == "好 \ufffd\ufffd bad"
    assert warnings == ["bad.md: not valid UTF-8 (byte 4); undecodable bytes replaced"]


def test_utf8_bom_is_dropped_and_frontmatter_still_read(make_vault: MakeVault) -> None:
    """A BOM before `---` must not hide the frontmatter."""
    note, warnings = only_note(make_vault, b"\xef\xbb\xbf---\ntitle: T\n---\nbody")
    assert (note.text, note.title, warnings) == ("body", "T", [])


@pytest.mark.parametrize(
    ("bom", "encoding"),
    [
        (codecs.BOM_UTF16_LE, "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be"),
        (codecs.BOM_UTF32_BE, "utf-32-be"),
    ],
)
def test_utf16_and_utf32_with_bom_decode_correctly(make_vault: MakeVault, bom: bytes, encoding: str) -> None:
    """A BOM marks the encoding; such files contain NUL bytes yet are not binary."""
    note, warnings = only_note(make_vault, bom + "---\ntitle: 标题\n---\n中文 #标签".encode(encoding))
    assert (note.text, note.title, listed(note, "tags"), warnings) == ("中文 #标签", "标题", ["标签"], [])


def test_decode_note_reports_bad_utf16() -> None:
    """A truncated UTF-16 file is replaced and reported like bad UTF-8."""
    text, warning = decode_note(b"\xff\xfea\x00b")
    assert (text, warning) == ("a\ufffd", "not valid UTF-16 (byte 4); undecodable bytes replaced")


def test_binary_file_named_md_is_skipped_with_a_warning(make_vault: MakeVault) -> None:
    """NUL bytes without a BOM mean binary content, not a note."""
    listing = scan(make_vault({"blob.md": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "ok.md": "ok"}))
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert (listing.warnings, listing.skipped, listing.kept_ids) == (
        ["blob.md: binary content in a .md file; skipped"],
        1,
        set(),
    )


def test_oversize_file_is_not_read_and_keeps_its_indexed_copy(make_vault: MakeVault) -> None:
    """A file over `max_bytes` is not read but exists, so its indexed copy stays (kept); one at the limit is read."""
    listing = scan(make_vault({"big.md": "x" * 101, "edge.md": "y" * 100}), max_bytes=100)
    assert [r.metadata["path"] for r in listing.records] == ["edge.md"]
    assert listing.warnings == ["big.md: 101 bytes is over the 100-byte limit; not read, its indexed copy is kept"]
    assert (listing.skipped, listing.kept_ids) == (1, {"vault:notes/big.md"})


def test_empty_file_is_a_note_with_empty_text(make_vault: MakeVault) -> None:
    """An empty note is still a note (so deleting its content does not delete it from the index)."""
    note, warnings = only_note(make_vault, "", rel="empty.md")
    assert (note.text, note.title, warnings) == ("", "empty", [])


def test_unreadable_file_keeps_its_indexed_copy(make_vault: MakeVault) -> None:
    """A permission error puts the id in `kept_ids` so the sync does not delete the note."""
    root = make_vault({"locked.md": "secret", "ok.md": "ok"})
    (root / "locked.md").chmod(0)
    try:
        with as_an_ordinary_user():
            listing = scan(root)
    finally:
        (root / "locked.md").chmod(0o644)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert listing.kept_ids == {"vault:notes/locked.md"}
    assert listing.warnings == ["locked.md: cannot be read (Permission denied); its indexed copy is kept"]


def test_file_modes_hold_for_root_only_inside_the_ordinary_user_block(make_vault: MakeVault) -> None:
    """The permission tests run as root in CI: inside the block a mode-0 file cannot be read, after it root is root."""
    root = make_vault({"locked.md": "secret"})
    (root / "locked.md").chmod(0)
    try:
        readable_before = os.access(root / "locked.md", os.R_OK)  # True for root only
        with as_an_ordinary_user(), pytest.raises(PermissionError):
            (root / "locked.md").read_text(encoding="utf-8")
        assert os.access(root / "locked.md", os.R_OK) == readable_before, "root's privileges come back after it"
    finally:
        (root / "locked.md").chmod(0o644)


def test_a_note_that_cannot_be_opened_keeps_its_indexed_copy(make_vault: MakeVault) -> None:
    """Any read error, here a symlink loop (readable even by root), keeps the id instead of dropping it."""
    root = make_vault({"ok.md": "ok"})
    (root / "loop.md").symlink_to("loop.md")
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert listing.kept_ids == {"vault:notes/loop.md"}
    assert listing.warnings == ["loop.md: cannot be read (Too many levels of symbolic links); its indexed copy is kept"]
    assert listing.skipped == 1


def test_a_fifo_named_md_is_skipped_not_read(make_vault: MakeVault) -> None:
    """Reading a named pipe would block the scan forever."""
    root = make_vault({"ok.md": "ok"})
    os.mkfifo(root / "pipe.md")
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert (listing.warnings, listing.skipped) == (["pipe.md: not a regular file; skipped"], 1)


def test_a_folder_named_like_a_note_is_walked_as_a_folder(make_vault: MakeVault) -> None:
    """`x.md/` is a directory: its notes are listed, it is not itself a note."""
    listing = scan(make_vault({"x.md/inner.md": "inner"}))
    assert ([r.id for r in listing.records], listing.warnings) == (["vault:notes/x.md/inner.md"], [])


def test_an_unlistable_folder_fails_the_scan_instead_of_hiding_its_notes(make_vault: MakeVault) -> None:
    """A partial listing would make the sync delete every note in that folder."""
    root = make_vault({"ok.md": "ok", "private/a.md": "a"})
    (root / "private").chmod(0)
    try:
        with as_an_ordinary_user(), pytest.raises(VaultError, match="private"):
            scan(root)
    finally:
        (root / "private").chmod(0o755)


def test_an_unlistable_root_fails_the_scan_instead_of_listing_nothing(make_vault: MakeVault) -> None:
    """An empty listing of an unreadable vault would make the sync delete every note (e.g. macOS privacy denials)."""
    root = make_vault({"ok.md": "ok"})
    root.chmod(0o311)
    try:
        with as_an_ordinary_user(), pytest.raises(VaultError, match="cannot list the vault folder"):
            scan(root)
    finally:
        root.chmod(0o755)


def test_broken_symlink_is_skipped_with_a_warning(make_vault: MakeVault) -> None:
    """A link to a note that no longer exists is reported, not silently dropped."""
    root = make_vault({"ok.md": "ok"})
    (root / "gone.md").symlink_to(root / "missing.md")
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert (listing.warnings, listing.skipped, listing.kept_ids) == (["gone.md: broken symlink; skipped"], 1, set())


# --- symlinks -----------------------------------------------------------------------------------------------------


def test_symlink_to_a_file_outside_the_vault_is_skipped(make_vault: MakeVault, tmp_path: Path) -> None:
    """Only the vault's own notes are indexed."""
    outside = tmp_path / "outside.md"
    outside.write_text("private", encoding="utf-8")
    root = make_vault({"ok.md": "ok"})
    (root / "link.md").symlink_to(outside)
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert listing.warnings == ["link.md: symlink points outside the vault; skipped"]


def test_symlink_to_a_folder_outside_the_vault_is_skipped(make_vault: MakeVault, tmp_path: Path) -> None:
    """A linked-in folder from elsewhere is not walked."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.md").write_text("x", encoding="utf-8")
    root = make_vault({"ok.md": "ok"})
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert listing.warnings == ["linked: symlink points outside the vault; skipped"]


def test_a_symlink_loop_ends_and_lists_each_note_once(make_vault: MakeVault) -> None:
    """A folder link to an ancestor is reported and not followed."""
    root = make_vault({"top.md": "t", "a/b/deep.md": "d"})
    (root / "a" / "b" / "up").symlink_to(root / "a", target_is_directory=True)
    listing = scan(root)
    assert [r.id for r in listing.records] == ["vault:notes/a/b/deep.md", "vault:notes/top.md"]
    assert listing.warnings == ["a/b/up: symlink to an enclosing folder (a loop); skipped"]


def test_symlink_to_another_note_in_the_vault_is_allowed(make_vault: MakeVault) -> None:
    """A file link inside the vault is a second name for the note and is listed under it."""
    root = make_vault({"real.md": "shared"})
    (root / "alias.md").symlink_to(root / "real.md")
    listing = scan(root)
    assert {str(r.metadata["path"]): r.text for r in listing.records} == {"alias.md": "shared", "real.md": "shared"}
    assert listing.warnings == []


def test_symlinked_folder_inside_the_vault_does_not_rename_its_notes(make_vault: MakeVault) -> None:
    """Notes of a linked folder keep their real path, whichever name the walk meets first, and are listed once."""
    root = make_vault({"projects/2024/plan.md": "plan"})
    (root / "a-shortcut").symlink_to(root / "projects" / "2024", target_is_directory=True)
    listing = scan(root)
    assert ([r.id for r in listing.records], listing.warnings) == (["vault:notes/projects/2024/plan.md"], [])


def test_symlink_into_a_hidden_folder_is_followed(make_vault: MakeVault) -> None:
    """A dot-folder is skipped, but a visible link into it is an explicit choice to include its notes."""
    root = make_vault({".stash/kept.md": "kept"})
    (root / "stash").symlink_to(root / ".stash", target_is_directory=True)
    (root / "again").symlink_to(root / ".stash", target_is_directory=True)
    listing = scan(root)
    assert ([r.id for r in listing.records], listing.warnings) == (["vault:notes/again/kept.md"], [])


def test_missing_root_raises_vault_error_naming_the_path(tmp_path: Path) -> None:
    """The whole vault being absent is an error, not an empty listing (which would delete every note)."""
    missing = tmp_path / "no-such-vault"
    with pytest.raises(VaultError, match=str(missing)):
        scan(missing)
    (tmp_path / "file.md").write_text("x", encoding="utf-8")
    with pytest.raises(VaultError, match="not a directory"):
        scan(tmp_path / "file.md")


def test_root_given_through_a_symlink(make_vault: MakeVault, tmp_path: Path) -> None:
    """A vault opened via a linked path lists its notes relative to that path, named after the real folder."""
    root = make_vault({"a.md": "a"}, name="real-vault")
    (tmp_path / "shortcut").symlink_to(root, target_is_directory=True)
    listing = scan(tmp_path / "shortcut")
    assert ([r.id for r in listing.records], listing.warnings) == (["vault:real-vault/a.md"], [])


# --- unchanged files: decided before parsing ---------------------------------------------------------------------

FRONTMATTER_NOTES = {
    "a.md": "---\ntitle: Alpha\ntags: [x]\n---\nSee [[b]].",
    "b.md": "---\ntitle: Beta\n---\nbeta",
    "sub/c.md": "# Gamma\n\ngamma",
}


def test_files_whose_bytes_match_their_signature_are_listed_without_parsing(
    make_vault: MakeVault, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second pass parses nothing: each note is listed in `unchanged_ids` from its bytes alone."""
    root = make_vault(FRONTMATTER_NOTES)
    first = scan(root)
    assert set(first.signatures) == {r.id for r in first.records} and len(first.records) == 3
    parsed: list[str] = []
    original = VaultScanner.parse
    monkeypatch.setattr(VaultScanner, "parse", lambda self, rel, *a: parsed.append(rel) or original(self, rel, *a))
    again = VaultScanner(root).scan(first.signatures)
    assert (again.records, parsed, again.signatures) == ([], [], {})
    assert again.unchanged_ids == set(first.signatures)
    os.utime(root / "b.md", (1_700_000_000, 1_700_000_000))  # touched, same bytes: still unchanged
    (root / "a.md").write_text(FRONTMATTER_NOTES["a.md"] + " Edited.", encoding="utf-8")
    edited = VaultScanner(root).scan(first.signatures)
    assert (parsed, [r.id for r in edited.records]) == (["a.md"], ["vault:notes/a.md"])
    assert edited.unchanged_ids == {"vault:notes/b.md", "vault:notes/sub/c.md"}
    assert edited.signatures["vault:notes/a.md"] != first.signatures["vault:notes/a.md"]


def test_a_record_depends_only_on_its_own_path_and_bytes(make_vault: MakeVault) -> None:
    """Why bytes decide: links are kept as written (resolved at search time) and nothing is taken from other files,
    so renaming, retitling or deleting a linked note leaves every other record as it was."""
    root = make_vault(FRONTMATTER_NOTES)
    before = {r.id: r.content_hash for r in scan(root).records}
    (root / "b.md").write_text("---\ntitle: Renamed\n---\nnew", encoding="utf-8")
    (root / "sub" / "c.md").rename(root / "c.md")
    (root / "new.md").write_text("# a\n\n[[a]]", encoding="utf-8")
    after = {r.id: r.content_hash for r in scan(root).records}
    assert after["vault:notes/a.md"] == before["vault:notes/a.md"]


def test_a_note_with_a_warning_gets_no_signature_so_it_is_warned_about_every_time(make_vault: MakeVault) -> None:
    """Skipping it would also skip its warning: bad UTF-8 and broken frontmatter are parsed (and reported) again."""
    root = make_vault({"ok.md": "ok", "bad.md": b"\xff bad", "fm.md": "---\na: [\n---\nbody"})
    first = scan(root)
    assert set(first.signatures) == {"vault:notes/ok.md"}
    again = VaultScanner(root).scan(first.signatures)
    assert [r.id for r in again.records] == ["vault:notes/bad.md", "vault:notes/fm.md"]
    assert [w.split(":")[0] for w in again.warnings] == ["bad.md", "fm.md"]


def test_a_signature_covers_the_parsing_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A change to the code that builds records invalidates every signature: old records are rebuilt, not trusted."""
    from readers import markdown_syntax

    before = file_signature(b"same bytes")
    changed = tmp_path / "markdown_syntax.py"
    changed.write_bytes(Path(markdown_syntax.__file__).read_bytes() + b"\n# a change\n")
    monkeypatch.setattr(markdown_syntax, "__file__", str(changed))
    vault_scanner._parser_stamp.cache_clear()
    try:
        assert file_signature(b"same bytes") != before
    finally:
        monkeypatch.undo()
        vault_scanner._parser_stamp.cache_clear()
    assert file_signature(b"same bytes") == before != file_signature(b"other bytes")


# --- deep folders -------------------------------------------------------------------------------------------------


def test_a_folder_nested_1100_deep_is_cut_at_the_cap_and_the_rest_lists(
    make_vault: MakeVault, deep_folder: Callable[[Path, int], Path]
) -> None:
    """No recursion: the walk neither overflows nor fails; notes down to the cap are listed, the folder below is
    named in a warning."""
    root = make_vault({"top.md": "top", "z/after.md": "after"})
    (deep_folder(root, 1100) / "bottom.md").write_text("bottom", encoding="utf-8")
    (root.joinpath(*["d"] * MAX_FOLDER_DEPTH) / "at-cap.md").write_text("at cap", encoding="utf-8")
    listing = scan(root)
    at_cap = "/".join(["d"] * MAX_FOLDER_DEPTH) + "/at-cap.md"
    assert [r.metadata["path"] for r in listing.records] == [at_cap, "top.md", "z/after.md"]
    too_deep = "/".join(["d"] * (MAX_FOLDER_DEPTH + 1))
    assert listing.warnings == [f"{too_deep}: folder nested deeper than {MAX_FOLDER_DEPTH} levels; skipped"]


def test_a_path_too_long_to_open_is_skipped_with_a_warning(make_vault: MakeVault) -> None:
    """Folders whose full path passes the system's limit (made here through folder handles) cannot be listed by
    path; their notes could never be read, so they are named and skipped instead of failing the vault."""
    root = make_vault({"ok.md": "ok"})
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(20):
            os.mkdir("n" * 250, dir_fd=fd)
            child = os.open("n" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("lost.md", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    listing = scan(root)
    assert [r.metadata["path"] for r in listing.records] == ["ok.md"]
    assert len(listing.warnings) == 1
    assert listing.warnings[0].endswith(": path too long for the system to open; skipped")


# --- the bundled sample vault -------------------------------------------------------------------------------------


def test_sample_vault() -> None:
    """41 notes, `.obsidian` skipped, no warnings, and a few known notes read as written."""
    listing = scan(SAMPLE_VAULT)
    notes = by_path(listing)
    assert (len(listing.records), listing.warnings, listing.kept_ids, listing.skipped) == (41, [], set(), 0)
    assert not any(path.startswith(".") for path in notes)
    assert listed(notes["生活/电影清单.md"], "tags") == ["电影", "清单"]
    assert "不存在的笔记" in listed(notes["index.md"], "links")
    assert notes["index.md"].title == "首页"
    assert notes["tech/vim-notes.md"].title == "vim-notes"
    assert notes["daily/2024-03-15.md"].metadata["created"] == "2024-03-15T00:00:00Z"
    assert notes["index.md"].id == "vault:sample_vault/index.md"
