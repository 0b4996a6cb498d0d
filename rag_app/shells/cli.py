"""`brain`: parses arguments, calls the engine, prints text or JSON. No logic of its own."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from rag_app.answers.answer import NOT_FOUND, AnswerResponse, filters_text, readable_excerpt, unmentioned_clause
from rag_app.answers.llm import missing_message
from rag_app.answers.search_notes import search_notes
from rag_app.engine import (
    BackgroundWatch,
    Brain,
    ConfigError,
    DiskFull,
    HomeGone,
    NoteNotFound,
    SearchError,
    SourceError,
    SourceReport,
    StopRequested,
    StoreError,
    SyncBusyError,
    SyncReport,
    WatchBusy,
    claim_watch,
    release_watch,
    time_left,
)
from rag_app.shells import warm_engine
from rag_app.shells.agent_skill import SkillConflict, install_skill, skill_files

EXIT_FAILED, EXIT_USAGE, EXIT_BUSY, EXIT_INTERRUPTED = 1, 2, 3, 130
DEMO_HOME = ".brain-demo"  # where `make demo` keeps its notes (the Makefile's DEMO_HOME)


class TqdmProgress:
    """Progress bar on stderr (rate and time left), only on a terminal."""

    def __init__(self) -> None:
        self._bar: Any = None

    def start(self, total: int, description: str, unit: str = "chunk") -> None:
        from tqdm import tqdm  # here: ~25 ms that only a sync on a terminal spends

        self.close()
        self._bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True)

    def advance(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _open(ctx: click.Context, create: bool = False) -> Brain:
    """The home's Brain. Only the commands that fill it (sync, watch, serve, mcp) may `create` the home: reading one
    that does not exist is an error naming it, so a typo in --home leaves no empty index behind. A command run by the
    home's warm engine (rag_app.shells.warm_engine) gets the engine's open Brain."""
    served = warm_engine.served_brain()
    if served is not None:
        return served
    with _reported():
        brain = Brain(ctx.obj["home"], store_url=ctx.obj["store_url"])
    if not create and not brain.home.is_dir():
        _fail(f"no home at {brain.home.absolute()}: `brain sync --vault DIR` (or --memos URL) with this home creates "
              f"it{_demo_hint(brain.home)}", EXIT_USAGE)
    for notice in brain.notices:
        click.echo(f"brain: {_plain(notice)}", err=True)
    ctx.obj["created_home"] = brain.home.absolute() if brain.create_home() else None
    handler = _LogFile(brain.settings.log_path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("cflow_brain")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    return brain


class _LogFile(logging.FileHandler):
    """brain.log. A record that cannot be written (a full disk) is dropped: a traceback for each would bury the one
    line the command prints about it."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        return None


def _demo_hint(home: Path) -> str:
    """After `make demo` its notes are in ./.brain-demo, not in the home a bare `brain` uses: say where they are."""
    demo = warm_engine.client_cwd() / DEMO_HOME
    if demo.is_dir() and demo.resolve() != home.resolve():
        return f"; the demo's notes are in {DEMO_HOME}: add --home {DEMO_HOME} (brain --home {DEMO_HOME} search ...)"
    return ""


def _no_notes(brain: Brain) -> str | None:
    """The answer for a home with no notes yet, found from the manifest alone (no model, no Chroma), else None."""
    if brain.status()["notes"]:
        return None
    return (f"no notes yet in {brain.home.absolute()}: run brain sync --vault DIR or --memos URL"
            f"{_demo_hint(brain.home)}")


_ESCAPE_SEQUENCE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-_])|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _plain(value: object, keep_lines: bool = False) -> str:
    """Note data made safe for a terminal: escape sequences (colours, OSC titles and links) dropped, other control
    and bidi characters shown as spaces, so a title or file name can neither drive the terminal nor split a line."""
    text = _ESCAPE_SEQUENCE.sub("", str(value))
    if keep_lines:
        return "\n".join(_CONTROL.sub(" ", line) for line in text.replace("\r\n", "\n").split("\n"))
    return _CONTROL.sub(" ", text)


def _fail(message: str, code: int, as_json: bool = False) -> NoReturn:
    if as_json:
        _print_json({"error": message, "exit_code": code})
    click.echo(f"brain: {_plain(message)}", err=True)
    sys.exit(code)


@contextmanager
def _reported(as_json: bool = False) -> Iterator[None]:
    """The engine's errors as one line on stderr and the documented exit code (busy 3, bad input or setup 2, a full
    disk 1); with
    `as_json`, also as {"error", "exit_code"} on stdout, so a script reading the JSON is not left with nothing."""
    try:
        yield
    except SyncBusyError as exc:
        _fail(str(exc), EXIT_BUSY, as_json)
    except DiskFull as exc:
        _fail(str(exc), EXIT_FAILED, as_json)
    except (ConfigError, SearchError, StoreError) as exc:
        _fail(str(exc), EXIT_USAGE, as_json)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(package_name="cflow-brain", prog_name="brain")
