"""The agent tools (search_notes, get_note, related_notes, brain_status; capture_note when enabled), written once.

`BrainTools` holds the privacy and output shaping and runs every call through tools.contract (the one argument and
error contract); `brain_tools()` wraps it as LlamaIndex FunctionTools and tools.mcp_server wraps the same object for
MCP. Annotations here stay real objects (no `from __future__ import annotations`): the wrappers and the contract read
the `Annotated[..., Field(...)]` parameters, so the schema an agent sees and the checks it meets are one declaration.
"""

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

from pydantic import Field

from rag_app.engine import (
    MAX_CAPTURE_BYTES,
    MAX_QUERIES,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    Brain,
    CaptureError,
    ConfigError,
    NoteNotFound,
    SearchError,
    SourceError,
)
from tools.brief import PASSAGE_CHARS, PREVIEW_CHARS, REPLY_CHARS, brief_results
from tools.contract import ToolCallError, check_arguments, refusal, usage

if TYPE_CHECKING:
    from llama_index.core.tools import FunctionTool, ToolOutput

__all__ = ["CAPTURE_TOOL", "TOOL_NAMES", "BrainTools", "ToolCallError", "ToolReply", "brain_tools"]

log = logging.getLogger("cflow_brain.tools")

TOOL_NAMES = ("search_notes", "get_note", "related_notes", "brain_status")  # always offered
CAPTURE_TOOL = "capture_note"  # offered only when config.toml has [capture] enabled = true
AUDIENCE = "agent"  # PRIVATE memos stay hidden unless config.toml has [mcp] allow_private = true
MAX_K = 20
MAX_QUERY_CHARS = 2_000
MAX_FILTER_CHARS = 200
MAX_DATE_CHARS = 32
MAX_NOTE_ID_CHARS = 1_024
NOTE_CHARS = 20_000
MAX_LINKS = 50  # the most items of any list in a reply (links, backlinks, tags, aliases, results' tags, ...)
FIELD_CHARS = 2_000  # the longest string in a reply besides a note's text
MAX_REPLY_BYTES = 256_000  # one reply, whatever the notes hold; beyond it `reply_capped` says what was cut
MAX_CUT_PATHS = 20
RELATED_K = 8
COVERAGE_KEYS = ("queries", "filters", "time_phrase", "channels", "filling_vectors", "freshness", "not_found",
                 "topics", "translation", "translation_language", "store_down", "no_note_matches_filters",
                 "unmentioned")
NOTE_ID_HINT = "note ids come from search_notes or related_notes results (never a file path)"
INTERNAL_HINT = "retry once; if it fails again, tell the user (details in brain.log; brain doctor checks the index)"

NoteId = Annotated[str, Field(
    description="A note id from search_notes or related_notes, e.g. 'vault:notes/生活/电影清单.md' or "
                "'memos:cflow/7rJq2h'. Never a file path.",
    min_length=1, max_length=MAX_NOTE_ID_CHARS)]


class ToolReply(NamedTuple):
    """What every shell sends back: JSON text, and whether it is an error (MCP sets isError from it)."""

    text: str
    is_error: bool


