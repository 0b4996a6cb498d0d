"""The cflow-brain agent Skill (package data in rag_app/shells/skill/cflow-brain/) and where each agent looks for it.

Claude Code reads personal skills from `~/.claude/skills/<name>/` (`$CLAUDE_CONFIG_DIR` moves `~/.claude`); Codex from
`$CODEX_HOME/skills/<name>/` (default `~/.codex/skills`; newer Codex releases also read `~/.agents/skills`, reachable
with `--dir`). An install never overwrites a copy someone changed unless forced.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

__all__ = ["SKILL_NAME", "TARGETS", "SkillConflict", "SkillInstall", "default_skills_dir", "install_skill",
           "skill_files"]

SKILL_NAME = "cflow-brain"
TARGETS = ("claude", "codex")


class SkillConflict(Exception):
    """The installed Skill differs from this version's (edited by someone): overwriting needs --force."""


@dataclass
class SkillInstall:
    """What an install did: the Skill's folder and which files it wrote or found already identical."""

    path: Path
    target: str
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def skill_files() -> dict[str, bytes]:
    """Every file of the Skill, relative path → bytes, read from the installed package (wheel or checkout)."""
    root = resources.files("rag_app.shells").joinpath("skill", SKILL_NAME)
    files: dict[str, bytes] = {}
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder.iterdir():
            rel = f"{prefix}{entry.name}"
            if entry.is_dir():
                stack.append((entry, rel + "/"))
            elif not entry.name.startswith("."):
                files[rel] = entry.read_bytes()
    return dict(sorted(files.items()))


def default_skills_dir(target: str) -> Path:
    """The per-user skills folder the agent reads."""
    if target == "claude":
        return Path(os.environ.get("CLAUDE_CONFIG_DIR") or "~/.claude").expanduser() / "skills"
    if target == "codex":
        return Path(os.environ.get("CODEX_HOME") or "~/.codex").expanduser() / "skills"
    raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")


def install_skill(target: str = "claude", skills_dir: str | os.PathLike[str] | None = None,
                  force: bool = False) -> SkillInstall:
    """Write the Skill to `<skills_dir>/cflow-brain/` (default: the agent's per-user folder).

    Files identical to this version are left alone; a file that differs is someone's edit (or an older version)
    and is only replaced with `force`. Files the package does not have are never touched."""
    base = Path(skills_dir).expanduser() if skills_dir else default_skills_dir(target)
    dest = base / SKILL_NAME
    files = skill_files()
    result = SkillInstall(dest, target)
    blocked = _in_the_way(dest, files)
    if blocked:
        raise NotADirectoryError(errno.ENOTDIR, f"{blocked} is in the way of the Skill's files; nothing was written")
    changed = [rel for rel, data in files.items() if (dest / rel).is_file() and (dest / rel).read_bytes() != data]
    if changed and not force:
        raise SkillConflict(f"{dest} holds a changed copy ({', '.join(changed)}); keep it, or overwrite it with "
                            "--force")
    staged: list[tuple[Path, Path]] = []
    try:
        for rel, data in files.items():
            path = dest / rel
            if path.is_file() and path.read_bytes() == data:
                result.unchanged.append(rel)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            staged.append((_staged(path, data), path))
            result.written.append(rel)
        for temp, path in staged:  # every file is written before any is put in place
            os.replace(temp, path)
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
    return result


def _in_the_way(dest: Path, files: dict[str, bytes]) -> Path | None:
    """The first path that would fail the install part-way: a file where a folder goes, a folder where a file goes."""
    for rel in files:
        path = dest / rel
        if path.exists() and not path.is_file():
            return path
        for folder in reversed(path.parents):
            if folder.exists() and not folder.is_dir():
                return folder
    return None


def _staged(path: Path, data: bytes) -> Path:
    """`data` in a hidden file beside `path`, to be renamed over it: a reader (the agent starting up) sees the old
    file or the new one, never half of it."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temp, 0o644)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return Path(temp)
