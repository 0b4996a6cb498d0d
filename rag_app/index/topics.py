"""What each note is about, in a few words: its title, aliases, tags and headings, embedded by the packaged fast
model (USE-m3).

A person asks their notes topically ("观影", "movies I want to watch"): the question shares no word with the note,
and its similarity to a long chunk stands no further out than an unrelated question's best hit. Its similarity to the
note's own names for itself does: on the sample vault the right note's best title, tag or heading scores 0.40–0.69
against such questions, while questions no note answers reach at most 0.42 (docs/retrieval.md, "Topical questions").
So the topics are a search channel of their own and evidence that a result is *about* the question.

The vectors are kept in the manifest by text (`topic_vectors`), filled by a sync right after the fast model's chunk
vectors and reused across notes that share a tag or title; a search reads them once per index generation.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag_app.config import FAST_EMBEDDING
from rag_app.index.manifest import Manifest
from readers.markdown_syntax import headings

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

TOPIC_MODEL = FAST_EMBEDDING
TOPICS_GENERATION = "topics_generation"  # meta: the index generation whose topics all have vectors
MAX_TOPIC_CHARS = 120  # a "heading" longer than this is a sentence, not a name
MAX_NOTE_TOPICS = 64  # names one chunk gives its note (the sample vault's most: 9)
LAZY_LIMIT = 256  # topics a search embeds itself when a sync has not (an older home): the rest wait for the next sync
HEADING_PARTS = " › "


def topics_of(meta: dict[str, object], text: str = "") -> list[str]:
    """A chunk's names for its note: title, its heading's last part (the title is its first), the headings inside its
    text (a short note is one chunk under its first heading), aliases, tags; at most `MAX_NOTE_TOPICS`, in that
    order (a note with 20,000 tags would otherwise cost 20 minutes of embedding, and no person names a note so)."""
    names = [str(meta.get("title") or "")]
    heading = str(meta.get("heading") or "")
    if heading:
        names.append(heading.rsplit(HEADING_PARTS, 1)[-1])
    names += [title for _, title in headings(text)]  # not a `# comment` in a code block
    for key in ("aliases", "tags"):
        value = meta.get(key)
        try:
            names += [str(v) for v in (json.loads(value) if isinstance(value, str) else value or [])]
        except ValueError:
            continue
    return [n.strip() for n in names if n.strip() and len(n.strip()) <= MAX_TOPIC_CHARS][:MAX_NOTE_TOPICS]


def note_topics(manifest: Manifest) -> list[tuple[str, str]]:
    """(note id, topic) pairs of every note, each pair once."""
    seen: set[tuple[str, str]] = set()
    out: list[tuple[str, str]] = []
    for note_id, text, meta in manifest.chunk_topic_rows():
        for topic in topics_of(meta, text):
            if (note_id, topic) not in seen:
                seen.add((note_id, topic))
                out.append((note_id, topic))
    return out


def fill_topics(manifest: Manifest, embed: Callable[[list[str]], list[list[float]]], batch: int = 256,
                stop: Callable[[], bool] = lambda: False) -> int:
    """Embed the topics that have no vector yet (a sync, after the fast model's chunks); returns how many. Topics no
    note names any more are dropped. Cheap when nothing changed: the index generation is compared first."""
    generation = manifest.generation()
    if manifest.get_meta(TOPICS_GENERATION) == generation:
        return 0
    pairs = note_topics(manifest)
    wanted = sorted({topic for _, topic in pairs})
    missing = manifest.topics_without_vectors(wanted)
    import numpy as np

    for start in range(0, len(missing), batch):
        if stop():
            return start
        texts = missing[start : start + batch]
        vectors = np.asarray(embed(texts), dtype=np.float32)
        with manifest.transaction():
            manifest.put_topic_vectors(list(zip(texts, (v.tobytes() for v in vectors), strict=True)))
    with manifest.transaction():
        manifest.keep_topic_vectors(wanted)
        manifest.put_note_topics(pairs)
        manifest.set_meta(TOPICS_GENERATION, generation)
    return len(missing)


@dataclass
class TopicIndex:
    """Every note's topics (rows): the note and the text of each row, and unit vectors of the topics. With
    `row_vector`, `vectors` holds each distinct text once and row i's vector is `vectors[row_vector[i]]` (a heading
    shared by many notes is one vector: at 25,000 notes one row per vector was ~300 MB); without it, one per row."""

    notes: list[str]
    texts: list[str]
    vectors: np.ndarray
    row_vector: np.ndarray | None = None

    @staticmethod
    def load(manifest: Manifest, embed: Callable[[list[str]], list[list[float]]] | None = None) -> TopicIndex:
        """The home's topics with their stored vectors; up to LAZY_LIMIT missing ones are embedded with `embed` (an
        older home, or a sync still running), the rest are left out until a sync fills them."""
        import numpy as np

        if manifest.get_meta(TOPICS_GENERATION) == manifest.generation():  # a sync filled them: one read
            rows = manifest.stored_note_topics()
            return TopicIndex._of([(n, t) for n, t, _ in rows], {t: v for _, t, v in rows})
        pairs = note_topics(manifest)
        stored = manifest.topic_vectors(sorted({t for _, t in pairs}))
        missing = sorted({t for _, t in pairs if t not in stored})
        if missing and embed is not None:
            fresh = missing[:LAZY_LIMIT]
            vectors = np.asarray(embed(fresh), dtype=np.float32)
            stored.update({t: v.tobytes() for t, v in zip(fresh, vectors, strict=True)})
            if len(missing) > LAZY_LIMIT:
                log.info("%d note topics wait for the next sync to be searchable by topic", len(missing) - LAZY_LIMIT)
        return TopicIndex._of([(n, t) for n, t in pairs if t in stored], stored)

    @staticmethod
    def _of(kept: list[tuple[str, str]], stored: dict[str, bytes]) -> TopicIndex:
        import numpy as np

        if not kept:
            return TopicIndex([], [], np.zeros((0, 0), dtype=np.float32))
        kept = sorted(kept, key=lambda pair: pair[0])  # a note's rows together (best reads them as groups)
        distinct = list(dict.fromkeys(t for _, t in kept))
        place = {t: i for i, t in enumerate(distinct)}
        matrix = np.stack([np.frombuffer(stored[t], dtype=np.float32) for t in distinct])
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return TopicIndex([n for n, _ in kept], [t for _, t in kept], matrix / np.where(norms > 0, norms, 1.0),
                          np.asarray([place[t] for _, t in kept], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.notes)

    def best(self, query_vectors: Iterable[list[float]], allowed: set[str] | None = None, top: int | None = None,
             include: Iterable[str] = ()) -> dict[str, tuple[float, str]]:
        """Per note: its best topic's cosine to the query (the better of the query's forms per topic) and that topic,
        best first; only notes in `allowed` when given. `top`: only the `top` best notes, and those of `include`
        (a search reads the first few and its results': at 25,000 notes a dict of every note cost ~220 ms)."""
        if not len(self):
            return {}
        import numpy as np

        queries = np.asarray(list(query_vectors), dtype=np.float32)
        queries /= np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
        sims = (self.vectors @ queries.T).max(axis=1)
        if self.row_vector is not None:
            sims = sims[self.row_vector]
        note_names, starts, place = self._groups
        per_note = np.maximum.reduceat(sims, starts)
        if allowed is not None:
            per_note = np.where(np.fromiter((n in allowed for n in note_names), dtype=bool, count=len(note_names)),
                                per_note, -np.inf)
        if top is None or top >= len(per_note):
            order = np.argsort(-per_note, kind="stable")
        else:  # the `top` best and the notes asked for, best first: no pass over every note in Python
            picked = {*np.argpartition(-per_note, top)[:top].tolist(), *(place[n] for n in include if n in place)}
            order = sorted(picked, key=lambda i: (-per_note[i], i))
        ends = np.append(starts[1:], len(sims))
        out: dict[str, tuple[float, str]] = {}
        for i in order:
            if per_note[i] == -np.inf:
                break
            row = starts[i] + int(np.argmax(sims[starts[i]:ends[i]]))
            out[note_names[i]] = (float(per_note[i]), self.texts[row])
        return out

    @functools.cached_property
    def _groups(self) -> tuple[list[str], Any, dict[str, int]]:
        """The notes in row order, where each note's rows start (rows are grouped by note: `_of`), and each note's
        place in that order."""
        import numpy as np

        starts = [i for i, note in enumerate(self.notes) if i == 0 or note != self.notes[i - 1]]
        names = [self.notes[i] for i in starts]
        return names, np.asarray(starts, dtype=np.int64), {note: i for i, note in enumerate(names)}