class BrainTools:
    """One Brain behind the agent tools. The tool methods' docstrings are the descriptions agents read.

    LlamaIndex and MCP call tools from whichever thread or event loop they like; the engine serialises its own use
    of the index, so calls go straight to it (async ones on a worker thread, to keep the event loop free).
    """

    def __init__(self, brain: Brain) -> None:
        self.brain = brain

    def tool_names(self) -> tuple[str, ...]:
        """The tools this brain offers: capture_note only when capture is enabled (otherwise it does not exist)."""
        return TOOL_NAMES + ((CAPTURE_TOOL,) if self.brain.capture_enabled else ())

    def search_notes(
        self,
        query: Annotated[str, Field(
            description="What to look for, in the user's words (Chinese or English): the main query.",
            max_length=MAX_QUERY_CHARS)],
        queries: Annotated[list[Annotated[str, Field(max_length=MAX_QUERY_CHARS)]] | None, Field(
            description=f"Besides `query`: your own rewrites of the question (literal words, synonyms, the other "
                        f"language, tags), up to {MAX_QUERIES - 1} per call ({MAX_QUERIES} texts with `query`).",
            max_length=MAX_QUERIES - 1)] = None,
        k: Annotated[int, Field(description=f"How many notes to return, 1 to {MAX_K}.", ge=1, le=MAX_K)] = 8,
        source: Annotated[str | None, Field(
            description="Only this source: a source name from brain_status, or 'vault' or 'memos'.",
            max_length=MAX_FILTER_CHARS)] = None,
        tag: Annotated[str | None, Field(
            description="Only notes with this tag or one of its sub-tags, without '#'.",
            max_length=MAX_FILTER_CHARS)] = None,
        since: Annotated[str | None, Field(
            description="Only notes dated on or after this day, YYYY-MM-DD.", max_length=MAX_DATE_CHARS)] = None,
        until: Annotated[str | None, Field(
            description="Only notes dated on or before this day, YYYY-MM-DD.", max_length=MAX_DATE_CHARS)] = None,
        detail: Annotated[Literal["brief", "passages"], Field(
            description=f"'brief' (default): one preview of at most {PREVIEW_CHARS} characters per note. "
                        f"'passages': the passages that matched instead (up to 3 per note, {PASSAGE_CHARS:,} "
                        "characters each), for an inventory or to compare notes without opening each.")] = "brief",
    ) -> dict[str, Any]:
        """Search the user's own notes (Markdown vaults and Memos) by meaning and by words, Chinese or English.

        Returns up to k notes, best first, each with note_id (for get_note and related_notes), title, path or url,
        `relevance` (0 to 1: how likely the note answers the query, the same scale in every call) and `strength`
        from it (strong: likely answers; related: may help; weak: a lead only), dates, tags and a `preview`: the
        sentences that best match, at most 300 characters, and `topic` (the title, tag or heading closest to the
        query). `answer_state`: "found" (a note is strong or related), "unsure" (none is, but the first notes are
        close: say the notes may cover it and name them as possible matches) or "not_found" (nothing close: say the
        notes do not hold it rather than answer from weak leads; `not_found` is true then only). Read a note with
        get_note; ask for detail="passages" only to see the matched passages of many notes at once. The server does
        not rewrite the query beyond matching its notes' titles, tags and headings: pass your own variants in
        `queries`. A time phrase in the query (上个月, last week) filters by date unless
        since/until are given. `coverage` says which queries ran, which filters applied and which search channels
        were skipped or still being filled. Cite the notes you use by title and path or url.
        """
        texts = [t for t in (_stripped(query), *(_stripped(q) for q in queries or ())) if t]
        if not texts:
            raise ToolCallError("query is empty: give the text to search for", usage(self.search_notes))
        main, variants = texts[0], [t for t in dict.fromkeys(texts[1:]) if t != texts[0]]
        response = self.brain.search(
            main, k,
            sources=_one(source), tags=_one(tag), since=_stripped(since), until=_stripped(until),
            variants=variants or None, expand=False, audience=AUDIENCE,
        )
        coverage = _brief_coverage(response.coverage)
        room = REPLY_CHARS - len(_json({"query": main, "answer_state": response.answer_state,
                                        "not_found": response.not_found, "results": [], "coverage": coverage}))
        return {
            "query": main,
            "answer_state": response.answer_state,
            "not_found": response.not_found,
            "results": brief_results(response.results, coverage.get("queries") or texts, detail, room),
            "coverage": coverage,
        }

    def get_note(
        self,
        note_id: NoteId,
        fresh: Annotated[bool, Field(
            description="Read the note again from its source (the vault file, the Memos server) instead of the "
                        "index; the reply says `stale` when the indexed copy differs.")] = False,
    ) -> dict[str, Any]:
        """Read one note in full, with its metadata, tags, dates, outgoing links and backlinks.

        The text is capped at 20,000 characters (`truncated` and `chars` say when it was cut), lists at 50 items
        (`<list>_total` gives the full count). Use it after search_notes when an excerpt is not enough. With
        fresh=true the text is the source's current one: `stale` true means the index has an older copy (quote the
        fresh text), `deleted_at_source` true means the note is gone from its source.
        """
        return self.brain.get_note(_note_id(note_id), max_chars=NOTE_CHARS, audience=AUDIENCE, fresh=fresh)

    def related_notes(self, note_id: NoteId) -> dict[str, Any]:
        """Notes around one note: those it links to, those linking to it, then the nearest ones in meaning.

        Use it to explore from a note found by search_notes (a project's other notes, earlier thoughts on it).
        """
        return self.brain.related(_note_id(note_id), k=RELATED_K, audience=AUDIENCE)

    def brain_status(self) -> dict[str, Any]:
        """What the notes index holds: note and chunk counts per source (vault or Memos), when each source
        last synced and whether that sync failed, and the embedding model.

        Use it to say how fresh the notes are, or why a search finds nothing.
        """
        status = self.brain.status()
        return {
            "notes": status["notes"],
            "chunks": status["chunks"],
            "sources": status["sources"],
            "channels": status["channels"],
            "embedding_model": status["embedding_model"],
            "private_memos_visible": self.brain.agents_see_private,
            "capture_enabled": self.brain.capture_enabled,
        }

    def capture_note(
        self,
        text: Annotated[str, Field(
            description="The note's content (Markdown), at most 100 KB.", min_length=1,
            max_length=MAX_CAPTURE_BYTES)],
        title: Annotated[str | None, Field(
            description="A one-line title; default: the text's first line.", max_length=MAX_TITLE_CHARS)] = None,
        tags: Annotated[list[str] | None, Field(
            description="Tags without '#', e.g. ['reading', 'projects/brain'].", max_length=MAX_TAGS)] = None,
    ) -> dict[str, Any]:
        """Save a new note into the user's notes (the inbox folder of their vault, or a PRIVATE memo) and index it
        at once, so search_notes finds it in this session. Returns its note_id.

        Only save what the user asked to keep (a decision, a summary, a link); never overwrites anything.
        """
        saved = self.brain.capture(text, title, tags)
        if saved.get("visibility") == "PRIVATE" and not self.brain.agents_see_private:
            saved["hidden_from_agents"] = True  # saved and indexed, but [mcp] allow_private keeps it from search_notes
        return saved

    @staticmethod
    def description(name: str) -> str:
        return inspect.getdoc(getattr(BrainTools, name)) or name

    def call(self, name: str, arguments: object, positional: Sequence[object] = ()) -> ToolReply:
        return self._invoke(name, arguments, positional)

    async def acall(self, name: str, arguments: object, positional: Sequence[object] = ()) -> ToolReply:
        return await asyncio.to_thread(self._invoke, name, arguments, positional)

    def _invoke(self, name: str, arguments: object, positional: Sequence[object] = ()) -> ToolReply:
        """Run one tool through the contract: every refusal is `{"error", "tool", "hint"}` JSON, never a traceback."""
        method = getattr(self, name) if name in self.tool_names() else None
        try:
            if method is None:
                raise ToolCallError("unknown tool", f"the tools are {', '.join(self.tool_names())}")
            return ToolReply(capped_json(method(**check_arguments(method, arguments, positional))), False)
        except ToolCallError as exc:
            return _refused(name[:MAX_FILTER_CHARS], str(exc), exc.hint or usage(method))
        except NoteNotFound as exc:
            return _refused(name, str(exc), NOTE_ID_HINT)
        except (SearchError, CaptureError) as exc:  # an argument the engine refused (a date, a source, a tag)
            return _refused(name, str(exc), usage(method))
        except ConfigError as exc:
            return _refused(name, str(exc), "the user's config.toml decides this: tell the user, do not retry")
        except SourceError as exc:
            return _refused(name, str(exc), "the source could not be read now: without fresh=true the indexed "
                                            "copy is returned")
        except Exception:  # the agent gets one line; the traceback goes to brain.log
            log.exception("tool %s failed", name)
            return _refused(name, "internal error in the notes index", INTERNAL_HINT)


