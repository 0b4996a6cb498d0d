"""Faults a sync meets for real: a Memos server that breaks mid-walk, a `brain sync` killed with -9, two writers and
readers at once. Every failure must leave the index, the manifest and BM25 exactly as they were, or converge."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fault_trials import (
    BRAIN,
    MEMOS_FAULTS,
    REPO,
    TOKEN,
    MemosFault,
    brain_env,
    change_memos,
    convergence_problems,
    kill_trial,
    list_requests,
    memos_fault_trial,
    memos_home,
    run_brain,
    snapshot,
    start_sync,
    wait_for_lock,
    write_notes,
)
from rag_app.config import ConfigError
from rag_app.engine import Brain
from tests.doubles.memos_server import MemosDouble, seed_memos


@pytest.fixture(scope="module")
def memos_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, MemosDouble, list[str]]]:
    """One double and one synced home for every Memos fault: each case leaves the stores as it found them."""
    with pytest.MonkeyPatch.context() as patch, MemosDouble(mode="head") as double:
        for var in ("BRAIN_HOME", "BRAIN_STORE_URL", "MEMOS_TOKEN"):
            patch.delenv(var, raising=False)
        patch.setenv("CFLOW_API_TOKEN", TOKEN)
        keys = seed_memos(double, 40)
        home = memos_home(tmp_path_factory.mktemp("memos") / "home", double.url)
        assert not Brain(home).sync(memos=(double.url,)).failed
        yield home, double, keys


@pytest.mark.parametrize("fault", MEMOS_FAULTS, ids=[f.name for f in MEMOS_FAULTS])
def test_memos_fault_keeps_every_store_then_recovers(memos_setup, fault: MemosFault, caplog):
    home, double, keys = memos_setup
    logger = logging.getLogger("cflow_brain")  # caught here even if a CLI run in this process stopped propagation
    logger.addHandler(caplog.handler)
    try:
        problems = memos_fault_trial(home, double, keys, fault, random.Random(fault.name))
    finally:
        logger.removeHandler(caplog.handler)
    assert problems == []
    assert ("failed, nothing changed" in caplog.text) is fault.fails
    assert TOKEN not in caplog.text


def test_memos_fault_through_the_cli_says_one_line_and_never_the_token(memos_setup):
    """The log file is written by the CLI only: check it, stderr and status for the token."""
    home, double, keys = memos_setup
    before = snapshot(home)
    change_memos(double, keys, random.Random(7))
    served = sum(1 for r in list_requests(double) if r["status"] == 200)
    first = len(double.requests)
    double.faults.update({"unauthorized_after_pages": served + 1})
    try:
        done = run_brain(home, "sync", "--memos", double.url, env={"CFLOW_API_TOKEN": TOKEN})
    finally:
        double.faults.clear()
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("brain:")]
    assert len(errors) == 1 and "401" in errors[0] and "CFLOW_API_TOKEN" in errors[0]
    assert len(list_requests(double, first)) == 2
    assert snapshot(home) == before
    log = (home / "brain.log").read_text(encoding="utf-8")
    assert "failed, nothing changed" in log
    status = run_brain(home, "status", "--json").stdout
    assert json.loads(status)["sources"][0]["last_result"]["failed"] is True
    assert TOKEN not in done.stdout + done.stderr + log + status



@pytest.mark.parametrize(("line", "message"), [
    ("timeout = \"fast\"", "sources[0].timeout: must be a number from 0.05 to 600, got 'fast'"),
    ("max_retries = 1.5", "sources[0].max_retries: must be a whole number from 0 to 20, got 1.5"),
    ("page_size = 0", "sources[0].page_size: must be a whole number from 1 to 1,000, got 0")])
def test_a_bad_client_knob_is_a_clear_config_error(home, line: str, message: str):
    (home / "config.toml").write_text(f'[[sources]]\nkind = "memos"\nurl = "http://127.0.0.1:9"\n{line}\n')
    with pytest.raises(ConfigError) as caught:
        Brain(home)
    assert message in str(caught.value)


@pytest.mark.parametrize("mid_write", [False, True], ids=["random-point", "mid-write"])
def test_kill_9_during_a_sync_then_syncing_again_converges(home, tmp_path, mid_write: bool):
    """Batches commit one by one: whatever a kill leaves, the next sync finishes it without duplicates."""
    vault = tmp_path / "vault"
    titles = write_notes(vault, 60)
    seed = random.randrange(1_000_000)
    result = kill_trial(home, vault, titles, random.Random(seed), max_delay=1.5 if mid_write else 5.0,
                        mid_write=mid_write)
    assert result.problems == [], f"seed {seed}: killed={result.killed} after {result.delay:.2f} s"


def test_two_sync_processes_one_writes_the_other_waits_then_reports_busy(home, tmp_path):
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[sync]\nlock_wait_seconds = 1\n')
    vault = tmp_path / "vault"
    titles = write_notes(vault, 60)
    first = start_sync(home, vault)
    assert wait_for_lock(home, first)
    started = time.monotonic()
    second = run_brain(home, "sync", "--vault", str(vault), "--json")
    waited = time.monotonic() - started
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out)["sources"][0]["added"] == 60
    refused = json.loads(second.stdout)  # --json: the refusal as JSON too, not an empty stdout
    assert second.returncode == 3 and refused["exit_code"] == 3
    assert f"another sync is running on {home} (pid {first.pid}); waited 1 s" in refused["error"]
    assert f"another sync is running on {home} (pid {first.pid}); waited 1 s" in second.stderr
    assert waited >= 1.0
    assert convergence_problems(home, titles) == []


def test_searches_while_another_process_syncs_see_old_or_new_notes_and_never_fail(home, tmp_path):
    """Embedded Chroma, one writer process and readers in this process and in a CLI process at the same time."""
    vault = tmp_path / "vault"
    old = write_notes(vault, 30, seed=1)
    assert not Brain(home).sync(vaults=(str(vault),)).failed
    new = write_notes(vault, 60, seed=2)  # rewrites the 30 (new titles) and adds 30
    for n in range(5):
        (vault / f"n{n:03d}.md").unlink()
        del new[f"vault:vault/n{n:03d}.md"]
    queries = list(old.values()) + list(new.values())
    sync = start_sync(home, vault)
    assert wait_for_lock(home, sync)
    cli = subprocess.Popen([*BRAIN, "--home", str(home), "search", queries[-1], "--json", "--no-expand"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=brain_env())
    brain = Brain(home)
    rng = random.Random(3)
    searches, errors, seen = 0, [], set()
    while sync.poll() is None:
        try:
            found = brain.search(rng.choice(queries), k=5, expand=False)
        except Exception as exc:  # noqa: BLE001 - any exception is the failure this test looks for
            errors.append(repr(exc))
            continue
        searches += 1
        seen.update(r["note_id"] for r in found.results)
        time.sleep(0.05)  # leave the writer some CPU on a 2-core machine
    brain.close()
    cli_out, cli_err = cli.communicate(timeout=300)
    assert sync.returncode == 0, sync.stderr.read() if sync.stderr else ""
    assert errors == [] and searches > 0
    assert cli.returncode == 0, cli_err
    assert isinstance(json.loads(cli_out)["results"], list)
    assert seen <= old.keys() | new.keys()
    assert convergence_problems(home, new) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MB file system (tmpfs), for a full disk; mounting takes root (CI runs as root)."""
    import os

    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (uid {os.geteuid()}): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_up(disk: Path) -> Path:
    """Take every free byte of `disk` with one file (removed to make room again)."""
    import os

    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        return filler
    finally:
        os.close(fd)


def test_a_full_disk_gives_one_line_naming_the_store_and_nothing_is_lost(small_disk: Path, tmp_path: Path):
    """Issue 30 (Medium 7): a sync or doctor on a full disk once printed two chained tracebacks (~60 lines)."""
    home = small_disk / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n', encoding="utf-8")
    vault = tmp_path / "vault"
    write_notes(vault, 3)
    first = run_brain(home, "sync", "--vault", str(vault))
    assert first.returncode == 0, first.stderr
    before = snapshot(home)
    write_notes(vault, 40)  # the same 3 and 37 more
    filler = fill_up(small_disk)
    for args in (["sync"], ["doctor"]):
        done = run_brain(home, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith(f"brain: the disk of {home} is full: ") and "nothing was lost" in line, line
        assert any(store in line for store in ("docstore.sqlite", "index.sqlite", "chroma/", "bm25/")), line
    filler.unlink()
    assert snapshot(home) == before, "what was synced before is all there"
    again = run_brain(home, "sync")
    assert again.returncode == 0, again.stderr
    assert len(snapshot(home)["notes"]) == 40
    assert run_brain(home, "doctor").returncode == 0
