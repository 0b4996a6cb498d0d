"""Chroma as a server (`chroma run`): several processes write and read one index through it, while the manifest,
BM25 and the sync lock stay in the home. This is the answer to embedded Chroma's one-writer limit."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import chromadb
import httpx

from bench.fault_trials import convergence_problems, run_brain, start_sync, wait_for_lock, write_notes
from rag_app.engine import Brain
from rag_app.index.store import collection_name
from tests.conftest import free_port, stop


def test_writers_and_readers_in_several_processes_share_one_index_through_the_server(home, tmp_path, chroma_server):
    url = chroma_server
    (home / "config.toml").write_text('[embedding]\nmodel = "use-m3"\n[sync]\nlock_wait_seconds = 1\n')
    vault = tmp_path / "vault"
    old = write_notes(vault, 30, seed=1)
    done = run_brain(home, "sync", "--vault", str(vault), "--json", store_url=url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sources"][0]["added"] == 30
    assert not (home / "chroma").exists()  # vectors live in the server; manifest and BM25 in the home
    assert (home / "index.sqlite").exists() and (home / "bm25" / "ids.json").exists()
    parsed = urlparse(url)
    served = chromadb.HttpClient(host=parsed.hostname, port=parsed.port).get_collection(collection_name("use-m3"))
    assert served.count() == Brain(home).status()["chunks"]
    note_id, title = next(iter(old.items()))
    found = run_brain(home, "search", title, "--json", "--no-expand", store_url=url)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["results"][0]["note_id"] == note_id

    new = write_notes(vault, 60, seed=2)
    reader = Brain(home, store_url=url)
    stop = threading.Event()
    outcome: dict[str, list] = {"errors": [], "seen": [], "done": []}

    def read() -> None:
        rng = random.Random(5)
        queries = list(old.values()) + list(new.values())
        while not stop.is_set():
            try:
                hits = reader.search(rng.choice(queries), k=5, expand=False).results
            except Exception as exc:  # noqa: BLE001 - any exception is the failure this test looks for
                outcome["errors"].append(repr(exc))
                continue
            outcome["seen"] += [r["note_id"] for r in hits]
            outcome["done"].append(1)
            time.sleep(0.05)  # leave the writers some CPU on a 2-core machine

    thread = threading.Thread(target=read)
    thread.start()
    first = start_sync(home, vault, store_url=url)
    assert wait_for_lock(home, first)
    second = run_brain(home, "sync", "--vault", str(vault), store_url=url)
    out, err = first.communicate(timeout=300)
    compacted = run_brain(home, "doctor", "--compact", "--json", store_url=url)  # swaps the collection under the reader
    time.sleep(1)
    stop.set()
    thread.join()
    reader.close()
    assert first.returncode == 0, err
    assert json.loads(out)["sources"][0]["added"] == 30
    assert second.returncode == 3 and "another sync is running" in second.stderr
    assert outcome["errors"] == [] and len(outcome["done"]) > 0
    assert set(outcome["seen"]) <= old.keys() | new.keys()
    report = json.loads(compacted.stdout)
    assert compacted.returncode == 0 and report["ok"] is True and report["store"] == url
    assert report["compact"]["bytes_before"] is None and report["compact"]["vacuum"] is None
    assert convergence_problems(home, new, store_url=url) == []


def test_a_chroma_server_that_is_down_leaves_new_notes_searchable_by_keyword(home, tmp_path):
    """Chunking needs neither a model nor Chroma: with the server down a sync still commits the notes' chunks and
    keyword index (the vectors' failure is reported and retried), so a new note is found by its words."""
    vault = tmp_path / "notes"
    vault.mkdir()
    (vault / "潜水.md").write_text("# 潜水日志\n\n第一次在珊瑚礁潜水，看到了海龟。", encoding="utf-8")
    brain = Brain(home, store_url=f"http://127.0.0.1:{free_port()}")
    try:
        report = brain.sync(vaults=(str(vault),))
        assert report.fill_error and "Chroma" in report.fill_error
        assert brain.status()["notes"] == 1
        found = brain.search("海龟 潜水", mode="bm25", k=3)
        assert [r["title"] for r in found.results][:1] == ["潜水日志"]
    finally:
        brain.close()


def test_a_chroma_url_s_credentials_are_never_shown(home, tmp_path):
    """A user and password (user:pw@) or a token in the query of `--store-url` / `[store] url` are never printed:
    `status` and `doctor` (text and JSON) name the server as scheme://host:port, as the PostgreSQL docstore's URL is
    shown; so does the one line for a server that cannot be reached. (A server of its own: doctor would count the
    module's other homes' vectors in a shared one as orphans.)"""
    data = tmp_path / "chroma"
    data.mkdir()
    server, url = _chroma_run(data)
    parsed = urlparse(url)
    secret_url = f"http://reader:pa55-w0rd@{parsed.hostname}:{parsed.port}/?token=t0ken-123"
    vault = tmp_path / "vault"
    write_notes(vault, 3, seed=4)
    try:
        done = run_brain(home, "sync", "--vault", str(vault), store_url=secret_url)
        assert done.returncode == 0, done.stderr
        runs = [run_brain(home, *args, store_url=secret_url) for args in
                (("status",), ("status", "--json"), ("doctor",), ("doctor", "--json"))]
    finally:
        stop(server)
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
        assert "pa55-w0rd" not in run.stdout + run.stderr and "t0ken-123" not in run.stdout + run.stderr
        assert "reader" not in run.stdout + run.stderr
    assert json.loads(runs[1].stdout)["store"] == url and json.loads(runs[3].stdout)["store"] == url
    assert f"store: {url}" in runs[0].stdout
    dead = f"http://reader:pa55-w0rd@127.0.0.1:{free_port()}/?token=t0ken-123"
    down = run_brain(home, "doctor", store_url=dead)
    assert down.returncode == 2 and "cannot reach the Chroma server at http://127.0.0.1:" in down.stderr
    assert "pa55-w0rd" not in down.stdout + down.stderr and "t0ken-123" not in down.stdout + down.stderr


def _chroma_run(data) -> tuple[subprocess.Popen, str]:
    """A `chroma run` of this test's own (the module's server is shared: this one is stopped mid-test)."""
    port = free_port()
    log = (data / "server.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "chroma"), "run", "--path", str(data / "db"), "--host",
                               "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v2/heartbeat", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, (data / "server.log").read_text()[-500:]
        time.sleep(0.2)


def test_a_chroma_server_gone_is_said_and_keyword_hits_are_not_called_strong(home, tmp_path):
    """With the Chroma server down, a search (a long-running Brain's, whose client was made while it was up, and a
    new `brain search`) goes on by keyword: it says the vector channel is down (one line; `coverage.store_down` in
    JSON) and labels nothing strong, since the dense evidence was never gathered. Before: a cold search exited 2, a
    warm one raised httpx's ConnectError, and one whose collection was not yet opened found BM25's hits alone, as
    strong as ever."""
    (home / "config.toml").write_text('[embedding]\nmodel = "e5-small"\n', encoding="utf-8")
    vault = tmp_path / "vault"
    vault.mkdir()
    notes = {"rust.md": "# Rust ownership\n\nThe borrow checker allows one mutable borrow or many shared borrows.\n",
             "coffee.md": "# 手冲咖啡\n\n水温 92 度，粉水比 1:15。\n",
             "cats.md": "# 猫咪日常\n\n猫今天称了体重，四公斤。\n"}
    for name, text in notes.items():
        (vault / name).write_text(text, encoding="utf-8")
    data = tmp_path / "chroma"
    data.mkdir()
    server, url = _chroma_run(data)
    try:
        done = run_brain(home, "sync", "--vault", str(vault), "--json", store_url=url)
        assert done.returncode == 0, done.stderr
        warm = Brain(home, store_url=url)
        up = warm.search("rust borrow checker mutable borrow", k=3, expand=False)
        assert up.results[0]["title"] == "Rust ownership" and up.results[0]["strength"] == "strong"
        assert "store_down" not in up.coverage
    finally:
        stop(server)
    try:
        down = warm.search("rust borrow checker mutable borrow", k=3, expand=False)
    finally:
        warm.close()
    assert down.results[0]["title"] == "Rust ownership" and down.results[0]["strength"] == "related"
    assert down.coverage["store_down"] == f"cannot reach the Chroma server at {url}"
    cold = run_brain(home, "search", "rust borrow checker mutable borrow", "--json", "--no-expand", store_url=url)
    assert cold.returncode == 0, cold.stderr
    found = json.loads(cold.stdout)
    assert found["coverage"]["store_down"] == f"cannot reach the Chroma server at {url}"
    assert found["results"][0]["title"] == "Rust ownership"
    assert all(r["strength"] != "strong" for r in found["results"])
    text = run_brain(home, "search", "rust borrow checker mutable borrow", "--no-expand", store_url=url)
    assert text.returncode == 0 and "related" in text.stdout.splitlines()[0]
    assert [line for line in text.stderr.splitlines() if line.startswith("brain:")] == [
        f"brain: the vector channel is down (cannot reach the Chroma server at {url}): found by keyword only, "
        "nothing labelled strong"]