def brain_tools(brain: Brain) -> list["FunctionTool"]:
    """The tools as LlamaIndex FunctionTools for any agent (FunctionAgent, ReActAgent); results are JSON text, and a
    refusal is a ToolOutput with is_error=True. capture_note is among them only when capture is enabled."""
    from llama_index.core.tools import FunctionTool  # here, not at the top: the MCP server starts without it

    class BrainFunctionTool(FunctionTool):
        """A FunctionTool whose output carries the contract's is_error (FunctionTool itself only sets it when the
        function raises, and ours never does)."""

        def call(self, *args: Any, **kwargs: Any) -> "ToolOutput":
            return _marked(super().call(*args, **kwargs))

        async def acall(self, *args: Any, **kwargs: Any) -> "ToolOutput":
            return _marked(await super().acall(*args, **kwargs))

    tools = BrainTools(brain)
    made = []
    for name in tools.tool_names():
        sync_fn, async_fn = _callables(tools, name)
        made.append(BrainFunctionTool.from_defaults(fn=sync_fn, async_fn=async_fn, name=name,
                                                    description=BrainTools.description(name)))
    return made


def _callables(tools: BrainTools, name: str) -> tuple[Callable[..., ToolReply], Callable[..., Any]]:
    """Sync and async entry points that keep the tool method's signature (the schema comes from it)."""
    method = getattr(tools, name)

    @functools.wraps(method)
    def call(*positional: Any, **arguments: Any) -> ToolReply:
        return tools.call(name, arguments, positional)

    @functools.wraps(method)
    async def acall(*positional: Any, **arguments: Any) -> ToolReply:
        return await tools.acall(name, arguments, positional)

    return call, acall


def _marked(output: "ToolOutput") -> "ToolOutput":
    """The ToolOutput of a ToolReply: its JSON text as content, its is_error as the output's."""
    from llama_index.core.tools import ToolOutput

    reply = output.raw_output
    return ToolOutput(tool_name=output.tool_name, content=reply.text, raw_input=output.raw_input,
                      raw_output=reply.text, is_error=reply.is_error)


