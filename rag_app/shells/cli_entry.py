"""`brain`, the CLI's entry point: a command the home's warm engine can serve (search, ask, get, status, sessions) goes
to it over the home's socket (shells/warm_engine.py); any other, or one no warm engine takes, runs the CLI
(shells/cli.py) in this process, a one-shot command with the lean start of shells/lazy_packages.py.

Until the socket was tried this imports only the warm engine's client half and what the interpreter has loaded
already, so a served command costs an interpreter start (~0.1 s). What a command run here needs is imported when it
runs here: the CLI (click and the engine, ~0.5 s), the lean start's hooks (importlib's machinery, ast) and logging
(~7 ms), each where it is used, saying so.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import NoReturn

from rag_app.shells import warm_engine


def main() -> None:
    """The `brain` command: the home's warm engine answers when one serves it, else the CLI runs in this
    process (as `python -m rag_app.shells.cli` always does). A warm engine lost mid-request is said once, then it
    runs here."""
    request = warm_engine.warm_request(sys.argv[1:], os.environ)
    if request is not None:
        command_at = len(sys.argv) - len(request.args)
        warm_engine.with_turn_id(request)
        sys.argv[command_at:] = request.args  # the same ask, should it run here after all
        try:
            code = warm_engine.ask_warm(request, sys.stdout, sys.stderr)
        except warm_engine.WarmEngineLost as exc:
            sys.stderr.write(f"brain: the warm engine of {request.home} stopped answering ({exc}); "
                             "running in this process\n")
            sys.stderr.flush()
        except KeyboardInterrupt:  # Ctrl-C: as click ends an interrupted command
            sys.stderr.write("Aborted!\n")
            sys.exit(1)
        else:
            if code is not None:
                sys.exit(code)
            notice = warm_engine.fallback_notice()
            if notice:
                sys.stderr.write(notice + "\n")
                sys.stderr.flush()
    lean = warm_engine.one_shot(sys.argv[1:])
    if lean:
        _lean_start()
    # Imported here, after the socket was tried: the CLI imports click and the engine (~0.5 s), which a command the
    # warm engine serves never pays; and after _lean_start, whose hooks must be in place before LlamaIndex is imported.
    from rag_app.shells.cli import main as run_in_process

    if not lean:
        run_in_process()
        return
    try:
        run_in_process()
    except SystemExit as exc:
        _end_now(exc.code)
    _end_now(0)


def _lean_start() -> None:
    """How a one-shot command starts: LlamaIndex's and Chroma's package inits deferred, the modules it imports but
    never reads left unrun and Chroma's checks of its own classes skipped (shells/lazy_packages.py), and the cyclic
    garbage collector run every 50,000 allocations rather than every 700: the imports make ~200,000 objects that live
    as long as the process, and collecting them again and again cost ~0.1 s of CPU."""
    # Imported here: a command the warm engine serves never starts lean.
    from rag_app.shells.lazy_packages import defer_module_bodies, defer_package_inits, skip_override_checks

    gc.set_threshold(50_000, 10, 10)
    defer_package_inits()
    defer_package_inits("chromadb")
    defer_module_bodies()
    skip_override_checks()


def _end_now(code: object) -> NoReturn:
    """End a one-shot command's process without the interpreter's teardown, which frees ~1,400 modules one by one
    (~0.3 s of CPU after the answer is printed). What must outlast the process is flushed first: the log
    (logging.shutdown, the only exit handler that keeps anything), stdout and stderr. These commands write nothing
    else that is not already committed (sessions are SQLite transactions)."""
    import logging  # imported here: a command the warm engine serves never logs (the CLI has imported it by now)

    if code is None or isinstance(code, int):
        status = code or 0
    else:  # sys.exit("message"), as the interpreter would report it
        print(code, file=sys.stderr)
        status = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with it closed (`>&-`)
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`brain search ... | head`), a closed stream
            pass
    os._exit(status)
