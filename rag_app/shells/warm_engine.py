"""The warm engine: while `brain watch`, `brain serve` or `brain mcp` runs for a home, its open Brain answers the CLI's
everyday commands (search, ask, get, status, sessions) over a Unix socket inside that home, so such a command costs an
interpreter start instead of loading LlamaIndex, Chroma, jieba and the models.

Where the protocol cuts: the client sends its command line and the server runs that very CLI command (shells/cli.py) on
its open Brain, sending back what the command writes to stdout and stderr, then its exit code. A warm command's text,
JSON, error lines and exit codes therefore come from the same code as the in-process ones and cannot drift from them;
an engine-call protocol would need every response serialised and rebuilt and the CLI's formatting run on the client
(which would then import the engine it is trying to avoid). Output is captured per thread, so that concurrent clients
never see each other's output: while serving, sys.stdout and sys.stderr are routers that hand a thread's writes to the
client it answers, and every other thread's (the page's, the MCP server's, the watcher's) to the real stream.

Safety: the socket is `<home>/warm/engine.sock` (the folder 0700, the socket 0600), never a TCP port; a client uses it
only when the folder and the socket are its own user's, and on Linux the server also checks the peer's uid. One server
per home: it holds an exclusive lock on `<home>/warm/engine.lock` while it serves, so a socket file that a server
holding the lock finds is stale (its server died) and is replaced. A client finding a socket with nobody behind it
runs in-process and says nothing: that is the in-process path, output included.

The client half (what `brain`, the CLI's entry point in shells/cli_entry.py, calls first) imports only the standard
library before it has tried the socket, and only what it uses: the server half imports logging, fcntl, time, traceback
and struct where it uses them, and the client tomllib and platformdirs only for the homes that need them.

The server runs what it loaded at start: a client whose environment (env_digests) or `<home>/config.toml`
(config_fingerprint) differs from what the server started with is refused, and runs in its own process; so is a
client of other brain code (code_identity: the server was started before an upgrade or an edit). `brain status` then
says why the command ran in-process. Served commands never start a background refresh of stale sources (the
in-process CLI never does).

Wire: newline-delimited JSON. Client → server, one request {"protocol": 2, "code", "command", "home", "store_url",
"env", "config", "cwd", "tty"}.
Server → client: {"accepted": {"server", "pid"}} or {"refused": reason, "protocol": 2, ...}; then {"out": text} /
{"err": text} frames as the command writes; then {"exit": code}. Protocol 1 (before issue 30) sent "argv" and no
version: a protocol-1 server refuses a protocol-2 request ("not a command line", with no "protocol"), which is how a
client knows the server is older than itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

PROTOCOL = 2
WARM_COMMANDS = frozenset({"search", "ask", "get", "status", "sessions"})
SOCKET_DIR, SOCKET_NAME, LOCK_NAME = "warm", "engine.sock", "engine.lock"
NO_DAEMON_ENV = "BRAIN_NO_DAEMON"
# Variables that change what a command answers (LLM, embeddings, tokens): a client whose values differ from the
# server's runs in-process, where its own environment applies. The home and the store are compared on their own.
ENV_PREFIXES = ("BRAIN_", "CFLOW_", "LLM_", "EMBEDDING_", "OPENAI_")
ENV_COMPARED_APART = frozenset({"BRAIN_HOME", "BRAIN_STORE_URL", NO_DAEMON_ENV})
# Compared too, outside the prefixes above: the models' hub (HF_HOME, HF_HUB_OFFLINE, HF_TOKEN, ...), the tokens a
# source may read (MEMOS_TOKEN by default, and whatever variable a [[sources]] entry's `token_env` names), which `get`
# uses to read a note from its source, and TZ (what "today" and "上周" mean).
ENV_ALSO_PREFIXES = ("HF_",)
ENV_ALSO_SUFFIXES = ("_TOKEN",)
ENV_ALSO_NAMES = frozenset({"TZ"})
CODE_PACKAGES = ("rag_app", "readers", "tools")  # what a warm engine runs of brain (pyproject's packages)
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path, 108 on Linux, less on macOS) without its NUL
CONFIG_FILE = "config.toml"  # rag_app.config.CONFIG_FILE (a test keeps the two equal)
ACCEPT_SECONDS = 10.0  # a server that does not take a request within this is treated as gone
MAX_REQUEST_BYTES = 1_000_000
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})


def socket_path(home: Path) -> Path:
    return home / SOCKET_DIR / SOCKET_NAME


def env_digests(environ: dict[str, str] | os._Environ[str], home: Path) -> dict[str, str]:
    """Each variable that changes a command's answer, by name, with a digest of its value (never the value on the
    wire): a server names the variables that differ, so `brain status` can say which without showing any value."""
    named = ENV_ALSO_NAMES | token_env_names(home)
    return {k: hashlib.sha256(f"{k}={v}".encode(errors="surrogateescape")).hexdigest()[:24]
            for k, v in sorted(environ.items())
            if (k.startswith(ENV_PREFIXES) and k not in ENV_COMPARED_APART)
            or k.startswith(ENV_ALSO_PREFIXES) or k.endswith(ENV_ALSO_SUFFIXES) or k in named}


def token_env_names(home: Path) -> frozenset[str]:
    """The variables `<home>/config.toml`'s sources name as their token (`token_env`); none when it cannot be read
    (config_fingerprint tells that apart)."""
    try:
        text = (home / CONFIG_FILE).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return frozenset()
    if "token_env" not in text:  # most homes: no TOML parser to import (~5 ms of a warm command's ~0.1 s)
        return frozenset()
    import tomllib

    try:
        sources = tomllib.loads(text).get("sources")
    except ValueError:
        return frozenset()
    return frozenset(s["token_env"] for s in sources if isinstance(s.get("token_env"), str)) \
        if isinstance(sources, list) and all(isinstance(s, dict) for s in sources) else frozenset()


def code_identity() -> str:
    """Which brain code this process runs: every module's path, size and modification time in the installed packages.
    An upgrade (pip, uv, a new wheel) rewrites them and an editable checkout's edit touches one, so a warm engine
    started before either no longer matches the `brain` that asks it. (The package version alone misses an editable
    checkout's edits; click's option set would need the CLI imported, which the client avoids.) ~1 ms."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        stack = [root / package]
        while stack:
            folder = stack.pop()
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(Path(entry.path))
                elif entry.name.endswith((".py", ".json")):
                    try:
                        info = entry.stat()
                    except OSError:
                        continue
                    digest.update(f"{entry.path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode(errors="replace"))
    return digest.hexdigest()[:32]


def config_fingerprint(home: Path) -> str:
    """A digest of `<home>/config.toml` as it is now ("absent" without one, "unreadable" when it cannot be read)."""
    try:
        return hashlib.sha256((home / CONFIG_FILE).read_bytes()).hexdigest()
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "unreadable"


def default_home() -> Path:
    """rag_app.config.default_home without importing pydantic (a test keeps the two equal)."""
    env = os.environ.get("BRAIN_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("cflow-brain", appauthor=False))


# ---------------------------------------------------------------------------------------------------------- client


class WarmRequest:
    """A command line a warm engine may answer: the home it is for, the store it expects, the command's own args.
    (A plain class: importing dataclasses costs the client ~17 ms of its ~0.1 s.)"""

    def __init__(self, home: Path, store_url: str, args: list[str]):
        self.home, self.store_url, self.args = home, store_url, args


def warm_request(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> WarmRequest | None:
    """The request for this command line, or None when it runs in-process: --no-daemon (or BRAIN_NO_DAEMON), a
    command the warm engine does not answer, help or version, an option this scan does not know (click judges it),
    and `search --queries` (it reads a file or stdin of this process)."""
    scanned = _scan(argv, environ)
    if scanned is None:
        return None
    home, store_url, no_daemon, args = scanned
    if no_daemon or not args or args[0] not in WARM_COMMANDS:
        return None
    if _refused_args(args[1:]) or not all(_utf8(a) for a in args):  # an undecodable byte: the CLI says what it says
        return None
    home_path = Path(home).expanduser() if home else default_home()
    return WarmRequest(home_path.absolute(), store_url, args)


def one_shot(argv: list[str]) -> bool:
    """Whether this command line runs one everyday command (search, ask, get, status, sessions) on one thread and
    ends: such a process may defer LlamaIndex's package imports (shells/lazy_packages.py); watch, serve, mcp may not."""
    scanned = _scan(argv, {})
    return scanned is not None and bool(scanned[3]) and scanned[3][0] in WARM_COMMANDS


def _scan(argv: list[str],
          environ: dict[str, str] | os._Environ[str]) -> tuple[str | None, str, bool, list[str]] | None:
    """(home, store url, no daemon, the command and its args) of a command line; None when an option before the
    command is one this scan does not know."""
    home = environ.get("BRAIN_HOME") or None
    store_url = environ.get("BRAIN_STORE_URL") or ""
    no_daemon = environ.get(NO_DAEMON_ENV, "").strip().lower() in _TRUE
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        name, has_value, value = argv[at].partition("=")
        if name in ("--home", "--store-url"):
            if not has_value:
                if at + 1 >= len(argv):
                    return None
                at += 1
                value = argv[at]
            if name == "--home":
                home = value
            else:
                store_url = value
        elif argv[at] == "--no-daemon":
            no_daemon = True
        else:
            return None
        at += 1
    return home, store_url, no_daemon, argv[at:]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a byte of the command line that is not UTF-8 (kept as a lone surrogate)
        return False
    return True


def socket_path_problem(home: Path) -> str | None:
    """Why no warm engine can ever serve this home (its socket path is longer than a Unix socket allows), or None."""
    path = socket_path(home.absolute())
    size = len(os.fsencode(path))
    if size <= SOCKET_PATH_MAX:
        return None
    return (f"no warm engine can serve this home: its socket {path} is {size} bytes, over the {SOCKET_PATH_MAX} a "
            "Unix socket allows; a shorter --home path (a symlink to the home will do) lets `brain watch` serve it")


def own_socket(home: Path) -> Path | None:
    """The home's socket if a client may use it: the folder a directory of this user's that nobody else may enter,
    the socket a socket of this user's. Anything else (missing, someone else's, loosened) is never used."""
    path = socket_path(home)
    try:
        folder, sock = os.lstat(path.parent), os.lstat(path)
    except OSError:
        return None
    uid = os.geteuid()
    if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != uid or folder.st_mode & 0o077:
        return None
    if not stat.S_ISSOCK(sock.st_mode) or sock.st_uid != uid:
        return None
    return path


class WarmEngineLost(Exception):
    """The warm engine took the request and then stopped answering (killed, crashed)."""


class _Fallback:
    """Why this process runs its command itself although a warm engine serves its home (for `brain status`), and the
    line to say at once when the reason is one the user must act on (the engine runs other brain code)."""

    why: str | None = None
    say: str | None = None


_fallback = _Fallback()


def fallback_notice() -> str | None:
    """The line to say at once when the warm engine refused this process's command for a reason the user must act on
    (it runs other brain code), else None."""
    return _fallback.say


def ask_warm(request: WarmRequest, stdout: TextIO | None, stderr: TextIO | None) -> int | None:
    """Run the command on the home's warm engine; its exit code, or None when no warm engine takes it (no socket,
    nobody behind it, not ours, a different environment or store, or a process started with stdout or stderr
    closed: the in-process CLI knows how to end without them). WarmEngineLost once it took the request and went.

    Output is held until the command ends, so that a fallback after a lost engine prints it once; only a terminal
    gets it as it comes (an answer streamed by the LLM)."""
    path = own_socket(request.home)
    if path is None or stdout is None or stderr is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(ACCEPT_SECONDS)
        try:
            conn.connect(str(path))
        except OSError:  # a stale socket (refused), gone meanwhile, or a path too long for AF_UNIX
            return None
        tty = [stdout.isatty(), stderr.isatty()]
        message = request_message(request, tty)
        try:
            conn.sendall(json.dumps(message, ensure_ascii=False).encode() + b"\n")
            frames = conn.makefile("r", encoding="utf-8")
            first = _frame(frames)
        except (OSError, ValueError) as exc:
            raise WarmEngineLost(str(exc) or type(exc).__name__) from None
        if "refused" in first:
            _note_refusal(first, _peer(conn)[0])
            return None
        if "accepted" not in first:
            raise WarmEngineLost("an unexpected reply")
        conn.settimeout(None)  # a command may take as long as it takes (an LLM answer)
        held: dict[str, list[str]] = {"out": [], "err": []}
        streams = {"out": stdout, "err": stderr}
        live = {"out": tty[0], "err": tty[1]}
        while True:
            try:
                frame = _frame(frames)
            except (OSError, ValueError) as exc:
                raise WarmEngineLost(str(exc) or type(exc).__name__) from None
            if "exit" in frame:
                for name in ("out", "err"):
                    streams[name].write("".join(held[name]))
                    streams[name].flush()
                return int(frame["exit"])
            for name in ("out", "err"):
                if name in frame:
                    if live[name]:
                        streams[name].write(frame[name])
                        streams[name].flush()
                    else:
                        held[name].append(frame[name])
    finally:
        conn.close()


def _note_refusal(frame: dict[str, Any], pid: int | None) -> None:
    """Keep why the server refused (for `brain status`); a server of other brain code is also said at once."""
    served = frame.get("served_by") if isinstance(frame.get("served_by"), dict) else {}
    who = ", ".join(str(x) for x in (served.get("server"), f"pid {pid or served.get('pid') or '?'}") if x)
    if "protocol" not in frame:  # a protocol-1 server, which refuses every protocol-2 request
        _fallback.why = (f"the warm engine runs an older brain ({who}): restart it (`systemctl --user restart` its "
                         "unit, or stop `brain watch` and start it again)")
    elif frame.get("outdated"):
        _fallback.why = f"the warm engine runs an older brain ({who}): " + (
            "it restarts itself now" if frame.get("restarts") else "restart it to use this version")
    elif frame.get("other_code"):
        _fallback.why = f"the warm engine runs other brain code than this `brain` ({who}): restart one or the other"
    else:
        _fallback.why = f"the warm engine ({who}) {str(frame.get('refused'))[:300]}"
        return
    _fallback.say = f"brain: {_fallback.why}; running in this process"


def request_message(request: WarmRequest, tty: list[bool]) -> dict[str, Any]:
    """What the client sends for `request` (see the wire in the module's docstring)."""
    return {"protocol": PROTOCOL, "code": code_identity(), "command": request.args, "home": str(request.home),
            "store_url": request.store_url, "env": env_digests(os.environ, request.home),
            "config": config_fingerprint(request.home), "cwd": os.getcwd(), "tty": tty}


def with_turn_id(request: WarmRequest) -> None:
    """An ask gets an id of its own (unless it names one): a warm engine that stores the turn and dies before it
    answers leaves it stored, and the same ask run in-process then answers with it instead of storing it again."""
    if request.args[0] == "ask" and not any(a == "--turn-id" or a.startswith("--turn-id=") for a in request.args):
        request.args = ["ask", "--turn-id", os.urandom(16).hex(), *request.args[1:]]


def _refused_args(args: list[str]) -> bool:
    """Arguments that run the command in the caller's process: help and version (click's own output) and
    `search --queries` (it reads a file relative to the caller's folder, or the caller's stdin)."""
    return any(a in ("-h", "--help", "--version", "--queries") or a.startswith("--queries=") for a in args)


def _frame(frames: Any) -> dict[str, Any]:
    line = frames.readline()
    if not line.endswith("\n"):
        raise ValueError("the connection closed")
    frame = json.loads(line)
    if not isinstance(frame, dict):
        raise ValueError("not a frame")
    return frame


# ---------------------------------------------------------------------------------------------------------- server


class _Client:
    """What the thread answering one client needs: where its output goes and how the client's terminal looks."""

    def __init__(self, conn: socket.socket, brain: Any, served_by: dict[str, Any], cwd: Path,
                 tty: tuple[bool, bool]):
        self.conn, self.brain, self.served_by, self.cwd, self.tty = conn, brain, served_by, cwd, tty
        self.gone = False
        self.lock = threading.Lock()

    def gone_away(self) -> bool:
        """Whether the client has closed its end (killed, Ctrl-C): it sends nothing after its request, so a readable
        end-of-file is its going. Asked between a search's steps, which then stop (Brain.cancelled_when)."""
        if not self.gone:
            try:
                self.gone = self.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                pass
            except OSError:
                self.gone = True
        return self.gone

    def send(self, frame: dict[str, Any]) -> None:
        """A frame to the client; once it has gone (Ctrl-C) the command finishes quietly (a session turn is kept)."""
        data = json.dumps(frame, ensure_ascii=False).encode() + b"\n"
        with self.lock:
            if self.gone:
                return
            try:
                self.conn.sendall(data)
            except OSError:
                self.gone = True


_answering = threading.local()


def _client() -> _Client | None:
    return getattr(_answering, "client", None)


def served_brain() -> Any | None:
    """The Brain this thread's command runs on when a warm engine runs it, else None (the command opens its own)."""
    client = _client()
    return client.brain if client is not None else None


def client_cwd() -> Path:
    """The working directory of the command's caller: the client's when run by a warm engine."""
    client = _client()
    return client.cwd if client is not None else Path.cwd()


def how_this_runs(home: Path) -> dict[str, Any]:
    """For `brain status`: {"mode": "warm", "server": "brain watch", "pid": N}, or {"mode": "in-process"} with "why"
    when a warm engine would have answered but could not (another environment, other brain code, a socket path too
    long for the OS)."""
    client = _client()
    if client is not None:
        return {"mode": "warm", **client.served_by}
    why = _fallback.why or socket_path_problem(home)
    return {"mode": "in-process", "why": why} if why else {"mode": "in-process"}


class _Routed:
    """sys.stdout or sys.stderr while a warm engine serves: a thread answering a client writes to that client, any
    other thread to the real stream (the MCP server's stdout, the page's log lines)."""

    def __init__(self, real: TextIO, name: str):
        self.real = real
        self.name = name

    def write(self, text: str) -> int:
        client = _client()
        if client is None:
            return self.real.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            client.send({self.name: text})
        return len(text)

    def flush(self) -> None:
        if _client() is None:
            self.real.flush()

    def isatty(self) -> bool:
        client = _client()
        if client is None:
            return self.real.isatty()
        return client.tty[0 if self.name == "out" else 1]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class WarmEngine:
    """Serves `brain`'s open Brain on the home's socket until stopped. `run(argv)` runs a CLI command line on the
    calling thread and returns its exit code (rag_app.shells.cli supplies it, so this module never imports the CLI)."""

    def __init__(self, brain: Any, server_name: str, run: Callable[[list[str]], int], store_url: str,
                 on_outdated: Callable[[], None] | None = None):
        """`on_outdated` is called once when a client runs newer brain code than this process loaded (an upgrade or
        an edit since it started): the server restarts itself through it (`brain watch`), or, without one, each
        client says that it must be restarted."""
        import logging

        self.brain = brain
        self.home = Path(brain.home).absolute()
        self.served_by = {"server": server_name, "pid": os.getpid()}
        self.run = run
        self.store_url = store_url
        self.code = code_identity()
        self.on_outdated = on_outdated
        self._outdated = threading.Event()
        self.env = env_digests(os.environ, self.home)
        self.config = config_fingerprint(self.home)  # what the Brain loaded (its settings are read once, at start)
        self.log = logging.getLogger("cflow_brain.warm")
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._bound: tuple[int, int] | None = None
        self._streams: tuple[Any, Any] | None = None

    def start(self) -> str | None:
        """Serve; returns why not instead (another process serves this home, the folder is not ours, the path is
        too long for a socket). Never raises: a server that cannot serve warm still does its own work."""
        import fcntl

        folder = self.home / SOCKET_DIR
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(folder)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                return self._not_serving(f"{folder} is not a folder of this user's")
            if info.st_mode & 0o077:
                os.chmod(folder, 0o700)
            fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            return self._not_serving(f"{folder}: {exc.strerror or exc}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return self._not_serving("another process serves this home's engine")
        self._lock_fd = fd
        path = folder / SOCKET_NAME
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.lexists(path):
                os.unlink(path)  # stale: its server held the lock we now hold, so it is gone
            listener.bind(str(path))
            os.chmod(path, 0o600)
            listener.listen(16)
            listener.settimeout(0.5)
            info = os.lstat(path)
        except OSError as exc:
            listener.close()
            self._release_lock()
            return self._not_serving(f"{path}: {exc.strerror or exc}")
        self._listener, self._bound = listener, (info.st_dev, info.st_ino)
        self.brain.load_libraries()  # before any thread of this process can import them (see Brain.load_libraries)
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Routed(sys.stdout, "out"), _Routed(sys.stderr, "err")  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._accept, name="brain-warm-engine", daemon=True)
        self._thread.start()
        threading.Thread(target=self._warm_up, name="brain-warm-up", daemon=True).start()
        self.log.info("warm engine: serving %s on %s", self.served_by["server"], path)
        return None

    def _warm_up(self) -> None:
        """The models loaded now, not by the first command that comes (which would wait seconds for them)."""
        import time

        began = time.monotonic()
        try:
            with self.brain.refresh_off():  # loading the models, not syncing stale sources
                self.brain.warm_up()
            self.log.info("warm engine: warmed up in %.1f s", time.monotonic() - began)
        except Exception:  # an index not built yet, a model that fails: the first command meets it, as in-process
            self.log.warning("warm engine: warming up failed", exc_info=True)

    def _not_serving(self, reason: str) -> str:
        self.log.info("warm engine: not serving (%s)", reason)
        return reason

    def stop(self) -> None:
        """Stop taking requests, remove the socket (if it is still ours) and the output routing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._listener is not None:
            self._listener.close()
            path = socket_path(self.home)
            try:
                info = os.lstat(path)
                if (info.st_dev, info.st_ino) == self._bound:
                    os.unlink(path)
            except OSError:
                pass
            self._listener = None
        if self._streams is not None:
            if isinstance(sys.stdout, _Routed):
                sys.stdout = self._streams[0]
            if isinstance(sys.stderr, _Routed):
                sys.stderr = self._streams[1]
            self._streams = None
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                self.log.warning("warm engine: accept failed", exc_info=True)
                self._stop.wait(0.5)
                continue
            threading.Thread(target=self._answer, args=(conn,), name="brain-warm-request", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        import time
        import traceback

        with conn:
            peer = _peer(conn)
            if peer[1] is not None and peer[1] != os.geteuid():
                _send_raw(conn, {"refused": "another user"})  # before reading a byte of what it sends
                return
            conn.settimeout(ACCEPT_SECONDS)
            try:
                request = json.loads(conn.makefile("rb").readline(MAX_REQUEST_BYTES))
            except OSError:
                return
            except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
                _send_raw(conn, self._refused("not a request"))
                return
            refusal = self._refusal(request)
            if refusal is not None:
                _send_raw(conn, refusal)
                return
            conn.settimeout(None)
            argv, tty = request["command"], request["tty"]
            client = _Client(conn, self.brain, self.served_by, Path(request["cwd"] or "/"), (tty[0], tty[1]))
            client.send({"accepted": self.served_by})
            began = time.monotonic()
            _answering.client = client
            try:
                # as in-process, a served command never starts a background sync; unlike it, its search stops once
                # its client has gone (killed, Ctrl-C), so the next client does not wait behind it
                with self.brain.refresh_off(), self.brain.cancelled_when(client.gone_away):
                    code = self.run(["--home", str(self.home), *argv])
            except Exception:  # as in-process: the traceback on the caller's stderr, exit 1
                if not client.gone_away():
                    sys.stderr.write(traceback.format_exc())
                code = 1
            finally:
                _answering.client = None
            ended = "stopped: its client went away" if client.gone_away() else f"exit {code}"
            self.log.info("warm engine: `%s` for pid %s, %s, %.3f s", argv[0], peer[0], ended,
                          time.monotonic() - began)
            client.send({"exit": code})

    def _refused(self, reason: str, **more: Any) -> dict[str, Any]:
        return {"refused": reason, "protocol": PROTOCOL, "served_by": self.served_by, **more}

    def _refusal(self, request: Any) -> dict[str, Any] | None:
        """The refused frame for a request run in the client's own process instead, or None to run it here (the
        client's own exclusions repeated: a request need not come from `brain`, and none of its fields is trusted)."""
        if not isinstance(request, dict):
            return self._refused("not a request")
        if request.get("code") != self.code:
            return self._other_code(request.get("code"))
        if request.get("protocol") != PROTOCOL:
            return self._refused(f"speaks protocol {PROTOCOL}")
        argv = request.get("command")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            return self._refused("not a command line")
        tty = request.get("tty")
        texts = [request.get(key) for key in ("home", "cwd", "store_url", "config")]
        env = request.get("env")
        if (not isinstance(tty, list) or len(tty) != 2 or not all(isinstance(t, bool) for t in tty)
                or not all(isinstance(t, str) and "\0" not in t for t in texts)
                or not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
            return self._refused("not a request: tty, home, cwd, store_url, config or env malformed")
        if argv[0] not in WARM_COMMANDS:
            return self._refused(f"runs `{argv[0][:40]}` in the caller's process")
        if _refused_args(argv[1:]):
            return self._refused("runs help, version and --queries in the caller's process")
        try:
            same_home = Path(request["home"]).resolve() == self.home.resolve()
        except (OSError, ValueError):
            same_home = False
        if not same_home:
            return self._refused("serves another home")
        if request["store_url"] != self.store_url:
            return self._refused("runs with another store")
        if env != self.env:
            names = sorted(k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k))
            shown = ", ".join(re.sub(r"[^A-Za-z0-9_]", "?", n)[:60] for n in names[:5]) + (" ..." if names[5:] else "")
            return self._refused(f"runs with another environment: {shown} differ{'s' if len(names) == 1 else ''}")
        if request["config"] != self.config:
            return self._refused(f"loaded {self.home / CONFIG_FILE} before it changed")
        return None

    def _other_code(self, code: object) -> dict[str, Any]:
        """A client of other brain code. When its code is what is installed now, this process runs what was there
        before (an upgrade, an edit): it is outdated, and restarts itself if it can (once)."""
        outdated = isinstance(code, str) and code == code_identity()
        restarts = outdated and self.on_outdated is not None
        if restarts and not self._outdated.is_set():
            self._outdated.set()
            self.log.info("warm engine: brain's code changed since this %s started: restarting",
                          self.served_by["server"])
            assert self.on_outdated is not None
            self.on_outdated()
        elif outdated and not self._outdated.is_set():
            self._outdated.set()
            self.log.warning("warm engine: brain's code changed since this %s started: restart it",
                             self.served_by["server"])
        return self._refused("runs other brain code", outdated=outdated, restarts=restarts, other_code=True)


def _peer(conn: socket.socket) -> tuple[int | None, int | None]:
    """(pid, uid) of the client, where the platform tells (Linux: SO_PEERCRED)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None, None
    import struct

    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _send_raw(conn: socket.socket, frame: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(frame).encode() + b"\n")
    except OSError:
        pass


@contextmanager
def serving(brain: Any, server_name: str, run: Callable[[list[str]], int], store_url: str,
            on_outdated: Callable[[], None] | None = None) -> Iterator[WarmEngine]:
    """A warm engine for the life of the block (not serving, when another process serves the home: see start)."""
    engine = WarmEngine(brain, server_name, run, store_url, on_outdated)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()
