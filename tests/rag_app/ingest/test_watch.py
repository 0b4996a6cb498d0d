"""Freshness: `brain watch` re-syncs on file events and Memos polls; long-running shells refresh a stale index."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rag_app.engine import Brain
from rag_app.shells import cli
from tests.conftest import REPO
from tests.doubles.memos_server import MemosDouble
from tests.rag_app.shells.test_cli import BRAIN, brain


def wait_for(condition, timeout: float, step: float = 0.1) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s")


def found(home: Path, query: str) -> list[str]:
    done = brain(home, "search", query, "--json", "--mode", "bm25")
    return [r["note_id"] for r in json.loads(done.stdout)["results"]] if done.returncode == 0 else []


class WatchProcess:
    """`brain watch --json` as a user runs it, its JSON lines collected as they come."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None):
        full_env = {k: v for k, v in os.environ.items() if k not in ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "BRAIN_HOME")}
        full_env["PYTHONFAULTHANDLER"] = "1"  # a native crash prints every thread's stack (see stop)
        self.process = subprocess.Popen([*BRAIN, "--home", str(home), "watch", "--json", *args], cwd=REPO,
                                        env=full_env | (env or {}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """The exit code; a process killed by a signal (a segfault at shutdown, seen once in CI) fails the test with
        its stderr, where the fault handler wrote the stacks."""
        self.process.send_signal(signum)
        code = self.process.wait(timeout=30)
        assert code >= 0, f"watch died of signal {-code}:\n{self.process.stderr.read()[-6000:]}"
        return code


def test_watch_makes_new_edited_and_deleted_notes_searchable_within_seconds(home, make_vault):
    vault = make_vault({"a.md": "# Alpha\n\nthe first note\n"})
    watcher = WatchProcess(home, "--vault", str(vault))
    try:
        wait_for(lambda: watcher.lines, 120)
        assert watcher.lines[0]["trigger"] == "start" and watcher.lines[0]["sources"][0]["added"] == 1
        # within seconds: each change is searchable inside this bound; its typical latency is bench/watch_bench.py's
        (vault / "b.md").write_text("# Bravo\n\nquokka sightings on the island\n", encoding="utf-8")
        wait_for(lambda: found(home, "quokka") == ["vault:notes/b.md"], 30)
        (vault / "b.md").write_text("# Bravo\n\nwombat sightings instead\n", encoding="utf-8")
        wait_for(lambda: found(home, "wombat") == ["vault:notes/b.md"], 30)
        assert found(home, "quokka") == []
        (vault / "b.md").unlink()
        wait_for(lambda: found(home, "wombat") == [], 30)
        assert {line["trigger"] for line in watcher.lines[1:]} == {"files"}
    finally:
        code = watcher.stop()
    assert code == 0
    assert Brain(home).status()["channels"]["use-m3"]["complete"] is True


def test_watch_polls_memos_on_its_interval_and_exits_0_on_sigint(home):
    with MemosDouble(mode="head") as double:
        double.add_memo("the first memo")
        watcher = WatchProcess(home, "--memos", double.url, "--interval", "1",
                               env={"CFLOW_API_TOKEN": "memos_pat_test"})
        try:
            wait_for(lambda: watcher.lines, 120)
            double.add_memo("a capybara memo written while watching")
            wait_for(lambda: len(found(home, "capybara")) == 1, 30)
            assert any(line["trigger"] == "poll" for line in watcher.lines)
        finally:
            code = watcher.stop(signal.SIGINT)
    assert code == 0


def test_a_background_watcher_keeps_a_long_running_brain_fresh(home, make_vault):
    vault = make_vault({"a.md": "# Alpha\n\nfirst\n"})
    brain_ = Brain(home)
    watcher = brain_.watch_in_background(brain_.resolve_sources(vaults=(str(vault),)), interval=60)
    try:
        wait_for(lambda: brain_.status()["notes"] == 1, 120)
        assert [r["note_id"] for r in brain_.search("first", mode="bm25").results] == ["vault:notes/a.md"]
        (vault / "c.md").write_text("# Charlie\n\nnarwhal facts\n", encoding="utf-8")
        wait_for(lambda: [r["note_id"] for r in brain_.search("narwhal").results[:1]] == ["vault:notes/c.md"], 30)
    finally:
        ended = watcher.stop(timeout=30)
    assert ended and not watcher.thread.is_alive()


def test_serve_and_mcp_with_watch_stop_their_watcher_when_they_end(home, make_vault):
    """`serve --watch` and `mcp --watch` run inside cli.kept_fresh: when the server returns, the watcher thread ends
    (a sync in hand finishes its batch) instead of being cut off mid-write at exit."""
    vault = make_vault({"a.md": "# Alpha\n\nfirst\n"})
    (home / "config.toml").write_text(f'[embedding]\nmodel = "use-m3"\n[[sources]]\nkind = "vault"\npath = "{vault}"\n',
                                      encoding="utf-8")
    brain_ = Brain(home)
    with cli.kept_fresh(brain_, True, interval=60) as watcher:
        assert watcher is not None and watcher.thread.is_alive()
        wait_for(lambda: brain_.status()["notes"] == 1, 120)
    watcher.thread.join(1)
    assert not watcher.thread.is_alive()
    assert not brain_.auto_refresh


def test_serve_and_mcp_without_watch_refresh_a_stale_index_instead(home):
    brain_ = Brain(home)
    with cli.kept_fresh(brain_, False, interval=60) as watcher:
        assert watcher is None and brain_.auto_refresh


def test_a_stale_index_is_refreshed_before_a_search_and_embedding_goes_on_in_the_background(home, make_vault):
    vault = make_vault({"a.md": "# Alpha\n\nfirst\n"})
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[sync]\nstale_seconds = 1\n', encoding="utf-8")
    Brain(home).sync(vaults=(str(vault),))
    (vault / "d.md").write_text("# Delta\n\naxolotl care sheet\n", encoding="utf-8")
    time.sleep(1.2)
    brain_ = Brain(home)
    brain_.auto_refresh = True
    response = brain_.search("axolotl")
    assert [r["note_id"] for r in response.results[:1]] == ["vault:notes/d.md"]
    freshness = response.coverage["freshness"]
    assert freshness["checked"] is True and freshness["changed_notes"] == 1
    assert brain_.search("axolotl").coverage.get("freshness") in (None, {"syncing": True})  # not re-checked at once
    wait_for(lambda: brain_.status()["channels"]["use-m3"]["complete"], 60)


def test_without_auto_refresh_a_search_never_syncs(home, make_vault):
    vault = make_vault({"a.md": "# Alpha\n\nfirst\n"})
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[sync]\nstale_seconds = 1\n', encoding="utf-8")
    Brain(home).sync(vaults=(str(vault),))
    (vault / "e.md").write_text("# Echo\n\npangolin\n", encoding="utf-8")
    time.sleep(1.2)
    response = Brain(home).search("pangolin")
    assert "freshness" not in response.coverage and not any(r["note_id"].endswith("e.md") for r in response.results)


def test_a_vault_inside_a_dot_folder_is_watched_but_its_own_dot_folders_are_not(home, tmp_path):
    from rag_app.config import load_settings, vault_source
    from rag_app.ingest.watch import Watcher

    root = tmp_path / ".config" / "vault"
    root.mkdir(parents=True)
    spec = vault_source(str(root))
    watcher = Watcher(load_settings(home), [spec])
    resolved = root.resolve()
    assert watcher._vaults_of({resolved / "note.md"}) == [spec]
    assert watcher._vaults_of({resolved / ".obsidian" / "workspace.md", resolved / "x.json"}) == []


def inotify_watches(pid: int) -> int:
    """The inotify watches a process holds: the `inotify wd:` lines of its descriptors' fdinfo."""
    count = 0
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            count += info.read_text().count("inotify wd:")
        except OSError:  # a descriptor closed meanwhile
            continue
    return count


def test_a_symlink_out_of_the_vault_is_never_watched_and_a_new_folder_is(home, make_vault, tmp_path):
    """Issue 22 item 3: `ln -s / V/root` led the watcher into /proc, where it died; `ln -s /usr V/usr` added 15,715
    watches. Only the vault's own folders are watched (as the scanner reads only them), new ones included."""
    outside = tmp_path / "outside"
    for n in range(40):
        (outside / f"f{n}" / "sub").mkdir(parents=True)
    vault = make_vault({"a.md": "# Alpha\n\nfirst\n", "sub/b.md": "# Bravo\n\nsecond\n", ".obsidian/app.json": "{}"})
    (vault / "out").symlink_to(outside, target_is_directory=True)
    watcher = WatchProcess(home, "--vault", str(vault))
    try:
        wait_for(lambda: watcher.lines, 120)
        assert watcher.lines[0]["sources"][0]["added"] == 2
        assert inotify_watches(watcher.process.pid) == 2, "the vault and sub/: not .obsidian, not the 81 outside"
        (outside / "f1" / "x.md").write_text("# Outside\n\nokapi\n", encoding="utf-8")
        time.sleep(2)
        assert len(watcher.lines) == 1, "a change outside the vault is no event"
        (vault / "new").mkdir()
        (vault / "new" / "c.md").write_text("# Charlie\n\ncapybara\n", encoding="utf-8")
        wait_for(lambda: found(home, "capybara") == ["vault:notes/new/c.md"], 30)
        (vault / "new" / "d.md").write_text("# Delta\n\nnarwhal\n", encoding="utf-8")
        wait_for(lambda: found(home, "narwhal") == ["vault:notes/new/d.md"], 30)
        assert inotify_watches(watcher.process.pid) == 3
    finally:
        code = watcher.stop()
    assert code == 0 and found(home, "okapi") == []


def test_watch_holds_a_mass_delete_says_so_once_and_keeps_the_index(home, make_vault, tmp_path):
    """Issue 22: under `brain watch` a vault emptied by a sync client lost all its notes within seconds."""
    vault = make_vault({f"notes/n{i}.md": f"# Note {i}\n\nlemur fact {i}\n" for i in range(4)})
    full_env = {k: v for k, v in os.environ.items() if k not in ("CFLOW_API_TOKEN", "MEMOS_TOKEN", "BRAIN_HOME")}
    process = subprocess.Popen([*BRAIN, "--home", str(home), "watch", "--vault", str(vault)], cwd=REPO, env=full_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True).start()
    try:
        wait_for(lambda: len(found(home, "lemur")) == 4, 120)
        (vault / "notes").rename(tmp_path / "away")  # the folder emptied at once
        wait_for(lambda: any("--allow-deletes notes" in line for line in errors), 30)
        (vault / "empty folder").mkdir()  # another change: the next sync is held for the same reason
        time.sleep(4)
        (tmp_path / "away").rename(vault / "notes")
        time.sleep(4)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0
    held = [line for line in errors if "--allow-deletes" in line]
    assert len(held) == 1 and "found 0 of its 4 notes" in held[0], errors
    assert len(found(home, "lemur")) == 4 and Brain(home).status()["notes"] == 4


@pytest.mark.parametrize("how", ["moved", "deleted", "replaced"])
def test_a_watch_whose_home_goes_stops_with_one_line_and_writes_no_half_home(home, make_vault, how):
    """`mv home home2`, `rm -rf home` or a new folder put in its place under a running `brain watch`: it stops with
    one line and exit 1 (before: the next sync wrote a new half home at the old path, 0 vectors, and the moved home
    got no updates)."""
    vault = make_vault({"a.md": "# Alpha\n\nthe first note\n"})
    watcher = WatchProcess(home, "--vault", str(vault))
    moved = home.with_name("home2")
    try:
        wait_for(lambda: watcher.lines, 120)
        if how == "deleted":
            shutil.rmtree(home)
        else:
            home.rename(moved)
            if how == "replaced":
                home.mkdir()
        (vault / "b.md").write_text("# Bravo\n\na note saved after the home went\n", encoding="utf-8")
        code = watcher.process.wait(timeout=60)  # it notices within a second or two; generous for 2 shared cores
    finally:
        if watcher.process.poll() is None:
            watcher.stop()
    err = watcher.process.stderr.read()
    assert code == 1, err
    assert err.splitlines()[-1] == (f"brain: the home {home} was moved, deleted or replaced while watching it: "
                                    "stopped, nothing was written there; to watch it in its new place: "
                                    "brain --home NEW_PATH watch")
    assert len(watcher.lines) == 1  # no sync after the home went
    if how == "replaced":
        assert list(home.iterdir()) == []
    else:
        assert not home.exists()
