"""The per-user cache folder of derived data: USE-m3's tokenizer tables and arrays, jieba's dictionary (marshal, .npy,
SQLite). Such files are loaded as they are, so a file another user could plant there must never be read: the folder
is used only while nobody else can write to it or to any folder above it."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
from pathlib import Path

from rag_app.index.private import not_ours, others_symlink, writers

log = logging.getLogger("cflow_brain.cache")
FOLDER = "cflow-brain"
READ = ("usem3-", "jieba-", "cedict-", "cedictrev-")  # how the names of what is read from the folder start
_warned: set[str] = set()
_swept: set[Path] = set()  # private folders cleared of others' entries in this process: nobody else can add any


def cache_dir() -> Path | None:
    """Our folder in XDG_CACHE_HOME (when absolute) or the home's .cache, created 0700, as a resolved path; None when
    it is not private (someone else's, writable by group or others, or below a folder others may write to without the
    sticky bit) or cannot be made: the derived data is then built in memory, and the log says why, once."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    try:
        root = Path(base) if os.path.isabs(base) else _home() / ".cache"
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = root / FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        resolved = folder.resolve(strict=True)
        reason = others_symlink(folder) or _not_private(resolved)
        if reason is None and resolved not in _swept:
            reason = _remove_others_entries(resolved)
            if reason is None:
                _swept.add(resolved)
    except OSError as exc:
        resolved, reason = None, str(exc)
    except KeyError:
        resolved, reason = None, f"no home folder: HOME is not an absolute path and uid {os.geteuid()} has no entry"
    if reason is None:
        return resolved
    if reason not in _warned:
        _warned.add(reason)
        log.warning("not using the cache folder: %s; tokenizer and model tables are built in memory", reason)
    return None


def _home() -> Path:
    """HOME when it is an absolute path, else the user database's home: Path.home() takes an empty HOME for "/" and a
    relative one from the current folder. KeyError when this user has no entry."""
    home = os.environ.get("HOME", "")
    return Path(home) if os.path.isabs(home) else Path(pwd.getpwuid(os.geteuid()).pw_dir)


def _not_private(folder: Path) -> str | None:
    """Why others could change what `folder` holds, or None: it must be a folder of this user's that group and others
    cannot write to, and each folder above it this user's or root's, writable by others only with the sticky bit
    (as /tmp: nobody else may then rename or remove what is ours in it)."""
    uid = os.geteuid()
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a folder"
    reason = not_ours(folder, info)
    if reason:
        return reason
    if info.st_mode & 0o022:
        return f"{folder} is writable by {writers(info.st_mode)} (mode {stat.S_IMODE(info.st_mode):04o})"
    for above in folder.parents:
        info = os.lstat(above)
        if info.st_uid not in (uid, 0):
            return f"{above}, above it, belongs to uid {info.st_uid}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return f"{above}, above it, is writable by {writers(info.st_mode)} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _remove_others_entries(folder: Path) -> str | None:
    """Remove what is read from `folder` (READ), at any depth, that is not this user's or root's (by lstat: a symlink
    counts as its own): only another user could have put it there, while the folder was open to others. Why the
    folder cannot be used, or None."""
    uid = os.geteuid()
    removed: list[str] = []
    for top, folders, files in os.walk(folder):
        if top == str(folder):
            folders[:] = [name for name in folders if name.startswith(READ)]
            files = [name for name in files if name.startswith(READ)]
        for name in [*folders, *files]:
            path = os.path.join(top, name)
            try:
                owner = os.lstat(path).st_uid
            except FileNotFoundError:  # ours, gone meanwhile: a partial file another process renamed into place
                continue
            if owner in (uid, 0):
                continue
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                    folders.remove(name)
                else:
                    os.unlink(path)
            except OSError as exc:
                return f"{path}, in it, belongs to uid {owner} and cannot be removed ({exc.strerror})"
            removed.append(f"{os.path.relpath(path, folder)} (uid {owner})")
    if removed:
        log.warning("removed from the cache folder %s what another user had put there: %s", folder, ", ".join(removed))
    return None
