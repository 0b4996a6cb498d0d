"""Freshness without thinking: `brain watch` (and `serve --watch`, `mcp --watch`) re-syncs a vault when its files
change and polls Memos servers on an interval; long-running shells without a watcher refresh a stale index before a
search, embedding in the background.

Each sync takes the sync lock only while it runs, so a `brain sync` from a terminal can still get in between. One
watcher per home (`watch.lock`, held while it runs): a second one would only sync the same changes again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rag_app.config import Settings, SourceSpec
from rag_app.ingest.lock import StopRequested, SyncBusyError, stop_on_signals
from rag_app.ingest.report import SyncReport
from rag_app.ingest.sync import sync_sources

log = logging.getLogger("cflow_brain.watch")
DEBOUNCE_MS = 300  # file events closer than this are one change (an editor's save is several events)
BUSY_RETRY_SECONDS = 2.0


class WatchBusy(SyncBusyError):
    """Another watcher (`brain watch`, `serve --watch`, `mcp --watch`) keeps this home fresh: a second one would sync
    every change twice, each process with its own copy of embedded Chroma's state (one went stale and failed a sync
    in ~80 with "Error finding id"). It is refused, as a second sync is (exit 3)."""


_CLAIMS: dict[Path, list[int]] = {}  # home → [lock fd, holders in this process]
_CLAIMS_LOCK = threading.Lock()


def claim_watch(home: Path) -> None:
    """Hold `<home>/watch.lock` for this process (re-entrant within it), or raise WatchBusy naming the process that
    holds it. The lock goes with the process: a watcher killed with -9 leaves no stale claim."""
    home = Path(home)
    with _CLAIMS_LOCK:
        held = _CLAIMS.get(home)
        if held is not None:
            held[1] += 1
            return
        fd = os.open(home / "watch.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WatchBusy(f"another watcher (pid {holder}) already keeps {home} fresh: this one is not needed "
                            "(stop that one first to start another)") from None
        os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):  # who holds it is only told to a second watcher (a full disk: not)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        _CLAIMS[home] = [fd, 1]


def release_watch(home: Path) -> None:
    """Give up one hold of this process on the home's watch lock; the last one releases it."""
    home = Path(home)
    with _CLAIMS_LOCK:
        held = _CLAIMS.get(home)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _CLAIMS[home]
            with contextlib.suppress(OSError):
                os.ftruncate(held[0], 0)
            fcntl.flock(held[0], fcntl.LOCK_UN)
            os.close(held[0])


class HomeGone(Exception):
    """The home folder was moved, deleted or replaced while a watcher ran. It stops instead of syncing on: a sync at
    the old path would write a half home there (the notes' rows without their vectors) while the moved home gets no
    updates."""


