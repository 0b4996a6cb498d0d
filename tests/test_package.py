"""Opt-in (`make test-slow`): a plain `pip install` of the wheel into a fresh venv gives a working `brain` anywhere."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLE_VAULT, free_port, stop


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_brain_works_from_any_folder(tmp_path: Path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
                   check=True, timeout=600)
    wheel = next(wheels.glob("cflow_brain-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints.txt"), str(wheel)],
                   check=True, timeout=1800)
    elsewhere = tmp_path / "elsewhere"  # no checkout on the path: only what the wheel installed
    elsewhere.mkdir()
    brain = str(venv / "bin" / "brain")
    home = tmp_path / "home"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([brain, "--home", str(home), *args], cwd=elsewhere, capture_output=True, text=True,
                              timeout=600)

    assert run("--version").stdout.startswith("brain, version")
    synced = run("sync", "--vault", str(SAMPLE_VAULT))
    assert synced.returncode == 0, synced.stderr
    found = run("search", "观影", "--json")
    assert found.returncode == 0 and "电影清单" in found.stdout
    assert "cflow-brain" in run("skill", "show").stdout
    port = free_port()
    server = subprocess.Popen([brain, "--home", str(home), "serve", "--port", str(port)], cwd=elsewhere,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert page.status == 200
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout.read() if server.stdout \
                    else ""
                time.sleep(1)
    finally:
        stop(server)