@click.option("--home", envvar="BRAIN_HOME", type=click.Path(file_okay=False), help="State directory [env BRAIN_HOME].")
@click.option("--store-url", envvar="BRAIN_STORE_URL", help="Chroma server, e.g. http://127.0.0.1:8000.")
@click.option("--no-daemon", is_flag=True, envvar=warm_engine.NO_DAEMON_ENV,
              help="Run here even when `brain watch`/`serve`/`mcp` serves this home warm [env BRAIN_NO_DAEMON].")
@click.pass_context
def main(ctx: click.Context, home: str | None, store_url: str | None, no_daemon: bool) -> None:
    """cflow-brain: a searchable second brain over your Memos and markdown vaults."""
    ctx.obj = {"home": home, "store_url": store_url}


@main.command(short_help="Index new and changed notes; remove deleted ones.")
@click.option("--vault", "vaults", multiple=True, type=click.Path(), help="Sync this vault folder (repeatable).")
@click.option("--memos", "memos", multiple=True, help="Sync this Memos/CFlow server URL (token: CFLOW_API_TOKEN).")
@click.option("--source", "names", multiple=True, help="Sync only this known source (repeatable).")
@click.option("--allow-deletes", "allow_deletes", multiple=True, metavar="SOURCE",
              help="Let this source's sync delete most or all of its notes (held otherwise; repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@click.option("-v", "--verbose", is_flag=True, help="List every warning.")
@click.pass_context
def sync(ctx: click.Context, vaults: tuple[str, ...], memos: tuple[str, ...], names: tuple[str, ...],
         allow_deletes: tuple[str, ...], as_json: bool, progress: bool | None, verbose: bool) -> None:
    """Index new and changed notes; remove deleted ones. Only the sources of this run are touched."""
    brain = _open(ctx, create=True)
    with _home_kept_only_if_used(ctx):
        _sync(brain, vaults, memos, names, allow_deletes, as_json, progress, verbose)


@contextmanager
def _home_kept_only_if_used(ctx: click.Context) -> Iterator[None]:
    """A home this command created is removed again when it exits on bad input (a missing vault, no sources, a typo
    in --home): nothing was synced into it, and an empty folder would pass for a home later."""
    try:
        yield
    except SystemExit as exc:
        created = ctx.obj.get("created_home")
        if exc.code == EXIT_USAGE and created is not None:
            logging.getLogger("cflow_brain").handlers.clear()
            shutil.rmtree(created, ignore_errors=True)
        raise


def _sync(brain: Brain, vaults: tuple[str, ...], memos: tuple[str, ...], names: tuple[str, ...],
          allow_deletes: tuple[str, ...], as_json: bool, progress: bool | None, verbose: bool) -> None:
    show_progress = sys.stderr.isatty() if progress is None else progress

    def on_source(result: SourceReport) -> None:
        if not as_json:
            click.echo(_source_line(result, verbose))

    try:
        with _reported(as_json):
            report = brain.sync(vaults, memos, names, progress=TqdmProgress() if show_progress else None,
                                on_source=on_source, allow_deletes=allow_deletes)
    except KeyboardInterrupt:  # a second Ctrl-C: out at once, with the documented code (not Click's "Aborted!", 1)
        _fail("stopped at once; every finished batch is saved and searchable, `brain sync` continues from there",
              EXIT_INTERRUPTED)
    if as_json:
        store_failure = {"error": report.store_error, "exit_code": EXIT_USAGE} if report.store_error else {}
        _print_json(report.to_dict() | store_failure)
    else:
        vectors = ", ".join(f"{model} {count}" for model, count in report.vectors.items()) or "none new"
        click.echo(f"chunked {report.chunks_written} chunks (searchable by keyword), vectors: {vectors}; "
                   f"removed {report.deleted_chunks} chunks; {report.seconds:.1f} s")
    if report.interrupted:
        click.echo("brain: stopped; what was done is saved and searchable, `brain sync` continues from there",
                   err=True)
    if report.failed:
        for failed in (s for s in report.sources if s.failed and not s.store_failed):
            click.echo(_failure_line(failed), err=True)
        if report.store_error:  # once, however many sources met it
            met = ", ".join(_plain(s.name) for s in report.sources if s.store_failed)
            click.echo(f"brain: {_plain(report.store_error)} (met while syncing {met}; what was done is kept)",
                       err=True)
        if report.fill_error:
            click.echo(f"brain: embedding stopped, notes stay searchable by keyword and the next sync resumes: "
                       f"{_plain(report.fill_error)}", err=True)
        sys.exit(EXIT_USAGE if report.store_error else EXIT_FAILED)
    if report.interrupted:
        sys.exit(EXIT_INTERRUPTED)


def _failure_line(failed: SourceReport) -> str:
    """One line on stderr for a failed source: what happened and the way out."""
    if failed.deletes_held:
        return f"brain: source {_plain(failed.name)}: {_plain(failed.error)}"
    if failed.store_failed:  # the store's fault, not the source's: its message names it and what to do
        return f"brain: {_plain(failed.error)} (met while syncing {_plain(failed.name)}; what was done is kept)"
    after = (" It was not remembered: fix it and sync again." if not failed.remembered else
             f" To stop syncing it: brain source remove {_plain(failed.name)}")
    return f"brain: source {_plain(failed.name)} failed, nothing of it changed: {_plain(failed.error)}." + after


def _source_line(result: SourceReport, verbose: bool) -> str:
    head = f"{_plain(result.name)} ({result.kind}): "
    if result.failed:
        return head + "FAILED, the index keeps what it had (reason below)"
    line = (head + f"{result.added} added, {result.updated} updated, {result.deleted} deleted, "
            f"{result.unchanged} unchanged, {result.skipped} skipped")
    if result.warnings:
        shown = result.warnings if verbose else result.warnings[:3]
        line += f"\n  {len(result.warnings)} warning(s):" + "".join(f"\n  - {_plain(w)}" for w in shown)
        if len(shown) < len(result.warnings):
            line += "\n  (use -v for all; also in brain.log)"
    return line


@main.command(short_help="What the index holds and how far each search channel is.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """What the index holds, per source, and when each last synced."""
    brain = _open(ctx)
    data = brain.status(docstore=True) | {"engine": warm_engine.how_this_runs(brain.home)}
    if as_json:
        _print_json(data)
        return
    click.echo(f"home: {data['home']}  store: {data['store']}")
    click.echo(f"model: {data['embedding_model']}  chunker: {data['chunker_version']}")
    click.echo(f"{data['notes']} notes, {data['chunks']} chunks")
    if data["channels"]:
        click.echo(_channels_line(data["channels"], data["chunks"]))
    click.echo(_docstore_line(data["docstore"], data["notes"]))
    for src in data["sources"]:
        result = src["last_result"] or {}
        state = "FAILED: " + _plain(result.get("error")) if result.get("failed") else "ok"
        click.echo(f"  {_plain(src['name'])} ({src['kind']}): {src['notes']} notes, {src['chunks']} chunks, "
                   f"last sync {src['last_sync'] or 'never'}, last result {state}")
    engine = data["engine"]
    click.echo(f"engine: warm ({engine['server']}, pid {engine['pid']})" if engine["mode"] == "warm" else
               "engine: in-process" + (f" — {_plain(engine['why'])}" if engine.get("why") else ""))


def _docstore_line(docstore: dict[str, Any], notes: int) -> str:
    """Which docstore, how many notes it holds, and whether that is the index's count."""
    if docstore["error"]:  # it names the docstore
        return f"docstore: UNUSABLE: {_plain(docstore['error'])}"
    head = f"docstore: {_plain(docstore['name'])}"
    if docstore["agrees"]:
        return f"{head}: {docstore['notes']} notes, as in the index"
    return f"{head}: {docstore['notes']} notes, the index has {notes}: `brain doctor --repair` fills it"


def _channels_line(channels: dict[str, dict[str, Any]], chunks: int) -> str:
    """How far each search channel is: a sync makes every note searchable by BM25 first, then fills each model."""
    parts = []
    for name, channel in channels.items():
        if channel.get("complete"):
            parts.append(f"{name} complete")
        else:
            left = "" if name == "bm25" else f", {time_left(channel.get('seconds_left'))}"
            parts.append(f"{name} {channel.get('chunks', 0)}/{chunks} chunks{left}")
    return "search channels: " + "; ".join(parts)


@main.command("search", short_help="Find notes by meaning and by words.")
@click.argument("query", required=False)
@click.option("-k", "k", default=8, show_default=True, type=click.IntRange(1, 100), help="Notes to return.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--queries", "queries_file", type=click.File("r", encoding="utf-8"),
              help='Batch: a JSONL file of {"id", "text"}; prints one JSON line per query.')
@click.option("--source", "sources", multiple=True, help="Only these sources (name or kind: vault, memos).")
@click.option("--tag", "tags", multiple=True, help="Only notes with this tag (or a sub-tag).")
@click.option("--path", "path_prefix", default="", help="Only vault notes under this path prefix.")
@click.option("--since", default=None, help="Only notes dated on or after YYYY-MM-DD.")
@click.option("--until", default=None, help="Only notes dated on or before YYYY-MM-DD.")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), default="hybrid", show_default=True)
@click.option("--variant", "variants", multiple=True, help="Your own query variant (repeatable): no LLM expansion.")
@click.option("--no-expand", is_flag=True, help="Never ask the LLM for query variants.")
@click.pass_context
def search_command(ctx: click.Context, query: str | None, k: int, as_json: bool, queries_file: Any,
                   sources: tuple[str, ...], tags: tuple[str, ...], path_prefix: str, since: str | None,
                   until: str | None, mode: str, variants: tuple[str, ...], no_expand: bool) -> None:
    """Find notes by meaning and by words, in Chinese or English, with where each came from."""
    brain = _open(ctx)
    options = {"sources": sources, "tags": tags, "path_prefix": path_prefix, "since": since, "until": until,
               "mode": mode, "variants": list(variants) or None, "expand": not no_expand}
    if queries_file is not None:
        _batch(brain, queries_file, k, options)
        return
    if query is None:
        _fail("give a QUERY, or --queries FILE.jsonl", EXIT_USAGE)
    empty = _no_notes(brain)
    if empty is not None:
        if as_json:
            _print_json({"query": query, "answer_state": "not_found", "not_found": True, "results": [],
                         "coverage": {"empty_index": True}})
        else:
            click.echo(empty)
        return
    with _reported():
        response = brain.search(query, k, **options)
    if as_json:
        _print_json(response.to_dict())
        return
    _print_results(response)


