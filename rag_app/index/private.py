"""What only this user may read or change: the home (every note in full, config.toml, the databases, the log) and
the per-user cache folder (rag_app.index.user_cache).

A user who can read a home reads the notes; one who made it or can write to it chooses, through its config.toml,
where questions and note text are sent. So a home is made 0700; everything written while one is open is private (the
process umask, because SQLite's journals and Chroma's files are made by libraries); an older home that others may
read is tightened when it is opened, with one line saying so; and a home (or anything in it) that is not this user's,
or that others may write to, is refused with one line naming the path and why. The folders above a home are not
checked: a home someone swapped for their own is theirs, and refused.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from rag_app.config import ConfigError

PRIVATE_UMASK = 0o077
_user_umask: list[int] = []  # the umask this process had before keep_private (set once)


def keep_private() -> None:
    """From now on, what this process creates is this user's alone (umask 077). What is meant to be shared, such as a
    note captured into a vault, gets the user's own mode back with `shared_mode`."""
    previous = os.umask(PRIVATE_UMASK)
    if not _user_umask:
        _user_umask.append(previous)


def shared_mode(mode: int) -> int:
    """`mode` as the user's own umask makes it (the one before keep_private)."""
    if _user_umask:
        return mode & ~_user_umask[0]
    current = os.umask(0)
    os.umask(current)
    return mode & ~current


def make_home(home: Path) -> bool:
    """Create the home 0700 (and any missing folder above it); whether it was created."""
    keep_private()
    if home.is_dir():
        return False
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return True


def open_home(home: Path) -> str | None:
    """Check a home before anything in it is read: ConfigError (one line: the path and why) when it or anything in it
    is another user's or writable by others; else make what others may read private. The line saying what was
    tightened, or None. A home that does not exist yet is fine: make_home creates it private."""
    keep_private()
    reason = others_symlink(home.absolute())
    if reason:
        raise ConfigError(f"{reason}: a home is never reached through another user's symlink (what is written there "
                          "would land where they chose); use a home of your own (--home)")
    try:
        top = os.stat(home)  # a home given as a symlink of this user's is the folder it names
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"the home {home} cannot be opened ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(top.st_mode):
        raise ConfigError(f"the home {home} is not a folder")
    loose: list[tuple[str, int]] = []
    for path, info in _entries(home, top):
        reason = not_ours(path, info) or _writable_by_others(path, info)
        if reason:
            raise ConfigError(f"{reason}: a home must be yours alone (another user could read your notes, or send "
                              f"them elsewhere through its config.toml); use a home of your own (--home), or "
                              f"check {home} and make it yours alone (chown, chmod -R go-w)")
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
            loose.append((path, stat.S_IMODE(info.st_mode)))
    return _tighten(home, loose)


def not_ours(path: str | Path, info: os.stat_result) -> str | None:
    """Why `path` (its lstat or stat in `info`) is not this user's, or None."""
    uid = os.geteuid()
    if info.st_uid == uid:
        return None
    return f"{path} belongs to uid {info.st_uid}{_user_name(info.st_uid)}, not to this user (uid {uid})"


def others_symlink(path: Path) -> str | None:
    """Why `path` leads where another user chose, or None: it, or a folder on the way to it, is a symlink of someone
    else's but root's (one planted in a sticky folder such as /tmp, pointing to a folder of ours: what we write would
    land there, among our own files)."""
    uid = os.geteuid()
    for step in (path, *path.parents):
        try:
            info = os.lstat(step)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (uid, 0):
            return f"{step} is a symlink of uid {info.st_uid}'s{_user_name(info.st_uid)}"
    return None


def writers(mode: int) -> str:
    """Who besides the owner may write under `mode`: 'its group', 'others', both joined by 'and', or ''."""
    return " and ".join(who for who, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit)


def _writable_by_others(path: str, info: os.stat_result) -> str | None:
    """Why others may change `path`, or None. Group write of this user's own private group (the umask 002 of
    user-private-group systems, Ubuntu's default) changes nothing: that group has no one else in it."""
    mode = info.st_mode & (0o002 if _own_private_group(info.st_gid) else 0o022)
    if stat.S_ISLNK(info.st_mode) or not mode:
        return None
    return f"{path} is writable by {writers(mode)} (mode {stat.S_IMODE(info.st_mode):04o})"


def _own_private_group(gid: int) -> bool:
    try:
        user = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _entries(home: Path, top: os.stat_result) -> list[tuple[str, os.stat_result]]:
    """The home and everything in it (lstat: a symlink is checked as itself and never followed)."""
    found = [(str(home), top)]
    for folder, folders, files in os.walk(home):
        for name in [*folders, *files]:
            path = os.path.join(folder, name)
            try:
                found.append((path, os.lstat(path)))
            except FileNotFoundError:  # removed meanwhile (a journal, a temporary file)
                continue
    return found


def _tighten(home: Path, loose: list[tuple[str, int]]) -> str | None:
    """Take group and others' access away from `loose`; the line saying so (or why it could not be done)."""
    if not loose:
        return None
    failed = ""
    for path, mode in loose:
        try:
            os.chmod(path, mode & 0o700)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed = failed or f"{path}: {exc.strerror or exc}"
    example, mode = next(((p, m) for p, m in loose if p != str(home)), loose[0])
    example = "the folder itself" if example == str(home) else os.path.relpath(example, home)
    if failed:
        return (f"the home {home} is readable by others (e.g. {example}, mode {mode:04o}) and could not be made "
                f"private ({failed})")
    return (f"made the home {home} private: {len(loose)} of its files and folders were readable by others "
            f"(e.g. {example}, mode {mode:04o}); now only you can read them")


def _user_name(uid: int) -> str:
    try:
        return f" ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return ""
