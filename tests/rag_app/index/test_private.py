"""A home is this user's alone: `brain` makes it 0700 and everything in it 0600, tightens an older one others could
read (one line), and refuses one that another user made or may write to (one line, nothing read, nothing sent).
"Another user" is a real one: a process running as nobody (uid 65534), as CI runs as root."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_app.config import ConfigError
from rag_app.engine import Brain
from tests.conftest import write_files
from tests.doubles.openai_server import OpenAIDouble
from tests.rag_app.shells.test_cli import brain

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's process takes root to start (CI runs as root)")


def as_nobody(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A shell script run by another user (`sh`: the project's Python may sit in a folder nobody can enter)."""
    return subprocess.run(["/bin/sh", "-c", script], user=NOBODY, group=NOBODY, extra_groups=[], env=env,
                          capture_output=True, text=True, timeout=60, cwd="/")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp (sticky, open to all), so another user can reach what is in it; removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="brain-private-"))
    top.chmod(0o1777)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def loose_entries(home: Path) -> list[str]:
    """What in the home group or others may read, write or enter."""
    return [f"{path} {stat.S_IMODE(path.lstat().st_mode):04o}" for path in [home, *home.rglob("*")]
            if not path.is_symlink() and path.lstat().st_mode & 0o077]


@as_root
def test_a_home_sync_creates_is_private_and_another_user_cannot_read_a_note(shared_tmp: Path):
    vault = write_files(shared_tmp / "vault", {"secret.md": "# Salary\n\nmy salary is 123456"})
    home = shared_tmp / "home"
    done = brain(home, "sync", "--vault", str(vault))
    assert done.returncode == 0, done.stderr
    assert "private" not in done.stderr, "a new home has nothing to tighten"
    names = {p.name for p in home.iterdir()}
    assert {"docstore.sqlite", "index.sqlite", "brain.log", "chroma", "bm25"} <= names
    assert loose_entries(home) == []
    for name in ("docstore.sqlite", "index.sqlite"):
        read = as_nobody('cat "$FILE" >/dev/null', FILE=str(home / name))
        assert read.returncode != 0 and "Permission denied" in read.stderr, read.stdout[:200]
    assert brain(home, "status").stderr == ""


@as_root
def test_an_older_home_others_could_read_is_tightened_with_one_line(shared_tmp: Path, home: Path):
    vault = write_files(shared_tmp / "vault", {"secret.md": "# Salary\n\nmy salary is 123456"})
    assert brain(home, "sync", "--vault", str(vault)).returncode == 0
    assert brain(home, "ask", "salary?", "--session", "s").returncode == 0
    moved = shared_tmp / "old-home"
    shutil.move(home, moved)
    for path in [moved, *moved.rglob("*")]:  # as versions before this one left it (umask 022)
        path.chmod(0o755 if path.is_dir() else 0o644)
    sessions = str(moved / "sessions.sqlite")
    assert as_nobody('cat "$FILE" >/dev/null', FILE=sessions).returncode == 0, "readable before"
    done = brain(moved, "status")
    assert done.returncode == 0
    [line] = done.stderr.splitlines()
    assert line.startswith(f"brain: made the home {moved} private: ") and "now only you can read them" in line
    assert loose_entries(moved) == []
    assert as_nobody('cat "$FILE" >/dev/null', FILE=sessions).returncode != 0
    again = brain(moved, "status")
    assert (again.returncode, again.stderr) == (0, "")


@as_root
def test_a_home_another_user_made_is_refused_and_nothing_reaches_their_server(shared_tmp: Path):
    """The attack of issue 30: a 0777 home in a shared folder, with a config.toml naming the other user's server."""
    vault = write_files(shared_tmp / "vault", {"secret.md": "# Salary\n\nmy salary is 123456"})
    trap = shared_tmp / "brain-home"
    with OpenAIDouble(["got it"]) as server:
        config = f'[llm]\nbase_url = "{server.url}"\nmodel = "m"\n[embedding]\nmodel = "use-m3"\n'
        made = as_nobody('mkdir -m 0777 "$HOME_DIR" && printf %s "$CONFIG" > "$HOME_DIR/config.toml"',
                         HOME_DIR=str(trap), CONFIG=config)
        assert made.returncode == 0, made.stderr
        for args in (["sync", "--vault", str(vault)], ["ask", "what is my salary?"], ["status"], ["sessions"]):
            done = brain(trap, *args)
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            [line] = done.stderr.splitlines()
            assert line.startswith(f"brain: {trap} belongs to uid {NOBODY} (nobody), not to this user"), line
            assert "a home must be yours alone" in line
        assert server.requests == [] and server.variant_requests == []
    assert sorted(p.name for p in trap.iterdir()) == ["config.toml"], "nothing was written there"


@as_root
def test_another_users_file_in_our_home_is_refused(home: Path):
    planted = home / "config.toml"
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=rf"^{planted} belongs to uid {NOBODY} \(nobody\), not to this user"):
        Brain(home)


@pytest.mark.parametrize("loosen", ["home", "config.toml"])
def test_a_home_others_may_write_to_is_refused(home: Path, loosen: str):
    path = home if loosen == "home" else home / loosen
    path.chmod(0o777 if loosen == "home" else 0o666)
    with pytest.raises(ConfigError, match="a home must be yours alone") as refused:
        Brain(home)
    assert str(refused.value).startswith(f"{path} is writable by ")
    assert f"others (mode {0o777 if loosen == 'home' else 0o666:04o})" in str(refused.value)


def test_a_home_writable_only_by_the_users_own_private_group_is_tightened(home: Path, monkeypatch):
    """Ubuntu's umask 002 makes files group-writable for a group with nobody else in it: nothing to refuse."""
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid())
    monkeypatch.setattr(grp, "getgrgid", lambda gid: grp.struct_group((me.pw_name, "x", me.pw_gid, [])))
    os.chown(home / "config.toml", -1, me.pw_gid)
    (home / "config.toml").chmod(0o664)
    notice = Brain(home).notices
    assert len(notice) == 1 and "made the home" in notice[0]
    assert stat.S_IMODE((home / "config.toml").stat().st_mode) == 0o600


def test_brain_status_json_still_reads_a_tightened_home(home: Path):
    home.chmod(0o755)
    done = brain(home, "status", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["notes"] == 0
    assert done.stderr.count("\n") == 1 and "made the home" in done.stderr


@as_root
def test_a_home_through_another_users_symlink_is_refused_and_nothing_is_written_where_it_points(shared_tmp: Path,
                                                                                             tmp_path: Path):
    """The /tmp symlink trick: another user points /tmp/brain-home at a folder of ours (say ~/public_html); a sync
    there would tighten our files and write the index among them."""
    mine = tmp_path / "public_html"
    mine.mkdir(mode=0o755)
    (mine / "index.html").write_text("hello")
    (mine / "index.html").chmod(0o644)
    link = shared_tmp / "brain-home"
    link.symlink_to(mine)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    vault = write_files(tmp_path / "vault", {"a.md": "# A\n\nalpha"})
    done = brain(link, "sync", "--vault", str(vault))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith(f"brain: {link} is a symlink of uid {NOBODY}'s (nobody): a home is never reached"), line
    assert [p.name for p in mine.iterdir()] == ["index.html"]
    assert stat.S_IMODE((mine / "index.html").stat().st_mode) == 0o644