def _batch(brain: Brain, lines: Any, k: int, options: dict[str, Any]) -> None:
    """One JSON line out per line in; a bad line gets an error line, the batch goes on."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            query_id, text = row["id"], row["text"]
        except (ValueError, KeyError, TypeError):
            click.echo(json.dumps({"line": number, "error": 'expected {"id": ..., "text": ...}'}))
            continue
        try:
            response = brain.search(text, k, **options)
        except SearchError as exc:
            click.echo(json.dumps({"id": query_id, "error": str(exc)}, ensure_ascii=False))
            continue
        click.echo(json.dumps({"id": query_id, "answer_state": response.answer_state, "not_found": response.not_found,
                               "results": response.results,
                               "ms": round(response.timing["total_ms"], 2)}, ensure_ascii=False))


def _without_leads(text: str) -> str:
    """A "not in your notes" answer without its list of leads: the sources below list them, with paths. (A "not
    sure" answer keeps its possible matches' passages.)"""
    return text.split("\n\n")[0] if text.startswith(NOT_FOUND) else text


def _search_lines(coverage: dict[str, Any]) -> list[str]:
    """What shaped the search besides the words (rag_app.answers.search_notes), one line each."""
    return [f"({_plain(note)})" for note in search_notes(coverage)]


def _store_down_line(coverage: dict[str, Any]) -> str | None:
    """One line when the vector channel could not be read (a Chroma server down): found by keyword only."""
    if not coverage.get("store_down"):
        return None
    return (f"brain: the vector channel is down ({_plain(coverage['store_down'])}): found by keyword only, "
            "nothing labelled strong")


def _print_results(response: Any) -> None:
    """What was found: the verdict first when the engine is unsure or found nothing that answers, then what shaped
    the search (`_search_lines`), then the notes."""
    if _store_down_line(response.coverage):
        click.echo(_store_down_line(response.coverage), err=True)
    if response.results and response.not_found:
        absent = response.coverage.get("unmentioned")
        why = unmentioned_clause(absent, response.coverage.get("filters")) if absent else (
            "nothing here seems to answer it")
        click.echo(f"not in your notes: {_plain(why)}; the nearest notes, as leads:")
    elif response.results and response.answer_state == "unsure":
        closest = ", ".join(_plain(r["title"]) for r in response.results[:3])
        click.echo(f"not sure your notes cover this — closest: {closest}")
    for line in _search_lines(response.coverage):
        click.echo(line)
    if not response.results:
        if response.coverage.get("no_note_matches_filters"):
            click.echo(f"no note matches the filters ({_plain(filters_text(response.coverage['filters']))})")
        else:
            click.echo("no matching notes")
        return
    for n, result in enumerate(response.results, 1):
        where = result["note_id"] + (f"  {result['url']}" if result.get("url") else "")  # the id `brain get` takes
        click.echo(f"{n:>2}. {_plain(result['title'])}  {_plain(where)}  "
                   f"{result['strength']} ({result['relevance']:.2f})")
        click.echo(f"    {_plain(readable_excerpt(result['excerpt'])[:200])}")
        if result.get("linked_from"):
            linked = result["linked_from"]
            click.echo(f"    ↳ linked from {_plain(linked['title'])}: {_plain(linked['sentence'])}")


@main.command("ask", short_help="Answer from your notes, citing them as [n].")
@click.argument("question")
@click.option("-k", "k", default=6, show_default=True, type=click.IntRange(1, 20), help="Notes to draw on.")
@click.option("--session", default=None, help="Continue this conversation (created on first use).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--source", "sources", multiple=True, help="Only these sources.")
@click.option("--tag", "tags", multiple=True, help="Only notes with this tag.")
@click.option("--since", default=None, help="Only notes dated on or after YYYY-MM-DD.")
@click.option("--until", default=None, help="Only notes dated on or before YYYY-MM-DD.")
@click.option("--turn-id", default=None, help="With --session: store this ask once, however often it is run "
              "(a retry answers with the stored turn). `brain` gives each ask one.")
@click.pass_context
def ask_command(ctx: click.Context, question: str, k: int, session: str | None, as_json: bool,
                sources: tuple[str, ...], tags: tuple[str, ...], since: str | None, until: str | None,
                turn_id: str | None) -> None:
    """Answer from your notes only, citing them as [n] (an LLM if configured, else the best passages).

    With --session, a follow-up ("第二部是谁导演的？") is read in the light of the earlier turns."""
    brain = _open(ctx)
    empty = _no_notes(brain)
    if empty is not None:
        if as_json:
            _print_json(AnswerResponse(empty, [], {"empty_index": True, "not_found": True, "answer_state": "not_found"},
                                       "extractive").to_dict())
        else:
            click.echo(empty)
        return
    stream = not as_json and sys.stdout.isatty()
    unbold = _Unbold()

    def on_token(piece: str) -> None:
        click.echo(_plain(unbold.feed(_without_leads(piece)), keep_lines=True), nl=False)

    with _reported():
        response = brain.ask(question, k, session=session, sources=sources, tags=tags, since=since, until=until,
                             on_token=on_token if stream else None, turn_id=turn_id)
    if as_json:
        _print_json(response.to_dict())
        return
    coverage = response.coverage
    if coverage.get("condensed_query") and coverage["condensed_query"] != question:
        click.echo(f"(follow-up searched as: {_plain(coverage['condensed_query'])})", err=True)
    if stream:
        click.echo(_plain(unbold.flush(), keep_lines=True))
    else:
        click.echo(_plain(_unmark(_without_leads(response.answer)), keep_lines=True))
    if coverage.get("llm") == "used":
        state = brain.llm_state()
        click.echo(f"(written by {_plain(state['model'])} at {_plain(state['base_url'])})")
    for line in _search_lines(coverage):
        click.echo(line)
    if response.citations:
        click.echo("")
        click.echo("Leads (not an answer):" if coverage.get("not_found") else
                   "Possible matches (not sure):" if coverage.get("answer_state") == "unsure" else "Sources:")
    for citation in response.citations:
        click.echo(f"  [{citation['n']}] {_plain(citation['title'])} — "
                   f"{_plain(citation.get('url') or citation.get('path'))} ({citation['strength']})")
    if _store_down_line(coverage):
        click.echo(_store_down_line(coverage), err=True)
    if coverage.get("llm_error"):
        click.echo(f"brain: LLM unavailable ({_plain(coverage['llm_error'])}); showing passages", err=True)
    elif coverage.get("llm_missing"):
        click.echo(f"brain: {missing_message(coverage['llm_missing'])}; showing passages", err=True)
    if coverage.get("session_not_saved"):
        click.echo(f"brain: {_plain(coverage['session_not_saved'])}", err=True)


def _unmark(text: str) -> str:
    """The page's markdown emphasis (query words in **bold**) as plain terminal text."""
    return text.replace("**", "")


class _Unbold:
    """`_unmark` over a stream: a "*" that ends one piece waits for the next (it may be half of "**")."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, piece: str) -> str:
        text = self._pending + piece
        self._pending = "*" if text.endswith("*") and not text.endswith("**") else ""
        return _unmark(text[: len(text) - len(self._pending)])

    def flush(self) -> str:
        pending, self._pending = self._pending, ""
        return pending


@main.group("sessions", invoke_without_command=True, short_help="List or delete conversations.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def sessions_group(ctx: click.Context, as_json: bool) -> None:
    """List conversations (name, turns, last question, last used), newest first; `delete NAME` removes one."""
    if ctx.invoked_subcommand is not None:
        return
    with _reported(as_json):
        rows = _open(ctx).sessions()
    if as_json:
        _print_json(rows)
        return
    if not rows:
        click.echo('no sessions yet: brain ask "QUESTION" --session NAME starts one')
    for row in rows:
        click.echo(f"{_plain(row['name'])}\t{row['turns']} turn(s)\t{row['updated']}\t"
                   f"{_plain(row['last_question'] or '')[:80]}")


@sessions_group.command("delete")
@click.argument("name")
@click.pass_context
def sessions_delete(ctx: click.Context, name: str) -> None:
    """Delete the conversation NAME and its turns (the notes are untouched)."""
    with _reported():
        _open(ctx).delete_session(name)
    click.echo(f"deleted session {_plain(name)}")


@main.group(short_help="List or remove sources.")
def source() -> None:
    """List or remove sources."""


@source.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def source_list(ctx: click.Context, as_json: bool) -> None:
    specs = [s.to_dict() for s in _open(ctx).known_sources()]
    if as_json:
        _print_json(specs)
        return
    for spec in specs:
        click.echo(f"{_plain(spec['name'])}\t{spec['kind']}\t{_plain(spec.get('path') or spec.get('url'))}")


@source.command("remove")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def source_remove(ctx: click.Context, name: str, as_json: bool) -> None:
    """Remove NAME and all its notes from the index (the notes themselves are untouched)."""
    with _reported():
        result = _open(ctx).remove_source(name)
    if as_json:
        _print_json(result)
    else:
        click.echo(f"removed {_plain(result['removed'])}: {result['notes']} notes")
        if result["still_in_config"]:
            click.echo("note: it is still listed in config.toml and will come back on the next sync", err=True)


@main.command(short_help="Keep the index fresh as notes change.")
@click.option("--vault", "vaults", multiple=True, type=click.Path(), help="Watch this vault folder (repeatable).")
@click.option("--memos", "memos", multiple=True, help="Poll this Memos/CFlow server (repeatable).")
@click.option("--interval", default=60.0, show_default=True, type=click.FloatRange(1, 86_400),
              help="Seconds between Memos polls.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per sync.")
@click.pass_context
def watch(ctx: click.Context, vaults: tuple[str, ...], memos: tuple[str, ...], interval: float,
          as_json: bool) -> None:
    """Keep the index fresh: sync a vault when its notes change, poll Memos servers; Ctrl-C or SIGTERM stops.

    Without --vault or --memos it watches every known source."""
    brain = _open(ctx, create=True)
    with _reported():
        specs = brain.resolve_sources(vaults, memos)
        claim_watch(brain.settings.home)  # another watcher keeps this home fresh: one line, exit 3

    said: dict[str, str | None] = {}  # the failure last reported per source: a failure that persists is said once

    def on_sync(trigger: str, report: SyncReport) -> None:
        if as_json:
            click.echo(json.dumps({"trigger": trigger, **report.to_dict()}, ensure_ascii=False))
            return
        for result in report.sources:
            if result.failed and said.get(result.name) == result.error:
                continue
            said[result.name] = result.error if result.failed else None
            click.echo(f"[{trigger}] " + _source_line(result, verbose=False))
            if result.failed:
                click.echo(_failure_line(result), err=True)
        if report.fill_error:
            click.echo(f"brain: embedding stopped, the next sync resumes: {_plain(report.fill_error)}", err=True)

    if not as_json:
        names = ", ".join(_plain(s.name) for s in specs)
        polled = f" (Memos every {interval:g} s)" if any(s.kind == "memos" for s in specs) else ""
        click.echo(f"watching {names}{polled}; Ctrl-C stops", err=True)
    stop, upgraded = StopRequested(), threading.Event()

    def restart() -> None:
        upgraded.set()
        stop.set()

    try:
        with _reported(), _served_warm(ctx, brain, "brain watch", restart):
            brain.watch(specs, interval, on_sync, stop=stop)
    except HomeGone as exc:  # exit 1: under systemd, Restart=on-failure starts a fresh watch on what is there now
        _fail(str(exc), EXIT_FAILED)
    if upgraded.is_set():
        _restart_after_upgrade()


def _restart_after_upgrade() -> NoReturn:
    """`brain watch` runs the new brain after an upgrade or an edit (a newer `brain` asked its warm engine): it
    stopped as on SIGTERM (the sync in hand finished its batch, the socket removed) and now replaces itself with the
    same command line. Why exec rather than exit non-zero for systemd's Restart=on-failure: the same pid and output
    go on under systemd, launchd, nohup or a terminal alike, where an exit would end a watch nobody restarts."""
    click.echo("brain watch: brain was upgraded since this watch started: restarting it", err=True)
    logging.getLogger("cflow_brain").info("watch: restarting after an upgrade")
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


@contextmanager
def _served_warm(ctx: click.Context, brain: Brain, server_name: str,
                 on_outdated: Callable[[], None] | None = None) -> Iterator[None]:
    """While a long-running command runs, its Brain answers this home's `brain search`, `ask`, `get`, `status` and
    `sessions` (rag_app.shells.warm_engine): they then skip the start-up and see what the watcher has synced.
    `serve` and `mcp` pass no `on_outdated`: a page's or an agent's session would not survive an exec, so after an
    upgrade their clients run in-process and say that the server must be restarted."""
    with warm_engine.serving(brain, server_name, _run_served, ctx.obj["store_url"] or "", on_outdated):
        yield


def _run_served(argv: list[str]) -> int:
    """One command line for the warm engine, run here as `brain` would run it; its exit code."""
    try:
        main.main(args=argv, prog_name="brain")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        click.echo(str(exc.code), err=True)
        return 1
    return 0


@contextmanager
def kept_fresh(brain: Brain, watch_sources: bool, interval: float) -> Iterator[BackgroundWatch | None]:
    """For a server's lifetime: with `--watch`, a watcher thread over every known source, stopped when the server
    returns; otherwise a stale index is refreshed before a search."""
    if not watch_sources:
        brain.auto_refresh = True
        yield None
        return
    with _reported():
        specs = brain.resolve_sources()
    try:
        claim_watch(brain.settings.home)
    except WatchBusy as exc:  # `brain watch` (or another server) keeps it fresh already: serve without a watcher
        click.echo(f"brain: not watching: {exc}", err=True)
        yield None
        return
    watcher = brain.watch_in_background(specs, interval)
    try:
        yield watcher
    finally:
        watcher.stop()
        release_watch(brain.settings.home)


@main.command(short_help="The chat page in your browser.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on; anything but this machine needs BRAIN_UI_USER and BRAIN_UI_PASSWORD.")
@click.option("--port", default=7860, show_default=True, type=click.IntRange(1, 65535))
@click.option("--watch", "watch_sources", is_flag=True, help="Also keep every known source fresh (as `brain watch`).")
@click.option("--interval", default=60.0, show_default=True, type=click.FloatRange(1, 86_400),
              help="With --watch: seconds between Memos polls.")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, watch_sources: bool, interval: float) -> None:
    """The chat page: conversations with cited answers, notes opened in place, filters, status and sync."""
    from rag_app.shells import page  # here: Gradio takes seconds to import, which no other command needs

    brain = _open(ctx, create=True)
    with kept_fresh(brain, watch_sources, interval), _served_warm(ctx, brain, "brain serve"), _reported():
        page.serve(brain, host, port)


@main.command("mcp", short_help="Serve the notes to agents over MCP.")
@click.option("--http", "over_http", is_flag=True, help="Streamable HTTP instead of stdio (token: BRAIN_MCP_TOKEN).")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="HTTP: port.")
@click.option("--watch", "watch_sources", is_flag=True, help="Also keep every known source fresh (as `brain watch`).")
@click.option("--interval", default=60.0, show_default=True, type=click.FloatRange(1, 86_400),
              help="With --watch: seconds between Memos polls.")
@click.pass_context
def mcp(ctx: click.Context, over_http: bool, host: str, port: int, watch_sources: bool, interval: float) -> None:
    """Serve search_notes, get_note, related_notes and brain_status to agents over MCP (stdio by default)."""
    from tools import mcp_server  # here: the MCP SDK (with starlette, uvicorn) takes seconds to import

    brain = _open(ctx, create=True)
    with kept_fresh(brain, watch_sources, interval), _served_warm(ctx, brain, "brain mcp"), _reported():
        if over_http:
            mcp_server.run_http(brain, host=host, port=port)
        else:
            mcp_server.run_stdio(brain)


@main.command("doctor", short_help="Check (and repair) that the stores agree.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report.")
@click.option("--repair", is_flag=True, help="Fix what disagrees (re-embeds only notes whose vectors are missing).")
@click.option("--compact", is_flag=True, help="Rebuild the Chroma collections to reclaim space after heavy churn.")
@click.pass_context
def doctor_command(ctx: click.Context, as_json: bool, repair: bool, compact: bool) -> None:
    """Check that Chroma, the manifest and the BM25 index hold the same chunks; exit 1 if they do not."""
    with _reported():
        result = _open(ctx).doctor(repair=repair, compact=compact)
    if as_json:
        _print_json(result)
    else:
        _print_doctor(result)
    if not result["ok"]:
        sys.exit(EXIT_FAILED)


def _print_doctor(result: dict[str, Any]) -> None:
    counts = result["counts"]
    click.echo(f"{counts['notes']} notes: {counts['manifest_chunks']} chunks in the manifest, "
               f"{counts['chunk_rows']} chunk rows, {counts['vectors']} vectors, {counts['bm25_ids']} in BM25; "
               f"the docstore ({_plain(result['docstore'])}) holds {counts['docstore_notes']} notes")
    done = result.get("repair", {})
    if "docstore" in done:
        rebuilt = done["docstore"]
        if not rebuilt["repaired"]:
            click.echo(f"docstore not repaired: {_plain(rebuilt['reason'])}")
        else:
            aside = f"; the damaged file is kept as {_plain(rebuilt['set_aside'][0])}" if rebuilt["set_aside"] else ""
            click.echo(f"repaired the docstore: {rebuilt['copied_notes']} notes copied in from the index{aside}")
    if "reembedded_notes" in done:
        click.echo(f"repaired: re-embedded {done['reembedded_notes']} notes ({done['chunks_written']} chunks), "
                   f"deleted {done['deleted_vectors']} orphan vectors and {done['deleted_chunk_rows']} chunk rows, "
                   "rebuilt BM25")
        if done["needs_sync"]:
            click.echo(f"  {len(done['needs_sync'])} notes had no stored text and were dropped: "
                       "the next `brain sync` adds them again")
    if "compact" in result:
        done = result["compact"]
        sizes = f"{done['bytes_before']} → {done['bytes_after']} bytes" if done["bytes_before"] is not None else ""
        click.echo(f"compacted {len(done['collections'])} collection(s) {sizes}".rstrip())
    for kind, found in result["problems"].items():
        if kind == "docstore_unusable" and found["count"]:
            click.echo(f"docstore: {_plain(found['examples'][0])}")
        elif found["count"]:
            click.echo(f"{kind}: {found['count']} (e.g. {_plain(', '.join(found['examples'][:3]))})")
    _print_sessions_check(result["sessions"])
    others = [kind for kind, found in result["problems"].items() if found["count"] and kind != "docstore_unusable"]
    if not any(found["count"] for found in result["problems"].values()):  # conversations are not the notes' stores
        click.echo("ok: the stores agree")
    elif others:  # an unusable docstore's own line says what to do
        click.echo("the stores disagree: run `brain doctor --repair`")


def _print_sessions_check(sessions: dict[str, Any]) -> None:
    if sessions["set_aside"]:
        click.echo(f"sessions: the damaged file was set aside as {_plain(sessions['set_aside'])}; the next "
                   "conversation starts a new one")
    elif sessions["problem"]:
        click.echo(f"sessions: {_plain(sessions['problem'])}")



@main.command("get", short_help="Print one note by its id.")
@click.argument("note_id")
@click.option("--fresh", is_flag=True, help="Read the note again from its source and say whether the index is stale.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def get_command(ctx: click.Context, note_id: str, fresh: bool, as_json: bool) -> None:
    """Print one note by its id (from `brain search`): text, tags, links; --fresh reads its source again."""
    brain = _open(ctx)
    try:
        with _reported():
            note = brain.get_note(note_id, max_chars=10_000_000, fresh=fresh)
    except (NoteNotFound, SourceError) as exc:
        _fail(str(exc), EXIT_FAILED)
    if as_json:
        _print_json(note)
        return
    click.echo(f"{_plain(note['title'])}  [{_plain(note['source'])}] {_plain(note.get('path') or note.get('url'))}")
    if fresh:
        state = ("deleted at its source" if note["deleted_at_source"] else
                 "the index holds an older copy (run `brain sync`)" if note["stale"] else "the index is current")
        click.echo(f"(read from the source at {note['read_at']}: {state})")
    if note["tags"]:
        click.echo("tags: " + ", ".join(_plain(t) for t in note["tags"]))
    click.echo("")
    click.echo(_plain(note["text"], keep_lines=True))


@main.group("skill", short_help="Install or show the agent Skill.")
def skill_group() -> None:
    """The agent Skill that teaches Claude Code or Codex to search, read and cite your notes."""


@skill_group.command("install", short_help="Write the Skill where the agent looks.")
@click.option("--target", type=click.Choice(["claude", "codex"]), default="claude", show_default=True,
              help="The agent whose skills folder to write to.")
@click.option("--dir", "skills_dir", type=click.Path(file_okay=False),
              help="Skills folder to use instead (the Skill goes into DIR/cflow-brain), e.g. .claude/skills.")
@click.option("--force", is_flag=True, help="Overwrite a copy that was changed since it was installed.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def skill_install(target: str, skills_dir: str | None, force: bool, as_json: bool) -> None:
    """Write the cflow-brain Skill where the agent looks (Claude Code: ~/.claude/skills, Codex: ~/.codex/skills)."""
    try:
        result = install_skill(target, skills_dir, force=force)
    except SkillConflict as exc:
        _fail(str(exc), EXIT_FAILED)
    except OSError as exc:
        _fail(f"cannot write the Skill: {exc.strerror or exc}", EXIT_FAILED)
    if as_json:
        _print_json({"path": str(result.path), "target": target, "written": result.written,
                     "unchanged": result.unchanged})
        return
    if result.written:
        click.echo(f"installed the cflow-brain Skill in {_plain(result.path)} ({len(result.written)} file(s) written); "
                   f"restart {'Claude Code' if target == 'claude' else 'Codex'} to load it")
    else:
        click.echo(f"the cflow-brain Skill in {_plain(result.path)} is already this version")


@skill_group.command("show")
def skill_show() -> None:
    """Print the Skill's SKILL.md."""
    click.echo(skill_files()["SKILL.md"].decode("utf-8"), nl=False)


if __name__ == "__main__":
    main()
