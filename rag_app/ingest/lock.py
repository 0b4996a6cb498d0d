"""One sync at a time per home, and how a sync is asked to stop: the lock file, Ctrl-C and SIGTERM."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("cflow_brain.sync")
class SyncBusyError(Exception):
    """Another process holds the sync lock."""


class SyncLock:
    """An exclusive flock on `<home>/sync.lock`; waits up to `wait` seconds, then refuses with who holds it."""

    def __init__(self, home: Path, wait: float):
        self.path = home / "sync.lock"
        self.wait = wait
        self._fd: int | None = None

    def __enter__(self) -> SyncLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise SyncBusyError(
                        f"another sync is running on {self.path.parent} (pid {holder}); "
                        f"waited {self.wait:g} s — try again when it finishes"
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):  # who holds the lock is only told to a waiting sync (a full disk: not)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class StopRequested:
    """A sync asked to stop (Ctrl-C, SIGTERM, a watcher shutting down): it ends after the batch in hand, with every
    finished batch committed, and the next sync resumes there."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

@contextmanager


def stop_on_signals(stop: StopRequested) -> Iterator[None]:
    """In the main thread, the first SIGINT/SIGTERM asks the sync to stop; a second SIGINT aborts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request(signum: int, frame: Any) -> None:
        if stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("stop requested (signal %d): finishing the batch in hand", signum)
        stop.set()

    previous = {sig: signal.signal(sig, request) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