class Watcher:
    """Syncs `specs` once, then again whenever a vault's notes change or a Memos poll is due, until stopped.

    `on_sync(trigger, report)` hears of every sync ("start", "files", "poll"); `stop` ends the loop (and the sync in
    hand, after its batch)."""

    def __init__(self, settings: Settings, specs: list[SourceSpec], interval: float = 60.0,
                 on_sync: Callable[[str, SyncReport], None] | None = None, stop: StopRequested | None = None):
        self.settings = settings
        self.specs = specs
        self.interval = interval
        self.on_sync = on_sync or (lambda trigger, report: None)
        self.stop = stop if stop is not None else StopRequested()  # (an unset one is falsy)
        self.vaults = {Path(s.path).expanduser().resolve(): s for s in specs if s.kind == "vault"}
        self.memos = [s for s in specs if s.kind == "memos"]
        self._unlisted: set[Path] = set()  # folders already warned about
        self._home: tuple[int, int] | None = None  # the home folder's (device, inode) once it exists

    def run(self) -> None:
        """Block until stopped. In the main thread, SIGINT and SIGTERM stop it. HomeGone when the home folder is
        moved, deleted or replaced meanwhile (checked at least every second and before each sync). WatchBusy when
        another watcher keeps this home fresh."""
        claim_watch(self.settings.home)
        try:
            self._run()
        finally:
            release_watch(self.settings.home)

    def _run(self) -> None:
        with stop_on_signals(self.stop):
            next_poll = 0.0
            for changed in self._events():  # watching starts first: a file saved during the first sync is an event
                if self.stop:
                    break
                self._check_home()
                if not next_poll:
                    self._sync(self.specs, "start")
                    next_poll = time.monotonic() + self.interval
                    continue
                vaults = self._vaults_of(changed)
                if vaults:
                    self._sync(vaults, "files")
                if self.memos and time.monotonic() >= next_poll:
                    self._sync(self.memos, "poll")
                    next_poll = time.monotonic() + self.interval

    def _events(self) -> Iterator[set[Path]]:
        """Sets of changed paths as they settle, and an empty set at least every second (so polls come on time).

        Each folder of a vault is watched on its own (not recursively: that would follow symlinks out of the vault,
        into / or /proc). When the folders change, watching restarts over the new set before the change is handed on,
        so a note saved in a new folder meanwhile is not missed."""
        if not self.vaults:
            yield set()
            while not self.stop.wait(1.0):
                yield set()
            return
        from watchfiles import watch

        pending: set[Path] = set()
        retry = 1.0
        while not self.stop:
            folders = self._folders()
            try:
                for changes in watch(*folders, recursive=False, ignore_permission_denied=True, debounce=DEBOUNCE_MS,
                                     step=50, rust_timeout=1000, yield_on_timeout=True, stop_event=self.stop,
                                     raise_interrupt=False):
                    paths, pending = pending | {Path(path) for _, path in changes}, set()
                    if changes and self._folders() != folders:
                        pending = paths
                        break
                    retry = 1.0
                    yield paths
            except OSError as exc:  # a folder went away or cannot be watched: walk the vaults again, soon
                log.warning("watch: %s; watching again in %g s", exc, retry)
                pending |= set(folders)
                if self.stop.wait(retry):
                    return
                retry = min(retry * 2, 60.0)

    def _folders(self) -> list[Path]:
        """Every folder of the vaults a sync reads: no dot-folder, no symlink (the scanner reads none out of the
        vault); a folder that cannot be listed is a warning, once, not the end of watching."""
        folders: list[Path] = []
        stack = list(self.vaults)
        while stack:
            folder = stack.pop()
            folders.append(folder)
            try:
                with os.scandir(folder) as entries:
                    stack += [Path(e.path) for e in entries
                              if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
            except OSError as exc:
                if folder not in self._unlisted:
                    self._unlisted.add(folder)
                    log.warning("watch: cannot list %s (%s); changes in it are not seen", folder,
                                exc.strerror or exc)
        return sorted(folders)

    def _vaults_of(self, paths: set[Path]) -> list[SourceSpec]:
        """The vault sources a change touches: notes (.md) and folders, not editor or Obsidian state."""
        touched: dict[str, SourceSpec] = {}
        for path in paths:
            if path.suffix.lower() not in (".md", ""):
                continue
            for root, spec in self.vaults.items():  # dot-folders inside the vault are skipped, as the scanner does
                inside = path == root or root in path.parents
                if inside and not any(p.startswith(".") for p in path.relative_to(root).parts):
                    touched[spec.name] = spec
        return list(touched.values())

    def _check_home(self) -> None:
        """HomeGone once the home folder is not the one this watcher has been syncing into."""
        home = Path(self.settings.home).absolute()
        try:
            info = os.stat(home)
            now: tuple[int, int] | None = (info.st_dev, info.st_ino)
        except OSError:
            now = None
        if self._home is None:
            self._home = now
        elif now != self._home:
            log.warning("watch: the home %s was moved, deleted or replaced: stopped", home)
            raise HomeGone(f"the home {home} was moved, deleted or replaced while watching it: stopped, nothing was "
                           "written there; to watch it in its new place: brain --home NEW_PATH watch")

    def _sync(self, specs: list[SourceSpec], trigger: str) -> None:
        while not self.stop:
            self._check_home()
            try:
                report = sync_sources(self.settings, specs, stop=self.stop)
            except SyncBusyError:  # a `brain sync` from a terminal holds the lock: ours comes after it
                if self.stop.wait(BUSY_RETRY_SECONDS):
                    return
                continue
            except Exception:  # a watcher outlives a bad moment; the next event or poll tries again
                log.exception("watch: sync (%s) failed", trigger)
                return
            self.on_sync(trigger, report)
            return


class BackgroundWatch:
    """A Watcher on a daemon thread, for `serve --watch` and `mcp --watch`: `stop()` when the server ends."""

    def __init__(self, watcher: Watcher):
        self.watcher = watcher
        self.thread = threading.Thread(target=_logged(watcher.run), name="brain-watch", daemon=True)

    def stop(self, timeout: float = 30.0) -> bool:
        """Ask the watcher to stop and wait up to `timeout` s for a sync in hand to finish its batch; True when the
        thread has ended (a daemon left running would be cut off mid-write when the process exits)."""
        self.watcher.stop.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("watch: the background watcher did not stop within %g s; the next sync resumes its work",
                        timeout)
            return False
        return True


def watch_in_background(settings: Settings, specs: list[SourceSpec], interval: float,
                        on_sync: Callable[[str, SyncReport], None] | None = None) -> BackgroundWatch:
    """Start a Watcher on a daemon thread; stop it through the returned handle."""
    background = BackgroundWatch(Watcher(settings, specs, interval, on_sync))
    background.thread.start()
    return background


def _logged(run: Callable[[], None]) -> Callable[[], None]:
    """A thread's work whose failure reaches brain.log (a thread's traceback otherwise goes to a stderr nobody reads,
    and the page or MCP server goes on serving an index nothing refreshes)."""
    def logged() -> None:
        try:
            run()
        except (HomeGone, WatchBusy) as exc:
            log.warning("watch: %s", exc)
        except Exception:
            log.exception("watch: the background watcher stopped; restart the server to watch again")
    return logged