def _refused(name: str, error: str, hint: str) -> ToolReply:
    return ToolReply(capped_json(refusal(name, error, hint)), True)


def _json(data: Any) -> str:
    """Compact JSON (no blanks after separators: a tenth of a search reply), Chinese as is."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)


def _stripped(value: str | None) -> str | None:
    """An optional text argument: blank means absent."""
    return (value or "").strip() or None


def _one(value: str | None) -> tuple[str, ...]:
    text = _stripped(value)
    return (text,) if text else ()


def _note_id(value: str) -> str:
    """Blank is refused here; the engine decides what a note id may look like (no paths, no traversal)."""
    if not value.strip():
        raise ToolCallError("note_id is empty", NOTE_ID_HINT)
    return value


def _brief_coverage(coverage: dict[str, Any]) -> dict[str, Any]:
    """What ran and what was missing, without the per-query channel weights (numbers agents cannot act on)."""
    shown = {key: coverage[key] for key in COVERAGE_KEYS if coverage.get(key) is not None}
    if "channels" in shown:
        shown["channels"] = {name: {key: value for key, value in channel.items() if key != "weights"}
                             for name, channel in shown["channels"].items()}
    if "filters" in shown:
        shown["filters"] = {key: value for key, value in shown["filters"].items() if value not in (None, "", [], ())}
    return shown


def capped_json(data: dict[str, Any], limit: int = MAX_REPLY_BYTES) -> str:
    """The reply as JSON of at most `limit` UTF-8 bytes, whatever a (hostile) note holds.

    Every list keeps MAX_LINKS items (`<key>_total` gives the full count) and every string FIELD_CHARS characters
    (a note's `text` NOTE_CHARS); if the reply is still too big, the largest parts are cut from their end (the last
    search results first). `reply_capped` lists what was cut, beside the lists' totals."""
    cut: list[str] = []  # the reply's own cuts first (they matter most), then the strings over FIELD_CHARS
    capped: list[str] = []
    shaped = _bounded(data, "", capped)
    room = limit - 100 - MAX_CUT_PATHS * (FIELD_CHARS // 10)  # what `reply_capped` itself may take
    size = _size(shaped)
    while size > room:
        _shrink(shaped, size - room, "", cut)
        size, before = _size(shaped), size
        if size >= before:  # nothing left to cut but keys: say so rather than send it
            shaped = {"error": "the reply was too large to send", "tool_reply_bytes": before}
            break
    cut += capped
    if cut:
        shaped["reply_capped"] = {"limit_bytes": limit, "cuts": len(cut),
                                  "cut": [where[:FIELD_CHARS // 10] for where in cut[:MAX_CUT_PATHS]]}
    return _json(shaped)


def _size(value: Any) -> int:
    return len(_json(value).encode())


def _bounded(value: Any, path: str, cut: list[str]) -> Any:
    """A copy with every list and string within its cap; `<key>_total` beside a list that was cut."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            key = str(key)[:FIELD_CHARS]
            if isinstance(item, list | tuple) and len(item) > MAX_LINKS:
                out[f"{key}_total"] = len(item)
            out[key] = _bounded(item, f"{path}.{key}" if path else key, cut)
        return out
    if isinstance(value, list | tuple):
        return [_bounded(item, f"{path}[{n}]", cut) for n, item in enumerate(value[:MAX_LINKS])]
    if isinstance(value, str):
        limit = NOTE_CHARS if path == "text" else FIELD_CHARS
        if len(value) > limit:
            cut.append(path)
            return value[:limit] + "…"
    return value


def _shrink(node: Any, excess: int, path: str, cut: list[str]) -> None:
    """Take about `excess` bytes from the end of the largest list or string under `node` (descending into the
    largest child): the last search results go first, then the longest texts."""
    entries = node.items() if isinstance(node, dict) else enumerate(node)
    sizes = {key: _size(child) for key, child in entries if isinstance(child, dict | list | str)}
    if not sizes:
        return
    key = max(sizes, key=sizes.__getitem__)
    child = node[key]
    where = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}" if path else str(key)
    if isinstance(child, str):
        node[key] = child[: max(0, len(child) - excess - 1)] + "…"
        cut.append(where)
    elif isinstance(child, list) and len(child) > 1:
        keep, size = len(child), sizes[key]
        while keep > 1 and size > sizes[key] - excess:
            keep -= 1
            size -= _size(child[keep]) + 1
        del child[keep:]
        cut.append(f"{where}[{keep}:]")
    else:
        _shrink(child, excess, where, cut)
