"""The link graph: wikilinks, frontmatter links and Memos relations, resolved to note ids; backlinks; broken links."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

from rag_app.index.keyword import tokenize
from readers.markdown_syntax import parse_wikilinks, piped_target
from readers.records import decode_list


@dataclass
class LinkGraph:
    outgoing: dict[str, list[str]] = field(default_factory=dict)
    backlinks: dict[str, list[str]] = field(default_factory=dict)
    broken: dict[str, list[str]] = field(default_factory=dict)
    private: set[str] = field(default_factory=set)  # PRIVATE memos: shells hide them from agents unless allowed

    @staticmethod
    def build(notes: dict[str, dict[str, Any]], text_of: Callable[[str], str] | None = None,
              resolver: LinkResolver | None = None) -> LinkGraph:
        """The graph of every note's links (`resolver`: one already made over these notes). With `text_of` (a
        note's text), a link its target does not resolve is read again from the note: Dendron writes
        `[[label|note]]`, and the label is what the metadata keeps."""
        graph = LinkGraph()
        resolver = resolver or LinkResolver(notes)
        for note_id, meta in notes.items():
            if meta.get("kind") == "memos" and meta.get("visibility") == "PRIVATE":
                graph.private.add(note_id)
            targets: list[str] = []
            piped: dict[str, list[str]] | None = None
            for raw in decode_list(meta.get("links")):
                target = resolver.resolve(raw, meta)
                if target is None and text_of is not None:
                    piped = _piped(text_of(note_id)) if piped is None else piped
                    target = next(filter(None, (resolver.resolve(n, meta) for n in piped.get(raw, ()))), None)
                if target is None:
                    graph.broken.setdefault(note_id, []).append(raw)
                elif target != note_id and target not in targets:
                    targets.append(target)
            parent = meta.get("parent")
            if isinstance(parent, str) and parent in notes and parent not in targets:
                targets.append(parent)
            graph.outgoing[note_id] = targets
            for target in targets:
                graph.backlinks.setdefault(target, []).append(note_id)
        return graph

    def stats(self) -> dict[str, int]:
        return {
            "notes": len(self.outgoing),
            "links": sum(len(v) for v in self.outgoing.values()),
            "broken_links": sum(len(v) for v in self.broken.values()),
            "orphans": sum(1 for n, out in self.outgoing.items() if not out and not self.backlinks.get(n)),
        }


def _piped(text: str) -> dict[str, list[str]]:
    """Per link target as the metadata keeps it, the notes the text after its pipes may name."""
    names: dict[str, list[str]] = {}
    for link in parse_wikilinks(text):
        if link.alias and (name := piped_target(link.alias)):
            names.setdefault(link.target, []).append(name)
    return names


class LinkResolver:
    """Obsidian-style resolution: a path, a file name, a title or an alias; the linking note's own vault first."""

    def __init__(self, notes: dict[str, dict[str, Any]]):
        self.notes = notes
        self.keys: dict[tuple[str, str], list[str]] = {}
        for note_id, meta in notes.items():
            source = str(meta.get("source") or "")
            names = {str(meta.get("title") or "")}
            if meta.get("path"):
                path = PurePosixPath(str(meta["path"]))
                names |= {str(path.with_suffix("")), path.stem, str(path)}
            names |= set(decode_list(meta.get("aliases")))
            for name in names:
                if name:
                    self.keys.setdefault((source, name.lower()), []).append(note_id)
                    self.keys.setdefault(("*", name.lower()), []).append(note_id)

    def named(self, token: str) -> set[str]:
        """The notes whose title, file name, folder or an alias holds a word (as BM25 tokenizes it): what a link,
        and a person, may call a note though its text never says it."""
        return self._name_tokens.get(token, set())

    @cached_property
    def _name_tokens(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for (scope, name), note_ids in self.keys.items():
            if scope == "*":
                for token in tokenize(name):
                    out.setdefault(token, set()).update(note_ids)
        return out

    def resolve(self, raw: str, meta: Mapping[str, Any], visible: Callable[[str], bool] | None = None) -> str | None:
        """The note a link names, or None; with `visible`, among the notes it allows only (a search that may not
        show a note resolves as if it were not there, so what it shows says nothing of the hidden one)."""
        def shown(note_id: str) -> bool:
            return visible is None or visible(note_id)

        if raw in self.notes and shown(raw):
            return raw
        name = raw.strip().removesuffix(".md").lower()
        for scope in (str(meta.get("source") or ""), "*"):
            found = [n for n in self.keys.get((scope, name), []) if shown(n)]
            if found:
                return sorted(found, key=len)[0]
        return None
