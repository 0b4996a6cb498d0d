"""Several brain processes on one home with embedded Chroma: a long-running one (a watcher, a page, an agent's server)
syncs after a `brain sync` from a terminal wrote the index; a second watcher is refused. Real Chroma, real CLI
processes."""

from __future__ import annotations

import signal
import subprocess

from rag_app.engine import Brain
from rag_app.index import store
from rag_app.shells import cli
from tests.conftest import REPO
from tests.rag_app.ingest.test_watch import WatchProcess, found, wait_for
from tests.rag_app.shells.test_cli import BRAIN, brain


def _notes(vault, count: int) -> None:
    vault.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        (vault / f"n{n}.md").write_text(f"# note {n}\n\nfirst words of note {n}\n", encoding="utf-8")


def test_a_long_running_brain_syncs_after_a_terminal_sync_added_notes(home, tmp_path):
    """A Brain that synced once (its process keeps embedded Chroma's indexes in memory) syncs again after a `brain
    sync` in another process added a note, and deletes or edits that note: before, its stale indexes failed the sync
    with Chroma's "Error finding id", told as the source's failure with `brain source remove` as the way out."""
    vault = tmp_path / "vault"
    _notes(vault, 6)
    long_running = Brain(home)
    try:
        assert not long_running.sync(vaults=(str(vault),)).failed
        (vault / "added.md").write_text("# added\n\nan okapi note from the terminal\n", encoding="utf-8")
        (vault / "other.md").write_text("# other\n\nanother one\n", encoding="utf-8")
        done = brain(home, "--no-daemon", "sync", "--vault", str(vault))
        assert done.returncode == 0, done.stderr
        (vault / "added.md").write_text("# added\n\nnow about a pangolin\n", encoding="utf-8")
        (vault / "other.md").unlink()
        report = long_running.sync(vaults=(str(vault),))
        assert not report.failed, [s.error for s in report.sources]
        assert report.sources[0].updated == 1 and report.sources[0].deleted == 1
        hits = long_running.search("pangolin", k=1, expand=False).results
        assert [r["note_id"] for r in hits] == ["vault:vault/added.md"]
    finally:
        long_running.close()
    doctor = brain(home, "--no-daemon", "doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_a_store_race_is_told_as_the_stores_never_as_the_sources(home, tmp_path, monkeypatch):
    """Should Chroma still refuse a sync's call (a process that leaves no mark, an older brain), the failure is the
    store's: one line naming Chroma, exit 2 for `brain sync`, the notes kept, and never `brain source remove`, which
    would drop every note of a source that did nothing wrong."""
    monkeypatch.setattr(store, "_forget_if_stale", lambda *args: None, raising=False)  # the race, as before
    vault = tmp_path / "vault"
    _notes(vault, 6)
    long_running = Brain(home)
    try:
        assert not long_running.sync(vaults=(str(vault),)).failed
        (vault / "added.md").write_text("# added\n\nan okapi note from the terminal\n", encoding="utf-8")
        assert brain(home, "--no-daemon", "sync", "--vault", str(vault)).returncode == 0
        (vault / "added.md").unlink()
        report = long_running.sync(vaults=(str(vault),))
    finally:
        long_running.close()
    source = report.sources[0]
    assert source.failed and source.store_failed and report.store_error
    assert "Error finding id" in report.store_error and report.store_error.startswith("Chroma (")
    line = cli._failure_line(source)
    assert "source remove" not in line and "Chroma" in line and "Nothing was lost" in line
    assert brain(home, "--no-daemon", "status", "--json").returncode == 0
    again = brain(home, "--no-daemon", "sync", "--vault", str(vault), "--allow-deletes", "vault")
    assert again.returncode == 0, again.stderr  # a fresh process converges
    assert found(home, "okapi") == []


def test_a_second_watcher_on_a_watched_home_is_refused_with_one_line(home, make_vault):
    """Two `brain watch` on one home synced every change twice, each process with its own copy of Chroma's state (1
    sync in ~80 failed). The second one now exits 3 with one line; the first goes on; `serve --watch` beside it
    serves without a watcher of its own, saying so."""
    vault = make_vault({"a.md": "# Alpha\n\nthe first note\n"})
    first = WatchProcess(home, "--vault", str(vault))
    try:
        wait_for(lambda: first.lines, 120)
        second = subprocess.run([*BRAIN, "--home", str(home), "watch", "--vault", str(vault)], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 3, second.stderr
        assert second.stderr.splitlines() == [f"brain: another watcher (pid {first.process.pid}) already keeps "
                                              f"{home} fresh: this one is not needed (stop that one first to start "
                                              "another)"]
        in_process = Brain(home)
        with cli.kept_fresh(in_process, True, interval=60) as watcher:
            assert watcher is None
        in_process.close()
        (vault / "b.md").write_text("# Bravo\n\nquokka sightings\n", encoding="utf-8")
        wait_for(lambda: found(home, "quokka") == ["vault:notes/b.md"], 60)
        assert first.process.poll() is None
    finally:
        code = first.stop(signal.SIGTERM)
    assert code == 0
    again = WatchProcess(home, "--vault", str(vault))  # the lock went with the first process
    try:
        wait_for(lambda: again.lines, 120)
    finally:
        assert again.stop() == 0
